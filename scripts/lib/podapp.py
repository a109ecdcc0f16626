#!/usr/bin/python3
"""The application in a simulated pod: an echo server that tells each client who it saw, and a
client that checks every byte it gets back. Standard library only; every wait is bounded.

  podapp.py serve  --port P [--name NAME]
      On each connection: one greeting line, JSON {"server": NAME, "peer": "ip:port"} (the
      address the server saw: the test of source-IP preservation), then echoes until EOF, then
      closes. Logs one line per connection to stdout.
  podapp.py client --target IP:PORT [--conns C] [--bytes N] [--seed S] [--timeout T]
                   [--stream-seconds S [--chunk B]] [--text T]
      C concurrent connections; each reads the greeting, sends N pseudo-random bytes (or, with
      --stream-seconds, chunks for that long) while reading the echo, half-closes, and checks
      that exactly the bytes sent came back (SHA-256) followed by EOF. Prints one JSON report:
      {"ok", "conns", "failed", "errors", "servers", "seen_as", "bytes", "elapsed", "ended_at",
       "first_error_at"} (times: seconds since the epoch).
"""
import argparse
import asyncio
import hashlib
import json
import random
import sys
import time


def pattern(seed, size, text=b""):
    """`size` pseudo-random bytes from `seed`, or `text` repeated (--text)."""
    if text:
        return (text * (size // len(text) + 1))[:size]
    return random.Random(seed).randbytes(size)


async def serve(args):
    async def handle(reader, writer):
        peer = writer.get_extra_info("peername")
        peer_text = "%s:%d" % (peer[0], peer[1])
        print("accepted from %s" % peer_text, flush=True)
        total = 0
        try:
            writer.write((json.dumps({"server": args.name, "peer": peer_text}) + "\n").encode())
            await writer.drain()
            while True:
                data = await asyncio.wait_for(reader.read(65536), args.idle_timeout)
                if not data:
                    break
                total += len(data)
                writer.write(data)
                await writer.drain()
            writer.write_eof()
            await writer.drain()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            print("connection from %s ended: %s" % (peer_text, type(e).__name__), flush=True)
        finally:
            writer.close()
        print("closed %s after echoing %d bytes" % (peer_text, total), flush=True)

    server = await asyncio.start_server(handle, host=args.host, port=args.port, backlog=1024,
                                        reuse_address=True)
    print("listening on %s:%d as %s" % (args.host, args.port, args.name), flush=True)
    async with server:
        await asyncio.sleep(args.max_seconds)


def describe(e):
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, BrokenPipeError):
        return "broken-pipe"  # a send after the peer's reset
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, asyncio.IncompleteReadError):
        return "eof"
    return "%s: %s" % (type(e).__name__, e)


async def one_connection(args, index, report):
    host, _, port = args.target.rpartition(":")
    seed = args.seed * 100003 + index
    sent_hash, got_hash = hashlib.sha256(), hashlib.sha256()
    sent = got = 0
    sender = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"),
                                                                        int(port)),
                                                args.timeout)
    except (OSError, asyncio.TimeoutError) as e:
        report["errors"].append("connect: " + describe(e))
        report["first_error_at"] = report["first_error_at"] or time.time()
        return False
    try:
        line = await asyncio.wait_for(reader.readline(), args.timeout)
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        hello = json.loads(line)
        report["servers"].add(hello["server"])
        report["seen_as"].add(hello["peer"].rpartition(":")[0])

        async def send():
            nonlocal sent
            if args.stream_seconds:
                end = time.monotonic() + args.stream_seconds
                i = 0
                while time.monotonic() < end:
                    chunk = pattern(seed + i, args.chunk, args.text.encode())
                    i += 1
                    sent_hash.update(chunk)
                    sent += len(chunk)
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), args.timeout)
                    await asyncio.sleep(0.01)
            else:
                data = pattern(seed, args.bytes, args.text.encode())
                sent_hash.update(data)
                for off in range(0, len(data), 65536):
                    writer.write(data[off:off + 65536])
                    await asyncio.wait_for(writer.drain(), args.timeout)
                sent = len(data)
            writer.write_eof()

        async def receive():
            nonlocal got
            while True:
                data = await asyncio.wait_for(reader.read(65536), args.timeout)
                if not data:
                    return
                got_hash.update(data)
                got += len(data)

        sender = asyncio.ensure_future(send())
        await receive()
        await sender
        if got != sent or got_hash.digest() != sent_hash.digest():
            raise ValueError("echo mismatch: sent %d bytes, got %d back%s" % (
                sent, got, "" if got != sent else " with different content"))
        report["bytes"] += got
        return True
    except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
        report["errors"].append("%s after %d bytes echoed" % (describe(e), got))
        report["first_error_at"] = report["first_error_at"] or time.time()
        return False
    finally:
        # When the receive side failed first, the sender is still running or has failed too:
        # end it and take its exception, or asyncio prints "Task exception was never retrieved"
        # after the report, and the report is no longer the last line.
        if sender is not None:
            if not sender.done():
                sender.cancel()
            try:
                await sender
            except (asyncio.CancelledError, OSError, asyncio.TimeoutError):
                pass
        writer.close()


async def client(args):
    report = {"target": args.target, "conns": args.conns, "failed": 0, "errors": [],
              "servers": set(), "seen_as": set(), "bytes": 0, "first_error_at": None,
              "started_at": time.time()}
    start = time.monotonic()
    results = await asyncio.wait_for(
        asyncio.gather(*[one_connection(args, i, report) for i in range(args.conns)]),
        args.timeout * 4 + args.stream_seconds)
    report["failed"] = results.count(False)
    report["ok"] = report["failed"] == 0
    report["elapsed"] = round(time.monotonic() - start, 3)
    report["ended_at"] = time.time()
    report["servers"] = sorted(report["servers"])
    report["seen_as"] = sorted(report["seen_as"])
    report["errors"] = report["errors"][:5]
    return report


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--name", default="app")
    s.add_argument("--idle-timeout", type=float, default=60)
    s.add_argument("--max-seconds", type=float, default=3600)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--conns", type=int, default=1)
    c.add_argument("--bytes", type=int, default=65536)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--timeout", type=float, default=10)
    c.add_argument("--stream-seconds", type=float, default=0)
    c.add_argument("--chunk", type=int, default=16384)
    c.add_argument("--text", default="", help="send this text repeated (to find it on a wire)")
    args = p.parse_args(argv)
    if args.mode == "serve":
        try:
            asyncio.run(serve(args))
        except KeyboardInterrupt:
            pass
        return 0
    try:
        report = asyncio.run(client(args))
    except asyncio.TimeoutError:
        report = {"ok": False, "target": args.target, "errors": ["overall deadline"]}
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
