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
import subprocess
import sys
import time
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "scripts", "lib"))

import cluster  # noqa: E402
import podspec  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, ClusterError, run, wait_until  # noqa: E402

TOOLS = os.environ.get("SOCKMESH_TOOLS", "/opt/sockmesh-tools")
HELM = os.path.join(TOOLS, "bin", "helm")
CHART = os.path.join(SOURCE, "manifests", "charts", "sockmesh")


class Container:
    """A podman container, with the cluster's Process interface."""

    def __init__(self, name, argv):
        self.name = name
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=30)
        run(argv, timeout=60)

    def alive(self):
        r = subprocess.run(["podman", "inspect", "-f", "{{.State.Running}}", self.name],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() == "true"

    def send(self, sig):
        subprocess.run(["podman", "kill", "-s", str(int(sig)), self.name], capture_output=True,
                       timeout=30)

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        if self.alive():
            self.send(sig)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        r = subprocess.run(["podman", "inspect", "-f", "{{.State.ExitCode}}", self.name],
                           capture_output=True, text=True, timeout=30)
        subprocess.run(["podman", "rm", "-f", "-t", "0", self.name], capture_output=True,
                       timeout=60)
        return int(r.stdout.strip() or -1)

    def log(self):
        r = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True,
                           timeout=30)
        return r.stdout + r.stderr

    def exec(self, *argv):
        return run(["podman", "exec", self.name] + list(argv), timeout=30)


class ChartRuntime:
    """Runs each node's containers as the rendered chart describes them."""

    def __init__(self, image):
        self.image = image
        self.installers = {}
        self.netns = []
        self.rendered = {}

    def render(self, n):
        c = n.cluster
        if n.name not in self.rendered:
            sets = {"tag": self.image.split(":")[1], "runDir": n.run_dir, "zdsSocketDir": n.run_dir,
                    "cniBinDir": n.bin_dir, "cniConfDir": n.conf_dir, "cniNetnsDir": "/run/netns",
                    "bpfPinRoot": n.pin_root, "cgroupRoot": n.cgroup,
                    "builtinCA.stateDir": c.ca_dir, "terminationGracePeriodSeconds": "8"}
            argv = [HELM, "template", "sockmesh", CHART, "-n", "istio-system"]
            for k, v in sets.items():
                argv += ["--set", "%s=%s" % (k, v)]
            docs = [d for d in yaml.safe_load_all(run(argv)) if d]
            self.rendered[n.name] = {d["metadata"]["name"]: d for d in docs
                                     if d["kind"] == "DaemonSet"}
        return self.rendered[n.name]

    def _run(self, n, ds_name, container, netns, pod_name):
        ds = self.render(n)[ds_name]
        ctx = podspec.PodContext(node_name=n.name, pod_name=pod_name, namespace="istio-system",
                                 pod_ip=n.link_ip, netns=netns,
                                 work_dir=os.path.join(n.dir, "kubelet", ds_name),
                                 config_maps={"sockmesh-config": n.cluster.work})
        prefix = "%s-%s-%s" % (n.cluster.id, n.short, ds_name)
        runs = dict(podspec.podman_runs(ds, ctx, name_prefix=prefix))
        return Container("%s-%s" % (prefix, container), runs[container])

    def start_proxy(self, n):
        ds = self.render(n)["sockmesh"]
        spec = ds["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork")
        # The cluster probes readiness as the manifest's readinessProbe says.
        assert spec["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/healthz/ready",
                                                                     "port": 15021}
        ns = "%s-%s-proxy" % (n.cluster.id, n.name)
        if ns not in self.netns:
            run(["ip", "netns", "add", ns])
            self.netns.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        n.proxy_netns_path = "/run/netns/" + ns
        return self._run(n, "sockmesh", "proxy", "/run/netns/" + ns, "sockmesh-" + n.short)

    def start_agent(self, n):
        ds = self.render(n)["sockmesh-node"]
        assert ds["spec"]["template"]["spec"]["hostNetwork"]
        return self._run(n, "sockmesh-node", "agent", n.netns_path, "sockmesh-node-" + n.short)

    def wait_agent(self, n):
        sock = os.path.join(n.run_dir, "cni.sock")

        def up():
            if not n.agent.alive():
                raise ClusterError("%s's agent container exited:\n%s" % (n.name, n.agent.log()))
            return "running: labels from" in n.agent.log() and os.path.exists(sock)
        wait_until("%s's agent container" % n.name, up, 30)

    def install_cni(self, n):
        with open(os.path.join(n.conf_dir, "10-bridge.conflist")) as f:
            n.original_conflist = f.read()
        n.original_bin = sorted(os.listdir(n.bin_dir))
        c = self._run(n, "sockmesh-node", "install-cni", n.netns_path, "sockmesh-node-" + n.short)
        self.installers[n.name] = c

        def installed():
            if not c.alive():
                raise ClusterError("install-cni exited:\n" + c.log())
            plugins = [p["type"] for p in n.conflist()["plugins"]]
            return plugins[-1:] == ["sockmesh-cni"] and \
                os.path.exists(os.path.join(n.bin_dir, "sockmesh-cni"))
        wait_until("%s's install-cni container to write the conflist" % n.name, installed, 30)

    def close(self, c):
        for inst in self.installers.values():
            inst.stop(signal.SIGKILL, timeout=5)
        for ns in self.netns:
            run(["ip", "netns", "delete", ns], check=False)


class ManifestRuns(unittest.TestCase):
    def test_the_charts_containers_run_the_demo_and_uninstall_cleanly(self):
        out = run([os.path.join(SOURCE, "scripts", "image")], timeout=600)
        sys.stdout.write(out.splitlines()[-1] + "\n")
        image = run([os.path.join(SOURCE, "scripts", "image"), "--print-tag"]).strip()
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
            self.assertEqual(r.get("servers"), ["shop/echo-b"], r)
            self.assertTrue(r.get("ok") and r.get("failed") == 0 and r.get("bytes") == 1 << 20, r)
            wait_until("node-a's proxy to log the outbound HBONE connection",
                       lambda: "dst.hbone_addr=%s:15008" % echo_b.ip in a.proxy.log(), 10)
            wait_until("node-b's proxy to log the inbound connection with the client's identity",
                       lambda: "src.identity=%s" % client.identity in b.proxy.log(), 10)
            r = client.client("%s:%d" % (pods["echo-a"].ip, APP_PORT), "--bytes", 4096)
            self.assertEqual(r.get("servers"), ["shop/echo-a"], r)

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
