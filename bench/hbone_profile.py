#!/usr/bin/python3
"""Where sockmesh's HBONE path spends more than the TLS floor (issue 16 item 3; root).

On the cluster bench's pods (bench/cluster.py), across nodes: the two node proxies of (2) (and
of (3), the same without the sockmap bypass, with --paths nobypass) against the two relays of (t)
(mutual TLS 1.3, no HTTP/2) and of (th) ((t) with one HTTP/2 CONNECT stream inside the TLS), for
the same work, one after the other:
  - a stream of --mib MiB (on --streams connections): syscalls per MiB and task-clock ms per GiB of the two processes
    (perf stat -e raw_syscalls:sys_enter,task-clock -p <pids>), their user and system CPU
    time per GiB (/proc/<pid>/stat), in all and by side (client's node, server's node), and
    their voluntary context switches (sleeps and wake-ups) per MiB;
  - --rtts round trips of 1 KiB: syscalls per round trip, and the calls that make them; then
    again, the user and system CPU time of the two processes per round trip (/proc/<pid>/stat)
    and that of the rest of the path's cgroup (the apps, and the softirq work charged to them);
    and once more, listing the pods' TCP sockets partway (`ss -tni`: segments out, of them with
    data), which shows whether the apps' answers carry their ACKs (a tunnel's app flow leaves
    the bypass once it has answered twice; before that, and on the bypass of old builds, each
    message the app gets costs it a pure ACK);
  - the same stream under perf record: the samples of the two processes by where they were
    (kernel send path, kernel receive path, softirq, crypto, memcpy, the rest), per MiB;
  - the same stream under perf trace -s, each side apart: the time spent inside each system call
    (which includes the softirq work a send or a receive does in line), per GiB;
  - the round trips once more with the kernel's BPF run-time statistics on: each program's runs
    and time per round trip (the capture programs at tc on the pods' eth0, sockops, sk_msg).
Prints a table; compare rows of one run only. Needs perf (Debian linux-perf, scripts/setup).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import re
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cluster as cb  # noqa: E402
from benchlib import BPF_STATS, BpfStatsOff, cpu_ticks, voluntary_switches  # noqa: E402

MESH_PATHS = ("bypass", "nobypass")  # the node proxies' rows; the others are floor relays
SYSCALLS = ["sendto", "recvfrom", "sendmsg", "recvmsg", "read", "write", "epoll_wait",
            "epoll_ctl", "ioctl"]


def pids(pattern):
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                          text=True).stdout.split()


def cpu_split(pid_list, work):
    """Runs work(); returns (user, system) CPU seconds the processes spent meanwhile."""
    hz = os.sysconf("SC_CLK_TCK")
    u0, s0 = cpu_ticks(pid_list)
    work()
    u1, s1 = cpu_ticks(pid_list)
    return (u1 - u0) / hz, (s1 - s0) / hz


def sides(combo):
    """[client-side pid, server-side pid] of the path's two proxies or relays."""
    if combo.path in MESH_PATHS:
        return [str(node.proxy.pid) for node in combo.cluster.nodes[:2]]
    p1, p2 = cb.FLOOR_PORTS[combo.path]
    return pids("sockmesh-loadgen relay --listen 127.0.0.1:%d " % p1) + pids(
        "sockmesh-loadgen relay --listen %s:%d " % (combo.server.ip, p2))


def sockets_midway(pods, work, after):
    """Runs work() and, `after` seconds into it, lists the TCP sockets of the pods' netns
    (`ss -tni`): [(pod ip, local, peer, segments out, of them with data)]. A socket whose
    segments out are nearly all without data is answering each message it gets with an ACK of
    its own. An error of work() is raised here, after the listing."""
    seen = []
    failed = []

    def run_work():
        try:
            work()
        except Exception as e:  # noqa: BLE001 - handed to the caller below
            failed.append(e)

    t = threading.Thread(target=run_work)
    t.start()
    try:
        time.sleep(after)
        for pod in pods:
            text = pod.sh(["ss", "-tniH", "state", "established"], in_cgroup=False)
            # A socket's line, then its info on the next line, which starts with a tab.
            for m in re.finditer(r"(\S+:\d+)[ \t]+(\S+:\d+)[ \t]*\n\t([^\n]*)", text):
                info = m.group(3)
                segs = re.search(r"\bsegs_out:(\d+)", info)
                data = re.search(r"\bdata_segs_out:(\d+)", info)
                if segs:
                    seen.append((pod.ip, m.group(1), m.group(2), int(segs.group(1)),
                                 int(data.group(1)) if data else 0))
    finally:
        t.join()
    if failed:
        raise failed[0]
    return seen


def bpf_programs():
    """{program name: [runs, ns]} over the kernel's BPF programs (run time counted while
    kernel.bpf_stats_enabled is 1)."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    totals = collections.defaultdict(lambda: [0, 0])
    for prog in json.loads(out.stdout or "[]"):
        totals[prog.get("name", "?")][0] += prog.get("run_cnt", 0)
        totals[prog.get("name", "?")][1] += prog.get("run_time_ns", 0)
    return totals


def bpf_time(work):
    """Runs work(); returns {program name: (runs, ns)} of the BPF programs that ran meanwhile
    (the capture programs at tc, sockops, sk_msg), with the kernel's run-time statistics on (off
    for the rest of the profile: BpfStatsOff)."""
    with open(BPF_STATS, "w") as f:
        f.write("1")
    try:
        before = bpf_programs()
        work()
        after = bpf_programs()
    finally:
        with open(BPF_STATS, "w") as f:
            f.write("0")
    return {name: (runs - before[name][0], ns - before[name][1])
            for name, (runs, ns) in after.items() if runs > before[name][0]}


def perf_stat(pid_list, events, work):
    """Runs work() under perf stat on the processes; returns {event: count}."""
    p = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(events), "-p",
                          ",".join(pid_list)], stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    work()
    p.send_signal(2)
    counts = {}
    for line in p.communicate()[1].splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].replace(".", "", 1).isdigit():
            counts[f[2]] = float(f[0])
    return counts


def where(frames):
    """A perf sample's place, from its call chain (innermost first)."""
    top = frames[0]
    if "libcrypto" in top:
        return "crypto"
    if "memmove" in top or "memcpy" in top:
        return "memcpy"
    if "[kernel.kallsyms]" not in top:
        return "user, other"
    chain = " ".join(frames)
    if "tcp_sendmsg" in chain or "tcp_bpf_sendmsg" in chain:
        return "kernel send"
    if "tcp_recvmsg" in chain or "tcp_bpf_recvmsg" in chain:
        return "kernel receive"
    if "handle_softirqs" in chain or "net_rx_action" in chain:
        return "softirq"
    return "kernel, other"


def perf_places(pid_list, work):
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        p = subprocess.Popen(["perf", "record", "-g", "-F", "499", "-o", data, "-p",
                              ",".join(pid_list)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        work()
        p.send_signal(2)
        p.wait()
        text = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"],
                              capture_output=True, text=True).stdout
    places = collections.Counter()
    for block in text.split("\n\n"):
        frames = [line.strip() for line in block.splitlines() if line.strip()]
        if frames:
            places[where(frames)] += 1
    return places


def perf_trace_times(pid_list, work):
    """Runs work() once under one `perf trace -s` per process; returns, per process, {syscall:
    (calls, msec)} summed over its threads (msec: the time inside the call, waiting included for
    epoll_wait)."""
    with tempfile.TemporaryDirectory() as d:
        outs = [os.path.join(d, "trace-%s.txt" % pid) for pid in pid_list]
        tracers = [subprocess.Popen(["perf", "trace", "-s", "-o", out, "-p", pid],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for pid, out in zip(pid_list, outs)]
        time.sleep(0.5)
        work()
        for p in tracers:
            p.send_signal(2)
        for p in tracers:
            p.wait()
        texts = []
        for out in outs:
            try:
                with open(out) as f:
                    texts.append(f.read())
            except OSError:
                texts.append("")
    result = []
    for text in texts:
        times = collections.defaultdict(lambda: [0, 0.0])
        for line in text.splitlines():
            f = line.split()
            if len(f) >= 4 and f[0] in SYSCALLS and f[1].isdigit():
                times[f[0]][0] += int(f[1])
                times[f[0]][1] += float(f[3])
        result.append({k: tuple(v) for k, v in times.items()})
    return result


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--streams", type=int, default=1,
                    help="parallel streams that carry the --mib MiB between them (the cluster "
                    "bench's second throughput run has 8)")
    ap.add_argument("--rtts", type=int, default=20000)
    ap.add_argument("--paths", default="bypass,tlsfloor,h2floor",
                    help="the rows to profile: bypass, nobypass (the proxies without the sockmap "
                    "bypass), tlsfloor, h2floor, h2asio ((th) on asio)")
    o = ap.parse_args(argv)
    # scripts/lib/cluster.py finds the binaries through this (not through ClusterBench's options).
    os.environ["SOCKMESH_BUILD_DIR"] = os.path.abspath(o.build_dir)
    bench = cb.ClusterBench(cb.parse_args(["--build-dir", o.build_dir, "--paths",
                                           o.paths, "--topologies", "cross",
                                           "--reps", "1", "--first-byte-conns", "0"]))
    rows = []
    socket_rows = []
    bpf_rows = []
    with BpfStatsOff() as stats:
        try:
            bench.setup()
            for combo in bench.combos:
                procs = sides(combo)  # [client side, server side]
                stream = lambda: bench.throughput(combo, o.mib << 20, o.streams)  # noqa: E731
                rtts = lambda: bench.pingpong(combo, o.rtts, 100)  # noqa: E731
                stream_split = []

                def measured_stream():
                    c0 = cb.cgroup_cpu_seconds(combo.cluster.cgroup)  # noqa: B023
                    t0 = [cpu_ticks([pid]) for pid in procs]  # noqa: B023
                    v0 = [voluntary_switches(int(pid)) for pid in procs]  # noqa: B023
                    user, system = cpu_split(procs, stream)  # noqa: B023
                    switches = [voluntary_switches(int(pid)) - v
                                for pid, v in zip(procs, v0)]  # noqa: B023
                    whole = cb.cgroup_cpu_seconds(combo.cluster.cgroup) - c0  # noqa: B023
                    hz = os.sysconf("SC_CLK_TCK")
                    per_side = [tuple((b - a) / hz for a, b in zip(t, cpu_ticks([pid])))
                                for t, pid in zip(t0, procs)]  # noqa: B023
                    stream_split.append((user, system, whole, per_side, switches))

                s = perf_stat(procs, ["raw_syscalls:sys_enter", "task-clock"], measured_stream)
                r = perf_stat(procs, ["syscalls:sys_enter_" + c for c in SYSCALLS], rtts)
                c0 = cb.cgroup_cpu_seconds(combo.cluster.cgroup)
                split = cpu_split(procs, rtts)
                split = split + (cb.cgroup_cpu_seconds(combo.cluster.cgroup) - c0,)
                programs = bpf_time(rtts)
                # a round trip takes 100-200 µs here: look about a quarter of the way in
                sockets = sockets_midway([combo.client, combo.server], rtts, o.rtts * 50e-6)
                places = perf_places(procs, stream)
                traced = perf_trace_times(procs, stream)
                rows.append((combo.path, s, r, places, split, stream_split[0], traced))
                bpf_rows.append((combo.path, programs))
                socket_rows.append((combo.path, sockets))
        finally:
            bench.cleanup()
    sys.stdout.write(stats.note())
    print("\nThe stream: %d MiB on %d connection(s) at once." % (o.mib, o.streams))
    names = {"bypass": "(2) sockmesh proxies", "nobypass": "(3) sockmesh proxies, no bypass",
             "tlsfloor": "(t) TLS floor relays",
             "h2floor": "(th) HTTP/2 floor relays",
             "h2asio": "(ta) HTTP/2 floor relays on asio"}
    print("\n| | syscalls / MiB | task-clock ms / GiB | CPU ms / GiB: user | system | "
          "apps and the rest | syscalls / round trip | CPU µs / round trip: user | system | "
          "apps and the rest |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path, s, r, _, (user, system, whole), (s_user, s_system, s_whole, _, _), _ in rows:
        per_rt = sum(r.values()) / o.rtts
        per_gib = 1e3 * 1024 / o.mib
        print("| %s | %.1f | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f |" % (
            names[path], s["raw_syscalls:sys_enter"] / o.mib, s["task-clock"] * 1024 / o.mib,
            s_user * per_gib, s_system * per_gib, (s_whole - s_user - s_system) * per_gib,
            per_rt, user * 1e6 / o.rtts, system * 1e6 / o.rtts,
            (whole - user - system) * 1e6 / o.rtts))
    print("\nUser and system CPU are those of the two proxies (or relays) only, from "
          "/proc/<pid>/stat; system includes the softirq work charged to them (the sends they "
          "make deliver the packets to the next socket). \"apps and the rest\": the path's "
          "cgroup v2 tree (as in the cluster bench's CPU s/GB) less those two: the client and "
          "server apps and the softirq work charged to them. While an app's flow is in the "
          "sockmap bypass, its answers reach its proxy through sk_msg, not through its own TCP "
          "socket, so that socket sends no data and never enters TCP's ping-pong mode: it "
          "acknowledges each message the proxy sends it with an ACK of its own (bounced by tc). "
          "A tunnel's relay takes the flow out of the bypass once the app has answered twice "
          "(sockmesh_bypass_flows_two_way_total), and from then on the ACK rides on the answer.")
    print("\nThe stream's CPU by side, ms per GiB (client side: node-a's proxy, or the relay in "
          "the client pod; server side: node-b's proxy, or the relay in the server pod):\n")
    print("| | client side: user | system | sleeps / MiB | server side: user | system | "
          "sleeps / MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, _, _, _, _, (_, _, _, per_side, switches), _ in rows:
        per_gib = 1e3 * 1024 / o.mib
        print("| %s | %s |" % (names[path], " | ".join(
            "%.0f | %.0f | %.1f" % (u * per_gib, k * per_gib, v / o.mib)
            for (u, k), v in zip(per_side, switches))))
    print("\nsleeps / MiB: the process's voluntary context switches (all threads) during the "
          "stream, per MiB: each one a wait in epoll_wait (or a lock) and a wake-up.")
    print("\nCalls per round trip:")
    for path, _, r, _, _, _, _ in rows:
        print("- %s: %s" % (names[path], ", ".join(
            "%s %.2f" % (k.split("sys_enter_")[1], v / o.rtts) for k, v in sorted(r.items())
            if v > 0)))
    print("\nBPF programs during the round trips (kernel.bpf_stats_enabled on for the run): "
          "runs per round trip, ns per run, µs per round trip. The floor rows' pods are not "
          "enrolled, so their packets meet none:")
    for path, programs in bpf_rows:
        total = sum(ns for _, ns in programs.values()) / 1e3 / o.rtts
        print("- %s: %s; in all %.2f µs" % (names[path], ", ".join(
            "%s %.2f × %.0f ns = %.2f µs" % (name, runs / o.rtts, ns / runs, ns / 1e3 / o.rtts)
            for name, (runs, ns) in sorted(programs.items())) or "none", total))
    print("\nTCP sockets of the two pods about a quarter of the way into the round trips "
          "(`ss -tni` in each pod's netns): local → peer, segments sent, of them with data. A "
          "socket that sends nothing but ACKs, one per message it gets, is a pod's app still in "
          "the bypass:")
    for path, sockets in socket_rows:
        print("- %s: %s" % (names[path], "; ".join(
            "%s → %s %d, %d with data" % (local, peer, segs, data)
            for _, local, peer, segs, data in sockets)))
    print("\nperf record samples per MiB of the stream (499 Hz), by place:")
    for path, _, _, places, _, _, _ in rows:
        print("- %s: %s" % (names[path], ", ".join(
            "%s %.2f" % (k, v / o.mib) for k, v in places.most_common())))
    print("\nTime inside system calls during the stream (perf trace -s), per GiB: calls, and ms "
          "spent in them; a send or receive includes the softirq work it does in line "
          "(epoll_wait, which includes waiting, is left out):\n")
    calls = [c for c in SYSCALLS if c != "epoll_wait"]
    print("| | side | " + " | ".join(calls) + " | all |")
    print("|---|---|" + "---:|" * (len(calls) + 1))
    scale = 1024.0 / o.mib
    for path, _, _, _, _, _, traced in rows:
        for side, t in zip(("client", "server"), traced):
            cells = ["%d, %.0f" % (t[c][0] * scale, t[c][1] * scale) if c in t else "—"
                     for c in calls]
            whole = sum(t[c][1] for c in calls if c in t) * scale
            print("| %s | %s | %s | %.0f ms |" % (names[path], side, " | ".join(cells), whole))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
