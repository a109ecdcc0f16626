#!/usr/bin/python3
"""sockmesh benchmark driver (run through scripts/bench).

Measures, in one run and on loopback addresses only:
  (a) direct TCP                      client -> server
  (b) sockmesh HBONE                  client -SOCKS5-> node A =HBONE (h2 CONNECT, mTLS 1.3)=> node B -> server
  (c1) nghttpx chain (off the shelf)  client -HTTP CONNECT-> nghttpx =h2, mTLS 1.3=> nghttpx -s -> tinyproxy -> server
  (c2) stunnel pair (off the shelf)   client -> stunnel client =mTLS 1.3=> stunnel server -> server
  (r) socat relays (reference)        client -> socat -> socat -> server, no TLS
  (f) floor relays (reference)        client -> loadgen relay -> loadgen relay -> server, no TLS
  (t) TLS floor relays (reference)    client -> loadgen relay =mTLS 1.3=> loadgen relay -> server
for: one 1 GiB stream, 8 parallel streams (aggregate), 1 KiB request/response round trips (p50,
p99); plus the sockmesh proxies' RSS idle and per 1,000 open tunnelled connections. Prints a
Markdown table and writes it to bench/results/latest.md.

Small DATA frames (also `--small-frames` alone, table in bench/results/small-frames.md): one
CONNECT stream over HTTP/2 and mutual TLS 1.3 straight to sockmesh's inbound (node B) and to
nghttpx -s (with tinyproxy behind it, as in (c1)), carrying 4,000,000 DATA frames of 16 bytes to
a sink: frames per second, and the server's CPU time per frame. It is what a chatty protocol (a
database's small requests) costs the receiving proxy.

Load comes from build/bench/sockmesh-loadgen (bench/loadgen.cc): the C++ standard library, and
OpenSSL for the TLS floor.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import select
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (BenchError, log, make_pki, openssl, rss_kib, run_bench,  # noqa: E402
                      set_log_prefix, tail, wait_until, yes)

set_log_prefix("bench")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MiB = 1 << 20

# Seconds the proxies sit idle before "idle after the run" is read.
IDLE_SETTLE_SECONDS = 6

# Targets from the issue.
TARGET_SINGLE_VS_DIRECT = 0.40
TARGET_THROUGHPUT_VS_OFFSHELF = 2.0
TARGET_RTT_VS_OFFSHELF = 0.5

# Flow-control windows for the nghttpx chain, the same as sockmesh's (ztunnel's) so that the
# comparison is of implementations, not of window sizes (nghttpx's default is 64 KiB).
H2_STREAM_WINDOW = 4 * MiB
H2_CONNECTION_WINDOW = 16 * MiB
# One AEAD everywhere: sockmesh prefers AES-128-GCM; the peers are told to use it too.
TLS13_CIPHER = "TLS_AES_128_GCM_SHA256"
# Rows that are not targets: socat relays, the floor relays, the floor relays with TLS.
REFERENCE_KEYS = ("relays", "floor", "tlsfloor")


# ---------------------------------------------------------------------------------------------
# Processes: every one we start is recorded and ended (its whole process group) on exit.

class Processes:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.procs = []  # (name, Popen)

    def start(self, name, args, stdin=None, stdout=None):
        path = os.path.join(self.log_dir, name + ".log")
        logf = open(path, "ab")
        p = subprocess.Popen(args, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else logf,
                             stderr=logf, start_new_session=True)
        p.log_path = path
        logf.close()
        self.procs.append((name, p))
        return p

    def check_alive(self, name, p):
        if p.poll() is not None:
            raise BenchError("%s exited with %s; log %s:\n%s" % (name, p.returncode, p.log_path,
                                                                 tail(p.log_path)))

    def stop(self, p, timeout=5.0):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # The group may still hold children (nghttpx workers) even after the leader is gone.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self):
        for _, p in reversed(self.procs):
            self.stop(p)
        self.procs = []


def port_open(ip, port):
    with socket.create_connection((ip, port), timeout=0.5):
        return True


# ---------------------------------------------------------------------------------------------
# /proc readings

def proc_tree(pid):
    """pid and all its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid):
    """User + system CPU time of pid and its descendants, with that of reaped children (socat
    forks one process per connection; its time moves to the parent's cutime once reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in proc_tree(pid):
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        except (OSError, ValueError, IndexError):
            pass
    return total / tick


def cgroup_bpf_programs():
    """Names of BPF programs attached to cgroups (sock_ops, sk_msg, connect hooks...). Another
    user's sockmap or connect redirection changes what loopback TCP costs, so the report says so."""
    if not shutil.which("bpftool"):
        return set()
    try:
        r = subprocess.run(["bpftool", "-j", "cgroup", "tree"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=10)
        tree = json.loads(r.stdout.decode() or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return set()
    out = set()
    for cg in tree:
        for prog in cg.get("programs", []):
            out.add("%s:%s" % (prog.get("attach_type", "?"), prog.get("name", "?")))
    return out


# ---------------------------------------------------------------------------------------------
# Certificates (openssl CLI) for the off-the-shelf peers.

# ---------------------------------------------------------------------------------------------
# The bench

class Path:
    def __init__(self, key, label, via, proxy, target, bind, pids=()):
        self.key, self.label = key, label
        self.via, self.proxy, self.target, self.bind = via, proxy, target, bind
        self.pids = list(pids)  # proxy processes on the path, for CPU accounting

    def args(self):
        a = ["--via", self.via, "--target", self.target, "--bind", self.bind]
        if self.proxy:
            a += ["--proxy", self.proxy]
        return a


class Bench:
    def __init__(self, opts):
        self.o = opts
        self.build_dir = os.path.abspath(opts.build_dir)
        self.proxy_bin = os.path.join(self.build_dir, "userspace", "sockmesh-proxy")
        self.loadgen_bin = os.path.join(self.build_dir, "bench", "sockmesh-loadgen")
        for b in (self.proxy_bin, self.loadgen_bin):
            if not os.access(b, os.X_OK):
                raise BenchError("missing %s: build it first (scripts/bench does)" % b)
        self.tmp = tempfile.mkdtemp(prefix="sockmesh-bench-")
        self.procs = Processes(self.tmp)
        # Our own 127.251.N block, apart from the integration tests' 127.100-249 range.
        blk = "127.251.%d" % (os.getpid() % 250 + 1)
        self.ip = {k: "%s.%d" % (blk, v) for k, v in (
            ("admin_a", 1), ("admin_b", 2), ("client", 10), ("server", 20), ("nghttpx_server", 40),
            ("tinyproxy", 41), ("nghttpx_client", 42), ("stunnel_client", 43),
            ("stunnel_server", 44), ("relay1", 45), ("relay2", 46), ("admin_a2", 3),
            ("admin_b2", 4))}
        self.server_port = 8080
        self.target = "%s:%d" % (self.ip["server"], self.server_port)
        self.paths = []
        self.notes = []
        self.meshes = []  # (path, node A, node B)
        self.bpf_seen = set()

    # -- processes ------------------------------------------------------------------------

    def start_server(self):
        p = self.procs.start("loadgen-server", [self.loadgen_bin, "server", "--listen", self.target,
                                                "--max-seconds", str(self.o.max_seconds)])
        wait_until(lambda: port_open(self.ip["server"], self.server_port), 10, "loadgen server")
        return p

    def sockmesh_config(self):
        def workload(uid, name, sa, ip, node):
            return ("- uid: %s\n  name: %s\n  namespace: bench\n  serviceAccount: %s\n"
                    "  workloadIps: [%s]\n  protocol: HBONE\n  node: %s\n" % (uid, name, sa, ip, node))
        return ("workloads:\n" + workload("c1", "client", "client", self.ip["client"], "node-a") +
                workload("s1", "server", "server", self.ip["server"], "node-b"))

    def start_sockmesh(self, tag, proxy_bin, admin_a, admin_b, hbone_port):
        """Nodes A and B of one build; returns (node A, node B, the path through them)."""
        cfg = os.path.join(self.tmp, "mesh.yaml")
        with open(cfg, "w") as f:
            f.write(self.sockmesh_config())
        state = os.path.join(self.tmp, "sockmesh-state-" + tag)
        nodes = {}
        for name, admin, extra in (
                ("node-a", admin_a, ["--socks5", "%s:15080" % admin_a,
                                     "--socks5-clients", "%s=c1" % self.ip["client"]]),
                ("node-b", admin_b, [])):
            args = [proxy_bin, "--node", name, "--config", cfg, "--state-dir", state,
                    "--admin", "%s:15000" % admin, "--metrics", "%s:15020" % admin,
                    "--readiness", "%s:15021" % admin, "--hbone-port", str(hbone_port),
                    "--log-level", "warn"] + extra
            if self.o.workers:
                args += ["--workers", str(self.o.workers)]
            nodes[name] = self.procs.start("%s-%s" % (tag, name), args)
        for name, admin in (("node-a", admin_a), ("node-b", admin_b)):
            p = nodes[name]

            def ready(p=p, name=name, admin=admin):
                self.procs.check_alive(name, p)
                with urllib.request.urlopen("http://%s:15021/healthz/ready" % admin, timeout=2) as r:
                    return r.status == 200
            wait_until(ready, 20, "%s %s ready" % (tag, name))
        return nodes["node-a"], nodes["node-b"]

    def start_nghttpx_chain(self, pki):
        ip = self.ip
        conf = os.path.join(self.tmp, "tinyproxy.conf")
        with open(conf, "w") as f:
            f.write("Port 18888\nListen %s\nTimeout 600\nMaxClients 4096\nAllow 127.0.0.0/8\n"
                    "ConnectPort %d\nDisableViaHeader Yes\nLogLevel Error\nLogFile \"%s\"\n"
                    "PidFile \"%s\"\n" % (ip["tinyproxy"], self.server_port,
                                          os.path.join(self.tmp, "tinyproxy-own.log"),
                                          os.path.join(self.tmp, "tinyproxy.pid")))
        tiny = self.procs.start("tinyproxy", ["tinyproxy", "-d", "-c", conf])
        wait_until(lambda: port_open(ip["tinyproxy"], 18888), 10, "tinyproxy")
        common = ["--conf=/dev/null", "--workers=%d" % self.o.offshelf_workers, "--log-level=WARN",
                  "--tls-min-proto-version=TLSv1.3", "--tls13-ciphers=" + TLS13_CIPHER,
                  "--no-ocsp",
                  "--frontend-http2-window-size=%d" % H2_STREAM_WINDOW,
                  "--frontend-http2-connection-window-size=%d" % H2_CONNECTION_WINDOW,
                  "--backend-http2-window-size=%d" % H2_STREAM_WINDOW,
                  "--backend-http2-connection-window-size=%d" % H2_CONNECTION_WINDOW,
                  "--read-timeout=10m", "--write-timeout=10m"]
        srv = self.procs.start("nghttpx-server", [
            "nghttpx", "-s", "--frontend=%s,15443" % ip["nghttpx_server"],
            "--backend=%s,18888" % ip["tinyproxy"],
            "--verify-client", "--verify-client-cacert=" + pki["ca"], "--npn-list=h2",
            "--errorlog-file=" + os.path.join(self.tmp, "nghttpx-server-error.log"),
            "--accesslog-file=/dev/null",
            "--frontend-read-timeout=10m", "--frontend-write-timeout=10m",
            "--backend-read-timeout=10m", "--backend-write-timeout=10m",
            pki["server_key"], pki["server_cert"]] + common[:-2])
        wait_until(lambda: port_open(ip["nghttpx_server"], 15443), 10, "nghttpx server")
        cli = self.procs.start("nghttpx-client", [
            "nghttpx", "--frontend=%s,13128;no-tls" % ip["nghttpx_client"],
            "--backend=%s,15443;;proto=h2;tls;sni=%s" % (ip["nghttpx_server"], self.o.server_name),
            "--client-cert-file=" + pki["client_cert"],
            "--client-private-key-file=" + pki["client_key"], "--cacert=" + pki["ca"],
            "--errorlog-file=" + os.path.join(self.tmp, "nghttpx-client-error.log"),
            "--accesslog-file=/dev/null",
            "--frontend-read-timeout=10m", "--frontend-write-timeout=10m",
            "--backend-read-timeout=10m", "--backend-write-timeout=10m"] + common[:-2])
        wait_until(lambda: port_open(ip["nghttpx_client"], 13128), 10, "nghttpx client")
        return Path("nghttpx", "(c1) nghttpx → h2 mTLS → nghttpx -s → tinyproxy", "http",
                    "%s:13128" % ip["nghttpx_client"], self.target, ip["client"],
                    pids=[cli.pid, srv.pid, tiny.pid])

    def start_stunnel(self, pki):
        ip = self.ip
        common = ("foreground = yes\npid =\ndebug = 3\nsyslog = no\n")
        tls = ("CAfile = %s\nverifyChain = yes\nsslVersionMin = TLSv1.3\nciphersuites = %s\n"
               % (pki["ca"], TLS13_CIPHER))
        server_conf = os.path.join(self.tmp, "stunnel-server.conf")
        with open(server_conf, "w") as f:
            f.write(common + "output = %s\n[hbone-like]\naccept = %s:19443\nconnect = %s\n"
                    "cert = %s\nkey = %s\nrequireCert = yes\n" % (
                        os.path.join(self.tmp, "stunnel-server-own.log"), ip["stunnel_server"],
                        self.target, pki["server_cert"], pki["server_key"]) + tls)
        client_conf = os.path.join(self.tmp, "stunnel-client.conf")
        with open(client_conf, "w") as f:
            f.write(common + "output = %s\n[hbone-like]\nclient = yes\naccept = %s:19000\n"
                    "connect = %s:19443\ncert = %s\nkey = %s\nsni = %s\ncheckHost = %s\n" % (
                        os.path.join(self.tmp, "stunnel-client-own.log"), ip["stunnel_client"],
                        ip["stunnel_server"], pki["client_cert"], pki["client_key"],
                        self.o.server_name, self.o.server_name) + tls)
        srv = self.procs.start("stunnel-server", ["stunnel", server_conf])
        cli = self.procs.start("stunnel-client", ["stunnel", client_conf])
        wait_until(lambda: port_open(ip["stunnel_server"], 19443), 10, "stunnel server")
        wait_until(lambda: port_open(ip["stunnel_client"], 19000), 10, "stunnel client")
        return Path("stunnel", "(c2) stunnel → mTLS → stunnel", "tcp", None,
                    "%s:19000" % ip["stunnel_client"], ip["client"], pids=[cli.pid, srv.pid])

    def start_socat_relays(self):
        ip = self.ip
        r2 = self.procs.start("socat-relay2", [
            "socat", "-b", "131072", "TCP-LISTEN:17002,bind=%s,reuseaddr,fork,nodelay" % ip["relay2"],
            "TCP:%s,nodelay" % self.target])
        r1 = self.procs.start("socat-relay1", [
            "socat", "-b", "131072", "TCP-LISTEN:17001,bind=%s,reuseaddr,fork,nodelay" % ip["relay1"],
            "TCP:%s:17002,nodelay" % ip["relay2"]])
        wait_until(lambda: port_open(ip["relay2"], 17002), 10, "socat relay 2")
        wait_until(lambda: port_open(ip["relay1"], 17001), 10, "socat relay 1")
        return Path("relays", "(r) reference: 2 plain TCP relays (socat, no TLS)", "tcp", None,
                    "%s:17001" % ip["relay1"], ip["client"], pids=[r1.pid, r2.pid])

    def start_floor_relays(self):
        """Two of loadgen's minimal relays (one recv and one send per message, nothing else) in
        place of nodes A and B: the floor that any user-space proxy pair stands on here."""
        ip = self.ip
        r2 = self.procs.start("floor-relay2", [self.loadgen_bin, "relay", "--listen",
                                               "%s:17012" % ip["relay2"], "--to", self.target,
                                               "--max-seconds", str(self.o.max_seconds)])
        r1 = self.procs.start("floor-relay1", [self.loadgen_bin, "relay", "--listen",
                                               "%s:17011" % ip["relay1"], "--to",
                                               "%s:17012" % ip["relay2"],
                                               "--max-seconds", str(self.o.max_seconds)])
        wait_until(lambda: port_open(ip["relay2"], 17012), 10, "floor relay 2")
        wait_until(lambda: port_open(ip["relay1"], 17011), 10, "floor relay 1")
        return Path("floor", "(f) floor: 2 minimal relays (epoll, recv → send, no TLS)", "tcp",
                    None, "%s:17011" % ip["relay1"], ip["client"], pids=[r1.pid, r2.pid])

    def start_tls_floor_relays(self, pki):
        """The floor relays with mutual TLS 1.3 between them (relay 1 the client, relay 2 the
        server): the floor that TLS alone, without HTTP/2, stands on here."""
        ip = self.ip
        r2 = self.procs.start("tls-floor-relay2", [
            self.loadgen_bin, "relay", "--listen", "%s:17022" % ip["relay2"], "--to", self.target,
            "--tls-listen", "%s,%s,%s" % (pki["server_cert"], pki["server_key"], pki["ca"]),
            "--max-seconds", str(self.o.max_seconds)])
        r1 = self.procs.start("tls-floor-relay1", [
            self.loadgen_bin, "relay", "--listen", "%s:17021" % ip["relay1"], "--to",
            "%s:17022" % ip["relay2"],
            "--tls-to", "%s,%s,%s" % (pki["client_cert"], pki["client_key"], pki["ca"]),
            "--max-seconds", str(self.o.max_seconds)])
        wait_until(lambda: port_open(ip["relay2"], 17022), 10, "TLS floor relay 2")
        wait_until(lambda: port_open(ip["relay1"], 17021), 10, "TLS floor relay 1")
        return Path("tlsfloor", "(t) TLS floor: 2 minimal relays, mTLS 1.3 between them, no HTTP/2",
                    "tcp", None, "%s:17021" % ip["relay1"], ip["client"], pids=[r1.pid, r2.pid])

    # -- load -----------------------------------------------------------------------------

    def loadgen(self, args, timeout):
        cmd = [self.loadgen_bin, "client"] + args + ["--timeout", str(int(timeout))]
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=timeout + 15, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BenchError("loadgen timed out: %s" % " ".join(cmd))
        if r.returncode != 0:
            raise BenchError("loadgen failed (%d): %s\n%s" % (r.returncode, " ".join(cmd),
                                                              r.stderr.decode(errors="replace")))
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    def throughput(self, path, nbytes, streams):
        cpu0 = sum(cpu_seconds(p) for p in path.pids)
        res = self.loadgen(["--mode", "throughput", "--bytes", str(nbytes),
                            "--streams", str(streams)] + path.args(), self.o.op_timeout)
        cpu = sum(cpu_seconds(p) for p in path.pids) - cpu0
        res["proxy_cpu_s_per_gib"] = cpu / (res["bytes"] / GiB)
        return res

    def pingpong(self, path, iters, warmup):
        return self.loadgen(["--mode", "pingpong", "--size", "1024", "--iters", str(iters),
                             "--warmup", str(warmup)] + path.args(), self.o.op_timeout)

    def measure_rss(self, path, node_a, node_b, conns):
        pids = {"node A": node_a.pid, "node B": node_b.pid}
        before = {k: rss_kib(p) for k, p in pids.items()}
        hold = self.procs.start("loadgen-hold", [
            self.loadgen_bin, "client", "--mode", "hold", "--conns", str(conns),
            "--hold-seconds", "120", "--timeout", "120"] + path.args(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready, _, _ = select.select([hold.stdout], [], [], 130)
        line = hold.stdout.readline() if ready else b""
        if not line:
            self.procs.stop(hold)
            raise BenchError("hold mode did not open %d connections: %s" % (conns, tail(hold.log_path)))
        opened = json.loads(line)
        time.sleep(1.0)
        during = {k: rss_kib(p) for k, p in pids.items()}
        hold.stdin.close()
        hold.wait(30)
        time.sleep(2.0)
        after = {k: rss_kib(p) for k, p in pids.items()}
        return {k: {"before": before[k], "during": during[k], "after_close": after[k],
                    "per_1000": (during[k] - before[k]) * 1000.0 / conns}
                for k in pids}, opened

    # -- the run --------------------------------------------------------------------------

    def run(self):
        o = self.o
        self.load_start = os.getloadavg()[0]
        self.bpf_seen |= cgroup_bpf_programs()
        log("temp dir %s, addresses %s.x" % (self.tmp, self.ip["client"].rsplit(".", 1)[0]))
        self.start_server()
        self.paths.append(Path("direct", "(a) direct TCP", "tcp", None, self.target,
                               self.ip["client"]))
        builds = [("sockmesh", "(b) sockmesh: SOCKS5 → A → HBONE → B", self.proxy_bin,
                   self.ip["admin_a"], self.ip["admin_b"], 15008)]
        if o.candidate_build:
            builds.append(("candidate", "(b′) candidate build %s" % o.candidate_build,
                           os.path.join(os.path.abspath(o.candidate_build), "userspace",
                                        "sockmesh-proxy"),
                           self.ip["admin_a2"], self.ip["admin_b2"], 15009))
        for key, label, binary, admin_a, admin_b, port in builds:
            a, b = self.start_sockmesh(key, binary, admin_a, admin_b, port)
            path = Path(key, label, "socks5", "%s:15080" % admin_a, self.target,
                        self.ip["client"], pids=[a.pid, b.pid])
            path.hbone_port = port
            self.paths.append(path)
            self.meshes.append((path, a, b))
        if o.small_frames_only:
            return self.run_small_frames()
        time.sleep(1.0)
        idle = {m[0].key: {"node A": rss_kib(m[1].pid), "node B": rss_kib(m[2].pid)}
                for m in self.meshes}
        pki = make_pki(self.tmp, o.server_name)
        if "nghttpx" in o.offshelf:
            self.paths.append(self.start_nghttpx_chain(pki))
        if "stunnel" in o.offshelf:
            self.paths.append(self.start_stunnel(pki))
        if o.reference:
            self.paths.append(self.start_socat_relays())
            self.paths.append(self.start_floor_relays())
            self.paths.append(self.start_tls_floor_relays(pki))

        rss, opened = {}, {}
        for path, a, b in self.meshes:
            log("RSS (%s): opening %d tunnelled connections through node A" % (path.key, o.conns))
            rss[path.key], opened[path.key] = self.measure_rss(path, a, b, o.conns)

        small = self.measure_small_frames(self.small_frame_servers(pki))

        log("warm-up")
        for p in self.paths:
            self.throughput(p, o.warmup_bytes, 1)
            self.pingpong(p, 200, 200)

        results = {p.key: {"single": [], "parallel": [], "pp": []} for p in self.paths}
        # Repetitions interleave the paths, so drift on the machine hits them all alike.
        for rep in range(o.reps):
            for p in self.paths:
                log("rep %d/%d %s: 1 stream x %d MiB" % (rep + 1, o.reps, p.key, o.single_bytes // MiB))
                results[p.key]["single"].append(self.throughput(p, o.single_bytes, 1))
            for p in self.paths:
                log("rep %d/%d %s: %d streams x %d MiB" % (rep + 1, o.reps, p.key, o.streams,
                                                           o.parallel_bytes // o.streams // MiB))
                results[p.key]["parallel"].append(self.throughput(p, o.parallel_bytes, o.streams))
            for p in self.paths:
                log("rep %d/%d %s: %d x 1 KiB round trips" % (rep + 1, o.reps, p.key, o.iters))
                results[p.key]["pp"].append(self.pingpong(p, o.iters, o.pp_warmup))
            self.bpf_seen |= cgroup_bpf_programs()
        for path, a, b in self.meshes:
            self.procs.check_alive(path.key + " node A", a)
            self.procs.check_alive(path.key + " node B", b)
        # A proxy hands free heap back once it has been idle for a few seconds (IdleTrimmer):
        # "idle after the run" is what it holds then, not in the middle of the last burst.
        log("idle for %d s before the last RSS reading" % IDLE_SETTLE_SECONDS)
        time.sleep(IDLE_SETTLE_SECONDS)
        idle_after = {m[0].key: {"node A": rss_kib(m[1].pid), "node B": rss_kib(m[2].pid)}
                      for m in self.meshes}
        text, raw = self.report(results, idle, idle_after, rss, opened)
        text += "\n" + "\n".join(self.small_frames_report(small)) + "\n"
        raw["small_frames"] = small
        return text, raw

    # -- small DATA frames ----------------------------------------------------------------

    def mesh_client_cert(self, path):
        """A certificate for the client workload from this mesh's own CA (node B's state dir),
        so that the h2frames client is a mesh peer as far as B can tell."""
        state = os.path.join(self.tmp, "sockmesh-state-" + path.key)
        d = os.path.join(self.tmp, "h2frames-" + path.key)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "client.ext"), "w") as f:
            f.write("subjectAltName=URI:spiffe://cluster.local/ns/bench/sa/client\n"
                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth,serverAuth\n"
                    "basicConstraints=critical,CA:FALSE\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", "client-key.pem", "-out", "client.csr", "-subj", "/O=bench client",
                cwd=d)
        openssl("x509", "-req", "-in", "client.csr", "-CA", os.path.join(state, "ca-cert.pem"),
                "-CAkey", os.path.join(state, "ca-key.pem"), "-CAcreateserial",
                "-out", "client-cert.pem", "-days", "2", "-extfile", "client.ext", cwd=d)
        return "%s,%s,%s" % (os.path.join(d, "client-cert.pem"), os.path.join(d, "client-key.pem"),
                             os.path.join(state, "ca-cert.pem"))

    def small_frame_servers(self, pki):
        """[(key, label, HTTP/2 server IP:PORT, --tls files, server pids)]: node B of each mesh,
        and nghttpx -s (with the tinyproxy behind it) when the nghttpx chain runs."""
        out = []
        for path, _, b in self.meshes:
            who = "sockmesh" if path.key == "sockmesh" else "candidate"
            out.append((path.key, who + " inbound (node B)",
                        "%s:%d" % (self.ip["server"], path.hbone_port),
                        self.mesh_client_cert(path), [b.pid]))
        for p in self.paths:
            if p.key == "nghttpx":
                out.append(("nghttpx", "nghttpx -s → tinyproxy",
                            "%s:15443" % self.ip["nghttpx_server"],
                            "%s,%s,%s" % (pki["client_cert"], pki["client_key"], pki["ca"]),
                            p.pids[1:]))  # nghttpx -s and tinyproxy, not the client nghttpx
        return out

    def measure_small_frames(self, servers):
        """Frames/s per server: medians of o.reps runs, the servers interleaved."""
        o = self.o
        runs = {key: [] for key, *_ in servers}
        for rep in range(o.reps + 1):  # the first round warms up and is not counted
            for key, _, addr, tls, pids in servers:
                if rep > 0:
                    log("rep %d/%d %s: %d DATA frames of %d bytes" % (rep, o.reps, key, o.frames,
                                                                      o.frame_bytes))
                frames = o.frames if rep > 0 else max(1000, o.frames // 10)
                cpu0 = sum(cpu_seconds(p) for p in pids)
                r = self.loadgen(["--mode", "h2frames", "--via", "h2", "--proxy", addr,
                                  "--tls", tls, "--target", self.target,
                                  "--bind", self.ip["client"], "--frames", str(frames),
                                  "--size", str(o.frame_bytes)], self.o.op_timeout)
                cpu = sum(cpu_seconds(p) for p in pids) - cpu0
                r["server_cpu_us_per_frame"] = cpu * 1e6 / frames
                if rep > 0:
                    runs[key].append(r)
        med = statistics.median
        return [{"key": key, "label": label,
                 "frames_per_s": med(r["frames_per_s"] for r in runs[key]),
                 "all": [r["frames_per_s"] for r in runs[key]],
                 "cpu_us_per_frame": med(r["server_cpu_us_per_frame"] for r in runs[key])}
                for key, label, *_ in servers]

    def small_frames_report(self, small):
        o = self.o
        ref = next((x for x in small if x["key"] == "nghttpx"), None)
        L = ["Small DATA frames: %d frames of %d bytes on one CONNECT stream over HTTP/2 and "
             "mutual TLS 1.3, sent straight to the HTTP/2 server by `sockmesh-loadgen --mode "
             "h2frames`, to a sink behind it; %s, servers interleaved. CPU is that of the server's "
             "processes (for nghttpx, tinyproxy's too). The client frames by hand and may itself "
             "be the limit of the fastest row; the CPU column is the server's cost either way." % (
                 o.frames, o.frame_bytes,
                 "medians of %d runs" % o.reps if o.reps > 1 else "one run"), "",
             "| HTTP/2 server | DATA frames/s | payload MB/s | server CPU µs/frame | vs nghttpx "
             "| runs |",
             "|---|---:|---:|---:|---:|---|"]
        for x in small:
            vs = times(x["frames_per_s"] / ref["frames_per_s"]) if ref else "—"
            L.append("| %s | %.0f | %.1f | %.2f | %s | %s |" % (
                x["label"], x["frames_per_s"], x["frames_per_s"] * o.frame_bytes / 1e6,
                x["cpu_us_per_frame"], vs, ", ".join("%.0f" % v for v in x["all"])))
        return L

    def run_small_frames(self):
        """--small-frames: only the small-frame row (sockmesh's node B and nghttpx -s)."""
        o = self.o
        pki = make_pki(self.tmp, o.server_name)
        self.paths.append(self.start_nghttpx_chain(pki))
        small = self.measure_small_frames(self.small_frame_servers(pki))
        for path, a, b in self.meshes:
            self.procs.check_alive(path.key + " node B", b)
        L = ["# sockmesh benchmark: small DATA frames", "",
             "%s · %s · %d CPUs · kernel %s · load average at start %.1f, at end %.1f" % (
                 datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), cpu_model(), os.cpu_count(),
                 platform.release(), self.load_start, os.getloadavg()[0]), ""]
        L += self.small_frames_report(small)
        L += ["", "nghttpx gets sockmesh's h2 windows (%d MiB stream, %d MiB connection) and %d "
              "worker(s); sockmesh runs with --log-level warn." % (
                  H2_STREAM_WINDOW // MiB, H2_CONNECTION_WINDOW // MiB, o.offshelf_workers)]
        return "\n".join(L) + "\n", {"small_frames": small}

    # -- report ---------------------------------------------------------------------------

    def report(self, results, idle, idle_after, rss, opened):
        o = self.o
        med = statistics.median

        def summary(key):
            r = results[key]
            return {
                "single": med(x["gbps"] for x in r["single"]),
                "single_all": [x["gbps"] for x in r["single"]],
                "single_cpu": med(x["proxy_cpu_s_per_gib"] for x in r["single"]),
                "parallel": med(x["gbps"] for x in r["parallel"]),
                "parallel_all": [x["gbps"] for x in r["parallel"]],
                "parallel_cpu": med(x["proxy_cpu_s_per_gib"] for x in r["parallel"]),
                "p50": med(x["p50_us"] for x in r["pp"]),
                "p99": med(x["p99_us"] for x in r["pp"]),
            }
        s = {p.key: summary(p.key) for p in self.paths}
        d = s["direct"]
        L = []
        L.append("# sockmesh benchmark")
        L.append("")
        L.append("%s · %s · %d CPUs · kernel %s · %s%s · load average at start %.1f, at end %.1f" % (
            datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), cpu_model(), os.cpu_count(),
            platform.release(), "quick run" if o.quick else "full run",
            " · sockmesh workers=%d" % o.workers if o.workers else "", self.load_start,
            os.getloadavg()[0]))
        L.append("")
        L.append("Single stream: %d MiB; parallel: %d streams × %d MiB; round trips: %d × 1 KiB "
                 "request + 1 KiB response on one connection (after %d warm-up). %s, paths "
                 "interleaved, all in this run on loopback." % (
                     o.single_bytes // MiB, o.streams, o.parallel_bytes // o.streams // MiB,
                     o.iters, o.pp_warmup,
                     "Medians of %d repetitions" % o.reps if o.reps > 1 else "One repetition"))
        L.append("")
        L.append("| path | 1 stream Gbit/s | vs direct | %d streams Gbit/s | vs direct | "
                 "1 KiB RTT p50 µs | p99 µs | p50 vs direct |" % o.streams)
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for p in self.paths:
            x = s[p.key]
            L.append("| %s | %.2f | %s | %.2f | %s | %.1f | %.1f | %s |" % (
                p.label, x["single"], pct(x["single"] / d["single"]), x["parallel"],
                pct(x["parallel"] / d["parallel"]), x["p50"], x["p99"], times(x["p50"] / d["p50"])))
        L.append("")
        L.append("| proxy | RSS idle MiB | RSS with %d tunnels MiB | RSS per 1,000 tunnels MiB | "
                 "after closing MiB | idle %d s after the run MiB |" % (o.conns, IDLE_SETTLE_SECONDS))
        L.append("|---|---:|---:|---:|---:|---:|")
        for path, _, _ in self.meshes:
            name = "sockmesh" if path.key == "sockmesh" else "candidate"
            for k in ("node A", "node B"):
                r = rss[path.key][k]
                L.append("| %s %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
                    name, k, idle[path.key][k] / 1024, r["during"] / 1024, r["per_1000"] / 1024,
                    r["after_close"] / 1024, idle_after[path.key][k] / 1024))
        L.append("")
        L.append("(%s; RSS is VmRSS from /proc/<pid>/status, on a freshly started proxy.)" % "; ".join(
            "%s: %d connections opened through A in %.2f s" % (k, v["conns"], v["open_seconds"])
            for k, v in opened.items()))
        L.append("")
        # Targets
        L.append("| target | measured | met |")
        L.append("|---|---:|:---:|")
        for mesh_key, who in (("sockmesh", "HBONE"), ("candidate", "candidate HBONE")):
            if mesh_key not in s:
                continue
            m = s[mesh_key]
            r = m["single"] / d["single"]
            L.append("| single-stream %s ≥ %d%% of direct TCP | %s | %s |" % (
                who, TARGET_SINGLE_VS_DIRECT * 100, pct(r), yes(r >= TARGET_SINGLE_VS_DIRECT)))
            for p in self.paths:
                if p.key in REFERENCE_KEYS + ("direct", "sockmesh", "candidate"):
                    continue
                x = s[p.key]
                for what, field in (("single-stream", "single"),
                                    ("%d-stream" % o.streams, "parallel")):
                    ratio = m[field] / x[field]
                    L.append("| %s %s ≥ %g× %s (%.2f Gbit/s) | %s | %s |" % (
                        what, who, TARGET_THROUGHPUT_VS_OFFSHELF, p.key, x[field], times(ratio),
                        yes(ratio >= TARGET_THROUGHPUT_VS_OFFSHELF)))
                ratio = m["p50"] / x["p50"]
                L.append("| 1 KiB RTT p50 %s < %g× %s (%.1f µs) | %s | %s |" % (
                    who, TARGET_RTT_VS_OFFSHELF, p.key, x["p50"], times(ratio),
                    yes(ratio < TARGET_RTT_VS_OFFSHELF)))
        if "floor" in s and "sockmesh" in s:
            # The two ratio targets, set against what relays with no HTTP/2 (and, but for (t), no
            # TLS) reach in the same run: a target a floor row misses cannot be met by adding
            # work to it.
            L.append("")
            L.append("The same ratios for the reference rows, which do no HTTP/2, and no TLS but "
                     "for the TLS floor:")
            L.append("")
            refs = [k for k in REFERENCE_KEYS if k in s]
            labels = {"relays": "socat relays", "floor": "floor relays",
                      "tlsfloor": "TLS floor relays"}
            L.append("| measure | target | sockmesh | %s |" % " | ".join(labels[k] for k in refs))
            L.append("|---|---:|---:|%s" % ("---:|" * len(refs)))
            L.append("| 1 stream vs direct TCP | ≥ %d%% | %s | %s |" % (
                TARGET_SINGLE_VS_DIRECT * 100, pct(s["sockmesh"]["single"] / d["single"]),
                " | ".join(pct(s[k]["single"] / d["single"]) for k in refs)))
            for p in self.paths:
                if p.key not in ("nghttpx", "stunnel"):
                    continue
                L.append("| 1 KiB RTT p50 vs %s | < %g× | %s | %s |" % (
                    p.key, TARGET_RTT_VS_OFFSHELF, times(s["sockmesh"]["p50"] / s[p.key]["p50"]),
                    " | ".join(times(s[k]["p50"] / s[p.key]["p50"]) for k in refs)))
        L.append("")
        L.append("Proxy CPU time (user+sys of every proxy process on the path) per GiB moved:")
        L.append("")
        L.append("| path | 1 stream CPU s/GiB | %d streams CPU s/GiB | 1 stream runs Gbit/s |" % o.streams)
        L.append("|---|---:|---:|---|")
        for p in self.paths:
            if p.key == "direct":
                continue
            x = s[p.key]
            L.append("| %s | %.2f | %.2f | %s |" % (p.label, x["single_cpu"], x["parallel_cpu"],
                                                   ", ".join("%.2f" % v for v in x["single_all"])))
        L.append("")
        L.append("Notes: off-the-shelf peers use TLS 1.3 with %s (as sockmesh prefers) and "
                 "client certificates; nghttpx gets sockmesh's h2 windows (%d MiB stream, %d MiB "
                 "connection) and %d worker(s). sockmesh runs with --log-level warn." % (
                     TLS13_CIPHER, H2_STREAM_WINDOW // MiB, H2_CONNECTION_WINDOW // MiB,
                     o.offshelf_workers))
        if o.reference:
            L.append("The reference rows are not targets: they show what two user-space relay "
                     "hops cost on this machine without HTTP/2. (r) is socat (128 KiB "
                     "buffers, one process per connection); (f) is `sockmesh-loadgen relay`, "
                     "which makes only the system calls every relay must (epoll_wait, one recv, "
                     "one send per message), so it is the floor for any proxy pair here. (t) is "
                     "the same relays with mutual TLS 1.3 (%s, OpenSSL %s) between them: one recv "
                     "takes many records, and the records of one write leave in one send. It is "
                     "the floor for any pair that does TLS in user space with this OpenSSL, "
                     "before HTTP/2 costs anything." % (TLS13_CIPHER, ssl.OPENSSL_VERSION.split()[1]))
        if self.bpf_seen:
            L.append("**Warning:** BPF programs were attached to cgroups during the run (%s); "
                     "they can redirect or slow loopback TCP, so these figures may not be "
                     "representative. Rerun when none are loaded." % ", ".join(sorted(self.bpf_seen)))
        if os.cpu_count() <= 2 or self.load_start > os.cpu_count():
            L.append("Every path runs client, proxies and server on the same %d CPUs; a load "
                     "average above %d means other work shared them, so compare rows of this run "
                     "only." % (os.cpu_count(), os.cpu_count()))
        text = "\n".join(L) + "\n"
        raw = {"results": results, "summary": s, "rss": rss, "idle": idle,
               "idle_after": idle_after, "opened": opened}
        return text, raw

    def cleanup(self):
        self.procs.stop_all()
        if self.o.keep_tmp:
            log("kept %s" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def pct(x):
    return "%.0f%%" % (x * 100)


def times(x):
    return "%.2f×" % x


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller transfers, one repetition")
    ap.add_argument("--build-dir", default=os.environ.get("SOCKMESH_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "latest.md"))
    ap.add_argument("--reps", type=int)
    ap.add_argument("--conns", type=int, default=1000, help="tunnels held open for the RSS figure")
    ap.add_argument("--workers", type=int, default=0, help="sockmesh --workers (0: its default)")
    ap.add_argument("--offshelf", default="nghttpx,stunnel",
                    help="comma list of off-the-shelf paths: nghttpx, stunnel (or empty)")
    ap.add_argument("--offshelf-workers", type=int, default=2, help="nghttpx --workers")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the reference rows (two socat relays; two minimal loadgen relays, "
                         "without and with TLS)")
    ap.add_argument("--candidate-build", default="",
                    help="also run the sockmesh-proxy of this build dir as row (b′), same run")
    ap.add_argument("--keep-tmp", action="store_true", help="keep configs and logs")
    ap.add_argument("--server-name", default="offshelf.bench.local")
    ap.add_argument("--small-frames", dest="small_frames_only", action="store_true",
                    help="only the small-DATA-frame row: frames/s into sockmesh's inbound and "
                         "into nghttpx -s (table in bench/results/small-frames.md)")
    ap.add_argument("--frames", type=int, help="DATA frames per small-frame run")
    ap.add_argument("--frame-bytes", type=int, default=16, help="bytes per small DATA frame")
    o = ap.parse_args(argv)
    if o.small_frames_only and o.out == os.path.join(ROOT, "bench", "results", "latest.md"):
        o.out = os.path.join(ROOT, "bench", "results", "small-frames.md")
    o.frames = o.frames or (1000000 if o.quick else 4000000)
    o.offshelf = [x for x in o.offshelf.split(",") if x]
    if o.quick:
        o.single_bytes, o.parallel_bytes, o.iters, o.pp_warmup = 256 * MiB, 512 * MiB, 3000, 300
        o.warmup_bytes = 32 * MiB
        o.reps = o.reps or 1
    else:
        o.single_bytes, o.parallel_bytes, o.iters, o.pp_warmup = GiB, 2 * GiB, 10000, 1000
        o.warmup_bytes = 128 * MiB
        o.reps = o.reps or 3
    o.streams = 8
    o.op_timeout = 180
    o.max_seconds = 1800
    return o


def main(argv):
    o = parse_args(argv)
    # Many sockets in the RSS step: raise our (and so the children's) descriptor limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    return run_bench(lambda: Bench(o), o.out, "benchmark")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
