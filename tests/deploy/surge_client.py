#!/usr/bin/python3
"""The application side of deploy_manifest_upgrade, run in the client pod: it holds connections
through the mesh and keeps opening new ones while the proxy is replaced. Standard library only;
every wait is bounded.

  surge_client.py --control DIR --hold GROUP=IP:PORT [--hold ...] --probe IP:PORT
                  [--interval S] [--max-seconds S]

Each --hold is one connection to a podapp echo server: it reads the greeting, then every 0.1 s
sends a numbered line and waits (3 s at most) for its echo. It ends cleanly (half-close, EOF from
the server) when the file DIR/end-GROUP or DIR/stop appears, or at its first error. Once its
greeting arrived it creates DIR/held-<n>. The prober opens a new connection to --probe every
--interval (greeting, "ping" echoed, close) and records when it started, whether it worked and
how long connect() took. DIR/stop (or --max-seconds) ends everything; the report is one JSON
line: {"held": [{"group", "target", "server", "pings", "ok", "error", "error_at", "ended_at"}],
"probes": [[started_at, ok, connect_ms, error]]} (times: seconds since the epoch)."""
import argparse
import json
import os
import socket
import threading
import time


def describe(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, BrokenPipeError):
        return "broken-pipe"
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    return "%s: %s" % (type(e).__name__, e)


def address(target):
    host, _, port = target.rpartition(":")
    return host, int(port)


class Client:
    def __init__(self, a):
        self.a = a
        self.deadline = time.monotonic() + a.max_seconds
        self.held, self.probes = [], []

    def done(self, group=None):
        if time.monotonic() > self.deadline or os.path.exists(os.path.join(self.a.control,
                                                                             "stop")):
            return True
        return group is not None and os.path.exists(os.path.join(self.a.control, "end-" + group))

    def hold(self, index, group, target):
        rec = {"group": group, "target": target, "server": None, "pings": 0, "ok": False,
               "error": None, "error_at": None, "ended_at": None}
        self.held.append(rec)
        s = None
        try:
            s = socket.create_connection(address(target), timeout=5)
            s.settimeout(3)
            f = s.makefile("rb")
            rec["server"] = json.loads(f.readline())["server"]
            open(os.path.join(self.a.control, "held-%d" % index), "w").close()
            seq = 0
            while not self.done(group):
                line = b"%d %s\n" % (seq, b"x" * 64)
                s.sendall(line)
                got = f.readline()
                if got != line:
                    raise OSError("eof" if not got else "bad echo")
                rec["pings"] += 1
                seq += 1
                time.sleep(0.1)
            s.shutdown(socket.SHUT_WR)
            if f.read():
                raise OSError("bytes after the last echo")
            rec["ok"] = True
        except (OSError, ValueError) as e:
            rec["error"], rec["error_at"] = describe(e), time.time()
        finally:
            rec["ended_at"] = time.time()
            if s is not None:
                s.close()

    def probe(self):
        while not self.done():
            started = time.time()
            t0 = time.monotonic()
            connect_ms = None
            try:
                with socket.create_connection(address(self.a.probe), timeout=3) as s:
                    connect_ms = round((time.monotonic() - t0) * 1000, 1)
                    s.settimeout(3)
                    f = s.makefile("rb")
                    if not f.readline().endswith(b"\n"):
                        raise OSError("no greeting")
                    s.sendall(b"ping\n")
                    if f.readline() != b"ping\n":
                        raise OSError("bad echo")
                self.probes.append([round(started, 3), True, connect_ms, ""])
            except OSError as e:
                self.probes.append([round(started, 3), False, connect_ms, describe(e)])
            time.sleep(self.a.interval)


def main():
    p = argparse.ArgumentParser(prog="surge_client.py")
    p.add_argument("--control", required=True)
    p.add_argument("--hold", action="append", default=[], help="GROUP=IP:PORT")
    p.add_argument("--probe", required=True)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--max-seconds", type=float, default=120)
    a = p.parse_args()
    c = Client(a)
    threads = [threading.Thread(target=c.probe)]
    for i, spec in enumerate(a.hold):
        group, _, target = spec.partition("=")
        threads.append(threading.Thread(target=c.hold, args=(i, group, target)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.max_seconds + 10)
    print(json.dumps({"held": c.held, "probes": c.probes}), flush=True)


if __name__ == "__main__":
    main()
