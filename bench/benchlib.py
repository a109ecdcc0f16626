"""What the benchmark drivers (run.py, capture.py, cluster.py) share: logging, waiting, and the main loop
that turns signals into a clean stop and writes the table."""
import json
import os
import signal
import subprocess
import sys
import time

_prefix = ["bench"]


def set_log_prefix(prefix):
    _prefix[0] = prefix


def log(msg):
    sys.stderr.write("[%s %s] %s\n" % (_prefix[0], time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class BenchError(Exception):
    pass


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            if pred():
                return
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.05)
    raise BenchError("timed out waiting for %s (last: %r)" % (what, last))


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]
    except OSError:
        return ""


def bench_arguments(doc, root, quick_help, reps_help, stream_help):
    """The options every namespace benchmark takes: --build-dir, --quick, --reps, --iters,
    --stream-mib. The caller adds its own and parses."""
    import argparse
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("SOCKMESH_BUILD_DIR",
                                                          os.path.join(root, "build")))
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--reps", type=int, help=reps_help)
    ap.add_argument("--iters", type=int, help="1 KiB round trips per repetition")
    ap.add_argument("--stream-mib", type=int, help=stream_help)
    return ap


def load_cluster_lib():
    """scripts/lib/cluster.py (the simulated cluster, and the metrics parser the tests use), under
    another module name: bench/cluster.py is cluster.py too."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "lib", "cluster.py")
    spec = importlib.util.spec_from_file_location("sockmesh_cluster_lib", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def proc_status(pid, field):
    """A numeric field of /proc/<pid>/status (VmRSS in KiB, Threads, ...)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchError("no %s for pid %d" % (field, pid))


def rss_kib(pid):
    """VmRSS of a process, KiB."""
    return proc_status(pid, "VmRSS")


def cpu_ticks(pid_list):
    """(user, system) clock ticks of the processes, all their threads (/proc/<pid>/stat)."""
    user = system = 0
    for pid in pid_list:
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])    # utime (field 14)
        system += int(fields[12])  # stime (field 15)
    return user, system


def on_cpu_ns(pid_list):
    """Nanoseconds the processes' threads have run (user and kernel, the softirq work done on their
    time included), from /proc/<pid>/task/*/schedstat: finer than cpu_ticks' clock ticks, so that
    a few thousand round trips give a per-round-trip figure to a tenth of a µs."""
    total = 0
    for pid in pid_list:
        task_dir = "/proc/%d/task" % pid
        try:
            tids = os.listdir(task_dir)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(os.path.join(task_dir, tid, "schedstat")) as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


def voluntary_switches(pid):
    """Voluntary context switches of all the threads of a process (each one a sleep and a
    wakeup): what per-event work costs beyond its CPU on a small VM."""
    total = 0
    task_dir = "/proc/%d/task" % pid
    for tid in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, tid, "status")) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue  # a thread that ended meanwhile
    return total


def yes(b):
    return "**yes**" if b else "**no**"


BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


class BpfStatsOff:
    """Turns the kernel's BPF run-time statistics off for a run and back to what they were. With
    them on (a debugging switch, off by default; some machines have it on), every run of a BPF
    program reads the clock twice, which the mesh rows would pay and the others not. .was is
    the value found ("0", "1", or None where it cannot be read or written: not root)."""

    def __enter__(self):
        self.was = None
        try:
            with open(BPF_STATS) as f:
                self.was = f.read().strip()
            if self.was != "0":
                with open(BPF_STATS, "w") as f:
                    f.write("0")
        except OSError:
            self.was = None
        return self

    def __exit__(self, *exc):
        if self.was not in (None, "0"):
            with open(BPF_STATS, "w") as f:
                f.write(self.was)
        return False

    def note(self):
        if self.was in (None, "0"):
            return ""
        return ("kernel.bpf_stats_enabled was %s on this machine: turned off for the measurements "
                "(with it on, each BPF program run reads the clock twice) and put back at the "
                "end.\n" % self.was)


def run_bench(make_bench, out_path, what):
    """Runs make_bench().run() -> (markdown, raw); cleans up on every exit, signals included;
    writes out_path (and its .json twin) and prints the table. Returns the exit code."""
    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    # SIGINT too: a shell that starts us in the background leaves SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_term)

    bench = None
    t0 = time.time()
    stats = BpfStatsOff()
    try:
        with stats:
            bench = make_bench()
            text, raw = bench.run()
    except KeyboardInterrupt:
        log("interrupted; stopping and removing everything")
        return 130
    except BenchError as e:
        log("FAILED: %s" % e)
        return 1
    finally:
        if bench is not None:
            # Cleanup must finish even if a second signal arrives.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            bench.cleanup()
    text += "\n" + stats.note() + "(%s took %.0f s)\n" % (what, time.time() - t0)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write(text)
    with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    sys.stdout.write(text)
    log("written to %s" % out_path)
    return 0


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=60)
    if r.returncode != 0:
        raise BenchError("openssl %s failed: %s" % (args[0], r.stderr.decode(errors="replace")))


def make_pki(d, server_name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/O=sockmesh-bench CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, san in (("server", "DNS:%s,URI:spiffe://cluster.local/ns/bench/sa/server" % server_name),
                      ("client", "URI:spiffe://cluster.local/ns/bench/sa/client")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\nkeyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\n"
                    % san)
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", name + "-key.pem", "-out", name + ".csr", "-subj", "/O=bench " + name,
                cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", name + "-cert.pem", "-days", "2",
                "-extfile", name + ".ext", cwd=d)
    return {k: os.path.join(d, v) for k, v in (
        ("ca", "ca.pem"), ("server_cert", "server-cert.pem"), ("server_key", "server-key.pem"),
        ("client_cert", "client-cert.pem"), ("client_key", "client-key.pem"))}
