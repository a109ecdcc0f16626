"""A simulated sockmesh cluster made of network namespaces, for the demo, the end-to-end tests and
the benchmark. Needs root.

    node netns  (one per node: its own sockmesh-loader agent, sockmesh-proxy, cgroup, bpffs root)
      eth0 ----------------------- the node link (172.30.0.0/24) ------------------ eth0
      cni0 bridge 10.244.<n>.1/24  (made by the reference bridge plugin on the first pod)
        veth -- pod netns eth0 10.244.<n>.<k>   (CNI chain: bridge + host-local, then sockmesh-cni)

With Cluster(dual_stack=True) every address has an IPv6 twin: the node link fd00:172:30::<n>/64,
pods fd00:10:244:<n>::<k>/64 (host-local with a second range; cni0 gets fd00:10:244:<n>::1),
routes between the nodes for both families, both addresses in each workload's workloadIps and
a second VIP per service (add_service(vip6=...)).

A node's CNI configuration starts as a plain bridge conflist in its own conf dir; the real
`sockmesh-install-cni --once` appends sockmesh-cni to it, as the DaemonSet would. The cluster acts
as the container runtime: it runs the chain inside the node's netns with the CNI_* environment.
Which pods are enrolled is the node agent's decision, made from the namespace labels in the
cluster's one config file (`mesh.yaml`), which both nodes' agents and proxies read; the cluster
rewrites it when pods, services or policies change, as a control plane would.

Every name starts with smc-<pid>-<n>-, so leftovers of a dead run are recognised and swept (netns,
cgroups, pin roots, processes, podman containers). close() removes everything, also after a
failure, and SIGTERM to the process that made the cluster closes it too.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "smc"
NODE_LINK = "172.30.0"
POD_CIDR = "10.244.%d"
NODE_LINK6 = "fd00:172:30::"      # dual_stack: the node link's IPv6 /64
POD_CIDR6 = "fd00:10:244:%d::"    # dual_stack: node n's pod /64
TRUST_DOMAIN = "cluster.local"
MESH_LABEL = "istio.io/dataplane-mode"
HERE = os.path.dirname(os.path.abspath(__file__))
PODAPP = os.path.join(HERE, "podapp.py")
ISTIOD = os.path.join(ROOT, "tests", "fixtures", "fake_istiod", "standalone.py")
PYTHON = "/usr/bin/python3"

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_counter = [0]


class ClusterError(Exception):
    pass


def run(argv, timeout=30, check=True, input=None):
    """Runs argv; returns its stdout (stderr folded in). Raises ClusterError when it fails."""
    try:
        r = subprocess.run(argv, input=input, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        raise ClusterError("timed out after %ss: %s" % (timeout, " ".join(argv)))
    if check and r.returncode != 0:
        raise ClusterError("%s failed (exit %d): %s" % (" ".join(argv), r.returncode,
                                                         r.stdout.strip()))
    return r.stdout


def wait_until(what, condition, timeout=15.0, interval=0.05):
    """Polls condition() until it returns a true value (returned) or raises after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = condition()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise ClusterError("timed out after %.0fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def cgroup2_mount():
    """Where cgroup v2 is mounted (not necessarily /sys/fs/cgroup), from /proc/mounts."""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return parts[1]
    raise ClusterError("cgroup v2 is not mounted (no cgroup2 line in /proc/mounts)")


def bpffs_root():
    """Where the cluster's pin roots go: /sys/fs/bpf (the loader mounts bpffs there if needed)."""
    return "/sys/fs/bpf"


def build_dir():
    return os.environ.get("SOCKMESH_BUILD_DIR") or os.path.join(ROOT, "build")


def binary(name, build=None):
    """A sockmesh binary of `build` (a build directory; default build_dir())."""
    sub = {"sockmesh-proxy": "userspace", "sockmesh-loader": "loader", "sockmesh-cni": "cni",
           "sockmesh-install-cni": "cni", "sockmesh-loadgen": "bench"}[name]
    path = os.path.join(build or build_dir(), sub, name)
    if not os.access(path, os.X_OK):
        raise ClusterError("%s is not built (%s); run cmake --build build" % (name, path))
    return path


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _owner_pid(name):
    m = re.match(r"^%s-(\d+)-" % PREFIX, name)
    return int(m.group(1)) if m else 0


def sweep_leftovers(log=None):
    """Removes what runs of this library left behind when their process died without cleaning
    up: processes in their cgroups, their netns, pin roots, cgroups."""
    cg = cgroup2_mount()
    cluster_ids = {}

    def stale(name):
        """Its owner is dead and nothing runs in its cluster's cgroup (a cluster kept up by
        `scripts/demo --keep` has live proxies there, and stays until `scripts/demo --down`)."""
        pid = _owner_pid(name)
        if not pid or pid == os.getpid() or _pid_alive(pid):
            return False
        cid = re.match(r"^(%s-\d+-\d+)" % PREFIX, name)
        if not cid:
            return True
        cid = cid.group(1)
        if cid not in cluster_ids:
            cluster_ids[cid] = not _populated(os.path.join(cg, cid))
        return cluster_ids[cid]
    # Containers first (scripts/demo --containers, the chart tests): their processes sit in the
    # cluster's cgroup, so while they run it looks like a cluster kept up on purpose. No cluster
    # with containers is ever kept (--containers and --keep do not go together), so a container
    # whose creating process is dead is a leftover.
    if shutil.which("podman"):
        out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"],
                             capture_output=True, text=True, timeout=60)
        for name in out.stdout.split() if out.returncode == 0 else []:
            pid = _owner_pid(name)
            if pid and pid != os.getpid() and not _pid_alive(pid):
                subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True,
                               timeout=60)
                if log:
                    log("swept container %s" % name)
    for name in sorted(os.listdir(cg)):
        if stale(name):
            _remove_cgroup(os.path.join(cg, name))
            if log:
                log("swept cgroup %s" % name)
    if os.path.isdir(bpffs_root()):
        for name in os.listdir(bpffs_root()):
            if stale(name):
                run([binary("sockmesh-loader"), "--pin-root", os.path.join(bpffs_root(), name),
                     "uninstall", "--force"], check=False)
                shutil.rmtree(os.path.join(bpffs_root(), name), ignore_errors=True)
                if log:
                    log("swept pin root %s" % name)
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if stale(name) and os.path.isdir(os.path.join(tmp, name)):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    for line in run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.strip() else ""
        if stale(name):
            run(["ip", "netns", "delete", name], check=False)
            if log:
                log("swept netns %s" % name)


_open_clusters = []  # clusters of this process not yet closed, for _close_on_sigterm


def _close_on_sigterm(signum, frame):
    """SIGTERM (timeout(1), a CI runner cancelling, kill): close this process's clusters, then
    die of the signal as before. Without it a terminated test or bench left its netns, pin roots,
    cgroups and containers for the next run's sweep."""
    for c in list(_open_clusters):
        try:
            c.close()
        except Exception as e:  # noqa: BLE001 - the others must still be closed
            print("closing %s on SIGTERM: %s" % (c.id, e), file=sys.stderr)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_sigterm():
    # Only where nobody else handles it, and only the main thread may set a handler.
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _close_on_sigterm)


def _populated(cgroup):
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            return "populated 1" in f.read()
    except OSError:
        return False


def tear_down_kept(log=None):
    """Removes every cluster of this library whose creating process has exited, also the ones
    with processes still running (scripts/demo --down)."""
    cg = cgroup2_mount()
    ids = set()
    for name in os.listdir(cg):
        m = re.match(r"^(%s-(\d+)-\d+)$" % PREFIX, name)
        if m and not _pid_alive(int(m.group(2))):
            ids.add(m.group(1))
    for cid in sorted(ids):
        _remove_cgroup(os.path.join(cg, cid))   # kills its processes first
        if log:
            log("stopped the processes of %s" % cid)
    sweep_leftovers(log)
    return sorted(ids)


def _remove_cgroup(path):
    """Kills everything in the cgroup tree at path and removes it, children first. A tree that
    vanishes meanwhile is fine: two tests of one ctest run may sweep the same leftover at once."""
    try:
        entries = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        child = os.path.join(path, entry)
        if os.path.isdir(child):
            _remove_cgroup(child)
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:  # a kernel before cgroup.kill (5.14), or the tree is gone
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = f.read().split()
        except FileNotFoundError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class Process:
    """A long-running process inside a netns (nsenter --net) and a cgroup, logging to a file."""

    def __init__(self, name, argv, netns=None, cgroup=None, log_path=None, tie_to_parent=True,
                 env=None):
        self.name, self.argv, self.log_path = name, argv, log_path
        cmd = (["nsenter", "--net=" + netns] if netns else []) + argv

        def pre():
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            if tie_to_parent:
                _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setpgid(0, 0)
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, preexec_fn=pre, env=env)
        if log_path:
            out.close()

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def send(self, sig):
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Sends sig, waits up to timeout, then SIGKILL. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(sig)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(10)

    def log(self):
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()


class Pod:
    def __init__(self, cluster, node, namespace, name, service_account, ip, labels=None,
                 ip6=None):
        self.cluster, self.node = cluster, node
        self.namespace, self.name, self.service_account = namespace, name, service_account
        self.ip = ip
        self.ip6 = ip6  # its IPv6 address in a dual-stack cluster, else None
        self.labels = dict(labels or {})
        self.netns = "%s-%s-%s" % (cluster.id, node.short, name)
        self.netns_path = "/run/netns/" + self.netns
        self.uid = "%s-%s" % (namespace, name)
        self.container_id = "ctr-" + self.netns
        self.cgroup = os.path.join(node.cgroup, "pod-" + name)
        self.processes = []

    @property
    def identity(self):
        return "spiffe://%s/ns/%s/sa/%s" % (TRUST_DOMAIN, self.namespace, self.service_account)

    @property
    def ips(self):
        return [self.ip] + ([self.ip6] if self.ip6 else [])

    @property
    def workload_uid(self):
        return "Kubernetes//v1/Pod/%s/%s" % (self.namespace, self.name)

    def __repr__(self):
        return "%s/%s (%s on %s)" % (self.namespace, self.name, ", ".join(self.ips),
                                     self.node.name)

    def sh(self, argv, timeout=30, check=True, input=None, in_cgroup=True):
        """Runs a command in the pod (its netns and cgroup) and returns its output. With
        in_cgroup=False, in its netns only (as `nsenter --net` alone would)."""
        cmd = ["nsenter", "--net=" + self.netns_path] + argv
        if not in_cgroup or not os.path.isdir(self.cgroup):
            return run(cmd, timeout=timeout, check=check, input=input)

        def pre():
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        try:
            r = subprocess.run(cmd, input=input, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout, text=True,
                               preexec_fn=pre)
        except subprocess.TimeoutExpired:
            raise ClusterError("timed out after %ss in %s: %s" % (timeout, self, " ".join(argv)))
        if check and r.returncode != 0:
            raise ClusterError("in %s: %s failed (exit %d): %s" % (
                self, " ".join(argv), r.returncode, r.stdout.strip()))
        return r.stdout

    def shell_command(self, command):
        """A shell command line that runs `command` as the pod's processes run: in its netns and
        in its cgroup (sockops, and so the bypass, applies to the cgroup)."""
        return "sh -c 'echo $$ > %s/cgroup.procs && exec nsenter --net=%s %s'" % (
            self.cgroup, self.netns_path, command)

    def spawn(self, name, argv):
        """Starts a long-running process in the pod; stopped when the pod or cluster goes."""
        p = Process(name, argv, netns=self.netns_path, cgroup=self.cgroup,
                    log_path=os.path.join(self.cluster.work, "%s-%s-%s.log" % (
                        self.node.short, self.name, name)),
                    tie_to_parent=not self.cluster.keep)
        self.processes.append(p)
        return p

    def serve(self, port=8080, name=None):
        """Starts podapp's echo server on 0.0.0.0:port (and [::]:port in a dual-stack cluster);
        returns once it listens."""
        tag = name or "serve-%d" % port
        host = ["--host", ""] if self.ip6 else []  # "": every address of both families
        p = self.spawn(tag, [PYTHON, PODAPP, "serve", "--port", str(port)] + host + [
                             "--name", "%s/%s" % (self.namespace, self.name)])
        # Both families' sockets in a dual-stack pod (ss shows "0.0.0.0:p" and "[::]:p").
        want = ["0.0.0.0:%d " % port] + (["[::]:%d " % port] if self.ip6 else [])

        def listening():
            out = self.sh(["ss", "-Hltn"])
            return all(w in out for w in want)
        wait_until("%s listening on %d" % (self, port), lambda: listening() or not p.alive(), 10)
        if not p.alive():
            raise ClusterError("server in %s exited: %s" % (self, p.log()))
        return p

    def client(self, target, *args, timeout=60):
        """Runs podapp's client to target ("ip:port") and returns its JSON report."""
        out = self.sh([PYTHON, PODAPP, "client", "--target", target] + [str(a) for a in args],
                      timeout=timeout, check=False)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ClusterError("podapp client in %s printed no report: %s" % (self, out))

    def client_process(self, name, target, *args):
        """podapp's client as a background process (its report: the last line of its log)."""
        return self.spawn(name, [PYTHON, PODAPP, "client", "--target", target] +
                          [str(a) for a in args])

    def stop_processes(self):
        for p in self.processes:
            p.stop(signal.SIGKILL, timeout=2)
        self.processes = []


class Node:
    def __init__(self, cluster, index, name):
        self.cluster, self.index, self.name = cluster, index, name
        self.short = name.replace("node-", "")
        self.netns = "%s-%s" % (cluster.id, name)
        self.netns_path = "/run/netns/" + self.netns
        self.cgroup = os.path.join(cluster.cgroup, name)
        self.proxy_cgroup = os.path.join(self.cgroup, "proxy")
        # The node's kubelet: the agent SNATs connections from this cgroup to enrolled pods to
        # the probe address, which capture exempts (beside the node's cgroup, as the agent's).
        self.kubelet_cgroup = os.path.join(cluster.cgroup, "kubelet-" + name)
        self.pin_root = os.path.join(bpffs_root(), "%s-%s" % (cluster.id, name))
        self.dir = os.path.join(cluster.work, name)
        self.run_dir = os.path.join(self.dir, "run")
        self.conf_dir = os.path.join(self.dir, "net.d")
        self.bin_dir = os.path.join(self.dir, "cni-bin")
        self.link_ip = "%s.%d" % (NODE_LINK, index + 1)
        self.pod_subnet = POD_CIDR % (index + 1)
        self.gateway = self.pod_subnet + ".1"
        # dual_stack: the IPv6 twins (the pod prefix is a /64; its hosts are ::<k>)
        self.link_ip6 = "%s%d" % (NODE_LINK6, index + 1)
        self.pod_subnet6 = POD_CIDR6 % (index + 1)
        self.zds_socket = os.path.join(self.run_dir, "zds.sock")
        # Where the proxy's own ports (15000, 15020, 15021) are: the node's netns, unless a
        # runtime gives the proxy a pod netns of its own (the chart's DaemonSet does).
        self.proxy_netns_path = self.netns_path
        self.cni_results = {}
        self.proxy = None
        self.agent = None
        self.proxy_runs = 0
        self.agent_runs = 0

    def sh(self, argv, timeout=30, check=True):
        return run(["nsenter", "--net=" + self.netns_path] + argv, timeout=timeout, check=check)

    def kubelet_sh(self, argv, timeout=30, check=True):
        """Runs a command as the node's kubelet would: in the node's netns and its cgroup."""
        command = 'echo $$ > %s/cgroup.procs && exec nsenter --net=%s "$@"' % (
            self.kubelet_cgroup, self.netns_path)
        return run(["sh", "-c", command, "kubelet"] + argv, timeout=timeout, check=check)

    # ---- the node's processes ----

    def proxy_log_path(self):
        return os.path.join(self.dir, "proxy-%d.log" % self.proxy_runs)

    def start_proxy(self, wait=True):
        if self.proxy:
            self.proxy.stop(signal.SIGKILL)  # reaps one that was stopped or killed before
        self.proxy_runs += 1
        c = self.cluster
        if c.runtime:
            self.proxy = c.runtime.start_proxy(self)
            if wait:
                self.wait_proxy_ready()
            return self.proxy
        source = c.xds_args(self) if c.xds else ["--config", c.config_path,
                                                 "--config-poll-ms", "200"]
        argv = [c.binary("sockmesh-proxy"), "--node", self.name] + source + [
                "--state-dir", c.ca_dir,
                "--zds-socket", self.zds_socket, "--bpf-pin-root", self.pin_root,
                "--admin", "127.0.0.1:15000", "--metrics", "0.0.0.0:15020",
                "--readiness", "0.0.0.0:15021", "--workers", "2",
                "--drain-timeout-ms", str(c.drain_timeout_ms),
                "--connect-timeout-ms", "3000", "--log-level", "info"] + c.proxy_extra
        self.proxy = Process("proxy", argv, netns=self.netns_path, cgroup=self.proxy_cgroup,
                             log_path=self.proxy_log_path(), tie_to_parent=not c.keep)
        if wait:
            self.wait_proxy_ready()
        return self.proxy

    def wait_proxy_ready(self, timeout=20):
        def ready():
            if not self.proxy.alive():
                raise ClusterError("%s's proxy exited:\n%s" % (self.name, self.proxy.log()[-3000:]))
            return self.http("127.0.0.1:15021", "/healthz/ready", check=False) == "ready\n"
        wait_until("%s's proxy to be ready (ZDS snapshot from its agent)" % self.name, ready,
                   timeout)

    def start_agent(self, wait=True, extra=(), env=None):
        if self.agent:
            self.agent.stop(signal.SIGKILL)
        self.agent_runs += 1
        c = self.cluster
        if c.runtime:
            self.agent = c.runtime.start_agent(self)
            if wait:
                c.runtime.wait_agent(self)
            return self.agent
        argv = [c.binary("sockmesh-loader"), "--pin-root", self.pin_root, "--log-level", "info",
                "run", "--run-dir", self.run_dir, "--labels-from", "config",
                "--config", c.config_path, "--node", self.name,
                "--zds-socket", self.zds_socket, "--cgroup", self.cgroup,
                "--probe-cgroup", os.path.relpath(self.kubelet_cgroup, cgroup2_mount())]
        if not c.bypass:
            argv.append("--no-bypass")
        argv += c.agent_extra + list(extra)
        # Its own cgroup beside the node's (not below it: the node's sockops is not for it), so
        # that removing the cluster's cgroup stops it too.
        agent_cgroup = os.path.join(c.cgroup, "agent-" + self.name)
        os.makedirs(agent_cgroup, exist_ok=True)
        self.agent = Process("agent", argv, netns=self.netns_path, cgroup=agent_cgroup,
                             log_path=os.path.join(self.dir, "agent-%d.log" % self.agent_runs),
                             tie_to_parent=not c.keep, env=env)
        if wait:
            sock = os.path.join(self.run_dir, "cni.sock")

            def up():
                if not self.agent.alive():
                    raise ClusterError("%s's agent exited:\n%s" % (self.name,
                                                                   self.agent.log()[-3000:]))
                return "running: labels from" in self.agent.log() and os.path.exists(sock)
            wait_until("%s's node agent" % self.name, up, 20)
        return self.agent

    def http(self, address, path, check=True, method="GET"):
        """GET (or POST) http://address/path from inside the node's netns; the body."""
        argv = ["curl", "-s", "--max-time", "5", "-X", method, "http://%s%s" % (address, path)]
        if check:
            argv.insert(1, "-f")
        netns = self.netns_path
        if address.rsplit(":", 1)[-1] in ("15000", "15020", "15021"):
            netns = self.proxy_netns_path
        return run(["nsenter", "--net=" + netns] + argv, check=check, timeout=10)

    def metrics(self):
        return self.http("127.0.0.1:15020", "/metrics")

    def datapath_counter(self, name):
        """A kernel datapath counter (sockmesh_datapath_<name>_total) as the proxy exports it."""
        return metric_value(self.metrics(), "sockmesh_datapath_%s_total" % name)

    def config_dump(self):
        return json.loads(self.http("127.0.0.1:15000", "/config_dump"))

    def loader(self, *args, check=True):
        return run([self.cluster.binary("sockmesh-loader"), "--pin-root", self.pin_root] + list(args),
                   check=check)

    def bpftool_dump(self, map_name):
        return json.loads(run(["bpftool", "-j", "map", "dump", "pinned",
                               os.path.join(self.pin_root, map_name)]))

    # ---- the container runtime's side of CNI ----

    def conflist(self):
        files = sorted(f for f in os.listdir(self.conf_dir) if f.endswith(".conflist"))
        with open(os.path.join(self.conf_dir, files[0])) as f:
            return json.load(f)

    def cni(self, command, pod, prev=None, extra_args="", after_plugin=None, ips=None):
        """Runs the node's CNI chain (ADD forwards, DEL backwards) for pod; the final result.
        after_plugin(type), if given, is called after each plugin succeeds. ips: the addresses
        to ask host-local for, one per range (the conventional "args": {"cni": {"ips": ...}} of
        the network config; CNI_ARGS' IP= takes one address only)."""
        conf = self.conflist()
        plugins = conf["plugins"] if command != "DEL" else list(reversed(conf["plugins"]))
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": pod.container_id,
               "CNI_NETNS": pod.netns_path, "CNI_IFNAME": "eth0",
               "CNI_PATH": self.bin_dir + ":/usr/lib/cni",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;"
                           "K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s%s" % (
                               pod.namespace, pod.name, pod.container_id, pod.uid, extra_args),
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        result = prev
        for plugin in plugins:
            net = dict(plugin)
            net["cniVersion"], net["name"] = conf["cniVersion"], conf["name"]
            if ips:
                net["args"] = {"cni": {"ips": list(ips)}}
            if result is not None:
                net["prevResult"] = result
            exe = None
            for d in (self.bin_dir, "/usr/lib/cni"):
                if os.access(os.path.join(d, plugin["type"]), os.X_OK):
                    exe = os.path.join(d, plugin["type"])
                    break
            if not exe:
                raise ClusterError("CNI plugin %s not found" % plugin["type"])
            r = subprocess.run(["nsenter", "--net=" + self.netns_path, exe], input=json.dumps(net),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, timeout=30)
            if r.returncode != 0:
                raise ClusterError("CNI %s of %s: %s failed (exit %d): %s %s" % (
                    command, pod, plugin["type"], r.returncode, r.stdout.strip(),
                    r.stderr.strip()))
            if command == "ADD":
                result = json.loads(r.stdout)
            if after_plugin:
                after_plugin(plugin["type"])
        return result


class Cluster:
    """Two (or more) simulated nodes; pods added with add_pod(); close() removes everything."""

    def binary(self, name):
        return binary(name, self.build)

    def __init__(self, nodes=("node-a", "node-b"), bypass=True, keep=False, drain_timeout_ms=3000,
                 log=None, work=None, build=None, runtime=None, xds=False, proxy_extra=(),
                 dual_stack=False, agent_extra=()):
        # dual_stack: pods, node link and services get an IPv6 address beside the IPv4 one.
        self.dual_stack = dual_stack
        # runtime: something that runs each node's agent, proxy and CNI installer in place of the
        # binaries (tests/deploy/test_manifest_runs.py: the chart's containers under podman).
        self.runtime = runtime
        # xds: the proxies take the mesh from a fake istiod (tests/fixtures/fake_istiod/
        # standalone.py) over Delta xDS, and their certificates from its CA, instead of reading
        # the config file and using the built-in CA. The fake follows the same file, so a test
        # changes the mesh the same way in both modes. It runs in the first node's netns.
        self.xds = xds
        self.istiod = None
        self.proxy_extra = list(proxy_extra)  # more sockmesh-proxy flags, on every node
        self.agent_extra = list(agent_extra)  # more `sockmesh-loader run` flags, on every node
        _counter[0] += 1
        self.build = build  # the build directory whose binaries it runs (None: build_dir())
        self.id = "%s-%d-%d" % (PREFIX, os.getpid(), _counter[0])
        self.bypass, self.keep, self.drain_timeout_ms = bypass, keep, drain_timeout_ms
        self.say = log or (lambda msg: None)
        self.work = work or tempfile.mkdtemp(prefix=self.id + "-")
        self.cgroup = os.path.join(cgroup2_mount(), self.id)
        self.ca_dir = os.path.join(self.work, "ca")
        self.config_path = os.path.join(self.work, "mesh.yaml")
        self.nodes = [Node(self, i, n) for i, n in enumerate(nodes)]
        self.pods = []
        self.namespaces = {}
        self.services = []
        self.policies = []
        self.extra_workloads = []
        self._made = {"netns": [], "cgroups": [], "installs": []}
        self.closed = False

    def node(self, name):
        return next(n for n in self.nodes if n.name == name or n.short == name)

    @property
    def istiod_address(self):
        return "https://%s:15012" % self.nodes[0].link_ip

    def _start_istiod(self):
        n = self.nodes[0]
        self.istiod_dir = os.path.join(self.work, "istiod")
        self.istiod = Process("fake-istiod", [PYTHON, ISTIOD, "--listen", "%s:15012" % n.link_ip,
                                              "--config", self.config_path,
                                              "--dir", self.istiod_dir],
                              netns=n.netns_path, log_path=os.path.join(self.work, "istiod.log"),
                              tie_to_parent=not self.keep)

        def serving():
            if not self.istiod.alive():
                raise ClusterError("the fake istiod exited:\n%s" % self.istiod.log()[-3000:])
            return "serving on" in self.istiod.log()
        wait_until("the fake istiod", serving, 30)
        self.say("fake istiod (Delta xDS and CA) at %s in %s's netns, following %s" % (
            self.istiod_address, n.name, os.path.basename(self.config_path)))

    def xds_args(self, node):
        """sockmesh-proxy's flags for the fake istiod: xDS, and the CA on the same address."""
        root = os.path.join(self.istiod_dir, "root-cert.pem")
        return ["--xds-address", self.istiod_address, "--xds-root-ca", root, "--ca-root-ca", root,
                "--xds-token-file", os.path.join(self.istiod_dir, "istio-token"),
                "--pod-name", "ztunnel-" + node.short, "--pod-namespace", "istio-system",
                "--instance-ip", node.link_ip, "--cluster-id", "sockmesh-sim"]

    def pod(self, name):
        return next(p for p in self.pods if p.name == name)

    # ---- building ----

    def up(self):
        """Nodes, the node link, routes, CNI config, node agents and proxies. Returns self."""
        if os.geteuid() != 0:
            raise ClusterError("the cluster needs root (network namespaces, BPF, cgroups)")
        for tool in ("ip", "nsenter", "curl", "bpftool"):
            if not shutil.which(tool):
                raise ClusterError("%s is missing: run scripts/setup" % tool)
        for plugin in ("bridge", "host-local"):
            if not os.access("/usr/lib/cni/" + plugin, os.X_OK):
                raise ClusterError("/usr/lib/cni/%s is missing: apt-get install "
                                   "containernetworking-plugins" % plugin)
        sweep_leftovers(self.say)
        if not self.keep:
            _open_clusters.append(self)
            _watch_sigterm()
        os.makedirs(self.cgroup)
        self._made["cgroups"].append(self.cgroup)
        self.write_config()
        for n in self.nodes:
            self._make_node(n)
        # The node link: one veth pair, eth0 in each of the two nodes (a star through a third
        # "switch" namespace would be needed for more than two).
        if len(self.nodes) == 2:
            a, b = self.nodes
            run(["ip", "link", "add", "eth0", "netns", a.netns, "type", "veth", "peer", "name",
                 "eth0", "netns", b.netns])
            for n, peer in ((a, b), (b, a)):
                n.sh(["ip", "addr", "add", n.link_ip + "/24", "dev", "eth0"])
                if self.dual_stack:  # nodad: usable at once, not tentative for a second
                    n.sh(["ip", "-6", "addr", "add", n.link_ip6 + "/64", "dev", "eth0", "nodad"])
                n.sh(["ip", "link", "set", "eth0", "up"])
                n.sh(["ip", "route", "add", peer.pod_subnet + ".0/24", "via", peer.link_ip])
                if self.dual_stack:
                    n.sh(["ip", "-6", "route", "add", peer.pod_subnet6 + "/64", "via",
                          peer.link_ip6])
        self.say("nodes %s joined by %s.0/24%s" % (
            ", ".join("%s (pods %s.0/24%s)" % (
                n.name, n.pod_subnet, ", %s/64" % n.pod_subnet6 if self.dual_stack else "")
                for n in self.nodes),
            NODE_LINK, " and %s/64" % NODE_LINK6 if self.dual_stack else ""))
        if self.xds:
            self._start_istiod()
        for n in self.nodes:
            n.start_proxy(wait=False)
            n.start_agent(wait=True)
        for n in self.nodes:
            n.wait_proxy_ready()
        self.say("each node runs sockmesh-loader run (agent) and sockmesh-proxy (in-pod mode)")
        return self

    def _make_node(self, n):
        run(["ip", "netns", "add", n.netns])
        self._made["netns"].append(n.netns)
        n.sh(["ip", "link", "set", "lo", "up"])
        n.sh(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        if self.dual_stack:
            # Forwarding between the node link and cni0, and no DAD wait on the node's links
            # (cni0's gateway address would be tentative, unroutable, for a second).
            for key in ("net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.all.accept_dad=0",
                        "net.ipv6.conf.default.accept_dad=0"):
                n.sh(["sysctl", "-qw", key])
        for d in (n.run_dir, n.conf_dir, n.bin_dir):
            os.makedirs(d, exist_ok=True)
        os.makedirs(n.proxy_cgroup)
        os.makedirs(n.kubelet_cgroup)
        self._made["installs"].append(n)
        # The node's own CNI network before sockmesh: bridge + host-local, as a cluster has it.
        ranges, routes = [[{"subnet": n.pod_subnet + ".0/24"}]], [{"dst": "0.0.0.0/0"}]
        if self.dual_stack:  # host-local's second range: one address of each family
            ranges.append([{"subnet": n.pod_subnet6 + "/64"}])
            routes.append({"dst": "::/0"})
        base = {"cniVersion": "1.0.0", "name": "pod-network", "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": os.path.join(n.dir, "ipam"),
                     "ranges": ranges, "routes": routes}}]}
        with open(os.path.join(n.conf_dir, "10-bridge.conflist"), "w") as f:
            json.dump(base, f, indent=2)
        # sockmesh-install-cni appends sockmesh-cni and copies the plugin, as its DaemonSet does.
        if self.runtime:
            self.runtime.install_cni(n)
            return
        run([self.binary("sockmesh-install-cni"), "--once", "--cni-bin-dir", n.bin_dir,
             "--cni-conf-dir", n.conf_dir, "--plugin", self.binary("sockmesh-cni"),
             "--service-account-dir", os.path.join(n.dir, "no-service-account"),
             "--agent-socket", os.path.join(n.run_dir, "cni.sock"),
             "--namespace-hints", os.path.join(n.run_dir, "cni-namespaces.json"),
             "--agent-timeout-ms", "5000"])

    # ---- the control plane's view: mesh.yaml ----

    def label_namespace(self, name, ambient=True):
        self.namespaces[name] = {MESH_LABEL: "ambient"} if ambient else {}

    def add_service(self, name, namespace, vip, ports, selector, vip6=None):
        """selector: pod names backing it. vip6: its IPv6 VIP too (a dual-stack service)."""
        self.services.append({"name": name, "namespace": namespace, "vip": vip, "ports": ports,
                              "pods": list(selector), "vip6": vip6})

    def set_policies(self, policies, wait=True):
        self.policies = list(policies)
        self.write_config(wait=wait)

    def config(self):
        doc = {"namespaces": [{"name": ns, **({"labels": labels} if labels else {})}
                              for ns, labels in sorted(self.namespaces.items())],
               "workloads": [], "services": [], "policies": self.policies}
        for p in self.pods:
            enrolled = self.is_ambient(p)
            w = {"uid": p.workload_uid, "name": p.name, "namespace": p.namespace,
                 "serviceAccount": p.service_account, "workloadName": p.name,
                 "canonicalName": p.labels.get("app", p.name), "node": p.node.name,
                 "protocol": "HBONE" if enrolled else "TCP", "workloadIps": p.ips}
            if p.labels:
                w["labels"] = dict(p.labels)
            svcs = {}
            for s in self.services:
                if p.name in s["pods"]:
                    svcs["%s/%s" % (s["namespace"], self.hostname(s))] = dict(s["ports"])
            if svcs:
                w["services"] = svcs
            doc["workloads"].append(w)
        for s in self.services:
            sans = sorted({self.pod(n).identity for n in s["pods"] if self.is_ambient(self.pod(n))})
            doc["services"].append({"name": s["name"], "namespace": s["namespace"],
                                    "hostname": self.hostname(s),
                                    "vips": ["/" + v for v in (s["vip"], s.get("vip6")) if v],
                                    "ports": dict(s["ports"]), "subjectAltNames": sans})
        return doc

    @staticmethod
    def hostname(s):
        return "%s.%s.svc.cluster.local" % (s["name"], s["namespace"])

    def is_ambient(self, pod):
        own = pod.labels.get(MESH_LABEL)
        if own is not None:
            return own == "ambient"
        return self.namespaces.get(pod.namespace, {}).get(MESH_LABEL) == "ambient"

    def write_config(self, wait=False):
        text = ("# sockmesh simulated cluster %s: written by scripts/lib/cluster.py, read by both\n"
                "# nodes' agents (namespace labels) and proxies (workloads, services, policies).\n"
                % self.id) + yaml.safe_dump(self.config(), sort_keys=False, width=100)
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.config_path)
        if wait:
            self.wait_config_applied()

    def wait_config_applied(self, timeout=10):
        """Until every running proxy serves the current config (workloads, services, policies)."""
        want = self.config()
        ips = sorted(ip for w in want["workloads"] for ip in w["workloadIps"])
        names = sorted(p["name"] for p in want["policies"])
        services = sorted("%s/%s" % (s["namespace"], s["name"]) for s in want["services"])

        def applied(n):
            try:
                d = n.config_dump()
            except (ClusterError, ValueError):
                return False
            have = sorted(ip for w in d.get("workloads", []) for ip in w.get("workloadIps", []))
            pols = sorted(p.get("name") for p in d.get("policies", []))
            svcs = sorted("%s/%s" % (s.get("namespace"), s.get("name"))
                          for s in d.get("services", []))
            return set(ips) <= set(have) and pols == names and set(services) <= set(svcs)
        for n in self.nodes:
            if n.proxy and n.proxy.alive():
                wait_until("%s's proxy to load the new config" % n.name, lambda: applied(n),
                           timeout)

    # ---- pods ----

    def add_pod(self, node, namespace, name, service_account="default", labels=None,
                host_index=None):
        """Creates the pod's netns and runs the node's CNI chain ADD for it (the pod's address:
        10.244.<node>.<host_index>, asked of host-local with CNI_ARGS IP=). The agent enrolls it
        or not; the cluster's config learns the pod."""
        n = self.node(node) if isinstance(node, str) else node
        if host_index is None:
            host_index = 10 + len([p for p in self.pods if p.node is n])
        ip = "%s.%d" % (n.pod_subnet, host_index)
        # dual_stack: fd00:10:244:<node>::<host_index>, the same digits as the IPv4 address's.
        ip6 = "%s%d" % (n.pod_subnet6, host_index) if self.dual_stack else None
        pod = Pod(self, n, namespace, name, service_account, ip, labels, ip6=ip6)
        self.pods.append(pod)
        self.write_config(wait=True)
        run(["ip", "netns", "add", pod.netns])
        self._made["netns"].append(pod.netns)
        run(["ip", "-n", pod.netns, "link", "set", "lo", "up"])
        if ip6:  # the pod's eth0 (made by the bridge plugin) starts without DAD
            run(["ip", "netns", "exec", pod.netns, "sysctl", "-qw",
                 "net.ipv6.conf.default.accept_dad=0"])
        os.makedirs(pod.cgroup)
        if ip6:
            result = n.cni("ADD", pod, ips=[ip, ip6])
        else:
            result = n.cni("ADD", pod, extra_args=";IP=" + ip)
        n.cni_results[pod.container_id] = result
        got = [a["address"].split("/")[0] for a in result["ips"]]
        if got != pod.ips:
            raise ClusterError("host-local gave %s to %s, not %s" % (got, pod, pod.ips))
        self.say("pod %-22s %-12s on %s%s" % ("%s/%s" % (namespace, name),
                                               ", ".join(pod.ips), n.name,
                                               "  (mesh: enrolled by the node agent)"
                                               if self.is_ambient(pod) else "  (not in the mesh)"))
        return pod

    def delete_pod(self, pod, after_plugin=None):
        """CNI DEL (sockmesh-cni first, then bridge), then the netns goes, as a runtime does.
        after_plugin(type) is called after each plugin's DEL (to look at the pod in between)."""
        pod.stop_processes()
        prev = pod.node.cni_results.pop(pod.container_id, None)
        pod.node.cni("DEL", pod, prev=prev, after_plugin=after_plugin)
        run(["ip", "netns", "delete", pod.netns], check=False)
        if pod.netns in self._made["netns"]:
            self._made["netns"].remove(pod.netns)
        if os.path.isdir(pod.cgroup):
            _remove_cgroup(pod.cgroup)
        self.pods.remove(pod)
        self.write_config()

    # ---- teardown ----

    def close(self):
        """Removes everything the cluster made. Safe to call twice and after partial set-up."""
        if self.closed:
            return
        self.closed = True
        if self in _open_clusters:
            _open_clusters.remove(self)
        errors = []
        for p in self.pods:
            p.stop_processes()
        for n in self.nodes:
            for proc in (n.agent, n.proxy):
                if proc:
                    proc.stop(signal.SIGKILL, timeout=5)
        if self.istiod:
            self.istiod.stop(signal.SIGKILL, timeout=5)
        if self.runtime:
            try:
                self.runtime.close(self)
            except Exception as e:  # noqa: BLE001 - the rest of the cleanup must still run
                errors.append("runtime: %s" % e)
        for n in self._made["installs"]:
            if os.path.isdir(n.pin_root):
                out = run([self.binary("sockmesh-loader"), "--pin-root", n.pin_root, "uninstall",
                           "--force"], check=False)
                if os.path.isdir(n.pin_root):
                    errors.append("uninstall %s: %s" % (n.pin_root, out.strip()))
        for ns in reversed(self._made["netns"]):
            run(["ip", "netns", "delete", ns], check=False)
        for cg in self._made["cgroups"]:
            try:
                _remove_cgroup(cg)
            except OSError as e:
                errors.append("cgroup %s: %s" % (cg, e))
        shutil.rmtree(self.work, ignore_errors=True)
        if errors:
            raise ClusterError("cleanup left things behind: " + "; ".join(errors))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def metric_value(text, name, **labels):
    """Sum of the samples of metric `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest[:1] not in ("{", " "):
            continue
        if rest.startswith("{"):
            body, _, value = rest[1:].rpartition("} ")
            got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body))
            if any(got.get(k) != v for k, v in labels.items()):
                continue
        else:
            if labels:
                continue
            value = rest.strip()
        total += float(value.split()[0])
    return total



# The topology of the demo and of the end-to-end tests:
#   namespace shop   (labelled istio.io/dataplane-mode=ambient)   namespace legacy (not labelled)
#   node-a: shop/client (sa client), shop/echo-a (sa echo), legacy/legacy-a
#   node-b: shop/echo-b (sa echo), legacy/legacy-b
#   service echo.shop.svc.cluster.local  VIP 10.96.0.20:80 -> 8080, backed by echo-b
ECHO_VIP = "10.96.0.20"
ECHO_VIP6 = "fd00:10:96::20"  # its IPv6 VIP in a dual-stack cluster
APP_PORT = 8080


def demo_topology(c, serve=True):
    """Namespaces, pods and the service above on an up() cluster; echo servers started in every
    pod but the client. Returns the pods by name."""
    c.label_namespace("shop", True)
    c.label_namespace("legacy", False)
    c.write_config(wait=True)
    pods = {
        "client": c.add_pod("node-a", "shop", "client", "client", labels={"app": "client"}),
        "echo-a": c.add_pod("node-a", "shop", "echo-a", "echo", labels={"app": "echo"}),
        "legacy-a": c.add_pod("node-a", "legacy", "legacy-a", "default",
                              labels={"app": "legacy"}),
        "echo-b": c.add_pod("node-b", "shop", "echo-b", "echo", labels={"app": "echo"}),
        "legacy-b": c.add_pod("node-b", "legacy", "legacy-b", "default",
                              labels={"app": "legacy"}),
    }
    c.add_service("echo", "shop", ECHO_VIP, {80: APP_PORT}, ["echo-b"],
                  vip6=ECHO_VIP6 if c.dual_stack else None)
    c.write_config(wait=True)
    if serve:
        for name, pod in pods.items():
            if name != "client":
                pod.serve(APP_PORT)
    return pods
