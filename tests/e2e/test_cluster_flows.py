#!/usr/bin/python3
"""End to end on two simulated nodes: the demo's flows with their payloads checked, the source
address the apps see, the cross-node hop on the wire, policy, 500 connections, and pod deletion.
Topology: cluster.demo_topology (client, echo-a, legacy-a on node-a; echo-b, legacy-b on node-b;
service echo VIP 10.96.0.20:80 -> echo-b:8080)."""
import os
import subprocess
import time

from cluster_case import (APP_PORT, ECHO_VIP, ClusterCase, main, metric_value,  # noqa: F401
                          wait_until)

MiB = 1 << 20


def deny_policy(name, **match):
    return {"name": name, "namespace": "shop", "scope": "Namespace", "action": "Deny",
            "rules": [[[match]]]}


class Flows(ClusterCase):

    def test_every_demo_flow_arrives_intact_and_is_logged_by_the_right_proxy(self):
        client = self.client
        echo_a, echo_b = self.pods["echo-a"], self.pods["echo-b"]
        legacy_a, legacy_b = self.pods["legacy-a"], self.pods["legacy-b"]
        out_a = self.a.datapath_counter("captured_outbound")
        in_a = self.a.datapath_counter("captured_inbound")

        # 1. pod -> pod on one node: the same-node fast path (no HBONE to the proxy's own
        # 15008; the tunnel it replaces is compared in test_cluster_same_node.py).
        r = self.talk(client, "%s:%d" % (echo_a.ip, APP_PORT), 2 * MiB)
        self.assertEqual(r["servers"], ["shop/echo-a"])
        line = self.access_lines(self.a, "direction=inbound", "dst.addr=%s:8080" % echo_a.ip)
        self.assertTrue(line, "node-a's proxy logged no inbound line for echo-a")
        self.assertIn(" path=same-node", line[0])
        self.assertNotIn("dst.hbone_addr", line[0])
        self.assertIn("src.identity=%s" % client.identity, line[0])
        # (bytes_sent: what reached the app; bytes_recv adds its greeting line to the echo.)
        self.assertIn("bytes_sent=%d" % (2 * MiB), line[0])

        # 2. pod -> service VIP -> pod on the other node.
        r = self.talk(client, "%s:80" % ECHO_VIP, 2 * MiB)
        self.assertEqual(r["servers"], ["shop/echo-b"])
        out = self.access_lines(self.a, "direction=outbound", "dst.service=echo.shop.svc")
        self.assertTrue(out, "node-a's proxy logged no outbound line for the VIP")
        self.assertIn("dst.hbone_addr=%s:15008" % echo_b.ip, out[0])
        inb = self.access_lines(self.b, "direction=inbound", "dst.addr=%s:8080" % echo_b.ip)
        self.assertTrue(inb, "node-b's proxy logged no inbound line")
        self.assertIn("src.identity=%s" % client.identity, inb[0])
        self.assertIn("dst.identity=%s" % echo_b.identity, inb[0])

        # 3. legacy pod (not in the mesh) -> mesh pod: plaintext captured on echo-a's 15006.
        for legacy in (legacy_a, legacy_b):
            r = self.talk(legacy, "%s:%d" % (echo_a.ip, APP_PORT), MiB)
            self.assertEqual(r["servers"], ["shop/echo-a"])
            line = self.access_lines(self.a, "direction=inbound", "src.addr=%s:" % legacy.ip)
            self.assertTrue(line, "no inbound plaintext line for %s" % legacy)
            self.assertNotIn("src.identity=spiffe", line[0], "plaintext has no peer identity")

        # 4. mesh pod -> legacy pod: captured outbound, passed through as plain TCP.
        r = self.talk(client, "%s:%d" % (legacy_b.ip, APP_PORT), MiB)
        self.assertEqual(r["servers"], ["legacy/legacy-b"])
        line = self.access_lines(self.a, "direction=outbound", "dst.addr=%s:8080" % legacy_b.ip)
        self.assertTrue(line)
        self.assertNotIn("dst.hbone_addr", line[0], "a pod outside the mesh gets plain TCP")

        # tc assigned every outbound SYN of the client (flows 1, 2, 4) and the two plaintext
        # inbound ones; node-b's capture saw no inbound plaintext (only HBONE arrived there).
        self.assertEqual(self.a.datapath_counter("captured_outbound") - out_a, 3)
        self.assertEqual(self.a.datapath_counter("captured_inbound") - in_a, 2)
        self.assertEqual(self.b.datapath_counter("captured_inbound"), 0)
        self.assertGreater(self.a.datapath_counter("bypass_sends"), 0,
                           "the app <-> proxy hop in the pods never took the sockmap bypass")
        # Pods outside the mesh have no workload record and no proxy listeners.
        status = self.a.loader("status")
        self.assertIn(self.client.ip, status)
        self.assertNotIn(legacy_a.ip, status)
        # The proxy's config dump shows the node's enrolled pods as the workload map has them.
        enrolled = {w["ip"]: w for w in self.a.config_dump()["enrolledWorkloads"]}
        self.assertEqual(sorted(enrolled), sorted([client.ip, echo_a.ip]))
        self.assertEqual(enrolled[client.ip]["identity"], client.identity)

    def test_apps_see_the_client_pods_own_address_same_node_and_across_nodes(self):
        client = self.client
        for target in ("%s:%d" % (self.pods["echo-a"].ip, APP_PORT),      # same node, fast path
                       "%s:80" % ECHO_VIP,                                 # across, via VIP
                       "%s:%d" % (self.pods["echo-b"].ip, APP_PORT),      # across, direct
                       "%s:%d" % (self.pods["legacy-b"].ip, APP_PORT)):   # passthrough
            r = self.talk(client, target, 64 * 1024, conns=3)
            self.assertEqual(r["seen_as"], [client.ip], "the server at %s saw %s" % (
                target, r["seen_as"]))
        legacy = self.pods["legacy-b"]
        r = self.talk(legacy, "%s:%d" % (self.pods["echo-a"].ip, APP_PORT), 64 * 1024)
        self.assertEqual(r["seen_as"], [legacy.ip], "captured plaintext keeps the source too")

    def test_the_cross_node_hop_is_tls13_h2_to_15008_and_carries_no_plaintext(self):
        marker = "sockmesh-plaintext-marker-%d" % os.getpid()
        pcap = os.path.join(self.cluster.work, "link.pcap")
        dump = subprocess.Popen(["nsenter", "--net=" + self.a.netns_path, "tcpdump", "-i", "eth0",
                                 "-U", "-s", "0", "-w", pcap, "tcp"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until("tcpdump to start", lambda: os.path.exists(pcap), 10)
            time.sleep(0.3)
            r = self.talk(self.client, "%s:80" % ECHO_VIP, 512 * 1024, text=marker)
            self.assertEqual(r["servers"], ["shop/echo-b"])
            # The plaintext control: the same marker from a legacy pod crosses in the clear.
            self.talk(self.pods["legacy-b"], "%s:%d" % (self.pods["legacy-a"].ip, APP_PORT),
                      4096, text="control-" + marker)

            def captured_control():
                with open(pcap, "rb") as f:
                    return ("control-" + marker).encode() in f.read()
            # The capture saw the link: it holds the control's plaintext (waits for tcpdump).
            wait_until("tcpdump to write the control flow", captured_control, 10)
        finally:
            dump.terminate()
            dump.wait(10)
        with open(pcap, "rb") as f:
            raw = f.read().replace(("control-" + marker).encode(), b"")
        self.assertEqual(raw.count(marker.encode()), 0,
                         "mesh payload crossed the link in the clear")

        def tshark(*args):
            return subprocess.run(["tshark", "-r", pcap, "-d", "tcp.port==15008,tls"] +
                                  list(args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, timeout=60).stdout
        mesh = "ip.src==%s && ip.dst==%s" % (self.client.ip, self.pods["echo-b"].ip)
        ports = set(tshark("-Y", mesh, "-T", "fields", "-e", "tcp.dstport").split())
        self.assertEqual(ports, {"15008"}, "client -> echo-b traffic went to ports %s" % ports)
        hello = tshark("-Y", mesh + " && tls.handshake.type==1", "-T", "fields", "-e",
                       "tls.handshake.extensions_alpn_str")
        self.assertTrue(hello.strip(), "no TLS ClientHello to 15008 on the link")
        self.assertEqual(set(hello.split()), {"h2"}, "ALPN offered: %s" % hello)
        server_hello = tshark("-Y", "tls.handshake.type==2", "-T", "fields", "-e",
                              "tls.handshake.extensions.supported_version")
        self.assertIn("0x0304", server_hello, "the server did not choose TLS 1.3")

    def test_a_deny_policy_refuses_new_connections_and_closes_live_ones(self):
        c, client, echo_a = self.cluster, self.client, self.pods["echo-a"]
        legacy = self.pods["legacy-b"]
        self.talk(legacy, "%s:%d" % (echo_a.ip, APP_PORT), 4096)       # allowed before
        live = client.client_process("live", "%s:80" % ECHO_VIP, "--stream-seconds", 30)
        wait_until("the live stream to reach echo-b",
                   lambda: self.access_lines(self.b, "connection opened", timeout=0) or
                   "accepted from %s" % client.ip in self.pods["echo-b"].processes[0].log(), 10)
        c.set_policies([
            deny_policy("deny-client", principals=["cluster.local/ns/shop/sa/client"]),
            deny_policy("deny-legacy-b", sourceIps=["%s/32" % legacy.ip])])
        applied = time.time()
        report = self.report_of(live, timeout=15)
        self.assertFalse(report["ok"], "the live connection survived the Deny policy")
        self.assertLess(report["first_error_at"] - applied, 5.0,
                        "the live connection was closed late: %s" % report)
        # New connections: refused, both the HBONE one and the captured plaintext one.
        for src, target in ((client, "%s:80" % ECHO_VIP),
                            (client, "%s:%d" % (echo_a.ip, APP_PORT)),
                            (legacy, "%s:%d" % (echo_a.ip, APP_PORT))):
            r = src.client(target, "--bytes", 4096, "--timeout", 5)
            self.assertFalse(r["ok"], "%s -> %s was not refused: %s" % (src, target, r))
            self.assertLess(r["elapsed"], 5.0, "refusal took the whole timeout: %s" % r)
        # Other traffic is untouched; the refusals are counted and logged with the reason.
        self.talk(self.pods["legacy-a"], "%s:%d" % (legacy.ip, APP_PORT), 4096)
        # The refusal is counted as the proxy's record of it closes, which may be just after
        # the client saw its socket close.
        wait_until("node-b to count a DENY", lambda: metric_value(
            self.b.metrics(), "istio_tcp_connections_closed_total", response_flags="DENY") >= 1,
            10)
        self.assertTrue(self.access_lines(self.a, "src.addr=%s:" % legacy.ip, "DENY") or
                        [ln for ln in self.a.proxy.log().splitlines()
                         if "deny-legacy-b" in ln], "no log line names the denying policy")

    def deny_all_but_nobody(self):
        """Only sa/nobody may talk to shop's pods: every captured connection is refused."""
        self.cluster.set_policies([{"name": "only-nobody", "namespace": "shop",
                                    "scope": "Namespace", "action": "Allow", "rules": [[[
                                        {"principals": ["cluster.local/ns/shop/sa/nobody"]}]]]}])
        r = self.pods["legacy-b"].client("%s:%d" % (self.pods["echo-a"].ip, APP_PORT),
                                         "--bytes", 4096, "--timeout", 5)
        self.assertFalse(r["ok"], "the policy did not refuse captured traffic: %s" % r)

    def client_from_the_node(self, target, kubelet):
        """podapp's client in node-a's netns, from its own address on the pods' bridge; in the
        kubelet's cgroup or outside it (any other host-network process)."""
        import json
        import cluster
        argv = [cluster.PYTHON, cluster.PODAPP, "client", "--target", target, "--bytes", "1024",
                "--timeout", "5"]
        out = (self.a.kubelet_sh if kubelet else self.a.sh)(argv, check=False)
        return json.loads(out.strip().splitlines()[-1])

    def test_probes_from_the_kubelet_reach_the_app_uncaptured_even_when_policy_denies_all(self):
        echo_a = self.pods["echo-a"]
        self.deny_all_but_nobody()
        captured = self.a.datapath_counter("captured_inbound")
        exempt = self.a.datapath_counter("node_exempt")
        probe = self.client_from_the_node("%s:%d" % (echo_a.ip, APP_PORT), kubelet=True)
        self.assertTrue(probe["ok"], "the kubelet's probe failed: %s" % probe)
        # SNAT in the node's netns: the app sees the probe address, not the node's.
        self.assertEqual(probe["seen_as"], ["169.254.7.127"], "the app sees the probe address")
        self.assertEqual(self.a.datapath_counter("node_exempt") - exempt, 1)
        self.assertEqual(self.a.datapath_counter("captured_inbound"), captured)
        self.assertIn("kubelet probes", self.a.agent.log())

    def test_a_host_network_process_cannot_bypass_policy_to_an_enrolled_pod(self):
        """A process in the node's netns, from the node's address, outside the kubelet's cgroup:
        captured like any other client, so the policy refuses it."""
        echo_a = self.pods["echo-a"]
        self.deny_all_but_nobody()
        captured = self.a.datapath_counter("captured_inbound")
        exempt = self.a.datapath_counter("node_exempt")
        r = self.client_from_the_node("%s:%d" % (echo_a.ip, APP_PORT), kubelet=False)
        self.assertFalse(r["ok"], "a host-network process bypassed the policy: %s" % r)
        self.assertEqual(self.a.datapath_counter("node_exempt"), exempt)
        self.assertGreaterEqual(self.a.datapath_counter("captured_inbound") - captured, 1)
        # Without the policy the same process gets through, captured (plaintext on 15006).
        self.cluster.set_policies([])
        r = self.client_from_the_node("%s:%d" % (echo_a.ip, APP_PORT), kubelet=False)
        self.assertTrue(r["ok"], "with no policy the node's client failed: %s" % r)
        self.assertEqual(r["seen_as"], [self.a.gateway], "captured, source address kept")
        self.assertEqual(self.a.datapath_counter("node_exempt"), exempt)

    def test_500_concurrent_connections_across_nodes_each_intact(self):
        opened = metric_value(self.b.metrics(), "istio_tcp_connections_opened_total",
                              reporter="destination")
        r = self.client.client("%s:80" % ECHO_VIP, "--conns", 500, "--bytes", 32 * 1024,
                               "--timeout", 30, timeout=120)
        self.assertTrue(r.get("ok"), "lost connections: %s" % {
            k: r.get(k) for k in ("failed", "errors", "elapsed")})
        self.assertEqual(r["bytes"], 500 * 32 * 1024)
        self.assertEqual(r["seen_as"], [self.client.ip])
        self.assertEqual(r["servers"], ["shop/echo-b"])
        wait_until("node-b to count 500 more inbound connections", lambda: metric_value(
            self.b.metrics(), "istio_tcp_connections_opened_total",
            reporter="destination") - opened >= 500, 10)

    def test_a_deleted_pod_leaves_no_map_entry_tc_program_or_listener(self):
        echo_a = self.pods["echo-a"]
        self.talk(self.client, "%s:%d" % (echo_a.ip, APP_PORT), 4096)
        pods_before = metric_value(self.a.metrics(), "sockmesh_zds_pods")
        self.assertEqual(pods_before, 2, "node-a's proxy has client and echo-a")
        self.assertIn(echo_a.ip, self.a.loader("status"))
        seen = {}

        def between(plugin):
            if plugin != "sockmesh-cni":
                return
            # sockmesh-cni's DEL is done; bridge has not yet removed eth0.
            seen["tc"] = echo_a.sh(["tc", "filter", "show", "dev", "eth0", "ingress"]) + \
                echo_a.sh(["tc", "filter", "show", "dev", "eth0", "egress"])
            seen["listening"] = echo_a.sh(["ss", "-Hltn"])
            seen["status"] = self.a.loader("status")
            seen["workloads"] = [".".join(str(b) for b in e["formatted"]["key"]["addr"][-4:])
                                 for e in self.a.bpftool_dump("sm_workloads")]
            seen["zds_pods"] = metric_value(self.a.metrics(), "sockmesh_zds_pods")
        self.cluster.delete_pod(echo_a, after_plugin=between)
        self.assertNotIn("bpf", seen["tc"], "tc programs still on eth0: %s" % seen["tc"])
        for port in (":15001 ", ":15006 ", ":15008 "):
            self.assertNotIn(port, seen["listening"], "a proxy listener stayed in the pod")
        self.assertNotIn(echo_a.ip, seen["status"], "its workload record or listeners remain")
        self.assertIn(self.client.ip, seen["status"], "the other pod must stay enrolled")
        self.assertNotIn(echo_a.ip, seen["workloads"], "bpftool still shows its record")
        self.assertIn(self.client.ip, seen["workloads"])
        self.assertEqual(seen["zds_pods"], 1)
        self.assertFalse(os.path.exists(echo_a.netns_path))
        # The rest of the cluster carries on.
        self.talk(self.client, "%s:80" % ECHO_VIP, 64 * 1024)


class FromIstiod(ClusterCase):
    """The same cluster with the mesh from a fake istiod (tests/fixtures/fake_istiod/
    standalone.py, built from proto/) over Delta xDS and every certificate from its CA, on one
    address as istiod serves both: the demo's flows and a policy pushed live."""
    xds = True

    def test_the_proxies_are_synced_from_istiod_and_hold_certificates_from_its_ca(self):
        for node in (self.a, self.b):
            d = node.config_dump()
            self.assertEqual(d["certificateIssuer"], "istio-ca")
            self.assertTrue(d["xds"]["synced"], d["xds"])
            self.assertEqual(d["xds"]["terminations"], {}, "the xDS stream was cut")
            self.assertTrue(d["configSource"].startswith("xds "), d["configSource"])
            local = sorted(w["identity"] for w in d["workloads"] if w["local"] and
                           w["protocol"] == "HBONE")
            held = sorted(c["identity"] for c in d["certificates"] if c["state"] == "Available")
            self.assertEqual(held, local, "%s: certificates for its local mesh pods" % node.name)
        log = self.cluster.istiod.log()
        self.assertIn("CA signed %s" % self.client.identity, log)
        self.assertIn("CA signed %s" % self.pods["echo-b"].identity, log)

    # The file's mesh, from istiod's APIs: the same flows and the same live policy change.
    test_every_demo_flow_arrives_intact_and_is_logged_by_the_right_proxy = \
        Flows.test_every_demo_flow_arrives_intact_and_is_logged_by_the_right_proxy
    test_a_deny_policy_refuses_new_connections_and_closes_live_ones = \
        Flows.test_a_deny_policy_refuses_new_connections_and_closes_live_ones


if __name__ == "__main__":
    main()
