#!/usr/bin/python3
"""sockmesh under load and faults (run through `scripts/bench --faults`; needs root).

On the simulated two-node cluster of scripts/lib/cluster.py (demo topology: shop/client and
shop/echo-a on node-a, shop/echo-b on node-b, service echo 10.96.0.20:80 -> echo-b:8080):

  tunnels  N concurrent tunnels client -> echo-b (across nodes, through node-a's and node-b's
           proxies), all opened by one `sockmesh-loadgen client --mode hold` and held; while
           they are held, a podapp client opens more (the proxies must keep accepting). Reads
           each proxy's RSS before and after: (after - before) / N is the figure per tunnel.
           Counts the HBONE connections the tunnels share (the per-source cap of OPERATING 5.3
           must stay far away) and the refusals in the metrics (must stay 0).
  kill     kill -9 loops under traffic: node-a's proxy, node-a's agent, and the loader (a
           `sockmesh-loader install`, killed part-way: in odd rounds beside the running agent,
           in even ones on a node whose datapath was uninstalled, the agent started again
           after). Each round waits a random, seeded delay, kills, restarts, and times the
           window until a new connection from the client pod succeeds again (a prober in the
           pod connects every 20 ms with a 250 ms connect timeout, which is also the traffic). A quarter of the proxy and agent rounds (seeded) kill the new
           process again while it starts. Checks: the window, BPF programs, maps and pins
           before/after, and the descriptors and RSS of the processes that were not killed.
           Then an upgrade: a second proxy started beside the running one (SO_REUSEPORT
           hand-over, OPERATING 6.4), the old one SIGTERMed; no established stream may break.
  disk     (run in a private mount namespace, `unshare -m`) the agent's run dir on a small
           tmpfs that is filled, then made read-only; the CA state dir full and read-only. A
           clear error in the log, the data path keeps serving, nothing half-written is left.

Every loop is bounded in count and time. Prints a table per scenario and writes them to
bench/results/faults.md. --quick: 1,000 tunnels, 3 rounds per component.
"""
import argparse
import datetime
import json
import os
import random
import resource
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import cluster as lib  # noqa: E402

PYTHON = "/usr/bin/python3"
LOAD_PORT = 9000  # the loadgen server in echo-b (hold mode)
APP_PORT = lib.APP_PORT
MiB = 1 << 20


class FaultError(Exception):
    pass


def log(msg):
    sys.stderr.write("[faults %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


# ---- what the machine says about a process and about BPF ----------------------------------

def proc_field(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_kib(pid):
    return proc_field(pid, "VmRSS")


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def fd_kinds(pid):
    """The process's descriptors by kind: socket, anon_inode:bpf-map, a file's path..."""
    out = []
    d = "/proc/%d/fd" % pid
    for fd in os.listdir(d):
        try:
            t = os.readlink(os.path.join(d, fd))
        except OSError:
            continue
        out.append(re.sub(r":\[\d+\]$", "", t))
    return sorted(out)


def bpf_counts(pin_roots):
    """Programs and maps in the kernel (all of them: nothing else may load or unload BPF
    objects meanwhile; under ctest the suite is RUN_SERIAL for that), and files pinned under
    the cluster's pin roots."""
    progs = json.loads(lib.run(["bpftool", "-j", "prog", "show"]) or "[]")
    maps = json.loads(lib.run(["bpftool", "-j", "map", "show"]) or "[]")
    pins = []
    for r in pin_roots:
        for dirpath, _, files in os.walk(r):
            pins += [os.path.relpath(os.path.join(dirpath, f), r) for f in files]
    return {"progs": sorted("%s:%s" % (p.get("type"), p.get("name")) for p in progs),
            "maps": sorted("%s:%s" % (m.get("type"), m.get("name")) for m in maps),
            "pins": sorted(pins)}


def held_map_ids(pid):
    """The ids of the BPF maps the process holds descriptors of."""
    ids = set()
    d = "/proc/%d/fd" % pid
    for fd in os.listdir(d):
        try:
            if os.readlink(os.path.join(d, fd)) != "anon_inode:bpf-map":
                continue
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                m = re.search(r"^map_id:\s*(\d+)", f.read(), re.M)
        except OSError:
            continue
        if m:
            ids.add(int(m.group(1)))
    return ids


def pinned_map_ids(pin_root):
    """{map id: pinned path} of the maps pinned under pin_root."""
    out = {}
    for dirpath, _, files in os.walk(pin_root):
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                info = json.loads(lib.run(["bpftool", "-j", "map", "show", "pinned", path]))
            except (lib.ClusterError, ValueError):
                continue  # a program or link
            out[info["id"]] = "%s (%s)" % (os.path.relpath(path, pin_root), info.get("name"))
    return out


def extra(after, before):
    """What after has more of than before (multisets of names)."""
    left = list(before)
    out = []
    for x in after:
        if x in left:
            left.remove(x)
        else:
            out.append(x)
    return out


def leftover_temp_files(dirs):
    out = []
    for d in dirs:
        for dirpath, _, files in os.walk(d):
            out += [os.path.join(dirpath, f) for f in files if ".tmp" in f]
    return out


# ---- the prober: runs in the client pod ------------------------------------------------------

def probe_main(argv):
    """faults.py probe --target IP:PORT [--interval S] [--max-seconds S]: one short connection
    to a podapp server every interval (greeting, 5 bytes echoed, close); prints "ok T" or
    "fail T reason" per attempt (T: time.time())."""
    p = argparse.ArgumentParser(prog="faults.py probe")
    p.add_argument("--target", required=True)
    p.add_argument("--interval", type=float, default=0.02)
    # A connect() whose SYN was dropped (no proxy) waits this long: the window's resolution.
    p.add_argument("--timeout", type=float, default=0.25)
    p.add_argument("--max-seconds", type=float, default=900)
    a = p.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    end = time.monotonic() + a.max_seconds
    while time.monotonic() < end:
        t = time.time()
        try:
            with socket.create_connection((host, int(port)), timeout=a.timeout) as s:
                f = s.makefile("rb")
                if not f.readline().endswith(b"\n"):
                    raise OSError("no greeting")
                s.sendall(b"ping\n")
                got = b""
                while len(got) < 5:
                    chunk = s.recv(5 - len(got))
                    if not chunk:
                        raise OSError("eof")
                    got += chunk
                if got != b"ping\n":
                    raise OSError("bad echo")
            print("ok %.3f" % t, flush=True)
        except OSError as e:
            print("fail %.3f %s" % (t, type(e).__name__), flush=True)
        time.sleep(a.interval)
    return 0


def probe_events(proc):
    out = []
    for line in proc.log().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("ok", "fail"):
            try:
                out.append((parts[0] == "ok", float(parts[1])))
            except ValueError:
                pass
    return out


def first_ok_after(proc, t, timeout):
    """Seconds from t to the first successful probe that started after t."""
    def found():
        for ok, at in probe_events(proc):
            if ok and at >= t:
                return at - t + 1e-6
        if not proc.alive():
            raise FaultError("the prober exited: %s" % proc.log()[-500:])
        return None
    return lib.wait_until("a new connection to succeed", found, timeout, 0.05)


# ---- the scenarios ---------------------------------------------------------------------------

class Faults:
    def __init__(self, o):
        self.o = o
        self.rng = random.Random(o.seed)
        self.tables = []
        self.failures = []
        self.c = None

    def check(self, cond, what):
        if not cond:
            self.failures.append(what)
            log("FAIL: " + what)
        return cond

    def cluster(self, work=None, drain_timeout_ms=3000):
        log("cluster: two nodes, agents, proxies, demo topology")
        c = lib.Cluster(log=lambda m: log("  " + m), work=work, drain_timeout_ms=drain_timeout_ms)
        self.c = c
        c.up()
        self.pods = lib.demo_topology(c)
        self.a, self.b = c.node("node-a"), c.node("node-b")
        self.client = self.pods["client"]
        return c

    def close(self):
        if self.c:
            try:
                self.c.close()
            finally:
                self.c = None

    def node_pins(self):
        return [n.pin_root for n in self.c.nodes]

    def talk(self, target, conns=1, size=4096, timeout=10):
        r = self.client.client(target, "--conns", conns, "--bytes", size, "--timeout", timeout,
                               timeout=timeout * 5 + 10)
        return r

    # -- 1: many tunnels --------------------------------------------------------------------

    def tunnels(self, n):
        c = self.c
        echo_b = self.pods["echo-b"]
        # All the tunnels come from one client address: each needs an ephemeral port of the
        # client pod (node-b's proxy connects to the app from the same address and port).
        lo, hi = map(int, self.client.sh(["cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                                         in_cgroup=False).split())
        if n > (hi - lo + 1) - 1000:
            raise FaultError("%d tunnels from one client address need more ephemeral ports than "
                             "%d-%d leaves; use fewer" % (n, lo, hi))
        loadgen = c.binary("sockmesh-loadgen")
        srv = echo_b.spawn("loadgen-server", [loadgen, "server", "--listen",
                                              "0.0.0.0:%d" % LOAD_PORT, "--netns-only", "yes",
                                              "--max-seconds", "1800"])
        lib.wait_until("loadgen server", lambda: (":%d " % LOAD_PORT) in echo_b.sh(
            ["ss", "-Hltn"]) or not srv.alive(), 15)
        self.talk("%s:%d" % (echo_b.ip, APP_PORT))  # the pool's connection and certificates
        time.sleep(2.5)  # the proxies trim their heaps after 2 s without connections
        before = {n_.name: rss_kib(n_.proxy.pid) for n_ in c.nodes}
        fds0 = {n_.name: fd_count(n_.proxy.pid) for n_ in c.nodes}
        # Hold mode closes its tunnels when its stdin closes: a pipe we keep open.
        cmd = ["sh", "-c", "echo $$ > %s/cgroup.procs && exec nsenter --net=%s "
               "%s client --mode hold --target %s:%d --conns %d --timeout %d --hold-seconds %d "
               "--netns-only yes" % (self.client.cgroup, self.client.netns_path, loadgen,
                                     echo_b.ip, LOAD_PORT, n, self.o.op_timeout,
                                     self.o.op_timeout + 300)]
        t0 = time.monotonic()
        hold = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        row = {"tunnels": n}
        try:
            line = ""
            deadline = time.monotonic() + self.o.op_timeout + 30
            while time.monotonic() < deadline:
                line = hold.stdout.readline()
                if not line or line.startswith("{"):
                    break
            report = json.loads(line) if line.startswith("{") else {"error": line.strip()}
            row["open_s"] = report.get("open_seconds")
            ok = self.check(report.get("conns") == n, "tunnels: %d opened, not %d: %s (%s)" % (
                report.get("conns", 0), n, report, hold.stdout.read()[-1000:]
                if report.get("conns") != n else ""))
            if ok:
                # Still all open at the server's end (node-b's proxy -> the app).
                held = len([ln for ln in echo_b.sh(
                    ["ss", "-Htn", "state", "established", "( sport = :%d )" % LOAD_PORT],
                    in_cgroup=False).splitlines() if ln.strip()])
                row["held_at_server"] = held
                self.check(held >= n, "tunnels: %d of %d held tunnels reach the server" % (
                    held, n))
                # All held: the proxies must still take new ones.
                r = self.talk("%s:%d" % (echo_b.ip, APP_PORT), conns=50, size=16384)
                row["new_while_held"] = "%d/50" % (50 - r["failed"])
                self.check(r["ok"], "tunnels: new connections while %d are held: %s" % (n, r))
                r = self.talk("%s:80" % lib.ECHO_VIP, conns=20, size=16384)
                self.check(r["ok"], "tunnels: via the VIP while held: %s" % r)
                hbone = len([ln for ln in echo_b.sh(
                    ["ss", "-Htn", "state", "established", "( sport = :15008 )"]).splitlines()
                    if ln.strip()])
                row["hbone_conns"] = hbone
                self.check(hbone < 2048 // 4, "tunnels: %d HBONE connections for %d tunnels "
                           "(per-source cap 2048)" % (hbone, n))
                after = {n_.name: rss_kib(n_.proxy.pid) for n_ in c.nodes}
                fds1 = {n_.name: fd_count(n_.proxy.pid) for n_ in c.nodes}
                for name in before:
                    per = (after[name] - before[name]) * 1024.0 / n
                    row["%s_rss_mib" % name] = "%.1f -> %.1f" % (before[name] / 1024.0,
                                                                  after[name] / 1024.0)
                    row["%s_kib_per_tunnel" % name] = round(per / 1024.0, 2)
                    row["%s_fds" % name] = "%d -> %d" % (fds0[name], fds1[name])
                    self.check(per <= self.o.per_tunnel_kib * 1024,
                               "tunnels: %s proxy used %.1f KiB per tunnel, over the documented "
                               "%d KiB" % (name, per / 1024.0, self.o.per_tunnel_kib))
                m = self.b.metrics()
                refused = lib.metric_value(m, "sockmesh_hbone_connections_refused_total")
                row["refused"] = int(refused)
                self.check(refused == 0, "tunnels: node-b refused %d HBONE connections" % refused)
        finally:
            try:
                hold.stdin.close()
                hold.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                hold.kill()
                hold.wait(10)
        row["total_s"] = round(time.monotonic() - t0, 1)
        # Once they are closed, the proxies serve as before.
        r = self.talk("%s:%d" % (echo_b.ip, APP_PORT))
        self.check(r["ok"], "tunnels: after closing them all: %s" % r)
        srv.stop(signal.SIGKILL)
        self.tables.append(("tunnels", [row]))
        return row

    # -- 2: kill -9 loops -------------------------------------------------------------------

    def start_probes(self):
        p = self.client.spawn("probe-%d" % len(self.client.processes), [
            PYTHON, os.path.abspath(__file__), "probe", "--target", "%s:80" % lib.ECHO_VIP,
            "--max-seconds", str(self.o.max_seconds)])
        first_ok_after(p, time.time() - 1, 20)
        return p

    def survivors(self, component):
        a = self.a
        procs = {"proxy": [("agent-a", a.agent), ("proxy-b", self.b.proxy)],
                 "agent": [("proxy-a", a.proxy), ("proxy-b", self.b.proxy)],
                 "loader": [("agent-a", a.agent), ("proxy-a", a.proxy)]}[component]
        return {name: (fd_count(p.pid), rss_kib(p.pid), fd_kinds(p.pid)) for name, p in procs}

    def kill_proxy_once(self, early):
        a = self.a
        a.proxy.popen.send_signal(signal.SIGKILL)
        killed = time.time()
        a.proxy.popen.wait(10)
        a.start_proxy(wait=False)
        if early is not None:  # again, while it starts
            time.sleep(early)
            a.proxy.popen.send_signal(signal.SIGKILL)
            a.proxy.popen.wait(10)
            a.start_proxy(wait=False)
        return killed

    def kill_agent_once(self, early):
        a = self.a
        a.agent.popen.send_signal(signal.SIGKILL)
        killed = time.time()
        a.agent.popen.wait(10)
        a.start_agent(wait=early is None)
        if early is not None:
            time.sleep(early)
            a.agent.popen.send_signal(signal.SIGKILL)
            a.agent.popen.wait(10)
            a.start_agent(wait=True)
        return killed

    def kill_loader_once(self, delay, fresh):
        """`sockmesh-loader install` killed delay s after it started: beside the running agent
        (an idempotent re-install), or, fresh, on a node whose datapath was uninstalled (the
        agent stopped first, as an upgrade that changes the maps does), so that the kill
        lands while pins are being made. Then what the agent's next start does: install to
        the end (fresh: the agent is started again, installs and re-enrolls its pods)."""
        a = self.a
        argv = [self.c.binary("sockmesh-loader"), "--pin-root", a.pin_root, "install",
                "--cgroup", a.cgroup]
        if fresh:
            a.agent.popen.send_signal(signal.SIGKILL)
            a.agent.popen.wait(10)
            a.loader("uninstall", "--force")
        p = lib.Process("loader-install", argv, netns=a.netns_path,
                        log_path=os.path.join(a.dir, "loader-install.log"))
        time.sleep(delay)
        p.popen.send_signal(signal.SIGKILL)
        killed = time.time()
        code = p.popen.wait(10)
        if fresh:
            a.start_agent(wait=True)
        else:
            out = lib.run(argv, timeout=30, check=False)
            self.check("installed" in out or "attached" in out or "pinned" in out,
                       "loader: the install after a kill failed: %s" % out[-500:])
        return killed, code == -signal.SIGKILL

    def kill_loop(self, component, rounds):
        log("kill -9 loop: %s, %d rounds (seed %d)" % (component, rounds, self.o.seed))
        probe = self.start_probes()
        bpf0 = bpf_counts(self.node_pins())
        first = None
        windows, rows = [], []
        landed_count = 0
        t_loop = time.monotonic()
        for i in range(rounds):
            if time.monotonic() - t_loop > self.o.max_seconds / 3:
                self.check(False, "%s: loop over its time budget after %d rounds" % (component, i))
                break
            delay = round(self.rng.uniform(0.0, 2.0), 3)
            early = round(self.rng.uniform(0.0, 0.5), 3) if (
                component != "loader" and self.rng.random() < 0.25) else None
            time.sleep(delay)
            if component == "proxy":
                killed = self.kill_proxy_once(early)
            elif component == "agent":
                killed = self.kill_agent_once(early)
            else:
                fresh = i % 2 == 1
                early = round(self.rng.uniform(0.0, 0.25 if fresh else 0.1), 3)
                killed, landed = self.kill_loader_once(early, fresh)
                landed_count += landed
            try:
                w = first_ok_after(probe, killed, self.o.window_limit + 10)
            except lib.ClusterError:
                w = None
            if component == "proxy":
                self.a.wait_proxy_ready(30)
            ok = self.check(w is not None and w <= self.o.window_limit,
                            "%s round %d: no new connection within %.1f s of the kill (%s)" % (
                                component, i + 1, self.o.window_limit, w))
            windows.append(w if w is not None else float("inf"))
            status = self.a.loader("status")
            listeners = status.count("outbound (15001)")
            self.check(listeners == 2, "%s round %d: %d pods of node-a have their outbound "
                       "listener registered, not 2:\n%s" % (component, i + 1, listeners, status))
            # The same use before every reading: connections to both nodes from each of the
            # client's flows, so that every worker's pooled HBONE connection exists, the new
            # proxy's and the old one's replaced (a count taken after fewer would differ by
            # the pool, not by a leak).
            r = self.talk("%s:80" % lib.ECHO_VIP, conns=8)
            self.check(r["ok"], "%s round %d: traffic after the restart: %s" % (
                component, i + 1, r))
            time.sleep(0.3)
            now = self.survivors(component)
            if first is None:
                first = now
            if component == "loader":
                rows.append({"round": i + 1, "delay_s": delay,
                             "install": "fresh" if fresh else "beside the agent",
                             "killed_at_s": early, "landed": "yes" if landed else "(it had ended)",
                             "window_s": round(w, 3) if w is not None else "none", "ok": ok})
            else:
                rows.append({"round": i + 1, "delay_s": delay,
                             "again_at_s": early if early is not None else "",
                             "window_s": round(w, 3) if w is not None else "none", "ok": ok})
            rows[-1]["survivors fds/RSS MiB"] = ", ".join(
                "%s %d/%.1f" % (name, v[0], v[1] / 1024.0) for name, v in sorted(now.items()))
            log("  round %d: delay %.3f s%s, new connection after %s s" % (
                i + 1, delay, " (again %.3f s into its start)" % early if early is not None
                else "", "%.3f" % w if w is not None else "never"))
        # Settle: the restarted processes finish their start, and the kernel frees the objects
        # of what died (map and program frees are deferred work): up to 10 s for the counts to
        # come back; what is still there after that is a leak.
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.5)
            bpf1 = bpf_counts(self.node_pins())
            if all(len(bpf1[k]) == len(bpf0[k]) for k in bpf0) or time.monotonic() > deadline:
                break
        for k in bpf0:
            self.check(len(bpf1[k]) == len(bpf0[k]),
                       "%s: BPF %s %d before the loop, %d after (more: %s; fewer: %s)" % (
                           component, k, len(bpf0[k]), len(bpf1[k]), extra(bpf1[k], bpf0[k]),
                           extra(bpf0[k], bpf1[k])))
        last = self.survivors(component)
        growth = []
        for name in first:
            dfd, drss = last[name][0] - first[name][0], last[name][1] - first[name][1]
            growth.append("%s fds %+d rss %+.1f MiB" % (name, dfd, drss / 1024.0))
            self.check(dfd <= 2, "%s: %s's descriptors grew by %d over the rounds: %s" % (
                component, name, dfd, extra(last[name][2], first[name][2])))
            if dfd > 0:
                log("  %s: descriptors first round -> last: +%s -%s" % (
                    name, extra(last[name][2], first[name][2]),
                    extra(first[name][2], last[name][2])))
            self.check(drss <= 8 * 1024, "%s: %s's RSS grew by %.1f MiB over the rounds" % (
                component, name, drss / 1024.0))
        # The processes that were not killed use the maps pinned now, not ones a reinstall
        # replaced (those would be kept alive by them, and no longer be what tc reads).
        pinned = pinned_map_ids(self.a.pin_root)
        all_maps = {m["id"]: m.get("name") for m in json.loads(
            lib.run(["bpftool", "-j", "map", "show"]) or "[]")}
        for name, p in (("agent-a", self.a.agent), ("proxy-a", self.a.proxy)):
            stale = sorted(i for i in held_map_ids(p.pid) if i not in pinned)
            self.check(not stale, "%s: %s holds BPF maps that are no longer pinned: %s" % (
                component, name, ["%d (%s)" % (i, all_maps.get(i)) for i in stale]))
        tmp = leftover_temp_files([self.a.run_dir, self.c.ca_dir])
        self.check(not tmp, "%s: temporary files left behind: %s" % (component, tmp))
        probe.stop(signal.SIGKILL)
        fails = sum(1 for ok, _ in probe_events(probe) if not ok)
        total = len(probe_events(probe))
        finite = sorted(w for w in windows if w != float("inf"))
        summary = {"component": component, "rounds": len(rows),
                   "window_p50_s": round(finite[len(finite) // 2], 3) if finite else "none",
                   "window_max_s": round(max(windows), 3) if windows else "none",
                   "probes_failed": "%d/%d" % (fails, total),
                   "bpf progs/maps/pins": "%d/%d/%d -> %d/%d/%d" % (
                       len(bpf0["progs"]), len(bpf0["maps"]), len(bpf0["pins"]),
                       len(bpf1["progs"]), len(bpf1["maps"]), len(bpf1["pins"])),
                   "survivors first->last round": "; ".join(growth)}
        if component == "loader":
            summary["rounds"] = "%d (%d killed mid-install)" % (len(rows), landed_count)
        self.tables.append(("kill -9 %s (seed %d)" % (component, self.o.seed), rows))
        return summary

    def upgrade(self):
        """A second proxy beside the running one (the chart's surge), then SIGTERM to the old:
        established streams that end within the drain deadline must all complete."""
        a, c = self.a, self.c
        log("upgrade: a second proxy on node-a, then SIGTERM to the first")
        old = a.proxy
        probe = self.start_probes()  # new connections all through the hand-over
        # Streams that end within the drain deadline (the cluster's: 3 s): a drain cuts the
        # ones that outlast it, by design (tests/e2e/test_cluster_failures.py).
        streams = [self.client.client_process("up-%d" % i, target, "--stream-seconds", 2,
                                              "--timeout", 10)
                   for i, target in enumerate(["%s:80" % lib.ECHO_VIP,
                                               "%s:%d" % (self.pods["echo-a"].ip, APP_PORT)] * 3)]
        lib.wait_until("the streams to start", lambda: all(
            "accepted from %s" % self.client.ip in p.processes[0].log()
            for p in (self.pods["echo-a"], self.pods["echo-b"])), 10)
        argv = list(old.argv)
        for flag, port in (("--admin", "127.0.0.1:25000"), ("--metrics", "0.0.0.0:25020"),
                           ("--readiness", "0.0.0.0:25021")):
            argv[argv.index(flag) + 1] = port
        new = lib.Process("proxy-new", argv, netns=a.netns_path, cgroup=a.proxy_cgroup,
                          log_path=os.path.join(a.dir, "proxy-upgrade.log"))
        t0 = time.time()
        lib.wait_until("the new proxy to be ready", lambda: a.http(
            "127.0.0.1:25021", "/healthz/ready", check=False) == "ready\n" or not new.alive(), 20)
        self.check(new.alive(), "upgrade: the new proxy exited: %s" % new.log()[-2000:])
        ready = time.time() - t0
        old.send(signal.SIGTERM)
        code = old.popen.wait(c.drain_timeout_ms / 1000.0 + 10)
        broken = []
        for s in streams:
            deadline = time.monotonic() + 30
            while s.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            line = (s.log().strip().splitlines() or ["{}"])[-1]
            try:
                r = json.loads(line)
            except ValueError:
                r = {"ok": False, "errors": [line]}
            if not r.get("ok"):
                broken.append(r)
        self.check(not broken, "upgrade: %d established stream(s) broke: %s" % (
            len(broken), broken[:2]))
        t_end = time.time()
        a.proxy = new  # the cluster stops it at close
        r = self.talk("%s:80" % lib.ECHO_VIP, conns=10)
        self.check(r["ok"], "upgrade: new connections through the new proxy: %s" % r)
        probe.stop(signal.SIGKILL)
        during = [ok for ok, at in probe_events(probe) if t0 <= at <= t_end]
        failed = during.count(False)
        self.check(during and failed == 0, "upgrade: %d of %d new connections failed during "
                   "the hand-over" % (failed, len(during)))
        row = {"streams": len(streams), "broken": len(broken), "new_ready_s": round(ready, 2),
               "old_exit": code, "new_conns_during_handover": "%d/%d ok" % (
                   len(during) - failed, len(during)), "new_connections_after_ok": r["ok"]}
        self.tables.append(("upgrade hand-over (SO_REUSEPORT)", [row]))
        return row

    # -- 3: disk full, read-only ------------------------------------------------------------

    def disk(self):
        if not os.environ.get("SOCKMESH_FAULTS_PRIVATE_MOUNTS"):
            raise FaultError("the disk scenario must run in a private mount namespace "
                             "(faults.py re-executes itself under unshare -m)")
        work = os.path.join("/tmp", "%s-%d-faultsdisk" % (lib.PREFIX, os.getpid()))
        run_a = os.path.join(work, "node-a", "run")
        os.makedirs(run_a, exist_ok=True)
        lib.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "faults-run", run_a])
        rows = []
        try:
            self.cluster(work=work)
            a = self.a
            rows.append(self.disk_agent(a, run_a))
            rows.append(self.disk_ca())
        finally:
            self.close()
            lib.run(["umount", "-l", run_a], check=False)
            shutil.rmtree(work, ignore_errors=True)
        self.tables.append(("disk full / read-only", rows))
        return rows

    def agent_warnings(self, since):
        return [ln for ln in self.a.agent.log()[since:].splitlines() if " warn " in ln
                or "warn" in ln.split()[:3]]

    def disk_agent(self, a, run_a):
        c = self.c
        row = {"case": "agent run dir: full, then read-only"}
        records = os.path.join(run_a, "agent-pods.json")
        good = open(records).read()
        # Full: a filler takes what is left of the tmpfs.
        filler = os.path.join(run_a, "filler")
        lib.run(["sh", "-c", "dd if=/dev/zero of=%s bs=4k 2>/dev/null; true" % filler])
        mark = len(a.agent.log())
        newpod = c.add_pod("node-a", "shop", "full-1", "client")
        newpod.serve(APP_PORT)
        warns = self.agent_warnings(mark)
        self.check(any("saving pod records" in w and "No space left on device" in w
                       for w in warns),
                   "disk: the agent did not say that its run dir is full: %s" % warns)
        row["full_log"] = next((w.split(" ", 2)[-1] for w in warns
                                if "saving pod records" in w), "")
        r = self.talk("%s:%d" % (newpod.ip, APP_PORT))
        self.check(r["ok"], "disk: the data path stopped with the run dir full: %s" % r)
        r = self.talk("%s:80" % lib.ECHO_VIP)
        self.check(r["ok"], "disk: cross-node traffic stopped with the run dir full: %s" % r)
        self.check(open(records).read() == good or json.loads(open(records).read()),
                   "disk: agent-pods.json was damaged")
        tmp = leftover_temp_files([run_a])
        self.check(not tmp, "disk: half-written files left in the run dir: %s" % tmp)
        # A restart while it is full: the agent starts (its sockets need no blocks), says that
        # it cannot save, and serves; a pod added now is enrolled.
        a.agent.popen.send_signal(signal.SIGKILL)
        a.agent.popen.wait(10)
        a.start_agent(wait=True)
        self.check("saving pod records" in a.agent.log() and "No space left" in a.agent.log(),
                   "disk: the agent restarted on a full run dir did not say so")
        newpod3 = c.add_pod("node-a", "shop", "full-2", "client")
        newpod3.serve(APP_PORT)
        r = self.talk("%s:%d" % (newpod3.ip, APP_PORT))
        self.check(r["ok"], "disk: a pod added after a restart on a full run dir: %s" % r)
        row["restart_when_full"] = "started, pod enrolled" if r["ok"] else "failed"
        os.unlink(filler)
        # Read-only: a read-only bind mount on top (the agent keeps its lock file open for
        # writing, so the tmpfs itself cannot be remounted read-only).
        lib.run(["mount", "--bind", run_a, run_a])
        lib.run(["mount", "-o", "remount,bind,ro", run_a])
        mark = len(a.agent.log())
        newpod2 = c.add_pod("node-a", "shop", "ro-1", "client")
        newpod2.serve(APP_PORT)
        warns = self.agent_warnings(mark)
        self.check(any("saving pod records" in w and "Read-only file system" in w
                       for w in warns),
                   "disk: the agent did not say that its run dir is read-only: %s" % warns)
        r = self.talk("%s:%d" % (newpod2.ip, APP_PORT))
        self.check(r["ok"], "disk: the data path stopped with the run dir read-only: %s" % r)
        # A restart on the read-only dir: a clear refusal.
        a.agent.popen.send_signal(signal.SIGKILL)
        a.agent.popen.wait(10)
        try:
            a.start_agent(wait=True)
            self.check(False, "disk: the agent started on a read-only run dir")
        except lib.ClusterError as e:
            text = str(e)
            row["ro_start"] = next((ln.split(" ", 2)[-1] for ln in text.splitlines()
                                    if "Read-only" in ln), text[-200:])
            self.check("Read-only file system" in text,
                       "disk: the agent's refusal to start does not say why: %s" % text[-500:])
        r = self.talk("%s:%d" % (newpod2.ip, APP_PORT))
        self.check(r["ok"], "disk: the data path stopped with the agent down: %s" % r)
        # Writable again: the next start reads back only whole files, and adopts the pods
        # whose records it could not write.
        lib.run(["umount", run_a])
        a.start_agent(wait=True)
        log_text = a.agent.log()
        for p in (newpod, newpod2, newpod3):
            # Its records could not be written: adopted from the workload map, by uid.
            self.check("adopted enrolled pod %s" % p.uid in log_text,
                       "disk: the restarted agent did not adopt %s" % p)
        self.check("ignoring unreadable pod records" not in log_text,
                   "disk: the agent found its records unreadable after the faults")
        rec = json.loads(open(records).read())
        names = sorted(p["uid"] for p in rec["pods"])
        self.check(newpod.uid in names and newpod2.uid in names and newpod3.uid in names,
                   "disk: the records after the restart lack the new pods: %s" % names)
        r = self.talk("%s:%d" % (newpod.ip, APP_PORT))
        self.check(r["ok"], "disk: traffic after the agent's restart: %s" % r)
        row["ok"] = not self.failures
        return row

    def disk_ca(self):
        c, a = self.c, self.a
        row = {"case": "CA state dir: read-only, full, fresh+full"}
        ca = c.ca_dir
        # Read-only bind mount of the dir with the live root: the running proxies keep
        # serving (a new pod gets a certificate), and a restarted proxy loads the root.
        lib.run(["mount", "--bind", ca, ca])
        lib.run(["mount", "-o", "remount,bind,ro", ca])
        try:
            pod = c.add_pod("node-a", "shop", "ca-ro", "other")
            pod.serve(APP_PORT)
            r = self.talk("%s:%d" % (pod.ip, APP_PORT))
            self.check(r["ok"], "ca: a new pod's traffic with the CA dir read-only: %s" % r)
            a.start_proxy(wait=True)
            r = self.talk("%s:80" % lib.ECHO_VIP)
            self.check(r["ok"], "ca: a proxy restarted on a read-only CA dir: %s" % r)
        finally:
            lib.run(["umount", ca], check=False)
        # A fresh, empty state dir that is full: a clear error, and what is left is whole.
        fresh = os.path.join(c.work, "ca-fresh")
        os.makedirs(fresh, mode=0o700)
        lib.run(["mount", "-t", "tmpfs", "-o", "size=4k,mode=0700", "faults-ca", fresh])
        try:
            argv = [c.binary("sockmesh-proxy"), "--node", "node-x", "--config", c.config_path,
                    "--state-dir", fresh, "--zds-socket", os.path.join(c.work, "none.sock"),
                    "--bpf-pin-root", a.pin_root, "--admin", "127.0.0.1:25100",
                    "--metrics", "127.0.0.1:25120", "--readiness", "127.0.0.1:25121",
                    "--workers", "1", "--log-level", "info"]
            out = lib.run(["nsenter", "--net=" + a.netns_path] + argv, timeout=20, check=False)
            line = next((ln for ln in out.splitlines() if "No space left" in ln), "")
            row["full_start"] = line.split(" ", 2)[-1]
            self.check(line, "ca: a proxy on a full, fresh state dir did not say so: %s" %
                       out[-800:])
            left = sorted(os.listdir(fresh))
            row["left_in_dir"] = ",".join(left) or "(nothing)"
            self.check(not [f for f in left if ".tmp" in f],
                       "ca: temporary files left in the state dir: %s" % left)
            # Room again: the next start completes the CA from what is there, or from nothing.
            lib.run(["mount", "-o", "remount,size=1m", fresh])
            p = lib.Process("proxy-ca", argv, netns=a.netns_path,
                            log_path=os.path.join(c.work, "proxy-ca.log"))
            try:
                lib.wait_until("the proxy on the freed state dir", lambda: (
                    "builtin CA root" in p.log() or not p.alive()), 15)
                self.check(p.alive() and "builtin CA root" in p.log(),
                           "ca: no CA after the space came back: %s" % p.log()[-800:])
                row["after_room"] = next((ln.split(" ", 2)[-1][:70] for ln in p.log().splitlines()
                                          if "builtin CA root" in ln), "")
            finally:
                p.stop(signal.SIGKILL)
        finally:
            lib.run(["umount", "-l", fresh], check=False)
        return row


# ---- output ----------------------------------------------------------------------------------

def markdown(title, rows):
    if not rows:
        return ""
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    out = ["### %s" % title, "", "| " + " | ".join(keys) + " |",
           "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return "\n".join(out) + "\n"


def parse(argv):
    p = argparse.ArgumentParser(prog="scripts/bench --faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1,000 tunnels, 3 rounds each")
    p.add_argument("--only", default="tunnels,kill,upgrade,disk",
                   help="comma list of tunnels, kill, upgrade, disk")
    p.add_argument("--tunnels", type=int, default=0, help="default 10000 (1000 with --quick)")
    p.add_argument("--rounds", type=int, default=0, help="default 20 (3 with --quick)")
    p.add_argument("--components", default="proxy,agent,loader")
    p.add_argument("--seed", type=int, default=0, help="default: from the clock (printed)")
    p.add_argument("--window-limit", type=float, default=5.0,
                   help="the restart window a new connection must succeed in (OPERATING 5.5)")
    p.add_argument("--per-tunnel-kib", type=int, default=0,
                   help="the most RSS per held tunnel, per proxy, that OPERATING 5.5 documents: "
                        "12 KiB from 5,000 tunnels, 16 below (the fixed part weighs more)")
    p.add_argument("--op-timeout", type=int, default=180)
    p.add_argument("--max-seconds", type=int, default=1800)
    p.add_argument("--build-dir", default=None)
    p.add_argument("--out", default=os.path.join(HERE, "results", "faults.md"))
    o = p.parse_args(argv)
    o.tunnels = o.tunnels or (1000 if o.quick else 10000)
    o.rounds = o.rounds or (3 if o.quick else 20)
    o.per_tunnel_kib = o.per_tunnel_kib or (12 if o.tunnels >= 5000 else 16)
    o.seed = o.seed or int(time.time()) % 100000
    if o.build_dir:
        os.environ["SOCKMESH_BUILD_DIR"] = os.path.abspath(o.build_dir)
    return o


def raise_file_limit(need):
    """Every process of the run (proxies, the holding client, the server) holds one descriptor
    per tunnel: raise this process's limit, which they inherit (root may raise the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(need, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, OSError) as e:
        raise FaultError("%d tunnels need an open-file limit of %d (ulimit -n is %d/%d): %s" % (
            need - 4096, need, soft, hard, e))
    log("open-file limit %d (was %d/%d)" % (want, soft, hard))


def run_scenarios(o):
    """Runs the scenarios of o.only; returns (failures, markdown text)."""
    f = Faults(o)
    only = o.only.split(",")
    summaries = []
    t0 = time.monotonic()
    try:
        if any(s in only for s in ("tunnels", "kill", "upgrade")):
            if "tunnels" in only:
                raise_file_limit(o.tunnels + 4096)
            f.cluster()
            if "tunnels" in only:
                f.tunnels(o.tunnels)
            if "kill" in only:
                for comp in o.components.split(","):
                    summaries.append(f.kill_loop(comp, o.rounds))
            if "upgrade" in only:
                f.upgrade()
            f.close()
        if "disk" in only:
            f.disk()
    except (FaultError, lib.ClusterError) as e:
        f.failures.append(str(e))
        log("FAIL: %s" % e)
    finally:
        f.close()
    text = ["## sockmesh under load and faults (%s, seed %d, %.0f s)" % (
        datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), o.seed,
        time.monotonic() - t0), "",
        "`scripts/bench --faults %s`" % " ".join(sys.argv[1:]), ""]
    if summaries:
        text.append(markdown("kill -9 loops: summary", summaries))
    for title, rows in f.tables:
        text.append(markdown(title, rows))
    text.append("failures: %s\n" % ("none" if not f.failures else "\n- " + "\n- ".join(
        f.failures)))
    return f.failures, "\n".join(text)


def in_private_mounts(argv):
    """The disk scenario mounts tmpfs and bind mounts: re-execute in a private mount namespace
    so that none of them is seen, or left, outside this run."""
    if os.environ.get("SOCKMESH_FAULTS_PRIVATE_MOUNTS"):
        return None
    env = dict(os.environ, SOCKMESH_FAULTS_PRIVATE_MOUNTS="1")
    return subprocess.call(["unshare", "-m", "--propagation", "private", PYTHON,
                            os.path.abspath(__file__)] + argv, env=env)


def main(argv):
    if argv[:1] == ["probe"]:
        return probe_main(argv[1:])
    if os.geteuid() != 0:
        sys.stderr.write("faults.py needs root (network namespaces, BPF, cgroups, mounts)\n")
        return 1
    o = parse(argv)
    if "disk" in o.only.split(","):
        rc = in_private_mounts(argv)
        if rc is not None:
            return rc
    log("seed %d (--seed %d repeats these kill moments)" % (o.seed, o.seed))
    failures, text = run_scenarios(o)
    print(text)
    os.makedirs(os.path.dirname(o.out), exist_ok=True)
    with open(o.out, "w") as fh:
        fh.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
