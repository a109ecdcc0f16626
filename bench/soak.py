#!/usr/bin/python3
"""sockmesh soak (run through `scripts/bench --soak`).

Many short tunnels through the proxy pair of the benchmark (client -SOCKS5-> node A =HBONE=>
node B -> server, on loopback), in rounds. Each round: --conns-per-round tunnels, each opened,
used for one 1 KiB echo and closed, from 8 workers (`sockmesh-loadgen client --mode churn`); then
one 128 MiB transfer and 500 round trips on one tunnel, so that the bulk buffers are used too.
While a round's tunnels run, the config file is rewritten every couple of seconds, an Allow
policy added and taken away again (both states allow the traffic), so that the proxies reload and
re-check their live connections under load. After each round the proxies sit idle for a few
seconds and are read: RSS, open descriptors, threads, and the connections their metrics count as
opened but not closed.

What it shows: leaks. Descriptors or connections still open once the traffic has stopped, or
memory that grows round after round, would each be a bug; the verdict lines at the end say
whether any was seen. Bounded in count (--rounds x --conns-per-round) and in time (every round
stops after --round-seconds of churn, every load call has a timeout). Prints a Markdown table and
writes it to bench/results/soak.md.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the benchmark's processes, addresses and proxy start-up)
from benchlib import (BenchError, load_cluster_lib, log, proc_status, rss_kib,  # noqa: E402
                      run_bench, set_log_prefix, yes)

metric_value = load_cluster_lib().metric_value  # the metrics parser the tests use

set_log_prefix("soak")
MiB = 1 << 20
# Idle time before a round's reading: the proxy trims its heap after 2 s without connections.
SETTLE_SECONDS = 5
# Allowed RSS growth from the second round to the last, per node: the first round's growth is
# the allocator reaching its working set; after that, growth round after round is a leak.
RSS_GROWTH_LIMIT_MIB = 4.0
# Socket timeout of each churned tunnel, s.
TUNNEL_TIMEOUT = 10


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def open_connections(admin_ip):
    """Connections the proxy's metrics count as opened and not yet closed (all label sets)."""
    with urllib.request.urlopen("http://%s:15020/metrics" % admin_ip, timeout=5) as r:
        text = r.read().decode()
    opened = metric_value(text, "istio_tcp_connections_opened_total")
    closed = metric_value(text, "istio_tcp_connections_closed_total")
    return int(opened - closed), int(opened)


# Added to and removed from the config while tunnels run: it matches the client's namespace, so the
# traffic is allowed either way, and each change makes both proxies re-check live connections.
SOAK_POLICY = """policies:
- name: soak-allow
  namespace: bench
  scope: Namespace
  action: Allow
  rules: [[[{namespaces: ["bench"]}]]]
"""


def policy_names(admin_ip):
    with urllib.request.urlopen("http://%s:15000/config_dump" % admin_ip, timeout=5) as r:
        return [p["name"] for p in json.loads(r.read().decode()).get("policies", [])]


class ConfigToggler(threading.Thread):
    """Rewrites the proxies' config file (atomically) every interval while a round runs, and
    waits after each write until both proxies show it: applied/written count the reloads."""

    def __init__(self, path, base, admins, interval=1.5, apply_timeout=5.0):
        super().__init__(daemon=True)
        self.path, self.base, self.admins = path, base, admins
        self.interval, self.apply_timeout = interval, apply_timeout
        self.stop_event = threading.Event()
        self.with_policy = False
        self.written = self.applied = 0
        self.error = None

    def write(self, with_policy):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.base + (SOAK_POLICY if with_policy else ""))
        os.replace(tmp, self.path)

    def run(self):
        try:
            while not self.stop_event.wait(self.interval):
                self.with_policy = not self.with_policy
                self.write(self.with_policy)
                self.written += 1
                deadline = time.time() + self.apply_timeout
                while time.time() < deadline:
                    seen = [("soak-allow" in policy_names(a)) == self.with_policy
                            for a in self.admins]
                    if all(seen):
                        self.applied += 1
                        break
                    time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - reported in the table
            self.error = repr(e)

    def finish(self):
        self.stop_event.set()
        self.join(30)
        if self.with_policy:  # leave the config as it started
            self.write(False)


class Soak:
    def __init__(self, o):
        self.o = o
        ropts = run.parse_args(["--build-dir", o.build_dir, "--no-reference", "--offshelf", ""])
        # The load server and the proxies' lifetimes cover every round, whatever its length.
        ropts.max_seconds = max(ropts.max_seconds, o.rounds * (o.round_seconds + 120) + 600)
        self.bench = run.Bench(ropts)

    def sample(self, nodes):
        out = {}
        for name, (proc, admin) in nodes.items():
            open_now, opened = open_connections(admin)
            out[name] = {"rss_kib": rss_kib(proc.pid), "fds": fd_count(proc.pid),
                         "threads": proc_status(proc.pid, "Threads"), "open": open_now, "opened": opened}
        return out

    def churn(self, path):
        """One round's tunnels. Each tunnel's socket calls time out after TUNNEL_TIMEOUT s (a hung
        tunnel is counted as failed), and the round stops starting tunnels after
        --round-seconds, so the whole call ends within round_seconds + TUNNEL_TIMEOUT."""
        o = self.o
        cmd = [self.bench.loadgen_bin, "client", "--mode", "churn", "--conns",
               str(o.conns_per_round), "--streams", "8", "--size", "1024",
               "--seconds", str(o.round_seconds), "--timeout", str(TUNNEL_TIMEOUT)] + path.args()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL,
                               timeout=o.round_seconds + TUNNEL_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            raise BenchError("churn did not end within its bounds: %s" % " ".join(cmd))
        if r.returncode != 0:
            raise BenchError("churn failed (%d): %s" % (r.returncode,
                                                        r.stderr.decode(errors="replace")))
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    def run(self):
        o, b = self.o, self.bench
        log("temp dir %s" % b.tmp)
        b.start_server()
        a, bn = b.start_sockmesh("sockmesh", b.proxy_bin, b.ip["admin_a"], b.ip["admin_b"], 15008)
        nodes = {"A": (a, b.ip["admin_a"]), "B": (bn, b.ip["admin_b"])}
        path = run.Path("sockmesh", "sockmesh", "socks5", "%s:15080" % b.ip["admin_a"], b.target,
                        b.ip["client"], pids=[a.pid, bn.pid])
        time.sleep(1.0)
        baseline = self.sample(nodes)
        rounds = []
        total = failures = 0
        reloads_written = reloads_applied = 0
        first_error = reload_error = ""
        for i in range(o.rounds):
            log("round %d/%d: %d tunnels (at most %d s), then 128 MiB and 500 round trips" % (
                i + 1, o.rounds, o.conns_per_round, o.round_seconds))
            toggler = ConfigToggler(os.path.join(b.tmp, "mesh.yaml"), b.sockmesh_config(),
                                    [b.ip["admin_a"], b.ip["admin_b"]])
            toggler.start()
            try:
                churn = self.churn(path)
            finally:
                toggler.finish()
            reloads_written += toggler.written
            reloads_applied += toggler.applied
            reload_error = reload_error or toggler.error
            b.throughput(path, 128 * MiB, 1)
            b.pingpong(path, 500, 50)
            for name, (proc, _) in nodes.items():
                b.procs.check_alive("node " + name, proc)
            total += churn["conns"]
            failures += churn["failures"]
            first_error = first_error or churn["first_error"]
            time.sleep(SETTLE_SECONDS)
            rounds.append({"churn": churn, "total": total, "nodes": self.sample(nodes)})
        return self.report(baseline, rounds, total, failures, first_error,
                           (reloads_written, reloads_applied, reload_error))

    def report(self, baseline, rounds, total, failures, first_error, reloads):
        o = self.o
        L = ["# sockmesh soak", ""]
        L.append("%s · %d CPUs · %d rounds × up to %d tunnels (1 KiB echo each, 8 workers) + "
                 "128 MiB + 500 round trips per round; readings %d s after each round." % (
                     datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), os.cpu_count(),
                     o.rounds, o.conns_per_round, SETTLE_SECONDS))
        L.append("")
        L.append("| round | tunnels so far | tunnels/s | failed | RSS A MiB | RSS B MiB | fds A | "
                 "fds B | threads A/B | open conns A/B |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")

        def row(label, total_so_far, rate, failed, n):
            return "| %s | %s | %s | %s | %.1f | %.1f | %d | %d | %d/%d | %d/%d |" % (
                label, total_so_far, rate, failed, n["A"]["rss_kib"] / 1024,
                n["B"]["rss_kib"] / 1024, n["A"]["fds"], n["B"]["fds"], n["A"]["threads"],
                n["B"]["threads"], n["A"]["open"], n["B"]["open"])
        L.append(row("start", 0, "–", "–", baseline))
        for i, r in enumerate(rounds):
            L.append(row(i + 1, r["total"], "%.0f" % r["churn"]["conns_per_s"],
                         r["churn"]["failures"], r["nodes"]))
        L.append("")
        last = rounds[-1]["nodes"]
        second = rounds[min(1, len(rounds) - 1)]["nodes"]
        first = rounds[0]["nodes"]
        growth = {k: (last[k]["rss_kib"] - second[k]["rss_kib"]) / 1024 for k in ("A", "B")}
        L.append("| check | measured | good |")
        L.append("|---|---:|:---:|")
        L.append("| every tunnel worked | %d of %d failed%s | %s |" % (
            failures, total + failures, " (first: %s)" % first_error if first_error else "",
            yes(failures == 0)))
        written, applied, reload_error = reloads
        L.append("| config changes under load reached both proxies (within 5 s each) | %d of %d%s "
                 "| %s |" % (applied, written, " (%s)" % reload_error if reload_error else "",
                            yes(written > 0 and applied == written and not reload_error)))
        open_after = max(r["nodes"][k]["open"] for r in rounds for k in ("A", "B"))
        L.append("| no connection counted open after a round | at most %d | %s |" % (
            open_after, yes(open_after == 0)))
        fd_growth = max(last[k]["fds"] - first[k]["fds"] for k in ("A", "B"))
        L.append("| descriptors after the last round ≤ after the first | %+d | %s |" % (
            fd_growth, yes(fd_growth <= 0)))
        L.append("| RSS growth from round 2 to round %d ≤ %.0f MiB per node | A %+.1f, B %+.1f MiB "
                 "| %s |" % (len(rounds), RSS_GROWTH_LIMIT_MIB, growth["A"], growth["B"],
                             yes(max(growth.values()) <= RSS_GROWTH_LIMIT_MIB)))
        L.append("")
        L.append("Opened per node in all: A %d, B %d connections (the metrics' "
                 "istio_tcp_connections_opened_total)." % (last["A"]["opened"], last["B"]["opened"]))
        text = "\n".join(L) + "\n"
        return text, {"baseline": baseline, "rounds": rounds,
                      "reloads": {"written": written, "applied": applied}}

    def cleanup(self):
        self.bench.cleanup()


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SOCKMESH_BUILD_DIR",
                                                          os.path.join(root, "build")))
    ap.add_argument("--quick", action="store_true", help="3 rounds of 5,000 tunnels")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--conns-per-round", type=int)
    ap.add_argument("--round-seconds", type=int, default=60,
                    help="churn time bound per round")
    ap.add_argument("--out", default=os.path.join(root, "bench", "results", "soak.md"))
    o = ap.parse_args(argv)
    o.rounds = o.rounds or (3 if o.quick else 10)
    o.conns_per_round = o.conns_per_round or (5000 if o.quick else 20000)
    if o.rounds < 3 or o.conns_per_round < 1 or o.round_seconds < 1:
        # Growth is read from round 2 to the last: fewer than 3 rounds would compare a round with
        # itself.
        ap.error("--rounds must be at least 3, --conns-per-round and --round-seconds positive")
    return run_bench(lambda: Soak(o), o.out, "soak")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
