"""Runs the Helm chart's containers on the simulated cluster (scripts/lib/cluster.py) in place of
the binaries: for each node the chart is rendered with the node's paths as values, and each
DaemonSet container becomes a podman container of the image (scripts/lib/podspec.py), with the
command, args, env, mounts and privileges the manifest gives. Used by
tests/deploy/test_manifest_runs.py and scripts/demo --containers. Needs root, podman and helm."""
import json
import os
import shutil
import signal
import subprocess
import time

import yaml

import podspec
from cluster import ClusterError, cgroup2_mount, run, wait_until

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.environ.get("SOCKMESH_TOOLS", "/opt/sockmesh-tools")
HELM = os.path.join(TOOLS, "bin", "helm")
CHART = os.path.join(SOURCE, "manifests", "charts", "sockmesh")


def run_manifest_tests(what, tools=("podman", "bpftool", "curl")):
    """The main() of a privileged test that runs the image from the chart: says loudly what is
    missing and exits 77 (a skip, which CI counts as a failure), else runs the test module's
    unittest cases."""
    import sys
    import unittest
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    for tool in tools:
        if not shutil.which(tool):
            problems.append("%s missing (scripts/setup)" % tool)
    if not os.access(HELM, os.X_OK):
        problems.append("%s missing (scripts/setup)" % HELM)
    if problems:
        sys.stderr.write("\n!!! SKIPPING the %s test: %s\n\n" % (what, "; ".join(problems)))
        sys.exit(77)
    unittest.main(module="__main__", verbosity=2)


def build_image(prebuilt=True):
    """Runs scripts/image; returns (image reference, its last line: id and size). prebuilt (the
    deploy tests): the image takes the binaries as built, since the other tests of the run use
    them and must not have them relinked under them; else (the demo) scripts/image builds them
    first if they are stale."""
    image = os.path.join(SOURCE, "scripts", "image")
    out = run((["env", "SOCKMESH_IMAGE_PREBUILT=1"] if prebuilt else []) + [image], timeout=900)
    tag = run([image, "--print-tag"]).strip()
    return tag, out.strip().splitlines()[-1]


class Container:
    """A podman container, with the cluster's Process interface."""

    def __init__(self, name, argv):
        self.name = name
        self.final_log = None  # what it logged, kept when stop() removes it
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
        self.final_log = self.log()
        subprocess.run(["podman", "rm", "-f", "-t", "0", self.name], capture_output=True,
                       timeout=60)
        return int(r.stdout.strip() or -1)

    def log(self):
        if self.final_log is not None:
            return self.final_log
        r = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True,
                           timeout=30)
        return r.stdout + r.stderr

    def exec(self, *argv):
        return run(["podman", "exec", self.name] + list(argv), timeout=30)


class ChartRuntime:
    """Runs each node's containers as the rendered chart describes them."""

    def __init__(self, image, api_server=None, values=None):
        self.image = image
        # (host, port, service account dir) of the API server the pods are told about, as
        # podspec.PodContext takes it; None: none (the cluster has no API server).
        self.api_server = api_server
        self.values = values or {}  # further --set values, e.g. node.labelsFrom
        self.installers = {}
        self.netns = []
        self.rendered = {}

    def render(self, n, extra=None):
        """The chart's DaemonSets for node n, by name; extra: more --set values on top (e.g. a
        new tag for an upgrade's surge pod)."""
        c = n.cluster
        key = (n.name, tuple(sorted((extra or {}).items())))
        if key not in self.rendered:
            sets = {"tag": self.image.split(":")[1], "runDir": n.run_dir, "zdsSocketDir": n.run_dir,
                    "cniBinDir": n.bin_dir, "cniConfDir": n.conf_dir, "cniNetnsDir": "/run/netns",
                    "bpfPinRoot": n.pin_root, "cgroupRoot": n.cgroup,
                    "builtinCA.stateDir": c.ca_dir, "terminationGracePeriodSeconds": "8",
                    # The simulated kubelet (cluster.Node.kubelet_sh), on the host's hierarchy.
                    "node.probeCgroup": os.path.relpath(n.kubelet_cgroup, cgroup2_mount())}
            sets.update(self.values)
            sets.update(extra or {})
            argv = [HELM, "template", "sockmesh", CHART, "-n", "istio-system"]
            for k, v in sets.items():
                argv += ["--set", "%s=%s" % (k, v)]
            docs = [d for d in yaml.safe_load_all(run(argv)) if d]
            self.rendered[key] = {d["metadata"]["name"]: d for d in docs
                                  if d["kind"] == "DaemonSet"}
        return self.rendered[key]

    def _run(self, n, ds_name, container, netns, pod_name, cgroup=None, pod_ip=None, extra=None,
             suffix=""):
        ds = self.render(n, extra)[ds_name]
        c = n.cluster
        config_maps = {"sockmesh-config": c.work}
        token_file = None
        if c.xds and ds_name == "sockmesh":
            # What a cluster with istiod gives every pod: istiod publishes its root as the
            # ConfigMap istio-ca-root-cert (key root-cert.pem) in each namespace, and the API
            # server issues the projected istio-ca token that istiod accepts.
            roots = os.path.join(c.work, "kubelet-configmaps", "istio-ca-root-cert")
            os.makedirs(roots, exist_ok=True)
            if not os.path.exists(os.path.join(roots, "root-cert.pem")):
                shutil.copy(os.path.join(c.istiod_dir, "root-cert.pem"),
                            os.path.join(roots, "root-cert.pem"))
            config_maps["istio-ca-root-cert"] = roots
            token_file = os.path.join(c.istiod_dir, "istio-token")
        ctx = podspec.PodContext(node_name=n.name, pod_name=pod_name, namespace="istio-system",
                                 pod_ip=pod_ip or n.link_ip, netns=netns,
                                 work_dir=os.path.join(n.dir, "kubelet", ds_name + suffix),
                                 config_maps=config_maps, token_file=token_file,
                                 cgroup_parent=self._relative_cgroup(cgroup),
                                 api_server=self.api_server)
        prefix = "%s-%s-%s%s" % (c.id, n.short, ds_name, suffix)
        runs = dict(podspec.podman_runs(ds, ctx, name_prefix=prefix))
        return Container("%s-%s" % (prefix, container), runs[container])

    @staticmethod
    def _relative_cgroup(path):
        if not path:
            return None
        os.makedirs(path, exist_ok=True)
        return "/" + os.path.relpath(path, cgroup2_mount())

    def start_proxy(self, n, revision=1, extra=None):
        """The proxy DaemonSet's pod on node n, in a pod netns of its own. revision > 1: an
        upgrade's surge pod beside the running one (its own netns, name and address), rendered
        with `extra` values on top (a new tag, say). The container gets .netns_path and .pod_ip.
        The first revision's netns is where n.http() reaches the proxy's own ports."""
        ds = self.render(n, extra)["sockmesh"]
        spec = ds["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork")
        # The cluster probes readiness as the manifest's readinessProbe says.
        assert spec["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/healthz/ready",
                                                                     "port": 15021}
        suffix = "" if revision == 1 else "-r%d" % revision
        ns = "%s-%s-proxy%s" % (n.cluster.id, n.name, suffix)
        pod_ip = None
        if ns not in self.netns:
            run(["ip", "netns", "add", ns])
            self.netns.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if n.cluster.xds:
                # On the pod network, as a real proxy pod is: it must reach istiod.
                pod_ip = self._pod_network(n, ns, 200 + revision)
        if revision == 1:
            n.proxy_netns_path = "/run/netns/" + ns
        # Below the node's cgroup, where the demo's proxy runs: on a node sockops sits on the
        # cgroup root, so the proxy's sockets meet it (the bypass) as every pod's do.
        pod = "sockmesh-" + n.short + ("-r%d" % revision if revision > 1 else "")
        c = self._run(n, "sockmesh", "proxy", "/run/netns/" + ns, pod, cgroup=n.proxy_cgroup,
                      pod_ip=pod_ip, extra=extra, suffix=suffix)
        c.netns_path, c.pod_ip = "/run/netns/" + ns, pod_ip
        return c

    @staticmethod
    def _pod_network(n, ns, host_index):
        """The node's own pod network (the first plugin of its original conflist: bridge +
        host-local, as before sockmesh-cni was added) for a proxy pod's netns. Returns its IP."""
        base = json.loads(n.original_conflist)
        net = dict(base["plugins"][0])
        net["cniVersion"], net["name"] = base["cniVersion"], base["name"]
        ip = "%s.%d" % (n.pod_subnet, host_index)
        ips = [ip] + (["%s%d" % (n.pod_subnet6, host_index)] if n.cluster.dual_stack else [])
        net["args"] = {"cni": {"ips": ips}}
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr-" + ns, "CNI_NETNS": "/run/netns/" + ns,
               "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=istio-system",
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        r = subprocess.run(["nsenter", "--net=" + n.netns_path, "/usr/lib/cni/" + net["type"]],
                           input=json.dumps(net), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env, timeout=30)
        if r.returncode != 0:
            raise ClusterError("the proxy pod's network (%s ADD): %s %s" % (
                net["type"], r.stdout.strip(), r.stderr.strip()))
        return ip

    def start_agent(self, n):
        ds = self.render(n)["sockmesh-node"]
        assert ds["spec"]["template"]["spec"]["hostNetwork"]
        # Beside the node's cgroup, as the demo's agent (the node's sockops is not for it).
        return self._run(n, "sockmesh-node", "agent", n.netns_path, "sockmesh-node-" + n.short,
                         cgroup=os.path.join(n.cluster.cgroup, "agent-" + n.name))

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
        # With cgroup v1 controllers beside cgroup2 (a hybrid host), runc also made the parents
        # in each v1 hierarchy; the cluster removes only its cgroup2 tree.
        v2 = cgroup2_mount()
        top = os.path.dirname(v2) if os.path.basename(v2) == "unified" else None
        for controller in (os.listdir(top) if top else []):
            tree = os.path.join(top, controller, c.id)
            if os.path.join(top, controller) == v2 or not os.path.isdir(tree):
                continue
            for d, _, _ in sorted(os.walk(tree), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
