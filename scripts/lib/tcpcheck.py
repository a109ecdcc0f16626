#!/usr/bin/python3
"""TCP semantics probes for a simulated pod: each server and client checks one behaviour of a
connection (an abort, a reconnect from a used port, backpressure, byte-exact delivery) and prints
one JSON line per connection. The end-to-end tests run the same probe through every mesh path and
between pods outside the mesh, and compare. Standard library only; every wait is bounded.

  tcpcheck.py serve --port P --mode MODE [--hold S]
      abort        read nothing, close after --hold seconds with the request unread (the peer
                   must see a reset)
      respond      send --bytes at once, then wait for the client: report whether it ended with
                   a reset or an EOF, and when ({"event": "peer-ended", "how", "at"})
      close-first  send 100 bytes and close at once (this side closes first)
      shut-first   send --bytes (seed 4) and half-close at once, then read to EOF what the client
                   still sends: {"event": "shut-first", "bytes", "sha256"} (or the error)
      sink         read nothing for --hold seconds, then read to EOF and answer
                   {"bytes", "sha256"} as one JSON line (push: the client is the writer)
      source       write for --hold seconds without a reader (non-blocking), then send a 40-byte
                   trailer (8-byte count, SHA-256) and close (pull: the server is the writer)
      echo         echo to EOF, then close
      ack          read an 8-byte count, read nothing more for --hold seconds, then read that
                   many bytes and answer with the count (8 bytes, big-endian): the bench's sink
  tcpcheck.py client --target IP:PORT --mode MODE [...]
      abort        send --bytes, then wait for the server's close: "reset" or "eof"
      respond      read one byte of the response and close with the rest unread
      reconnect    --rounds connections from the same --bind IP:PORT (SO_REUSEADDR), each read to
                   EOF: the connect time, the time to EOF and the bytes read of each
      churn        --conns short connections (--parallel at a time): connect, read to EOF;
                   connect times and failures
      push         write for --hold seconds to a server that does not read, then the rest of
                   the protocol: written bytes, and whether all arrived intact
      pull         read nothing for --hold seconds, then read to EOF and check the trailer
      echo         send --bytes (seeded by --seed), check the echo byte for byte
      shut-first   read the server's bytes to its EOF (--server-bytes, seed 4: checked), then
                   send --bytes (seeded by --seed) on the half that is still open, half-close,
                   and recv() once more: what came, what went, and "eof" (or the reset or
                   broken pipe that ended the sending half)
      rounds       against an echo server, --rounds messages of --bytes in lockstep on a
                   BLOCKING socket (as upload): send one, sleep in recv() until it is back, check
                   it; then half-close and read the server's EOF (a recv() that answers EAGAIN
                   before --timeout is counted as eof_eagain and made once more). Rounds intact,
                   or the error with its errno and how long the failing call waited
      upload       --parallel connections at once, each on a BLOCKING socket (no Python timeout,
                   which would poll first and hide an EAGAIN; SO_RCVTIMEO/SO_SNDTIMEO of
                   --timeout instead): send the count and --bytes (--chunk bytes per send(),
                   default all in one), then wait in a blocking recv() for the ack; with
                   --recv-after S the recv() starts on its own thread S seconds after the first
                   send (or when the send ends), while the writer may still be blocked, as a
                   full-duplex app's reader. Per stream: answered or the error, its errno and how
                   long the failing call waited (EAGAIN well before --timeout is a spurious
                   wakeup, not the timeout)
"""
import argparse
import errno
import fcntl
import hashlib
import json
import random
import select
import socket
import struct
import sys
import threading
import time

CHUNK = 65536
SHUT_FIRST_SEED = 4  # what a shut-first server sends first, which its client checks
FIONREAD = 0x541B


def out(**report):
    print(json.dumps(report), flush=True)


def describe(e):
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, BrokenPipeError):
        return "broken-pipe"
    if isinstance(e, socket.timeout):
        return "timeout"
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    return "%s: %s" % (type(e).__name__, e)


def data_of(seed, size):
    return random.Random(seed).randbytes(size)


def write_without_reader(sock, seconds, seed, cap):
    """Writes non-blocking for `seconds` (or until `cap` bytes); returns (written, sha256 obj)."""
    sock.setblocking(False)
    block = data_of(seed, CHUNK)
    h = hashlib.sha256()
    written = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and written < cap:
        try:
            n = sock.send(block)
        except BlockingIOError:
            select.select([], [sock], [], 0.05)
            continue
        h.update(block[:n])
        written += n
    sock.setblocking(True)
    return written, h


def read_to_eof(sock, timeout):
    sock.settimeout(timeout)
    h = hashlib.sha256()
    total = 0
    last = b""
    while True:
        d = sock.recv(1 << 20)
        if not d:
            return total, h, last
        total += len(d)
        h.update(d)
        last = (last + d)[-40:]


# ---- servers ----

def serve(args):
    ls = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((args.host, args.port))
    ls.listen(1024)
    print("listening on %s:%d mode %s" % (args.host, args.port, args.mode), flush=True)
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        ls.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            c, peer = ls.accept()
        except socket.timeout:
            break
        threading.Thread(target=serve_one, args=(args, c, peer), daemon=True).start()


def serve_one(args, c, peer):
    peer_text = "%s:%d" % (peer[0], peer[1])
    try:
        if args.mode == "abort":
            time.sleep(args.hold)
            unread = struct.unpack("i", fcntl.ioctl(c.fileno(), FIONREAD, b"\0\0\0\0"))[0]
            c.close()
            out(event="closed-unread", peer=peer_text, unread=unread, at=time.time())
        elif args.mode == "respond":
            c.sendall(data_of(1, args.bytes))
            c.settimeout(args.timeout)
            try:
                d = c.recv(CHUNK)
                how = "data" if d else "eof"
            except OSError as e:
                how = describe(e)
            out(event="peer-ended", peer=peer_text, how=how, at=time.time())
            c.close()
        elif args.mode == "close-first":
            c.sendall(b"x" * 100)
            c.close()
        elif args.mode == "shut-first":
            c.sendall(data_of(SHUT_FIRST_SEED, args.bytes))
            c.shutdown(socket.SHUT_WR)
            total, h, _ = read_to_eof(c, args.timeout)
            out(event="shut-first", peer=peer_text, bytes=total, sha256=h.hexdigest(),
                at=time.time())
            c.close()
        elif args.mode == "sink":
            time.sleep(args.hold)
            total, h, _ = read_to_eof(c, args.timeout)
            c.sendall((json.dumps({"bytes": total, "sha256": h.hexdigest()}) + "\n").encode())
            c.close()
        elif args.mode == "source":
            written, h = write_without_reader(c, args.hold, args.seed, args.cap)
            c.sendall(struct.pack("!Q", written) + h.digest())
            c.close()
            out(event="sourced", peer=peer_text, written=written)
        elif args.mode == "ack":
            c.settimeout(args.timeout)
            count = struct.unpack("!Q", recv_exact(c, 8))[0]
            time.sleep(args.hold)
            buf = bytearray(1 << 20)
            left = count
            while left > 0:
                n = c.recv_into(buf, min(left, len(buf)))
                if not n:
                    raise ConnectionError("EOF with %d of %d bytes unread" % (left, count))
                left -= n
            c.sendall(struct.pack("!Q", count))
            # Wait for the client's close, as the bench's sink does.
            while c.recv(CHUNK):
                pass
            c.close()
        elif args.mode == "echo":
            c.settimeout(args.timeout)
            while True:
                d = c.recv(CHUNK)
                if not d:
                    break
                c.sendall(d)
            c.shutdown(socket.SHUT_WR)
            c.close()
    except OSError as e:
        out(event="error", peer=peer_text, error=describe(e))
        c.close()


def recv_exact(sock, n):
    got = b""
    while len(got) < n:
        d = sock.recv(n - len(got))
        if not d:
            raise ConnectionError("EOF after %d of %d bytes" % (len(got), n))
        got += d
    return got


# ---- clients ----

def connect(args, bind=None):
    host, _, port = args.target.rpartition(":")
    host = host.strip("[]")
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if bind:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if args.transparent:
            s.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT
        bhost, _, bport = bind.rpartition(":")
        s.bind((bhost.strip("[]"), int(bport)))
    s.settimeout(args.timeout)
    t = time.monotonic()
    s.connect((host, int(port)))
    return s, time.monotonic() - t


def client(args):
    if args.mode == "abort":
        s, _ = connect(args)
        s.sendall(data_of(2, args.bytes))
        try:
            d = s.recv(CHUNK)
            how = "data" if d else "eof"
        except OSError as e:
            how = describe(e)
        out(how=how, at=time.time(), local=s.getsockname()[1])
        s.close()
    elif args.mode == "respond":
        s, _ = connect(args)
        first = s.recv(1)
        time.sleep(0.3)  # the rest of the response arrives and stays unread
        local = s.getsockname()[1]
        at = time.time()
        s.close()
        out(closed_at=at, got=len(first), local=local)
    elif args.mode == "reconnect":
        times, totals, received, errors = [], [], [], []
        for _ in range(args.rounds):
            try:
                t0 = time.monotonic()
                s, dt = connect(args, bind=args.bind)
                total, _, _ = read_to_eof(s, args.timeout)
                s.close()
                times.append(round(dt * 1000, 2))
                totals.append(round((time.monotonic() - t0) * 1000, 2))
                received.append(total)
            except OSError as e:
                errors.append(describe(e))
        out(connect_ms=times, total_ms=totals, received=received, errors=errors)
    elif args.mode == "shut-first":
        s, _ = connect(args)
        total, h, _ = read_to_eof(s, args.timeout)
        first = {"received": total,
                 "received_intact": h.hexdigest() == hashlib.sha256(
                     data_of(SHUT_FIRST_SEED, args.server_bytes)).hexdigest()}
        data = data_of(args.seed, args.bytes)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(args.timeout)
            d = s.recv(CHUNK)  # the server's FIN came before: EOF again, unless a reset did
            end = "eof" if not d else "data"
        except OSError as e:
            end = describe(e)
        out(sent=len(data), sent_sha256=hashlib.sha256(data).hexdigest(), end=end,
            local=s.getsockname()[1], **first)
        s.close()
    elif args.mode == "rounds":
        rounds(args)
    elif args.mode == "churn":
        churn(args)
    elif args.mode == "upload":
        upload(args)
    elif args.mode == "push":
        s, _ = connect(args)
        written, h = write_without_reader(s, args.hold, args.seed, args.cap)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(args.timeout)
        line = b""
        while not line.endswith(b"\n"):
            d = s.recv(4096)
            if not d:
                break
            line += d
        got = json.loads(line) if line.endswith(b"\n") else {}
        out(written=written, received=got.get("bytes"),
            intact=got.get("bytes") == written and got.get("sha256") == h.hexdigest())
        s.close()
    elif args.mode == "pull":
        s, _ = connect(args)
        time.sleep(args.hold + 0.5)
        out(**read_to_eof_keep_trailer(s, args.timeout))
        s.close()
    elif args.mode == "echo":
        s, _ = connect(args, bind=args.bind)
        data = data_of(args.seed, args.bytes)
        result = {}

        def reader():
            try:
                total, h, _ = read_to_eof(s, args.timeout)
                result.update(bytes=total, sha=h.hexdigest())
            except OSError as e:
                result.update(error=describe(e))
        t = threading.Thread(target=reader)
        t.start()
        for off in range(0, len(data), CHUNK):
            s.sendall(data[off:off + CHUNK])
            if args.pace:
                time.sleep(args.pace)
        s.shutdown(socket.SHUT_WR)
        t.join(args.timeout + 5)
        out(sent=len(data), intact=result.get("sha") == hashlib.sha256(data).hexdigest(),
            **result)
        s.close()


def read_to_eof_keep_trailer(s, timeout):
    """Reads to EOF; the last 40 bytes are source's trailer (count, SHA-256 of the rest)."""
    s.settimeout(timeout)
    h = hashlib.sha256()
    pending = b""
    total = 0
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        pending += d
        if len(pending) > 40:
            body, pending = pending[:-40], pending[-40:]
            h.update(body)
            total += len(body)
    if len(pending) != 40:
        return {"intact": False, "error": "no trailer"}
    count = struct.unpack("!Q", pending[:8])[0]
    return {"written": count, "received": total,
            "intact": count == total and pending[8:] == h.digest()}


def make_blocking(s, timeout):
    """A blocking socket whose recv() is one recvmsg() call (no poll() first, as a Python timeout
    would make, which hides an EAGAIN), bounded by SO_RCVTIMEO/SO_SNDTIMEO of `timeout` seconds."""
    timeo = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
    s.settimeout(None)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeo)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeo)


def upload(args):
    payload = data_of(args.seed, args.bytes)
    streams = [{} for _ in range(args.parallel)]
    socks = []
    for r in streams:  # all connected first, then all send at once (the bench's loadgen)
        s, _ = connect(args)
        make_blocking(s, args.timeout)
        socks.append(s)
        r["local"] = s.getsockname()[1]
    start = threading.Barrier(args.parallel + 1)

    def send(s, r):
        try:
            s.sendall(struct.pack("!Q", len(payload)))
            view = memoryview(payload)
            step = args.chunk or len(payload)
            for off in range(0, len(payload), step):
                s.sendall(view[off:off + step])
            r["sent"] = True
        except OSError as e:
            r.update(send_error=describe(e), send_errno=e.errno or 0)

    def receive(s, r):
        ack, t = b"", time.monotonic()
        try:
            while len(ack) < 8:
                t = time.monotonic()
                d = s.recv(8 - len(ack))
                if not d:
                    raise ConnectionError("EOF before the ack")
                ack += d
            r["recv_ms"] = round((time.monotonic() - t) * 1000, 1)
            r["answered"] = struct.unpack("!Q", ack)[0] == len(payload)
        except OSError as e:
            r.update(error=describe(e), errno=e.errno or 0,
                     waited_ms=round((time.monotonic() - t) * 1000, 1))

    def stream(s, r):
        start.wait()
        try:
            if args.recv_after is None:  # the bench's order: send everything, then recv()
                send(s, r)
                if r.get("sent"):
                    receive(s, r)
                return
            # A full-duplex app: its reader goes to sleep in recv() --recv-after seconds after
            # the first send (or when the send ends), while the writer may still be blocked.
            sender = threading.Thread(target=send, args=(s, r), daemon=True)
            sender.start()
            sender.join(args.recv_after)
            r["recv_during_send"] = sender.is_alive()
            receive(s, r)
            sender.join(args.timeout + 5)
        finally:
            s.close()
    threads = [threading.Thread(target=stream, args=(s, r), daemon=True)
               for s, r in zip(socks, streams)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    start.wait(args.max_seconds)
    for t in threads:
        t.join(max(0.1, args.max_seconds - (time.monotonic() - t0)))
    failed = [r for r in streams if not (r.get("answered") and r.get("sent"))]
    out(streams=len(streams), answered=sum(1 for r in streams if r.get("answered")),
        eagain=sum(1 for r in streams if r.get("errno") == errno.EAGAIN),
        failures=failed[:8], elapsed=round(time.monotonic() - t0, 2),
        max_recv_ms=max([r.get("recv_ms", 0) for r in streams]),
        recv_during_send=sum(1 for r in streams if r.get("recv_during_send")))


def rounds(args):
    """Request and response in lockstep against an echo server: --rounds messages of --bytes,
    each sent and then read back whole before the next, on a blocking socket (SO_RCVTIMEO), so
    that each recv() is one recvmsg() that sleeps until the answer comes, as an RPC client's does.
    Then a half-close, and the server's EOF. Reports how many rounds came back intact and any
    error, with its errno (EAGAIN from a blocking recv() before its timeout is a bug)."""
    s, _ = connect(args)
    make_blocking(s, args.timeout)
    r = {"rounds": args.rounds, "intact": 0}
    t = time.monotonic()
    try:
        for i in range(args.rounds):
            msg = data_of(args.seed + i, args.bytes)
            s.sendall(msg)
            t = time.monotonic()
            got = recv_exact(s, len(msg))
            if got != msg:
                r["error"] = "round %d came back different" % i
                break
            r["intact"] += 1
        else:
            s.shutdown(socket.SHUT_WR)
            # The server's FIN, nothing more: recv() answers 0. A blocking recv() that answers
            # EAGAIN well before its timeout is counted and called once more.
            r["eof_eagain"] = 0
            for _ in range(2):
                t = time.monotonic()
                try:
                    r["after_eof"] = len(s.recv(CHUNK))
                    break
                except BlockingIOError:
                    if time.monotonic() - t > args.timeout * 0.9:
                        raise
                    r["eof_eagain"] += 1
    except OSError as e:
        r.update(error=describe(e), errno=e.errno or 0,
                 waited_ms=round((time.monotonic() - t) * 1000, 1))
    s.close()
    out(**r)


def churn(args):
    lock = threading.Lock()
    stats = {"done": 0, "failed": 0, "errors": [], "slow": 0, "max_ms": 0.0}
    next_index = [0]
    deadline = time.monotonic() + args.max_seconds

    def worker():
        while time.monotonic() < deadline:
            with lock:
                if next_index[0] >= args.conns:
                    return
                next_index[0] += 1
            try:
                s, dt = connect(args)
                read_to_eof(s, args.timeout)
                s.close()
                ms = dt * 1000
                with lock:
                    stats["done"] += 1
                    stats["max_ms"] = max(stats["max_ms"], round(ms, 2))
                    if ms >= 100:
                        stats["slow"] += 1
            except OSError as e:
                with lock:
                    stats["failed"] += 1
                    if len(stats["errors"]) < 5:
                        stats["errors"].append(describe(e))
    threads = [threading.Thread(target=worker) for _ in range(args.parallel)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats["elapsed"] = round(time.monotonic() - t0, 2)
    stats["unstarted"] = args.conns - next_index[0]
    out(**stats)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--mode", required=True,
                   choices=["abort", "respond", "close-first", "shut-first", "sink", "source",
                            "echo", "ack"])
    s.add_argument("--hold", type=float, default=0.3)
    s.add_argument("--bytes", type=int, default=256 * 1024)
    s.add_argument("--seed", type=int, default=3)
    s.add_argument("--cap", type=int, default=128 << 20)
    s.add_argument("--timeout", type=float, default=20)
    s.add_argument("--max-seconds", type=float, default=3600)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--mode", required=True,
                   choices=["abort", "respond", "reconnect", "churn", "push", "pull", "echo",
                            "upload", "rounds", "shut-first"])
    c.add_argument("--bytes", type=int, default=64 * 1024)
    c.add_argument("--server-bytes", type=int, default=256 * 1024)
    c.add_argument("--bind", default=None)
    c.add_argument("--transparent", action="store_true")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--conns", type=int, default=1000)
    c.add_argument("--parallel", type=int, default=8)
    c.add_argument("--hold", type=float, default=2.0)
    c.add_argument("--seed", type=int, default=3)
    c.add_argument("--cap", type=int, default=128 << 20)
    c.add_argument("--pace", type=float, default=0)
    c.add_argument("--chunk", type=int, default=0)
    c.add_argument("--recv-after", type=float, default=None)
    c.add_argument("--timeout", type=float, default=10)
    c.add_argument("--max-seconds", type=float, default=120)
    args = p.parse_args(argv)
    if args.role == "serve":
        serve(args)
        return 0
    try:
        client(args)
    except OSError as e:
        out(error=describe(e), errno=getattr(e, "errno", None) or 0)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
