#!/usr/bin/python3
"""sockmesh pod -> pod benchmark on the simulated two-node cluster (issue 5; root; through
`scripts/bench --cluster` or on its own).

Pods are made by scripts/lib/cluster.py (network namespaces, the real CNI chain, a node agent and
an in-pod sockmesh-proxy per node). A client pod on node-a talks to a server pod on node-b
("across nodes": pod veth -> bridge -> node link -> bridge -> pod veth) and to a server pod on
node-a ("same node"), for four paths, measured interleaved in one run:

  (1) no mesh         pods in a namespace not labelled for the mesh: plain pod -> pod TCP
  (2) sockmesh        the namespace is labelled: tc capture in each pod's netns, the sockmap
                      bypass on the app <-> proxy hops, HBONE (mTLS HTTP/2 CONNECT) between the
                      proxies' in-pod sockets; on the same node the same-node fast path (the
                      proxy authorizes and dials the server pod itself: no HBONE to itself)
  (2f) fast path off  as (2), same node only, with --same-node-fast-path false: the HBONE hop
                      to the proxy's own 15008 that (2) skips
  (2n) no source IP   as (2), across nodes only, with --preserve-source-ip false: the server's
                      proxy dials the app from its own address, so the app's replies are not
                      steered back to a transparent socket (what preserving the client's IP costs)
  (2m) eth0 MTU       as (2), across nodes only, with the agents' --no-app-route: the apps'
                      sockets keep the pod's own routes, so the client app sends to its proxy in
                      eth0-sized segments (in (2) sockops marks them as they connect and the
                      pod's rule for the mark gives them a lo-sized MTU, then routes them over
                      lo once established): what those routes buy
  (3) no bypass       the same, on a cluster installed without the bypass (Cluster(bypass=False))
  (4) iptables        the same proxy and ZDS hand-over, but the pods' tc capture is detached after
                      enrollment and the pod netns gets Istio's iptables rules instead: nat OUTPUT
                      -> REDIRECT 15001, nat PREROUTING -> REDIRECT 15006 (except 15008 and the
                      proxy's mark 0x20000), plus the connmark + policy route that brings the
                      app's replies to the proxy's source-preserving (transparent) socket back
                      over lo. The proxy takes the original destination from SO_ORIGINAL_DST.

Each of (2), (2f), (2n), (2m), (3), (4) runs on a cluster of its own (so each has its own two node
proxies); (1) shares the cluster of (4), which has no BPF on its pods' datapath once tc is
detached.

Per path and topology: throughput with 1 stream and with 8 streams, 1 KiB request/response round
trips (p50, p99), CPU seconds per GB moved during the throughput runs (usage_usec of the
cluster's cgroup v2 tree: the client, the server and both node proxies; the system-wide
/proc/stat figure is kept in the JSON), CPU per round trip (that tree, and of it the node proxies'
own, or the floor rows' relays': what the proxies add, and what a change to them moves, with
less noise than the whole path's), and the VmRSS of the node proxies after the run. With a
baseline build, "(2b) → (2)" pairs the two builds' rows repetition by repetition.
Writes bench/results/cluster-<timestamp>.md (printed too), .json and .png (matplotlib).
Everything (namespaces, cgroups, pin roots, processes; iptables rules die with the pod netns) is
removed on exit and on Ctrl-C.
"""
import datetime
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from benchlib import (BenchError, bench_arguments, cpu_ticks, load_cluster_lib, log,  # noqa: E402
                      make_pki, on_cpu_ns, rss_kib, run_bench, set_log_prefix,
                      voluntary_switches)

set_log_prefix("cluster")

MiB = 1 << 20
GB = 1e9

SERVER_PORT = 9080
# From bpf/include/sockmesh/consts.h.
SM_MARK_PROXY = 0x00020000
SM_MARK_LOCAL_HOP = 0x00040000
SM_PORT_OUTBOUND = 15001
SM_PORT_INBOUND_PLAIN = 15006
SM_PORT_HBONE = 15008
# Policy routing for the iptables path's return traffic (Istio uses table 100 and mark 0x111; this
# is sockmesh's own mark bit, in a table apart from the loader's 0x534d).
IPT_ROUTE_TABLE = 0x5349
IPT_RULE_PRIORITY = 31990
# Every cluster's nodes track connections, as a Kubernetes node does (kube-proxy's rules match on
# conntrack state): a rule that only counts INVALID forwarded packets turns tracking on in the
# node's netns. Without it, tracking depends on whether an enrolled pod's probe SNAT rule exists
# on that cluster (the nodes of (1) and the floors had none unless (4) ran), and the floor rows
# skipped work that (2)'s nodes did for every packet between the nodes.
NODE_CONNTRACK_RULE = ["FORWARD", "-m", "conntrack", "--ctstate", "INVALID"]

PATHS = [
    ("nomesh", "(1) no mesh"),
    ("bypass", "(2) sockmesh: tc + sockmap bypass"),
    ("nofast", "(2f) as (2), --same-node-fast-path false"),
    ("nosrcip", "(2n) as (2), --preserve-source-ip false"),
    ("appmtu", "(2m) as (2), --no-app-route: the apps' sockets keep eth0's MTU and tc's bounce"),
    ("oneworker", "(2w) as (2), --workers 1: one thread per proxy, as each floor relay has"),
    ("nobypass", "(3) sockmesh: tc, no bypass"),
    ("iptables", "(4) sockmesh fed by iptables REDIRECT"),
    ("passthrough", "(5) passthrough: mesh client pod → pod not in the mesh"),
    ("ptsplice", "(5s) as (5) on (3)'s cluster (no bypass): the proxy splices"),
    ("ptfloor", "(p) passthrough floor: 1 minimal relay in the client pod, no TLS"),
    ("floor", "(f) floor: 2 minimal relays in the pods, no TLS"),
    ("tlsfloor", "(t) TLS floor: the relays with mTLS 1.3 between them"),
    ("h2floor", "(th) HTTP/2 floor: (t) with an HTTP/2 CONNECT stream inside the TLS"),
    ("h2asio", "(ta) as (th), woken by asio's reactor instead of the relays' own epoll loop"),
    # --baseline-rev / --baseline-build: (2) and (3) again, on the binaries of another build, and
    # (5) and (5s) when they run.
    ("basebypass", "(2b) as (2), baseline build"),
    ("basenobypass", "(3b) as (3), baseline build"),
    ("basepassthrough", "(5b) as (5), baseline build"),
    ("baseptsplice", "(5sb) as (5s), baseline build"),
]
BASELINE_PATHS = ("basebypass", "basenobypass", "basepassthrough", "baseptsplice")
# A baseline passthrough row runs only beside the row it is the baseline of.
BASELINE_PASSTHROUGH_OF = {"basepassthrough": "passthrough", "baseptsplice": "ptsplice"}
# Reference rows, across nodes only: loadgen relays where the proxies sit on the mesh path (relay 1
# in the client pod, relay 2 in the server pod on node-b), on the pods of (1).
FLOOR_PATHS = ("floor", "tlsfloor", "h2floor", "h2asio")
FLOOR_PORTS = {"floor": (17011, 17012), "tlsfloor": (17021, 17022), "h2floor": (17041, 17042),
               "h2asio": (17051, 17052)}
# The TLS floor rows and the relay flags each adds to mutual TLS.
TLS_FLOOR_FLAGS = {"tlsfloor": [], "h2floor": ["--h2", "yes"],
                   "h2asio": ["--h2", "yes", "--loop", "asio"]}
# (p), both topologies, on the pods of (1): the one relay a passthrough has, in the client pod, to
# the server app; one relay (and port) per server.
PT_FLOOR_PORTS = {"cross": 17031, "same": 17032}
# Targets of issue 16 that these rows are for.
TARGET_PASSTHROUGH_VS_NOMESH = 0.70
TARGET_RTT_OVER_TLS_FLOOR_US = 10.0
TARGET_CPU_VS_TLS_FLOOR = 1.0
# First byte of a new connection: the empty-pool row's proxies drop an idle pooled HBONE connection
# after this, and the client waits FIRST_BYTE_COLD_PAUSE_MS between samples (the pool sweeps every
# timeout/2), so that every sample finds the pool empty: TCP + TLS handshake + CONNECT.
FIRST_BYTE_POOL_IDLE_MS = 40
FIRST_BYTE_COLD_PAUSE_MS = 150
FIRST_BYTE_SIZE = 64
FIRST_BYTE_ROWS = [
    ("nomesh", "(1) no mesh"),
    ("bypass", "(2) sockmesh, a pooled HBONE connection"),
    ("basebypass", "(2b) as (2), the baseline build (--baseline-rev/--baseline-build)"),
    ("coldpool", "(2e) sockmesh, the HBONE pool empty (TCP + mTLS handshake + CONNECT)"),
    ("tlsfloor", "(t) TLS floor relays (TCP + mTLS 1.3 handshake between the relays)"),
]
# Proxy and agent flags of the clusters that differ from (2) by one flag.
PROXY_FLAGS = {"nofast": ["--same-node-fast-path", "false"],
               "nosrcip": ["--preserve-source-ip", "false"],
               "oneworker": ["--workers", "1"]}
AGENT_FLAGS = {"appmtu": ["--no-app-route"]}
# The clusters the loader's tc programs serve: their counters and their proxies' RSS are reported,
# the baseline build's too, so that an A/B run shows which way each build's packets went.
TC_CLUSTER_PATHS = ("bypass", "nofast", "nosrcip", "appmtu", "oneworker", "nobypass", "iptables",
                    "basebypass", "basenobypass")
# The passthrough rows and the cluster each runs on: (5) with the sockmap bypass (the app's socket
# is bypassed; the proxy pins its flow back to the stack, then splices), (5s) without it (the
# proxy splices from the start), and their baseline rows on the baseline's clusters.
PASSTHROUGH_HOSTS = {"passthrough": "bypass", "ptsplice": "nobypass",
                     "basepassthrough": "basebypass", "baseptsplice": "basenobypass"}
TOPOLOGIES = [("cross", "across nodes"), ("same", "same node")]


def cgroup_cpu_seconds(path):
    """usage_usec of a cgroup v2 tree (always present in cpu.stat, controller enabled or not)."""
    with open(os.path.join(path, "cpu.stat")) as f:
        for line in f:
            k, v = line.split()
            if k == "usage_usec":
                return int(v) / 1e6
    raise BenchError("no usage_usec in %s/cpu.stat" % path)


def system_cpu_seconds():
    """Busy CPU time of the whole machine (every CPU), from /proc/stat: all but idle and iowait."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


class Combo:
    """One path x one topology: the client pod and the server it talks to."""

    def __init__(self, path, topo, cluster, client, server, target=None, relays=None):
        self.path, self.topo = path, topo
        self.cluster, self.client, self.server = cluster, client, server
        # Where the client connects: the server pod's, or (floor rows) relay 1's address.
        self.target = target or "%s:%d" % (server.ip, SERVER_PORT)
        self.key = "%s/%s" % (path, topo)
        # The floor rows' relay processes; None for the rest (see ClusterBench.relay_pids).
        self.relays = relays


class ClusterBench:
    def __init__(self, o):
        self.o = o
        self.lib = load_cluster_lib()
        try:
            self.loadgen_bin = self.lib.binary("sockmesh-loadgen")
            for name in ("sockmesh-proxy", "sockmesh-loader", "sockmesh-cni",
                         "sockmesh-install-cni"):
                self.lib.binary(name)
        except self.lib.ClusterError as e:
            raise BenchError("%s (scripts/bench --cluster builds them)" % e)
        self.pki = None     # certificates of (t)
        self.cold_combo = None  # (2e): first byte with the HBONE pool empty, on its own cluster
        self.clusters = {}  # path key -> Cluster (nomesh shares iptables')
        self.made = []      # every Cluster, for cleanup
        self.combos = []
        self.notes = []
        self.fbres = {}
        self.fbsum = {}  # first-byte row key -> medians, for the chart
        # passthrough/<topo> -> {"splice": n, "copy": n}: sockmesh_plain_relays_total deltas (both
        # nodes of (2)'s cluster) summed over that row's measured runs only.
        self.plain_relays = {}
        self.measuring = False
        self.t0 = time.time()

    # -- helpers ----------------------------------------------------------------------------

    def check_budget(self):
        if time.time() - self.t0 > self.o.max_seconds:
            raise BenchError("over the time budget of %d s (--max-seconds)" % self.o.max_seconds)

    def new_cluster(self, what, bypass, build=None, proxy_extra=(), agent_extra=()):
        log("cluster for %s (bypass=%s%s%s%s): nodes, CNI, agents, proxies" % (
            what, bypass, ", binaries of " + build if build else "",
            ", proxies with " + " ".join(proxy_extra) if proxy_extra else "",
            ", agents with " + " ".join(agent_extra) if agent_extra else ""))
        c = self.lib.Cluster(bypass=bypass, log=lambda m: log("  " + m), build=build,
                             proxy_extra=proxy_extra, agent_extra=agent_extra)
        self.made.append(c)
        return c

    def track_connections(self, c):
        """Turns connection tracking on in each node's netns of cluster c (NODE_CONNTRACK_RULE)."""
        for n in c.nodes:
            n.sh(["iptables", "-w", "-A"] + NODE_CONNTRACK_RULE)

    def tracked_connections(self):
        """{cluster path: [TCP entries in the node's conntrack table, per node]}, after the run.
        A node with tracking on has some (the connections between the nodes, the harness's own
        requests to the node's proxy); one with none never tracked."""
        out = {}
        for path, c in self.clusters.items():
            # (1) and the floors share (4)'s cluster: named once, as the log names it.
            if c in [x.cluster for x in self.combos] and not (path == "nomesh" and
                                                              "iptables" in self.clusters):
                out[path] = [sum(1 for line in n.sh(["cat", "/proc/net/nf_conntrack"],
                                                   check=False).splitlines() if " tcp " in line)
                             for n in c.nodes]
        return out

    def serve(self, pod):
        p = pod.spawn("loadgen-server", [
            self.loadgen_bin, "server", "--listen", "0.0.0.0:%d" % SERVER_PORT,
            "--netns-only", "yes", "--max-seconds", str(self.o.max_seconds + 300)])

        def up():
            if not p.alive():
                raise BenchError("loadgen server in %s exited: %s" % (pod, p.log()[-2000:]))
            return (":%d " % SERVER_PORT) in pod.sh(["ss", "-Hltn"])
        self.lib.wait_until("loadgen server in %s" % pod, up, 15)
        return p

    def pods_for(self, c, path, namespace):
        client = c.add_pod("node-a", namespace, "%s-client" % path, "bench-client")
        same = c.add_pod("node-a", namespace, "%s-srv-a" % path, "bench-server")
        cross = c.add_pod("node-b", namespace, "%s-srv-b" % path, "bench-server")
        return client, same, cross

    def wait_enrolled(self, pods):
        for pod in pods:
            self.lib.wait_until(
                "the proxy's listeners in %s" % pod,
                lambda: all(":%d " % port in pod.sh(["ss", "-Hltn"])
                            for port in (SM_PORT_OUTBOUND, SM_PORT_INBOUND_PLAIN, SM_PORT_HBONE)),
                15)

    def floor_relays(self, key, client, server):
        """Starts (f), (t), (th) or (ta): relay 1 in the client pod (on its lo), relay 2 in the
        server pod on node-b, relay 2 -> the server app on the pod's lo; for (t) mutual TLS 1.3
        from relay 1 to relay 2, for (th) an HTTP/2 CONNECT stream inside it, for (ta) (th) with
        asio's reactor as the relays' event loop. Returns relay 1's address (the client's target)
        and the two relay processes."""
        p1, p2 = FLOOR_PORTS[key]
        tls1, tls2 = [], []
        if key in TLS_FLOOR_FLAGS:
            if self.pki is None:
                d = os.path.join(server.cluster.work, "bench-pki")
                os.makedirs(d, exist_ok=True)
                self.pki = make_pki(d, "relay2.bench.invalid")
            k = self.pki
            tls1 = ["--tls-to", "%s,%s,%s" % (k["client_cert"], k["client_key"], k["ca"])]
            tls2 = ["--tls-listen", "%s,%s,%s" % (k["server_cert"], k["server_key"], k["ca"])]
            tls1 += TLS_FLOOR_FLAGS[key]
            tls2 += TLS_FLOOR_FLAGS[key]
        _, relay2 = self.start_relay(server, "%s-relay2" % key, "%s:%d" % (server.ip, p2),
                                     "127.0.0.1:%d" % SERVER_PORT, tls2)
        target, relay1 = self.start_relay(client, "%s-relay1" % key, "127.0.0.1:%d" % p1,
                                          "%s:%d" % (server.ip, p2), tls1)
        return target, [relay1, relay2]

    def pt_floor_relay(self, topo, client, server):
        """Starts (p)'s relay in the client pod (on its lo) to the server app; returns its
        address (the client's target) and the relay process."""
        target, relay = self.start_relay(client, "ptfloor-%s-relay" % topo,
                                         "127.0.0.1:%d" % PT_FLOOR_PORTS[topo],
                                         "%s:%d" % (server.ip, SERVER_PORT))
        return target, [relay]

    def start_relay(self, pod, name, listen, to, tls=()):
        """`sockmesh-loadgen relay` in `pod` from `listen` to `to`, waited for until it listens;
        returns `listen` and the process."""
        proc = pod.spawn(name, [self.loadgen_bin, "relay", "--listen", listen, "--to", to] +
                         list(tls) + ["--netns-only", "yes",
                                      "--max-seconds", str(self.o.max_seconds + 300)])
        port = listen.rsplit(":", 1)[1]

        def up():
            if not proc.alive():
                raise BenchError("%s in %s exited: %s" % (name, pod, proc.log()[-2000:]))
            return (":%s " % port) in pod.sh(["ss", "-Hltn"])
        self.lib.wait_until("%s in %s" % (name, pod), up, 15)
        return listen, proc

    def plain_relay_counts(self, combo):
        texts = [n.metrics() for n in combo.cluster.nodes]
        return {r: int(sum(self.lib.metric_value(t, "sockmesh_plain_relays_total", relay=r)
                           for t in texts)) for r in ("splice", "copy")}

    def iptables_capture(self, pod):
        """Detaches the pod's tc capture (the loader's clsact filters) and installs Istio-style
        iptables redirection in the pod's netns instead. Nothing here outlives the pod netns."""
        for hook in ("ingress", "egress"):
            pod.sh(["tc", "filter", "del", "dev", "eth0", hook])
            left = pod.sh(["tc", "filter", "show", "dev", "eth0", hook]).strip()
            if left:
                raise BenchError("tc %s filters left on %s: %s" % (hook, pod, left))
        proxy_mark = "0x%x/0x%x" % (SM_MARK_PROXY, SM_MARK_PROXY)
        hop_mark = "0x%x/0x%x" % (SM_MARK_LOCAL_HOP, SM_MARK_LOCAL_HOP)
        rules = [
            # Outbound: the app's connections to the proxy's 15001 (not the proxy's own sockets).
            ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "!", "-d", "127.0.0.0/8",
             "-m", "mark", "!", "--mark", proxy_mark,
             "-j", "REDIRECT", "--to-ports", str(SM_PORT_OUTBOUND)],
            # Inbound plaintext: anything but HBONE and the proxy's own connections to 15006.
            ["-t", "nat", "-A", "PREROUTING", "-p", "tcp", "!", "-d", "127.0.0.0/8",
             "!", "--dport", str(SM_PORT_HBONE), "-m", "mark", "!", "--mark", proxy_mark,
             "-j", "REDIRECT", "--to-ports", str(SM_PORT_INBOUND_PLAIN)],
            # The proxy dials the app from the client's address (transparent): remember the
            # connection, and route the app's answers (mark restored) to lo, as Istio does.
            ["-t", "mangle", "-A", "OUTPUT", "-m", "mark", "--mark", hop_mark,
             "-j", "CONNMARK", "--set-xmark", hop_mark],
            ["-t", "mangle", "-A", "OUTPUT", "-m", "connmark", "--mark", hop_mark,
             "-j", "CONNMARK", "--restore-mark", "--mask", "0x%x" % SM_MARK_LOCAL_HOP],
        ]
        for r in rules:
            pod.sh(["iptables"] + r)
        pod.sh(["ip", "rule", "add", "fwmark", hop_mark, "lookup", str(IPT_ROUTE_TABLE),
                "pref", str(IPT_RULE_PRIORITY)])
        pod.sh(["ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table",
                str(IPT_ROUTE_TABLE)])

    def setup(self):
        o = self.o
        specs = [("bypass", True), ("nofast", True), ("nosrcip", True), ("appmtu", True),
                 ("oneworker", True), ("nobypass", False),
                 ("iptables", False),
                 ("basebypass", True), ("basenobypass", False)]
        # (5) runs on (2)'s cluster, (5s) on (3)'s, (f) and (t) on the pods of (1) (the cluster
        # of (4)).
        wanted = set(o.paths)
        hosts = {}  # cluster path -> the passthrough row it carries
        for pt, host in PASSTHROUGH_HOSTS.items():
            if pt in wanted:
                hosts[host] = pt
        if wanted & set(FLOOR_PATHS + ("ptfloor",)):
            wanted.add("nomesh")
        for path, bypass in specs:
            if path not in o.paths and not (path == "iptables" and "nomesh" in wanted) and \
                    path not in hosts:
                continue
            self.check_budget()
            c = self.new_cluster(path, bypass, o.baseline_build if path in BASELINE_PATHS else None,
                                 PROXY_FLAGS.get(path, ()), AGENT_FLAGS.get(path, ()))
            if path == "iptables":
                c.label_namespace("plain", False)
            if path in hosts:
                c.label_namespace("plain-" + hosts[path], False)
            c.label_namespace("mesh-" + path, True)
            c.up()
            self.track_connections(c)
            self.clusters[path] = c
            groups = []
            if path in o.paths:
                groups.append((path, "mesh-" + path))
            if path == "iptables" and "nomesh" in wanted:
                groups.append(("nomesh", "plain"))
                self.clusters["nomesh"] = c
            if path in hosts:
                if path not in o.paths:  # (5)/(5s) still needs a mesh client pod
                    groups.append(("client-only", "mesh-" + path))
                groups.append((hosts[path], "plain-" + hosts[path]))
            mesh_client = None
            for key, ns in groups:
                if key in PASSTHROUGH_HOSTS:
                    # The mesh client pod of (2)/(3) -> server pods in a namespace not labelled.
                    same = c.add_pod("node-a", ns, key + "-srv-a", "bench-server")
                    cross = c.add_pod("node-b", ns, key + "-srv-b", "bench-server")
                    for pod in (same, cross):
                        self.serve(pod)
                    for topo, server in (("cross", cross), ("same", same)):
                        if topo in o.topologies:
                            self.combos.append(Combo(key, topo, c, mesh_client, server))
                    continue
                if key == "client-only":
                    mesh_client = c.add_pod("node-a", ns, path + "-client", "bench-client")
                    self.wait_enrolled([mesh_client])
                    continue
                client, same, cross = self.pods_for(c, key, ns)
                if key != "nomesh":
                    self.wait_enrolled([client, same, cross])
                if key == "iptables":
                    for pod in (client, same, cross):
                        self.iptables_capture(pod)
                    log("  iptables: tc detached, REDIRECT rules in the 3 pods of (4)")
                if key in hosts:
                    mesh_client = client
                for pod in (same, cross):
                    self.serve(pod)
                for topo, server in (("cross", cross), ("same", same)):
                    # (2f) differs from (2) on the same node only.
                    if topo in o.topologies and (key != "nofast" or topo == "same") and \
                            (key not in ("nosrcip", "appmtu", "oneworker") or topo == "cross") and \
                            key in o.paths:
                        self.combos.append(Combo(key, topo, c, client, server))
                if key == "nomesh" and "ptfloor" in o.paths:
                    for topo, server in (("cross", cross), ("same", same)):
                        if topo in o.topologies:
                            target, relays = self.pt_floor_relay(topo, client, server)
                            self.combos.append(Combo("ptfloor", topo, c, client, server,
                                                     target=target, relays=relays))
                if key == "nomesh" and "cross" in o.topologies:
                    for fk in FLOOR_PATHS:
                        if fk in o.paths:
                            target, relays = self.floor_relays(fk, client, cross)
                            self.combos.append(Combo(fk, "cross", c, client, cross,
                                                     target=target, relays=relays))
        if o.first_byte_conns and "bypass" in o.paths and "cross" in o.topologies:
            self.check_budget()
            c = self.new_cluster("coldpool", True, None,
                                 ["--pool-idle-timeout-ms", str(FIRST_BYTE_POOL_IDLE_MS)])
            c.label_namespace("mesh-coldpool", True)
            c.up()
            self.track_connections(c)
            self.clusters["coldpool"] = c
            client = c.add_pod("node-a", "mesh-coldpool", "coldpool-client", "bench-client")
            cross = c.add_pod("node-b", "mesh-coldpool", "coldpool-srv-b", "bench-server")
            self.wait_enrolled([client, cross])
            self.serve(cross)
            self.cold_combo = Combo("coldpool", "cross", c, client, cross)
        order = {k: i for i, (k, _) in enumerate(PATHS)}
        self.combos.sort(key=lambda x: (order[x.path], [t for t, _ in TOPOLOGIES].index(x.topo)))

    # -- load -------------------------------------------------------------------------------

    def loadgen(self, combo, args):
        self.check_budget()
        t = self.o.op_timeout
        cmd = [self.loadgen_bin, "client", "--target", combo.target,
               "--via", "tcp", "--timeout", str(t), "--netns-only", "yes"] + args
        counted = self.measuring and combo.path in PASSTHROUGH_HOSTS
        try:
            if counted:
                before = self.plain_relay_counts(combo)
            out = combo.client.sh(cmd, timeout=t + 20, check=False)
            if counted:
                after = self.plain_relay_counts(combo)
                d = self.plain_relays.setdefault(combo.key, {"splice": 0, "copy": 0})
                for k in d:
                    d[k] += after[k] - before[k]
        except self.lib.ClusterError as e:
            raise BenchError("%s: %s" % (combo.key, e))
        for line in reversed(out.strip().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise BenchError("loadgen on %s gave no result: %s\n  (%s)" % (combo.key, out.strip()[-2000:],
                                                                     " ".join(args)))

    def throughput(self, combo, nbytes, streams):
        cg = combo.cluster.cgroup
        c0, s0 = cgroup_cpu_seconds(cg), system_cpu_seconds()
        r = self.loadgen(combo, ["--mode", "throughput", "--bytes", str(nbytes),
                                 "--streams", str(streams)])
        r["cgroup_cpu_s"] = cgroup_cpu_seconds(cg) - c0
        r["system_cpu_s"] = system_cpu_seconds() - s0
        return r

    def relay_pids(self, combo):
        """The processes that sit where the node proxies do on combo's path: the relays of a floor
        row, else the node proxies of its cluster (both nodes: on one node, or for a passthrough,
        the other one idles); none for no mesh (its cluster may be (4)'s, which has proxies)."""
        if combo.relays is not None:
            return [p.pid for p in combo.relays]
        if combo.path == "nomesh":
            return []
        return [n.proxy.pid for n in combo.cluster.nodes]

    def pingpong(self, combo, iters, warmup):
        """Round trips; with the CPU time of the path's cgroup tree per round trip (warm-up and
        the one connection's setup included: a few µs over thousands of round trips), and of it
        the CPU time of the node proxies, or of the floor rows' relays, per round trip."""
        cg = combo.cluster.cgroup
        relays = self.relay_pids(combo)
        c0 = cgroup_cpu_seconds(cg)
        n0 = on_cpu_ns(relays)
        r = self.loadgen(combo, ["--mode", "pingpong", "--size", "1024", "--iters", str(iters),
                                 "--warmup", str(warmup)])
        r["relay_cpu_us_per_rt"] = ((on_cpu_ns(relays) - n0) / 1e3 / (iters + warmup)
                                    if relays else None)
        r["cpu_us_per_rt"] = (cgroup_cpu_seconds(cg) - c0) * 1e6 / (iters + warmup)
        return r

    def first_byte_combos(self):
        out = []
        for key, label in FIRST_BYTE_ROWS:
            x = self.cold_combo if key == "coldpool" else next(
                (x for x in self.combos if x.key == key + "/cross"), None)
            if x is not None:
                out.append((key, label, x))
        return out

    def first_byte(self, combo, conns):
        """connect() -> first echoed byte on new connections; for (2e) and (2) also the delta of
        sockmesh_pool_connections_opened_total (client node) over the samples, and for (2) what
        each node's proxy spent per connection (CPU, voluntary context switches)."""
        pause = FIRST_BYTE_COLD_PAUSE_MS if combo.path == "coldpool" else 0
        node = combo.client.node if combo.path in ("coldpool", "bypass") else None
        before = node and self.lib.metric_value(node.metrics(),
                                                "sockmesh_pool_connections_opened_total")
        proxies = ([combo.client.node.proxy.pid, combo.server.node.proxy.pid]
                   if combo.path == "bypass" else [])
        cost0 = [(cpu_ticks([p]), voluntary_switches(p)) for p in proxies]
        r = self.loadgen(combo, ["--mode", "connect", "--conns", str(conns), "--size",
                                 str(FIRST_BYTE_SIZE), "--pause-ms", str(pause)])
        if proxies:
            hz = os.sysconf("SC_CLK_TCK")
            r["proxy_cost"] = [
                {"cpu_us": (sum(cpu_ticks([p])) - sum(t0)) / hz * 1e6 / conns,
                 "switches": (voluntary_switches(p) - v0) / conns}
                for p, (t0, v0) in zip(proxies, cost0)]
        if node:
            r["pool_opened"] = int(self.lib.metric_value(
                node.metrics(), "sockmesh_pool_connections_opened_total") - before)
        return r

    def evidence(self):
        """Counters that show each path went the way its label says: the loader's counters for
        the tc paths, the REDIRECT rule's packets for the iptables path."""
        ev = {}
        for path in TC_CLUSTER_PATHS:
            c = self.clusters.get(path)
            if c is None or path not in self.o.paths:
                continue
            counts = {}
            for n in c.nodes:
                out = n.loader("status", check=False)
                in_counters = False
                for line in out.splitlines():
                    if line.startswith("counters:"):
                        in_counters = True
                        continue
                    parts = line.split()
                    if in_counters and len(parts) >= 2 and parts[1].isdigit():
                        counts[parts[0]] = counts.get(parts[0], 0) + int(parts[1])
            try:
                texts = [n.metrics() for n in c.nodes]
                # (The destination reporter also counts same-node fast-path connections.)
                counts["connections_accepted(destination reporter)"] = int(sum(
                    self.lib.metric_value(t, "istio_tcp_connections_opened_total",
                                          reporter="destination") for t in texts))
                counts["same_node_fast_path"] = int(sum(
                    self.lib.metric_value(t, "sockmesh_same_node_fast_path_total")
                    for t in texts))
            except self.lib.ClusterError as e:
                self.notes.append("(metrics of %s unreadable: %s)" % (path, e))
            if path == "iptables":
                client = next(x.client for x in self.combos if x.path == "iptables")
                out = client.sh(["iptables", "-t", "nat", "-L", "OUTPUT", "-n", "-v", "-x"],
                                check=False)
                for line in out.splitlines():
                    if "REDIRECT" in line:
                        counts["iptables_redirected_packets(client pod)"] = int(line.split()[0])
            ev[path] = counts
        return ev

    def measure(self):
        o = self.o
        log("warm-up (%d combinations)" % len(self.combos))
        for x in self.combos:
            self.loadgen(x, ["--mode", "throughput", "--bytes", str(o.warmup_bytes),
                             "--streams", "1"])
            self.pingpong(x, 200, 100)
        fb = self.first_byte_combos() if o.first_byte_conns else []
        for _, _, x in fb:
            self.first_byte(x, 8)
        fbres = {k: [] for k, _, _ in fb}
        ev0 = self.evidence()
        self.measuring = True
        res = {x.key: {"tp1": [], "tp8": [], "pp": []} for x in self.combos}
        n = len(self.combos)
        for rep in range(o.reps):
            # Interleaved: every combination once per step, the order rotating each repetition.
            order = self.combos[rep % n:] + self.combos[:rep % n]
            for x in order:
                log("rep %d/%d %-16s %d x 1 KiB round trips" % (rep + 1, o.reps, x.key, o.iters))
                res[x.key]["pp"].append(self.pingpong(x, o.iters, o.pp_warmup))
            for x in order:
                log("rep %d/%d %-16s 1 stream x %d MiB" % (rep + 1, o.reps, x.key,
                                                          o.tp1_bytes // MiB))
                res[x.key]["tp1"].append(self.throughput(x, o.tp1_bytes, 1))
            for x in order:
                log("rep %d/%d %-16s %d streams x %d MiB" % (rep + 1, o.reps, x.key, o.streams,
                                                            o.tp8_bytes // o.streams // MiB))
                res[x.key]["tp8"].append(self.throughput(x, o.tp8_bytes, o.streams))
            for k, _, x in fb[rep % max(1, len(fb)):] + fb[:rep % max(1, len(fb))]:
                log("rep %d/%d %-16s %d new connections, first byte" % (rep + 1, o.reps, k,
                                                                      o.first_byte_conns))
                fbres[k].append(self.first_byte(x, o.first_byte_conns))
            for c in self.made:
                for node in c.nodes:
                    if not node.proxy.alive():
                        raise BenchError("%s's proxy of cluster %s exited:\n%s" % (
                            node.name, c.id, node.proxy.log()[-3000:]))
        self.measuring = False
        ev1 = self.evidence()
        self.conntrack = self.tracked_connections()
        untracked = [p for p, counts in self.conntrack.items() if not all(counts)]
        if untracked:
            raise BenchError("clusters with a node whose conntrack table holds no TCP connection "
                             "(tracking off: its rows would skip netfilter work the others do): "
                             "%s" % untracked)
        rss = {}
        for path in TC_CLUSTER_PATHS:
            c = self.clusters.get(path)
            if c is not None and path in o.paths:
                rss[path] = {n.name: rss_kib(n.proxy.pid) for n in c.nodes}
        self.fbres = fbres
        return res, ev0, ev1, rss

    # -- report -----------------------------------------------------------------------------

    def summarise(self, res, rss):
        med = statistics.median
        s = {}
        for x in self.combos:
            r = res[x.key]
            tp = r["tp1"] + r["tp8"]
            moved = sum(t["bytes"] for t in tp)
            s[x.key] = {
                "path": x.path, "topo": x.topo,
                "tp1": med(t["gbps"] for t in r["tp1"]),
                "tp8": med(t["gbps"] for t in r["tp8"]),
                "p50": med(p["p50_us"] for p in r["pp"]),
                "p99": med(p["p99_us"] for p in r["pp"]),
                "cpu_us_per_rt": med(p["cpu_us_per_rt"] for p in r["pp"]),
                "cpu_per_gb": sum(t["cgroup_cpu_s"] for t in tp) / (moved / GB),
                # the same by kind of throughput run: medians of each run's own CPU over bytes
                "cpu_per_gb_1": med(t["cgroup_cpu_s"] / (t["bytes"] / GB) for t in r["tp1"]),
                "cpu_per_gb_n": med(t["cgroup_cpu_s"] / (t["bytes"] / GB) for t in r["tp8"]),
                "sys_cpu_per_gb": sum(t["system_cpu_s"] for t in tp) / (moved / GB),
                "tp1_all": [t["gbps"] for t in r["tp1"]],
                "tp8_all": [t["gbps"] for t in r["tp8"]],
                "p50_all": [p["p50_us"] for p in r["pp"]],
                "cpu_rt_all": [p["cpu_us_per_rt"] for p in r["pp"]],
                # the node proxies' (or the floor relays') share of it; None for no mesh
                "relay_cpu_rt_all": [p["relay_cpu_us_per_rt"] for p in r["pp"]],
                "relay_cpu_us_per_rt": (med(p["relay_cpu_us_per_rt"] for p in r["pp"])
                                        if r["pp"] and r["pp"][0]["relay_cpu_us_per_rt"]
                                        is not None else None),
                # one figure per repetition: its 1-stream and its N-stream run together
                "cpu_gb_all": [(a["cgroup_cpu_s"] + b["cgroup_cpu_s"]) /
                               ((a["bytes"] + b["bytes"]) / GB)
                               for a, b in zip(r["tp1"], r["tp8"])],
                "rss_mib": (sum(rss[x.path].values()) / 1024.0) if x.path in rss else None,
            }
        return s

    def report(self, res, ev0, ev1, rss):
        o = self.o
        s = self.summarise(res, rss)
        labels = dict(PATHS)
        L = ["# sockmesh pod → pod benchmark (simulated two-node cluster)", ""]
        L.append("%s · %d CPUs · kernel %s · %s · load average at start %.1f, at end %.1f" % (
            datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), os.cpu_count(), platform.release(),
            "quick run" if o.quick else "full run", self.load_start, os.getloadavg()[0]))
        L.append("")
        L.append("Binaries: %s." % os.environ.get("SOCKMESH_BUILD_DIR", "?"))
        L.append("")
        L.append("Client pod on node-a → server pod on node-b (across nodes) or on node-a (same "
                 "node), pods made by the real CNI chain (bridge + host-local + sockmesh-cni). "
                 "Round trips: %d × 1 KiB request + 1 KiB response on one connection (after %d "
                 "warm-up); throughput: 1 stream × %d MiB and %d streams × %d MiB. Medians of %d "
                 "repetitions, all %d combinations interleaved (order rotating) in this run." % (
                     o.iters, o.pp_warmup, o.tp1_bytes // MiB, o.streams,
                     o.tp8_bytes // o.streams // MiB, o.reps, len(self.combos)))
        L.append("")
        for topo, tlabel in TOPOLOGIES:
            base = s.get("nomesh/" + topo)
            rows = [x for x in self.combos if x.topo == topo]
            if not rows:
                continue
            L.append("### %s" % tlabel)
            L.append("")
            L.append("| path | 1 stream Gbit/s | vs no mesh | %d streams Gbit/s | vs no mesh | "
                     "1 KiB RTT p50 µs | vs no mesh | p99 µs | vs no mesh | CPU s/GB | vs no mesh "
                     "| proxy RSS MiB (A+B) |" % o.streams)
            L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for x in rows:
                v = s[x.key]

                def ratio(field, fmt):
                    if base is None or not base[field]:
                        return "—"
                    return fmt % (v[field] / base[field])
                L.append("| %s | %.2f | %s | %.2f | %s | %.1f | %s | %.1f | %s | %.2f | %s | %s |" % (
                    labels[x.path], v["tp1"], ratio("tp1", "%.2f×"),
                    v["tp8"], ratio("tp8", "%.2f×"), v["p50"], ratio("p50", "%.2f×"), v["p99"],
                    ratio("p99", "%.2f×"), v["cpu_per_gb"], ratio("cpu_per_gb", "%.2f×"),
                    "—" if v["rss_mib"] is None else "%.1f" % v["rss_mib"]))
            L.append("")
        L.extend(self.target_lines(s))
        L.append("CPU s/GB: CPU time (usage_usec of the cgroup v2 tree of the path's cluster: the "
                 "client and server pods' processes and both node proxies; the node agents are "
                 "outside it and idle) over all throughput runs (1 and %d streams), divided by "
                 "the GB (10⁹ bytes) moved. Kernel work in softirq is charged to whatever task "
                 "the CPU was running, mostly the sender. The system-wide /proc/stat figure "
                 "(which also counts other users of this machine) is in the JSON as "
                 "sys_cpu_per_gb." % o.streams)
        L.append("")
        if rss:
            L.append("Proxy RSS: VmRSS of the two node proxies (node-a + node-b) of the path's "
                     "cluster after the run: %s. (1) has no proxy on its path." % "; ".join(
                         "%s: %s" % (k, ", ".join("%s %.1f MiB" % (n, kib / 1024.0)
                                                  for n, kib in sorted(v.items())))
                         for k, v in rss.items()))
            L.append("")
        L.append("Per-repetition figures (1 stream Gbit/s | %d streams Gbit/s | RTT p50 µs | "
                 "CPU µs per round trip | of it, the node proxies' (or the floor relays') | "
                 "CPU s/GB of the repetition's two throughput runs):" % o.streams)
        L.append("")
        for x in self.combos:
            v = s[x.key]
            L.append("- %s: %s | %s | %s | %s | %s | %s" % (
                x.key, ", ".join("%.2f" % g for g in v["tp1_all"]),
                ", ".join("%.2f" % g for g in v["tp8_all"]),
                ", ".join("%.1f" % g for g in v["p50_all"]),
                ", ".join("%.1f" % g for g in v["cpu_rt_all"]),
                ", ".join("—" if g is None else "%.1f" % g for g in v["relay_cpu_rt_all"]),
                ", ".join("%.2f" % g for g in v["cpu_gb_all"])))
        L.append("")
        L.append("Datapath evidence over the measured repetitions (counter deltas, both nodes):")
        L.append("")
        for path, after in ev1.items():
            before = ev0.get(path, {})
            d = {k: after[k] - before.get(k, 0) for k in after}
            L.append("- %s: %s" % (path, ", ".join("%s +%d" % kv for kv in sorted(d.items()) if kv[1])
                                   or "no counter moved"))
        L.append("")
        L.append("(4) is enrolled like (2)/(3) (the proxy holds its listeners in the pod netns via "
                 "ZDS, the workload map gives its identity), then its tc filters are deleted and "
                 "iptables nat OUTPUT → 15001 / PREROUTING → 15006 (not 15008, not mark 0x%x) plus "
                 "mangle CONNMARK and `ip rule fwmark 0x%x lookup %d` (local 0/0 dev lo) take "
                 "over, as istio-cni's in-pod rules do. Client, proxies and server share this "
                 "machine's %d CPUs with whatever else runs: compare rows of one run only." % (
                     SM_MARK_PROXY, SM_MARK_LOCAL_HOP, IPT_ROUTE_TABLE, os.cpu_count()))
        L.append("")
        L.append("Every cluster's nodes track connections (`iptables -A %s` in each node's netns, "
                 "a rule that only counts), as a Kubernetes node does, so that each row's packets "
                 "between the nodes pay the same netfilter work. TCP entries in the nodes' "
                 "conntrack tables at the end (node-a, node-b): %s." % (
                     " ".join(NODE_CONNTRACK_RULE),
                     "; ".join("%s %s" % (p, "/".join(map(str, v)))
                               for p, v in sorted(self.conntrack.items()))))
        L.extend(self.first_byte_lines(s))
        for n in self.notes:
            L.append(n)
        text = "\n".join(L) + "\n"
        raw = {"options": {k: v for k, v in vars(o).items()}, "results": res, "summary": s,
               "first_byte": self.fbres,
               "rss_kib": rss, "evidence_before": ev0, "evidence_after": ev1,
               "node_conntrack_tcp_entries": self.conntrack}
        return text, raw, s

    def first_byte_lines(self, s):
        """The first-byte table (across nodes); fills self.fbsum for the chart."""
        if not self.fbres:
            return []
        med = statistics.median
        L = ["", "### First byte of a new connection, across nodes", "",
             "| path | p50 µs | p99 µs | vs no mesh (p50) | HBONE connections opened / samples "
             "| per connection: proxy CPU µs, context switches (client's node; server's) |",
             "|---|---:|---:|---:|---:|---:|"]
        base = None
        for key, label in FIRST_BYTE_ROWS:
            rs = self.fbres.get(key)
            if not rs:
                continue
            p50, p99 = med(r["p50_us"] for r in rs), med(r["p99_us"] for r in rs)
            if key == "nomesh":
                base = p50
            self.fbsum[key] = {"p50": p50, "p99": p99}
            opened = ("%d / %d" % (sum(r["pool_opened"] for r in rs), sum(r["conns"] for r in rs))
                      if "pool_opened" in rs[0] else "—")
            cost = "—"
            if "proxy_cost" in rs[0]:
                cost = "; ".join("%.0f, %.1f" % (med(r["proxy_cost"][i]["cpu_us"] for r in rs),
                                                 med(r["proxy_cost"][i]["switches"] for r in rs))
                                 for i in range(2))
            L.append("| %s | %.1f | %.1f | %s | %s | %s |" % (
                label, p50, p99, "%.2f×" % (p50 / base) if base else "—", opened, cost))
        L.append("")
        L.append("`sockmesh-loadgen client --mode connect --conns %d --size %d`, %d times "
                 "(medians of the runs' p50 and p99): the time from just before connect() to the "
                 "first byte of the echo of a %d-byte message written as soon as connect() "
                 "returned, on a new connection each sample. (2e) runs on a cluster of its own "
                 "whose proxies have --pool-idle-timeout-ms %d, with %d ms between samples, so that "
                 "the client proxy's pool is empty at every sample (the pool key is source "
                 "identity + source IP + destination, so a new client source per sample would "
                 "need a new pod per sample; the timeout is a flag the proxy has); the opened "
                 "column (sockmesh_pool_connections_opened_total on the client's node) shows "
                 "whether each sample opened an HBONE connection. (2) reuses the pooled one. "
                 "(t)'s relay 1 does a TCP connect and a TLS 1.3 handshake with relay 2 per new "
                 "connection. The last column (row (2) only): the user + system CPU "
                 "(/proc/<pid>/stat) and the voluntary context switches (all threads' "
                 "/proc/<pid>/task/*/status) of each node's proxy over the samples, divided by "
                 "the connections; medians of the runs." % (
                     self.o.first_byte_conns, FIRST_BYTE_SIZE, self.o.reps, FIRST_BYTE_SIZE,
                     FIRST_BYTE_POOL_IDLE_MS, FIRST_BYTE_COLD_PAUSE_MS))
        L.append("")
        return L

    def target_lines(self, s):
        """Issue 16's targets for (5) and for sockmesh across nodes against (t), as lines."""
        L = []
        for (pt, label), (topo, tlabel) in itertools.product(
                (("passthrough", "(5)"), ("ptsplice", "(5s)")), TOPOLOGIES):
            v, base = s.get(pt + "/" + topo), s.get("nomesh/" + topo)
            if v is None or base is None:
                continue
            r = v["tp1"] / base["tp1"]
            pr = self.plain_relays.get(pt + "/" + topo, {})
            fl = s.get("ptfloor/" + topo)
            floor_note = "" if fl is None else (
                " The floor (p), one minimal relay: %.2f Gbit/s = %.0f%% of no mesh; %s = %.0f%% "
                "of the floor." % (fl["tp1"], 100 * fl["tp1"] / base["tp1"], label,
                                   100 * v["tp1"] / fl["tp1"]))
            L.append("- Passthrough " + label + ", %s: 1 stream %.2f against %.2f Gbit/s with no mesh = "
                     "%.0f%% (target ≥ %.0f%%: %s); %d streams %.0f%%. Relays that carried it "
                     "(sockmesh_plain_relays_total deltas over this row's measured runs, both "
                     "nodes): splice +%d, copy +%d." % (
                         tlabel, v["tp1"], base["tp1"], 100 * r, 100 * TARGET_PASSTHROUGH_VS_NOMESH,
                         "met" if r >= TARGET_PASSTHROUGH_VS_NOMESH else "NOT met", self.o.streams,
                         100 * v["tp8"] / base["tp8"], pr.get("splice", 0), pr.get("copy", 0))
                     + floor_note)

        def by_repetition(values, fmt):
            """Per-repetition figures of a pair of rows (each pair from one round of the
            interleaving, so a machine that speeds up or slows down between rounds moves both
            alike): (text of their range and median, the median or None)."""
            r = sorted(values)
            if not r:
                return "by repetition: none", None
            m = statistics.median(r)
            return ("by repetition " + fmt + " to " + fmt + ", median " + fmt) % (r[0], r[-1], m), m

        def rep_ratios(a, b):
            """CPU s/GB of a over b: the spread says how far one run's ratio can be trusted."""
            return by_repetition([x / y for x, y in zip(a["cpu_gb_all"], b["cpu_gb_all"]) if y > 0],
                                 "%.2f×")[0]

        def rep_gaps(a, b):
            """RTT p50 of a less that of b, µs: (text, median gap or None)."""
            return by_repetition([x - y for x, y in zip(a["p50_all"], b["p50_all"])], "%+.1f µs")

        def rep_relay_cpu(a, b):
            """CPU per round trip of a's proxies (or relays) less b's, µs: (text, median)."""
            return by_repetition([x - y for x, y in zip(a["relay_cpu_rt_all"],
                                                        b["relay_cpu_rt_all"])], "%+.1f µs")

        v, t = s.get("bypass/cross"), s.get("tlsfloor/cross")
        if v is not None and t is not None:
            d = v["p50"] - t["p50"]
            gaps, paired = rep_gaps(v, t)
            # The verdict takes the median of the paired gaps: the medians of two rows can come
            # from different rounds, and this VM's speed moves between rounds.
            verdict_gap = d if paired is None else paired
            c = v["cpu_per_gb"] / t["cpu_per_gb"]
            L.append("- Sockmesh (2) across nodes against the TLS floor (t): 1 KiB RTT p50 %.1f "
                     "against %.1f µs, %+.1f µs between the medians (%s; target within %.0f µs, "
                     "on the median of the paired gaps: %s); p99 %+.1f µs; CPU "
                     "s/GB %.2f against %.2f = %.2f× (%s; target ≤ %.2g: %s); 1 stream %.2f against "
                     "%.2f Gbit/s. CPU s/GB by throughput run (medians of each run's own): 1 "
                     "stream %.2f against %.2f (%.2f×), %d streams %.2f against %.2f (%.2f×). "
                     "CPU per round trip (all processes of the path, kernel "
                     "included): %.1f against %.1f µs, %+.1f µs: on 2 CPUs a round trip is "
                     "mostly CPU time, so the RTT gap follows this one." % (
                         v["p50"], t["p50"], d, gaps, TARGET_RTT_OVER_TLS_FLOOR_US,
                         "met" if verdict_gap <= TARGET_RTT_OVER_TLS_FLOOR_US else "NOT met",
                         v["p99"] - t["p99"], v["cpu_per_gb"], t["cpu_per_gb"], c,
                         rep_ratios(v, t), TARGET_CPU_VS_TLS_FLOOR,
                         "met" if c <= TARGET_CPU_VS_TLS_FLOOR else "NOT met", v["tp1"], t["tp1"],
                         v["cpu_per_gb_1"], t["cpu_per_gb_1"], v["cpu_per_gb_1"] / t["cpu_per_gb_1"],
                         self.o.streams, v["cpu_per_gb_n"], t["cpu_per_gb_n"],
                         v["cpu_per_gb_n"] / t["cpu_per_gb_n"],
                         v["cpu_us_per_rt"], t["cpu_us_per_rt"],
                         v["cpu_us_per_rt"] - t["cpu_us_per_rt"]))
        if v is not None and t is not None and v["relay_cpu_us_per_rt"] is not None:
            L.append("- Of that CPU per round trip, the two node proxies of (2) against the two "
                     "relays of (t), which sit where the proxies do: %.1f against %.1f µs (%s); "
                     "the rest (apps, and the kernel work charged to them) %.1f against %.1f µs. "
                     "Each process's time on a CPU, all threads, the softirq work done on its "
                     "time included (/proc/<pid>/task/*/schedstat)." % (
                         v["relay_cpu_us_per_rt"], t["relay_cpu_us_per_rt"],
                         rep_relay_cpu(v, t)[0],
                         v["cpu_us_per_rt"] - v["relay_cpu_us_per_rt"],
                         t["cpu_us_per_rt"] - t["relay_cpu_us_per_rt"]))
        # The baseline build's rows against this build's, repetition by repetition: what an
        # interleaved A/B run shows for a change.
        for mesh, base, label, blabel in (("bypass", "basebypass", "(2)", "(2b)"),
                                          ("nobypass", "basenobypass", "(3)", "(3b)")):
            for topo in ("cross", "same"):
                a, b = s.get("%s/%s" % (mesh, topo)), s.get("%s/%s" % (base, topo))
                if a is None or b is None:
                    continue
                L.append("- %s → %s, the baseline's binaries against these (%s): RTT p50 %.1f → "
                         "%.1f µs (%s less %s %s); the node proxies' CPU per round trip %.1f → "
                         "%.1f µs (%s); CPU s/GB %.2f → %.2f (%s over %s %s); 1 stream %.2f → "
                         "%.2f Gbit/s." % (
                             blabel, label, dict(TOPOLOGIES)[topo], b["p50"], a["p50"], label,
                             blabel, rep_gaps(a, b)[0], b["relay_cpu_us_per_rt"],
                             a["relay_cpu_us_per_rt"], rep_relay_cpu(a, b)[0], b["cpu_per_gb"],
                             a["cpu_per_gb"], label, blabel, rep_ratios(a, b), b["tp1"],
                             a["tp1"]))
        n = s.get("nosrcip/cross")
        if v is not None and n is not None:
            L.append("- (2n) → (2), what preserving the client's source IP costs across nodes: CPU "
                     "s/GB %.2f → %.2f (%+.0f%%), 1 stream %.2f → %.2f Gbit/s, RTT p50 %.1f → "
                     "%.1f µs.%s" % (
                         n["cpu_per_gb"], v["cpu_per_gb"],
                         100 * (v["cpu_per_gb"] / n["cpu_per_gb"] - 1), n["tp1"], v["tp1"],
                         n["p50"], v["p50"],
                         "" if t is None else " (2n) against (t): CPU s/GB %.2f×." % (
                             n["cpu_per_gb"] / t["cpu_per_gb"])))
        nb = s.get("nobypass/cross")
        if v is not None and nb is not None:
            L.append("- (3) → (2), what the sockmap bypass does across nodes: CPU s/GB %.2f → %.2f "
                     "(%+.0f%%; (2) over (3) %s), 1 stream %.2f → %.2f Gbit/s, RTT p50 %.1f → "
                     "%.1f µs (%+.1f; (2) less (3) %s). While an app's flow is in the bypass, its "
                     "answers reach its proxy through sk_msg, so its own TCP socket acknowledges "
                     "each message with an ACK of its own instead of on its answer; a tunnel's "
                     "flow leaves the bypass once the app has answered twice, so the round trips "
                     "here run on the stack after the first two, and the throughput runs (one "
                     "answer each) in the bypass (`bench/hbone_profile.py` lists the sockets).%s" % (
                         nb["cpu_per_gb"], v["cpu_per_gb"],
                         100 * (v["cpu_per_gb"] / nb["cpu_per_gb"] - 1), rep_ratios(v, nb),
                         nb["tp1"], v["tp1"], nb["p50"], v["p50"], v["p50"] - nb["p50"],
                         rep_gaps(v, nb)[0],
                         "" if t is None else " (3) against (t): RTT p50 %+.1f µs (%s), CPU s/GB "
                         "%.2f×." % (nb["p50"] - t["p50"], rep_gaps(nb, t)[0],
                                     nb["cpu_per_gb"] / t["cpu_per_gb"])))
        m = s.get("appmtu/cross")
        if v is not None and m is not None:
            L.append("- (2m) → (2), what the apps' lo-sized route buys across nodes (the client "
                     "app sends to its proxy in 65K segments instead of eth0's, as the floor rows' "
                     "apps do to relay 1 over lo): CPU s/GB %.2f → %.2f (%+.0f%%; (2) over (2m) "
                     "%s), 1 stream %.2f → %.2f Gbit/s, RTT p50 %.1f → %.1f µs.%s" % (
                         m["cpu_per_gb"], v["cpu_per_gb"],
                         100 * (v["cpu_per_gb"] / m["cpu_per_gb"] - 1), rep_ratios(v, m),
                         m["tp1"], v["tp1"], m["p50"], v["p50"],
                         "" if t is None else " (2m) against (t): CPU s/GB %.2f×." % (
                             m["cpu_per_gb"] / t["cpu_per_gb"])))
        w = s.get("oneworker/cross")
        if v is not None and w is not None:
            L.append("- (2w) → (2), what the proxies' second worker thread costs across nodes on "
                     "this machine's CPUs (the floor relays have one thread each): CPU s/GB %.2f → "
                     "%.2f ((2) over (2w) %s); by throughput run 1 stream %.2f → %.2f, %d streams "
                     "%.2f → %.2f; throughput 1 stream %.2f → %.2f, %d streams %.2f → %.2f Gbit/s; "
                     "RTT p50 %.1f → %.1f µs.%s" % (
                         w["cpu_per_gb"], v["cpu_per_gb"], rep_ratios(v, w), w["cpu_per_gb_1"],
                         v["cpu_per_gb_1"], self.o.streams, w["cpu_per_gb_n"], v["cpu_per_gb_n"],
                         w["tp1"], v["tp1"], self.o.streams, w["tp8"], v["tp8"], w["p50"],
                         v["p50"],
                         "" if t is None else " (2w) against (t): CPU s/GB %.2f× (1 stream "
                         "%.2f×, %d streams %.2f×)." % (
                             w["cpu_per_gb"] / t["cpu_per_gb"],
                             w["cpu_per_gb_1"] / t["cpu_per_gb_1"], self.o.streams,
                             w["cpu_per_gb_n"] / t["cpu_per_gb_n"])))
        f = s.get("floor/cross")
        if f is not None and t is not None:
            L.append("- (f) → (t), what mTLS 1.3 alone costs across nodes: RTT p50 %+.1f µs, CPU "
                     "s/GB %.2f → %.2f." % (t["p50"] - f["p50"], f["cpu_per_gb"], t["cpu_per_gb"]))
        h = s.get("h2floor/cross")
        if h is not None and t is not None:
            L.append("- (t) → (th), what HBONE's HTTP/2 framing adds to mTLS at its least (nghttp2, "
                     "no proxy around it): RTT p50 %+.1f µs, CPU s/GB %.2f → %.2f (%+.0f%%; "
                     "(th) over (t) %s; by throughput run 1 stream %.2f → %.2f, %d streams %.2f → "
                     "%.2f), 1 stream %.2f → %.2f Gbit/s." % (
                         h["p50"] - t["p50"], t["cpu_per_gb"], h["cpu_per_gb"],
                         100 * (h["cpu_per_gb"] / t["cpu_per_gb"] - 1), rep_ratios(h, t),
                         t["cpu_per_gb_1"], h["cpu_per_gb_1"], self.o.streams, t["cpu_per_gb_n"],
                         h["cpu_per_gb_n"], t["tp1"], h["tp1"]))
        a = s.get("h2asio/cross")
        if h is not None and a is not None:
            L.append("- (th) → (ta), what an event loop like the proxy's (Boost.Asio's reactor, a "
                     "wait per read) adds to the HTTP/2 floor: RTT p50 %+.1f µs (%s), the relays' "
                     "CPU per round trip %s, CPU s/GB %.2f → %.2f (%s)." % (
                         a["p50"] - h["p50"], rep_gaps(a, h)[0],
                         "—" if a["relay_cpu_us_per_rt"] is None else "%.1f → %.1f µs (%s)" % (
                             h["relay_cpu_us_per_rt"], a["relay_cpu_us_per_rt"],
                             rep_relay_cpu(a, h)[0]),
                         h["cpu_per_gb"], a["cpu_per_gb"], rep_ratios(a, h)))
            if v is not None and t is not None:
                L.append("- Sockmesh (2) against (ta), the floor with HTTP/2 and asio: RTT p50 "
                         "%+.1f µs (%s); (ta) against (t): %+.1f µs (%s)." % (
                             v["p50"] - a["p50"], rep_gaps(v, a)[0], a["p50"] - t["p50"],
                             rep_gaps(a, t)[0]))
        if h is not None:
            for key, label in (("bypass", "(2)"), ("nosrcip", "(2n)"), ("appmtu", "(2m)"),
                               ("oneworker", "(2w)")):
                x = s.get(key + "/cross")
                if x is None:
                    continue
                L.append("- Sockmesh %s against the HTTP/2 floor (th): CPU s/GB %.2f against %.2f "
                         "= %.2f× (%s); RTT p50 %+.1f µs; 1 stream %.2f against %.2f Gbit/s." % (
                             label, x["cpu_per_gb"], h["cpu_per_gb"],
                             x["cpu_per_gb"] / h["cpu_per_gb"], rep_ratios(x, h),
                             x["p50"] - h["p50"], x["tp1"], h["tp1"]))
        if L:
            L.append("")
            L.append("(f), (t), (th) and (ta) are `sockmesh-loadgen relay` (one thread; (t) with "
                     "`--tls-to`/`--tls-listen`, TLS 1.3 AES-128-GCM, mutual certificates, no "
                     "HTTP/2; (th) adds `--h2 yes`: one HTTP/2 CONNECT stream per connection "
                     "inside that TLS, nghttp2, the proxy's windows and frame size; (ta) adds "
                     "`--loop asio`: Boost.Asio's reactor wakes the relay, an `async_wait` per "
                     "read, where the others have a level-triggered epoll loop of their own) run in the "
                     "pods of (1): relay 1 in the client pod on 127.0.0.1, "
                     "relay 2 in the server pod on node-b, which relays to the server app on its "
                     "lo, where the two proxies sit on the mesh path. Their CPU is in the same "
                     "cgroup tree. (5) is (2)'s mesh client pod talking to pods of a namespace not "
                     "labelled for the mesh, on (2)'s cluster: the app's socket is in the sockmap "
                     "bypass, which splice cannot read, so the proxy pins the app's flow back to "
                     "the TCP stack, copies what was redirected before, then splices (a proxy "
                     "before 2026-12-06 copied throughout). (5s) is the same on (3)'s cluster "
                     "(no bypass), where the proxy splices from the start.")
            L.append("")
        return L

    def chart(self, s, png):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            self.notes.append("(No chart: matplotlib is missing: %s; scripts/setup installs "
                              "python3-matplotlib.)" % e)
            return None
        o = self.o
        topos = [t for t in TOPOLOGIES if any(x.topo == t[0] for x in self.combos)]
        paths = [p for p in PATHS if any(x.path == p[0] for x in self.combos)]
        colours = {"nomesh": "#8c8c8c", "bypass": "#2ca02c", "nofast": "#ff7f0e", "nosrcip": "#bcbd22",
                   "appmtu": "#8c564b", "oneworker": "#e377c2", "nobypass": "#1f77b4",
                   "iptables": "#d62728", "passthrough": "#9467bd", "ptsplice": "#c5b0d5", "ptfloor": "#e7e7e7", "floor": "#c7c7c7",
                   "tlsfloor": "#17becf", "h2floor": "#9edae5", "h2asio": "#c7c7c7", "basebypass": "#98df8a", "basenobypass": "#aec7e8",
                   "basepassthrough": "#dbdb8d", "baseptsplice": "#f7b6d2"}
        panels = [("tp1", "1 stream, Gbit/s (higher is better)"),
                  ("tp8", "%d streams, Gbit/s (higher is better)" % o.streams),
                  ("cpu_per_gb", "CPU s per GB moved (cgroup tree)"),
                  ("p50", "1 KiB round trip p50, µs"),
                  ("p99", "1 KiB round trip p99, µs"),
                  ("rss", "node proxies' RSS after the run, MiB"),
                  ("firstbyte", "first byte of a new connection, across nodes, p50 µs")]
        fig, axes = plt.subplots(2, 4, figsize=(18, 8))
        axes.flat[-1].axis("off")
        width = 0.8 / max(1, len(paths))
        for ax, (field, title) in zip(axes.flat, panels):
            if field == "firstbyte":
                ks = [(k, lbl) for k, lbl in FIRST_BYTE_ROWS if k in self.fbsum]
                vals = [self.fbsum[k]["p50"] for k, _ in ks]
                fbc = dict(colours, coldpool="#bcbd22")
                ax.bar(range(len(ks)), vals, 0.6, color=[fbc[k] for k, _ in ks])
                for i, y_ in enumerate(vals):
                    ax.annotate("%.0f" % y_, (i, y_), ha="center", va="bottom", fontsize=7)
                ax.set_xticks(range(len(ks)))
                ax.set_xticklabels([lbl.split(" ", 1)[0] for _, lbl in ks])
            elif field == "rss":
                # One figure per cluster (the two proxies of the path), not per topology.
                ks = [p for p in paths if any(v["path"] == p[0] and v["rss_mib"] is not None
                                              for v in s.values())]
                vals = [next(v["rss_mib"] for v in s.values() if v["path"] == k)
                        for k, _ in ks]
                ax.bar(range(len(ks)), vals, 0.6, color=[colours[k] for k, _ in ks])
                ax.set_xticks(range(len(ks)))
                ax.set_xticklabels([lbl.split(" ", 1)[0] for _, lbl in ks])
            else:
                for i, (pk, plabel) in enumerate(paths):
                    xs, ys = [], []
                    for j, (tk, _) in enumerate(topos):
                        v = s.get("%s/%s" % (pk, tk))
                        if v is not None:
                            xs.append(j + (i - (len(paths) - 1) / 2.0) * width)
                            ys.append(v[field])
                    ax.bar(xs, ys, width, label=plabel, color=colours[pk])
                    for x_, y_ in zip(xs, ys):
                        ax.annotate("%.0f" % y_ if y_ >= 100 else "%.3g" % y_, (x_, y_),
                                    ha="center", va="bottom", fontsize=7)
                ax.set_xticks(range(len(topos)))
                ax.set_xticklabels([t[1] for t in topos])
            ax.set_title(title, fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        spare = axes.flat[-1]
        if not spare.has_data():  # the legend in the empty panel: one path a line, none cut off
            spare.axis("off")
            spare.legend(handles, labels, loc="center", fontsize=8, frameon=False)
        else:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(paths), 3), fontsize=8,
                       frameon=False)
        fig.suptitle("sockmesh pod → pod on a simulated two-node cluster, %s (%s run, medians of "
                     "%d, paths interleaved)" % (datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
                                                 "quick" if o.quick else "full", o.reps),
                     fontsize=11)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(png, dpi=100)
        plt.close(fig)
        return png

    def run(self):
        self.load_start = os.getloadavg()[0]
        try:
            self.setup()
            log("%d combinations: %s" % (len(self.combos), ", ".join(x.key for x in self.combos)))
            res, ev0, ev1, rss = self.measure()
        except self.lib.ClusterError as e:
            raise BenchError(str(e))
        text, raw, s = self.report(res, ev0, ev1, rss)
        png = os.path.splitext(self.o.out)[0] + ".png"
        os.makedirs(os.path.dirname(png), exist_ok=True)
        try:
            charted = self.chart(s, png)
        except Exception as e:  # the table matters more than the picture
            self.notes.append("(no chart: %s)" % e)
            charted = False
        if charted:
            text += "\nChart: %s\n" % os.path.relpath(png, ROOT)
            log("chart written to %s" % png)
        else:
            text += "\n" + "\n".join(self.notes[-1:]) + "\n"
        return text, raw

    def cleanup(self):
        for c in reversed(self.made):
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - keep closing the others
                log("cleanup of cluster %s: %s" % (c.id, e))
        self.made = []


def parse_args(argv):
    ap = bench_arguments(__doc__, ROOT, "smaller transfers and fewer round trips (about 2 min)",
                         "repetitions (default 3)", "MiB for the 1-stream run (8 streams: twice)")
    ap.add_argument("--paths",
                    default="nomesh,bypass,nofast,nosrcip,appmtu,oneworker,nobypass,iptables,"
                    "passthrough,"
                    "ptsplice,ptfloor,floor,tlsfloor,h2floor,h2asio",
                    help="comma list of: nomesh, bypass, nofast (same node only), nosrcip, "
                    "appmtu and oneworker (across nodes only), nobypass, "
                    "iptables, passthrough, ptsplice, ptfloor, floor, tlsfloor, h2floor and h2asio "
                    "(the last four across nodes only)")
    ap.add_argument("--topologies", default="cross,same", help="comma list of: cross, same")
    ap.add_argument("--first-byte-conns", type=int, help="new connections per first-byte sample "
                    "run (default 20 quick, 100 full; 0: no first-byte rows)")
    ap.add_argument("--out", help="Markdown file (default bench/results/cluster-<time>.md)")
    ap.add_argument("--max-seconds", type=int, help="time budget of the whole run")
    ap.add_argument("--baseline-rev", help="also run (2), (3) and, when they run, (5) and (5s) on "
                    "binaries built from this git revision (rows (2b), (3b), (5b), (5sb)), e.g. the "
                    "commit before a fix: it is built once in build-base/<rev>/")
    ap.add_argument("--baseline-build", help="as --baseline-rev, with the binaries of this build "
                    "directory")
    o = ap.parse_args(argv)
    o.paths = [p for p in o.paths.split(",") if p]
    if o.baseline_rev and o.baseline_build:
        ap.error("--baseline-rev or --baseline-build, not both")
    if o.baseline_rev or o.baseline_build:
        o.paths += [p for p in BASELINE_PATHS if p not in o.paths and
                    (p not in BASELINE_PASSTHROUGH_OF or BASELINE_PASSTHROUGH_OF[p] in o.paths)]
    elif any(p in BASELINE_PATHS for p in o.paths):
        ap.error("paths %s need --baseline-rev or --baseline-build" % ", ".join(BASELINE_PATHS))
    o.topologies = [t for t in o.topologies.split(",") if t]
    for p in o.paths:
        if p not in dict(PATHS):
            ap.error("unknown path %s" % p)
    for t in o.topologies:
        if t not in dict(TOPOLOGIES):
            ap.error("unknown topology %s" % t)
    o.reps = o.reps or 3
    o.iters = o.iters or (2000 if o.quick else 5000)
    o.pp_warmup = 200 if o.quick else 500
    mib = o.stream_mib or (128 if o.quick else 512)
    o.tp1_bytes, o.tp8_bytes = mib * MiB, 2 * mib * MiB
    o.streams = 8
    o.warmup_bytes = 16 * MiB
    o.op_timeout = 60 if o.quick else 120
    if o.first_byte_conns is None:
        o.first_byte_conns = 20 if o.quick else 100
    o.max_seconds = o.max_seconds or (480 if o.quick else 1800)
    if not o.out:
        o.out = os.path.join(ROOT, "bench", "results", "cluster-%s.md" %
                             datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    return o


def build_baseline(rev):
    """Builds `rev` of this repository once, in build-base/<commit>/build; returns that directory."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", rev + "^{commit}"],
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise BenchError("--baseline-rev %s: %s" % (rev, commit.stderr.strip()))
    top = os.path.join(ROOT, "build-base", commit.stdout.strip())
    src, build = os.path.join(top, "src"), os.path.join(top, "build")
    if os.access(os.path.join(build, "userspace", "sockmesh-proxy"), os.X_OK):
        log("baseline %s: already built in %s" % (rev, build))
        return build
    log("baseline %s: git archive into %s, then cmake (a few minutes on 2 CPUs)" % (rev, src))
    shutil.rmtree(top, ignore_errors=True)
    os.makedirs(src)
    archive = subprocess.Popen(["git", "-C", ROOT, "archive", commit.stdout.strip()],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise BenchError("git archive %s failed" % rev)
    for cmd in (["cmake", "-S", src, "-B", build, "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                ["cmake", "--build", build, "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError("baseline build failed: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]
                                                                   + r.stderr[-3000:]))
    log("baseline %s: built in %s" % (rev, build))
    return build


def main(argv):
    o = parse_args(argv)
    if os.geteuid() != 0:
        log("needs root (network namespaces, CNI, BPF, cgroups, iptables)")
        return 1
    if o.baseline_rev:
        try:
            o.baseline_build = build_baseline(o.baseline_rev)
        except BenchError as e:
            log(str(e))
            return 1
    if o.baseline_build:
        o.baseline_build = os.path.abspath(o.baseline_build)
        PATHS[:] = [(k, v.replace("baseline build", "binaries of " + (
            o.baseline_rev or o.baseline_build))) for k, v in PATHS]
    # scripts/lib/cluster.py finds the binaries through this.
    os.environ["SOCKMESH_BUILD_DIR"] = os.path.abspath(o.build_dir)
    return run_bench(lambda: ClusterBench(o), o.out, "cluster benchmark")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
