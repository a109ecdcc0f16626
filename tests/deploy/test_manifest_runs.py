#!/usr/bin/python3
"""The manifest runs: the chart is rendered for each node of the simulated cluster
(scripts/lib/cluster.py), its DaemonSets' pod templates are turned into podman invocations
(scripts/lib/podspec.py) and the image scripts/image built runs in place of the binaries the demo
starts. The CNI installer container writes the conflist, the agent container enrolls the labelled
pods, traffic crosses the nodes over HBONE, and the uninstall (the installer's SIGTERM with the
manifest's --uninstall-on-exit, then sockmesh-loader uninstall from the image) leaves each node's
CNI configuration, plugin directory and pin root as they were. Commands, args, env, mounts and
privileges all come from the rendered manifest; the test supplies only what a kubelet would (the
node's paths as values, the downward-API fields, the ConfigMap's directory). Needs root, podman
and helm (scripts/setup); exits 77 without them."""
import json
import os
import shutil
import signal
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "scripts", "lib"))

import cluster  # noqa: E402
from chart_runtime import HELM, ChartRuntime, build_image  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, run, wait_until  # noqa: E402


class ManifestRuns(unittest.TestCase):
    def test_the_charts_containers_run_the_demo_and_uninstall_cleanly(self):
        image, summary = build_image()
        sys.stdout.write(summary + "\n")
        rt = ChartRuntime(image)
        with cluster.Cluster(runtime=rt, log=lambda m: sys.stdout.write("  %s\n" % m)) as c:
            # The ConfigMap sockmesh-config (key config.yaml) is the cluster's control plane: the
            # kubelet's ConfigMap directory is the cluster's work dir, kept up to date.
            c.config_path = os.path.join(c.work, "config.yaml")
            c.up()
            a, b = c.nodes
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

            # Uninstall, as helm uninstall does it: the pods go (SIGTERM; the installer removes
            # what it added, as the manifest's --uninstall-on-exit says), then the datapath is
            # unloaded with the image's own loader.
            for n in c.nodes:
                for proc in (rt.installers[n.name], n.proxy, n.agent):
                    proc.stop(signal.SIGTERM, timeout=15)
                n.proxy = n.agent = None
                with open(os.path.join(n.conf_dir, "10-bridge.conflist")) as f:
                    self.assertEqual(json.loads(f.read()), json.loads(n.original_conflist))
                self.assertEqual(sorted(os.listdir(n.bin_dir)), n.original_bin)
                self.assertEqual(sorted(os.listdir(n.conf_dir)), ["10-bridge.conflist"])
                run(["podman", "run", "--rm", "--runtime", "runc", "--ulimit",
                     "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--privileged",
                     "--network", "ns:" + n.netns_path, "-v", "/sys/fs/bpf:/sys/fs/bpf:rshared",
                     "-v", "/run/netns:/run/netns:rslave", "--entrypoint", "sockmesh-loader",
                     image, "--pin-root", n.pin_root, "uninstall", "--force"], timeout=60)
                self.assertFalse(os.path.exists(n.pin_root), "pins left under %s" % n.pin_root)
                cg = run(["bpftool", "cgroup", "show", n.cgroup], check=False)
                self.assertNotIn("sock_ops", cg)


def main():
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    for tool in ("podman", "bpftool", "curl"):
        if not shutil.which(tool):
            problems.append("%s missing (scripts/setup)" % tool)
    if not os.access(HELM, os.X_OK):
        problems.append("%s missing (scripts/setup)" % HELM)
    if problems:
        sys.stderr.write("\n!!! SKIPPING the manifest-runs test: %s\n\n" % "; ".join(problems))
        sys.exit(77)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
