#!/usr/bin/python3
"""The ambient profile runs: the chart rendered with --set profile=ambient, its containers run
from the rendered manifest with podman on the simulated cluster (scripts/lib/podspec.py,
scripts/lib/chart_runtime.py), against the fake istiod (tests/fixtures/fake_istiod/standalone.py:
Delta xDS and Istio's CA on one TLS address, as istiod serves both on 15012).

The test supplies only what a cluster with istiod would: istiod's address (xdsAddress and
caAddress, the values an operator sets when istiod is not at istiod.istio-system.svc), the
ConfigMap istio-ca-root-cert that istiod publishes, the projected istio-ca token, and the
proxy pod's place on the pod network. Everything else (env, args, mounts, privileges) comes from
the rendered manifest. It proves: the proxy has no local config file, takes its workloads and
policies over xDS and its certificates from the fake CA (/config_dump, the fake istiod's record
of what it signed); pod -> pod across nodes goes over HBONE with mTLS (the node link carries TLS
to 15008 and no plaintext; the server side logs the client's SPIFFE identity); a Deny policy
pushed by the fake istiod is enforced, and lifted again. As in deploy_manifest_runs the simulated
cluster has no pod API: node.labelsFrom=config. Needs root, podman, helm, tcpdump; exits 77
without them."""
import os
import re
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "scripts", "lib"))

import cluster  # noqa: E402
from chart_runtime import ChartRuntime, build_image, run_manifest_tests  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, metric_value, wait_until  # noqa: E402


def deny_client():
    return {"name": "deny-client", "namespace": "shop", "scope": "Namespace", "action": "Deny",
            "rules": [[[{"principals": ["cluster.local/ns/shop/sa/client"]}]]]}


class AmbientProfileRuns(unittest.TestCase):
    def test_the_ambient_profile_takes_mesh_and_certificates_from_istiod(self):
        image, summary = build_image()
        sys.stdout.write(summary + "\n")
        rt = ChartRuntime(image, values={"profile": "ambient", "node.labelsFrom": "config"})
        say = lambda m: sys.stdout.write("  %s\n" % m)  # noqa: E731
        with cluster.Cluster(runtime=rt, xds=True, log=say) as c:
            # istiod's address, as an operator sets it (the fake serves on node-a's link).
            rt.values.update({"xdsAddress": c.istiod_address, "caAddress": c.istiod_address})
            # The agent's namespace labels (labelsFrom=config) come from the ConfigMap's
            # directory; the fake istiod follows the same file and pushes it as xDS.
            c.config_path = os.path.join(c.work, "config.yaml")
            c.up()
            a, b = c.nodes
            pods = cluster.demo_topology(c)
            client, echo_b = pods["client"], pods["echo-b"]

            # The manifest's proxy: ztunnel's env, no local config file.
            proxy = rt.render(a)["sockmesh"]["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in proxy["env"]}
            self.assertEqual(env["XDS_ADDRESS"], c.istiod_address)
            self.assertEqual(env["CA_ADDRESS"], c.istiod_address)
            self.assertFalse([x for x in proxy["args"] if x.startswith("--config")], proxy["args"])

            # Mesh from xDS, certificates from the fake CA, on both nodes.
            istiod_log = c.istiod.log
            for n in c.nodes:
                d = n.config_dump()
                self.assertTrue(d["configSource"].startswith("xds "), d["configSource"])
                self.assertTrue(d["xds"]["synced"], d["xds"])
                self.assertEqual(d["certificateIssuer"], "istio-ca")
                plog = n.proxy.log()
                self.assertIn("identities: Istio CA at %s" % c.istiod_address.split("//")[1], plog)
                local = sorted(w["identity"] for w in d["workloads"]
                               if w["local"] and w["protocol"] == "HBONE")
                self.assertTrue(local, "%s: no local mesh workload from xDS" % n.name)
                wait_until("%s's certificates from the fake CA" % n.name, lambda: sorted(
                    x["identity"] for x in n.config_dump()["certificates"]
                    if x["state"] == "Available") == local, 20)
                for cert in n.config_dump()["certificates"]:
                    serial = cert["certChain"][0]["serialNumber"].lower().lstrip("0")
                    self.assertRegex(istiod_log(), r"CA signed %s \(serial 0*%s\)" % (
                        re.escape(cert["identity"]), serial),
                        "%s's certificate for %s is not one the fake CA signed" % (
                            n.name, cert["identity"]))
                say("%s: xDS synced (%s), certificates from the fake CA for %s" % (
                    n.name, d["configSource"], ", ".join(local)))

            # Across nodes over HBONE, mTLS: the link carries TLS to 15008, never the payload.
            marker = "sockmesh-ambient-marker-%d" % os.getpid()
            pcap = os.path.join(c.work, "link.pcap")
            dump = subprocess.Popen(["nsenter", "--net=" + a.netns_path, "tcpdump", "-i", "eth0",
                                     "-U", "-s", "0", "-w", pcap, "tcp"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_until("tcpdump to start", lambda: os.path.exists(pcap), 10)
                time.sleep(0.3)
                r = client.client("%s:80" % ECHO_VIP, "--bytes", 256 * 1024, "--text", marker,
                                  "--timeout", 20)
                time.sleep(0.5)
            finally:
                dump.terminate()
                dump.wait(10)
            self.assertEqual(r.get("servers"), ["shop/echo-b"], "%s\nnode-a's proxy:\n%s" % (
                r, a.proxy.log()[-4000:]))
            self.assertTrue(r.get("ok") and r.get("bytes") == 256 * 1024, r)
            with open(pcap, "rb") as f:
                raw = f.read()
            self.assertNotIn(marker.encode(), raw, "mesh payload crossed the link in the clear")
            mesh = "ip.src==%s && ip.dst==%s" % (client.ip, echo_b.ip)
            ports = set(subprocess.run(
                ["tshark", "-r", pcap, "-Y", mesh, "-T", "fields", "-e", "tcp.dstport"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                timeout=60).stdout.split())
            self.assertEqual(ports, {"15008"}, "client -> echo-b went to ports %s" % ports)
            hello = subprocess.run(
                ["tshark", "-r", pcap, "-d", "tcp.port==15008,tls", "-Y",
                 mesh + " && tls.handshake.type==1", "-T", "fields", "-e",
                 "tls.handshake.extensions_alpn_str"], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, timeout=60).stdout
            self.assertEqual(set(hello.split()), {"h2"}, "no TLS ClientHello with ALPN h2 to "
                             "echo-b:15008 on the link: %r" % hello)
            wait_until("node-a's proxy to log the outbound HBONE connection",
                       lambda: "dst.hbone_addr=%s:15008" % echo_b.ip in a.proxy.log(), 10)
            wait_until("node-b's proxy to log the client's identity (from its certificate)",
                       lambda: "src.identity=%s" % client.identity in b.proxy.log(), 10)

            # A policy pushed by istiod: node-b's proxy refuses the client, then lets it in again.
            def policy_acks():
                return sum(t["acks"] for name, t in b.config_dump()["xds"]["types"].items()
                           if "Authorization" in name)
            acks = policy_acks()
            c.set_policies([deny_client()])   # waits until both proxies serve it
            self.assertRegex(istiod_log(), r"pushed istio\.security\.Authorization: 1 changed")
            self.assertIn("deny-client", [p["name"] for p in b.config_dump()["policies"]])
            self.assertGreater(policy_acks(), acks, "node-b did not ACK the policy push")
            denied = metric_value(b.metrics(), "istio_tcp_connections_closed_total",
                                  response_flags="DENY")
            r = client.client("%s:80" % ECHO_VIP, "--bytes", 4096, "--timeout", 5)
            self.assertFalse(r.get("ok"), "the pushed Deny policy did not refuse: %s" % r)
            wait_until("node-b to count the refusal", lambda: metric_value(
                b.metrics(), "istio_tcp_connections_closed_total",
                response_flags="DENY") > denied, 10)
            r = client.client("%s:%d" % (pods["echo-a"].ip, APP_PORT), "--bytes", 4096,
                              "--timeout", 5)
            self.assertFalse(r.get("ok"), "same node: the pushed Deny did not refuse: %s" % r)
            c.set_policies([])
            r = client.client("%s:80" % ECHO_VIP, "--bytes", 4096, "--timeout", 10)
            self.assertTrue(r.get("ok"), "with the policy removed: %s" % r)
            say("policy deny-client pushed by the fake istiod: refused; removed: allowed")


def main():
    run_manifest_tests("ambient-profile", ("podman", "bpftool", "curl", "tcpdump", "tshark"))


if __name__ == "__main__":
    main()
