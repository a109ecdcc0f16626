#!/usr/bin/python3
"""The manifest runs: the chart is rendered for each node of the simulated cluster
(scripts/lib/cluster.py), its DaemonSets' pod templates are turned into podman invocations
(scripts/lib/podspec.py) and the image scripts/image built runs in place of the binaries the demo
starts. The CNI installer container writes the conflist, the agent container enrolls the labelled
pods, traffic crosses the nodes over HBONE, and the uninstall leaves each node's CNI
configuration, plugin directory and pin root as they were: helm uninstall deletes the DaemonSet,
its pods get SIGTERM, the installer removes what it added (the manifest's --uninstall-on-exit) and
the agent, asking the API server for its DaemonSet (the manifest's --uninstall-when-removed),
finds it gone and removes the datapath itself. Commands, args, env, mounts and privileges all come
from the rendered manifest; the test supplies only what a kubelet and the API server would (the
node's paths as values, the downward-API fields, the ConfigMap's directory, the API server's
address and a service account directory, and tests/e2e/fake_owner_api.py over TLS as the API
server's DaemonSet endpoint). The simulated cluster has no pod API, so the values say
node.labelsFrom=config. Needs root, podman and helm (scripts/setup); exits 77 without them."""
import json
import os
import shutil
import signal
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "scripts", "lib"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "fixtures", "fake_istiod"))

import cluster  # noqa: E402
from chart_runtime import ChartRuntime, build_image, run_manifest_tests  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, run, wait_until  # noqa: E402
import ca as fake_ca  # noqa: E402

API_PORT = 18443
API_TOKEN = "sockmesh-node-token"
OWNER_API = os.path.join(SOURCE, "tests", "e2e", "fake_owner_api.py")


class ManifestRuns(unittest.TestCase):
    def api_server(self):
        """The service account directory a kubelet mounts (token, ca.crt) and the serving pair
        of the fake API server, signed by that ca.crt for 127.0.0.1."""
        d = tempfile.mkdtemp(prefix="sm-manifest-api-")
        self.addCleanup(shutil.rmtree, d, True)
        root = fake_ca.TestRoot("simulated API server CA")
        sa_dir = os.path.join(d, "serviceaccount")
        os.makedirs(sa_dir)
        root.write(os.path.join(sa_dir, "ca.crt"))
        with open(os.path.join(sa_dir, "token"), "w") as f:
            f.write(API_TOKEN + "\n")
        with open(os.path.join(sa_dir, "namespace"), "w") as f:
            f.write("istio-system\n")
        cert_pem, key_pem = root.serving_pair("127.0.0.1")
        cert, key = os.path.join(d, "api.crt"), os.path.join(d, "api.key")
        for path, pem in ((cert, cert_pem), (key, key_pem)):
            with open(path, "wb") as f:
                f.write(pem if isinstance(pem, bytes) else pem.encode())
        return d, sa_dir, cert, key

    def start_owner_api(self, n, d, cert, key):
        """The API server's DaemonSet endpoint in node n's network namespace (the agent's
        container shares it: hostNetwork). Returns (state file, request log)."""
        state, requests = os.path.join(d, n.name + ".state"), os.path.join(d, n.name + ".requests")
        with open(state, "w") as f:
            f.write("present")
        run(["nsenter", "--net=" + n.netns_path, "ip", "link", "set", "lo", "up"])
        api = cluster.Process("owner-api-" + n.name, [OWNER_API, str(API_PORT), state, requests,
                                                      API_TOKEN, cert, key],
                              netns=n.netns_path, log_path=os.path.join(d, n.name + ".log"))
        self.addCleanup(api.stop, signal.SIGKILL)
        wait_until("the fake API server in %s" % n.name, lambda: api.alive() and run(
            ["nsenter", "--net=" + n.netns_path, "curl", "-sk", "-o", "/dev/null", "-w",
             "%{http_code}", "https://127.0.0.1:%d/" % API_PORT], check=False).strip() == "401",
            10)
        return state, requests

    def test_the_charts_containers_run_the_demo_and_uninstall_cleanly(self):
        image, summary = build_image()
        sys.stdout.write(summary + "\n")
        api_dir, sa_dir, api_cert, api_key = self.api_server()
        rt = ChartRuntime(image, api_server=("127.0.0.1", API_PORT, sa_dir),
                          values={"node.labelsFrom": "config"})
        with cluster.Cluster(runtime=rt, log=lambda m: sys.stdout.write("  %s\n" % m)) as c:
            # The ConfigMap sockmesh-config (key config.yaml) is the cluster's control plane: the
            # kubelet's ConfigMap directory is the cluster's work dir, kept up to date.
            c.config_path = os.path.join(c.work, "config.yaml")
            c.up()
            a, b = c.nodes
            owner = {n.name: self.start_owner_api(n, api_dir, api_cert, api_key)
                     for n in c.nodes}
            for n in c.nodes:
                plugins = [p["type"] for p in n.conflist()["plugins"]]
                self.assertEqual(plugins, ["bridge", "sockmesh-cni"], "install-cni's conflist")
            pods = cluster.demo_topology(c)
            client, echo_b = pods["client"], pods["echo-b"]

            # The agent container enrolled the labelled pods only (asked from inside it).
            status = a.agent.exec("sockmesh-loader", "--pin-root", a.pin_root, "status")
            self.assertIn(client.ip, status)
            self.assertIn(pods["echo-a"].ip, status)
            self.assertNotIn(pods["legacy-a"].ip, status)
            dump = json.loads(a.agent.exec("bpftool", "-j", "map", "dump", "pinned",
                                           os.path.join(a.pin_root, "sm_workloads")))
            self.assertEqual(len(dump), 2, dump)

            # Traffic: client on node-a -> service VIP -> echo-b on node-b, over HBONE.
            r = client.client("%s:80" % ECHO_VIP, "--bytes", 1 << 20, "--timeout", 20)
            self.assertEqual(r.get("servers"), ["shop/echo-b"], "%s\nnode-a's proxy:\n%s" % (
                r, a.proxy.log()[-4000:]))
            self.assertTrue(r.get("ok") and r.get("failed") == 0 and r.get("bytes") == 1 << 20, r)
            wait_until("node-a's proxy to log the outbound HBONE connection",
                       lambda: "dst.hbone_addr=%s:15008" % echo_b.ip in a.proxy.log(), 10)
            wait_until("node-b's proxy to log the inbound connection with the client's identity",
                       lambda: "src.identity=%s" % client.identity in b.proxy.log(), 10)
            r = client.client("%s:%d" % (pods["echo-a"].ip, APP_PORT), "--bytes", 4096)
            self.assertEqual(r.get("servers"), ["shop/echo-a"], r)

            # The kubelet's probes: the agent container wrote the SNAT rule (its image's
            # iptables, in the host's cgroup namespace), so a probe from the kubelet's cgroup
            # reaches the app as 169.254.7.127, uncaptured.
            probe = json.loads(a.kubelet_sh([cluster.PYTHON, cluster.PODAPP, "client", "--target",
                                             "%s:%d" % (pods["echo-a"].ip, APP_PORT), "--bytes",
                                             "1024", "--timeout", "5"],
                                            check=False).strip().splitlines()[-1])
            self.assertTrue(probe.get("ok"), "probe: %s\nagent:\n%s" % (probe, a.agent.log()[-3000:]))
            self.assertEqual(probe.get("seen_as"), ["169.254.7.127"],
                             "probe: %s\nagent:\n%s" % (probe, a.agent.log()[-3000:]))

            # Uninstall, as helm uninstall does it: the DaemonSet is deleted, then its pods get
            # SIGTERM. The installer removes what it added; the agent asks the API server for
            # its DaemonSet, finds it gone, and removes the datapath.
            for n in c.nodes:
                state, requests = owner[n.name]
                with open(state, "w") as f:
                    f.write("gone")
                for proc in (rt.installers[n.name], n.proxy, n.agent):
                    proc.stop(signal.SIGTERM, timeout=15)
                agent_log = n.agent.log()
                n.proxy = n.agent = None
                self.assertIn("DaemonSet istio-system/sockmesh-node is gone", agent_log,
                              agent_log[-3000:])
                with open(requests) as f:
                    asked = f.read()
                self.assertIn("/apis/apps/v1/namespaces/istio-system/daemonsets/sockmesh-node "
                              "Bearer " + API_TOKEN, asked,
                              "the agent asked with the mounted service account token")
                with open(os.path.join(n.conf_dir, "10-bridge.conflist")) as f:
                    self.assertEqual(json.loads(f.read()), json.loads(n.original_conflist))
                self.assertEqual(sorted(os.listdir(n.bin_dir)), n.original_bin)
                self.assertEqual(sorted(os.listdir(n.conf_dir)), ["10-bridge.conflist"])
                self.assertFalse(os.path.exists(n.pin_root), "pins left under %s" % n.pin_root)
                cg = run(["bpftool", "cgroup", "show", n.cgroup], check=False)
                self.assertNotIn("sock_ops", cg)


def main():
    run_manifest_tests("manifest-runs")


if __name__ == "__main__":
    main()
