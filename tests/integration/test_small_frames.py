"""What an inbound tunnel holds follows its bytes, not its DATA frames (issue #18).

A client speaks HTTP/2 over mutual TLS straight to node B's inbound port 15008 and writes DATA
frames of 1 to 16 bytes by hand (python-h2 would take minutes to frame millions of them; hpack
encodes the headers). Checked, against real sockets:

  * the application behind the tunnel does not read while the client fills the stream window
    with 1-byte (and, separately, 4-byte) frames: the proxy's RSS grows by at most twice the
    window, and once the application reads, every byte arrives;
  * the same while the proxy is still dialling the application (DATA that arrives before the
    tunnel is answered is held too, until the dial completes);
  * the other way: an application that writes a byte at a time while the client's window is
    shut costs the proxy its bytes, not a read buffer per byte;
  * 200,000 frames of 1-16 bytes through an echo server come back intact and in order, with no
    GOAWAY or RST_STREAM (small frames are neither refused nor rate limited);
  * one byte per millisecond for 10 s: the tunnel stays open, each byte comes back promptly.

Run with /usr/bin/python3 (the interpreter that has h2 and hpack); without them it skips (77).
"""
import os
import random
import socket
import ssl
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

try:
    import hpack
    import test_interop_h2 as interop
except ImportError:  # pragma: no cover - only on an interpreter without python3-h2
    if __name__ == "__main__":
        sys.stderr.write("python3-h2 / hpack is not available to %s; skipping\n" % sys.executable)
        sys.exit(77)
    raise

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
MAX_WINDOW = (1 << 31) - 1

IO_TIMEOUT = 10.0  # any single wait for the proxy


def frame(ftype, flags, stream_id, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags,
                                                             stream_id) + payload


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


class RawStream:
    def __init__(self):
        self.status = None
        self.data = bytearray()
        self.ended = False
        self.reset = None


class RawH2Client:
    """A minimal HTTP/2 client on one TLS connection: frames written by hand, so that millions
    of tiny DATA frames cost the test little. It keeps the proxy's flow-control windows (sending
    beyond them would be the client's fault) and opens its own receive windows as far as HTTP/2
    allows, so the proxy never waits for it."""

    def __init__(self, ip, port, ctx, source_ip, receive_window=MAX_WINDOW):
        raw = socket.create_connection((ip, port), timeout=IO_TIMEOUT,
                                       source_address=(source_ip, 0))
        try:
            self.tls = ctx.wrap_socket(raw)
        except Exception:
            raw.close()
            raise
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.buf = bytearray()
        self.streams = {}
        self.conn_window = 65535  # what we may still send, connection and per stream
        self.stream_windows = {}
        self.peer_initial_window = 65535
        self.peer_settings = False
        self.goaway = None
        self.eof = False
        self.next_stream = 1
        settings = struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, receive_window)
        self.tls.sendall(PREFACE + frame(SETTINGS, 0, 0, settings) +
                         frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))
        self.pump(lambda: self.peer_settings, what="server SETTINGS")

    # -- receiving

    def pump(self, until, timeout=IO_TIMEOUT, what="condition", quiet=False):
        """Handles frames until until() is true; fails after timeout (quiet: returns False)."""
        deadline = time.time() + timeout
        while not until():
            left = deadline - time.time()
            if left <= 0 or self.eof:
                if quiet and not self.eof:
                    return False
                raise AssertionError("h2 client: %s did not happen (eof=%s goaway=%s)" % (
                    what, self.eof, self.goaway))
            self.tls.settimeout(min(left, 0.2))
            try:
                d = self.tls.recv(1 << 20)
            except socket.timeout:
                continue
            if not d:
                self.eof = True
                continue
            self.handle(d)
        return True

    def drain(self):
        """Handles whatever has arrived, without waiting."""
        self.tls.settimeout(0.0)
        try:
            for _ in range(64):  # bounded: the caller comes back soon
                d = self.tls.recv(1 << 20)
                if not d:
                    self.eof = True
                    return
                self.handle(d)
        except (ssl.SSLWantReadError, BlockingIOError, socket.timeout):
            pass

    def handle(self, d):
        self.buf += d
        out = b""
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[0:3], "big")
            if len(self.buf) < 9 + n:
                break
            ftype, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.buf[9:9 + n])
            del self.buf[:9 + n]
            out += self.on_frame(ftype, flags, sid, payload)
        if out:
            self.tls.settimeout(IO_TIMEOUT)
            self.tls.sendall(out)

    def on_frame(self, ftype, flags, sid, payload):
        st = self.streams.get(sid)
        if ftype in (DATA, HEADERS) and flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        if ftype == DATA and st is not None:
            st.data += payload
            st.ended = st.ended or bool(flags & END_STREAM)
        elif ftype == HEADERS and st is not None:
            if flags & PRIORITY:
                payload = payload[5:]
            headers = dict(self.decoder.decode(payload, raw=False))
            st.status = int(headers.get(":status", 0))
            st.ended = st.ended or bool(flags & END_STREAM)
        elif ftype == RST_STREAM and st is not None:
            st.reset = int.from_bytes(payload[:4], "big")
        elif ftype == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack(">HI", payload[i:i + 6])
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.peer_initial_window
                    self.peer_initial_window = value
                    for s in self.stream_windows:
                        self.stream_windows[s] += delta
            self.peer_settings = True
            return frame(SETTINGS, ACK, 0)
        elif ftype == PING and not flags & ACK:
            return frame(PING, ACK, 0, payload)
        elif ftype == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif ftype == WINDOW_UPDATE:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += inc
            elif sid in self.stream_windows:
                self.stream_windows[sid] += inc
        return b""

    # -- sending

    def connect(self, authority, wait=True):
        sid = self.next_stream
        self.next_stream += 2
        self.streams[sid] = RawStream()
        self.stream_windows[sid] = self.peer_initial_window
        block = self.encoder.encode([(":method", "CONNECT"), (":authority", authority)])
        self.tls.settimeout(IO_TIMEOUT)
        self.tls.sendall(frame(HEADERS, END_HEADERS, sid, block))
        if wait:
            self.pump(lambda: self.answered(sid), what="answer to CONNECT")
        return sid

    def answered(self, sid):
        return self.streams[sid].status is not None or self.streams[sid].reset is not None

    def window(self, sid):
        return min(self.conn_window, self.stream_windows[sid])

    def send_raw(self, sid, wire, flow_bytes):
        """Writes prepared DATA frames carrying flow_bytes of window."""
        self.tls.settimeout(IO_TIMEOUT)
        self.tls.sendall(wire)
        self.conn_window -= flow_bytes
        self.stream_windows[sid] -= flow_bytes

    def check_healthy(self, sid, what):
        st = self.streams[sid]
        if self.goaway is not None or st.reset is not None or self.eof:
            raise AssertionError("%s: GOAWAY %s, RST_STREAM %s, eof %s" % (
                what, self.goaway, st.reset, self.eof))

    def close(self):
        try:
            self.tls.settimeout(1.0)
            self.tls.sendall(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
        except (OSError, ValueError):
            pass
        try:
            self.tls.close()
        except OSError:
            pass


class StalledApp(harness.TcpServer):
    """The application of a slow reader: accepts, reads nothing until go is set, then counts
    (and checks) everything until EOF. Its receive buffer is small, so that what the kernel
    holds for it is small and the proxy's queue is what a stalled tunnel costs."""

    def __init__(self, ip, port, fill):
        self.go = threading.Event()
        self.fill = fill
        self.conns = []
        super().__init__(ip, port, backlog=4)
        # Inherited by accepted sockets (set before the handshake, as a receive buffer must be).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def _track(self, addr):
        rec = {"bytes": 0, "other": 0, "fin": False}
        self.conns.append(rec)
        return rec

    def _serve(self, c, addr, rec):
        deadline = time.time() + 120
        try:
            while not self.go.wait(0.1):
                if self.stopped or time.time() > deadline:
                    return
            c.settimeout(0.2)
            while not self.stopped and time.time() < deadline:
                try:
                    d = c.recv(1 << 20)
                except socket.timeout:
                    continue
                if not d:
                    rec["fin"] = True
                    return
                rec["bytes"] += len(d)
                rec["other"] += len(d) - d.count(self.fill)
        except OSError:
            pass
        finally:
            c.close()


class UnacceptedApp:
    """An application whose listen queue is full (a connection of the test's own sits in it,
    never accepted), so the kernel drops the proxy's SYNs and its dial waits for retransmission.
    release() accepts both and counts (and checks) what the proxy's connection carries."""

    def __init__(self, ip, port, fill):
        self.fill = fill
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(0)  # room for one: the plug below
        self.plug = socket.create_connection((ip, port), timeout=IO_TIMEOUT)
        self.conns = []
        self.stopped = False
        self.thread = None

    def release(self):
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        deadline = time.time() + 60
        plug_peer = self.plug.getsockname()
        conn = None
        while conn is None and not self.stopped and time.time() < deadline:
            try:
                c, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if addr == plug_peer:
                c.close()
            else:
                conn = c
        if conn is None:
            return
        rec = {"bytes": 0, "other": 0}
        self.conns.append(rec)
        conn.settimeout(0.2)
        try:
            while not self.stopped and time.time() < deadline:
                try:
                    d = conn.recv(1 << 20)
                except socket.timeout:
                    continue
                if not d:
                    return
                rec["bytes"] += len(d)
                rec["other"] += len(d) - d.count(self.fill)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopped = True
        self.plug.close()
        self.sock.close()
        if self.thread is not None:
            self.thread.join(2)


class TricklingApp(harness.TcpServer):
    """Writes `count` single bytes, one every `interval` seconds, to each connection; then holds
    it open until closed."""

    def __init__(self, ip, port, count, interval):
        self.count, self.interval = count, interval
        self.written = 0
        super().__init__(ip, port, backlog=4)

    def _serve(self, c, addr, _rec):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.time()
        try:
            for i in range(self.count):
                if self.stopped or time.time() > t0 + 60:
                    return
                wait = t0 + i * self.interval - time.time()
                if wait > 0:
                    time.sleep(wait)
                c.sendall(b"y")
                self.written += 1
            while not self.stopped and time.time() < t0 + 60:
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            c.close()


class SmallFramesTest(interop.InteropTest):
    def setUp(self):
        super().setUp()
        self.pid = self.mesh.b.proc.pid

    def extra_workloads(self, block):
        # Called before the nodes start: node B's dial must outlast a few SYN retransmissions
        # (1 s, 3 s, 7 s) for the test of DATA that arrives while it dials.
        self.mesh.b.args += ["--connect-timeout-ms", "20000"]
        return ""

    def raw_client(self):
        c = RawH2Client(self.mesh.server_ip, 15008, self.client_ctx(), self.mesh.client_ip)
        self.closers.append(c.close)
        return c

    def fill_window(self, c, sid, frame_bytes, settle):
        """Sends whatever the windows allow in frames of frame_bytes until no WINDOW_UPDATE comes
        for `settle` seconds: the proxy reopens the window only for what the application has
        taken (here: what the kernel's buffers take), so that is when it holds all it will.
        Bounded by bytes and time in any case. Returns (bytes sent, RSS before, peak RSS)."""
        before = peak = rss_kib(self.pid)
        template = frame(DATA, 0, sid, b"x" * frame_bytes)
        per_send = max(1, (1 << 20) // len(template))
        window = c.peer_initial_window
        sent, t0 = 0, time.time()
        limit = 3 * window
        while sent < limit and time.time() < t0 + 40:
            c.drain()
            c.check_healthy(sid, "while filling the window")
            n = min(c.window(sid), limit - sent) // frame_bytes
            if n == 0:
                if not c.pump(lambda: c.window(sid) >= frame_bytes, timeout=settle, quiet=True):
                    break  # the window stays shut
                continue
            n = min(n, per_send)
            c.send_raw(sid, template * n, n * frame_bytes)
            sent += n * frame_bytes
            peak = max(peak, rss_kib(self.pid))
        c.pump(lambda: False, timeout=0.5, quiet=True)  # the proxy reads the last frames
        peak = max(peak, rss_kib(self.pid))
        sys.stderr.write("  %d-byte frames: %d bytes (%d frames) sent in %.1f s; proxy RSS %d -> "
                         "%d KiB (+%.1f MiB, window %d KiB)\n" % (
                             frame_bytes, sent, sent // frame_bytes, time.time() - t0, before,
                             peak, (peak - before) / 1024, window // 1024))
        self.assertGreaterEqual(sent, window, "the client filled at least one stream window")
        c.check_healthy(sid, "after filling the window")
        self.assertLessEqual((peak - before) * 1024, 2 * window,
                             "a stalled tunnel of %d-byte frames grew the proxy by %.1f MiB "
                             "(window %d KiB)" % (frame_bytes, (peak - before) / 1024,
                                                  window // 1024))
        return sent

    def stalled_tunnel(self, frame_bytes):
        app = StalledApp(self.mesh.server_ip, 8081, b"x")
        self.closers.append(app.close)
        c = self.raw_client()
        sid = c.connect(self.mesh.server_ip + ":8081")
        self.assertEqual(c.streams[sid].status, 200)
        wait_until(lambda: len(app.conns) == 1, what="application accepted the tunnel")
        time.sleep(0.5)  # let the connection's own buffers settle
        sent = self.fill_window(c, sid, frame_bytes, settle=1.5)
        # Nothing was lost while it was held: once the application reads, all of it arrives.
        app.go.set()
        wait_until(lambda: app.conns[0]["bytes"] >= sent, timeout=20, interval=0.05,
                   what="all %d bytes at the application" % sent)
        self.assertEqual(app.conns[0]["bytes"], sent)
        self.assertEqual(app.conns[0]["other"], 0)

    def test_a_window_of_one_byte_frames_costs_its_bytes(self):
        self.stalled_tunnel(1)

    def test_a_window_of_four_byte_frames_costs_its_bytes(self):
        self.stalled_tunnel(4)

    def test_a_window_of_four_byte_frames_while_the_proxy_dials(self):
        app = UnacceptedApp(self.mesh.server_ip, 8082, b"x")
        self.closers.append(app.close)
        c = self.raw_client()
        time.sleep(0.3)  # the client's connection settles before the baseline
        sid = c.connect(self.mesh.server_ip + ":8082", wait=False)
        # Nothing is consumed before the dial completes: the window closes at exactly its size.
        sent = self.fill_window(c, sid, 4, settle=0.5)
        self.assertFalse(c.answered(sid), "the data was early: the dial was still under way")
        self.assertEqual(sent, c.peer_initial_window)
        app.release()
        c.pump(lambda: c.answered(sid), timeout=15, what="answer to CONNECT once accepted")
        self.assertEqual(c.streams[sid].status, 200)
        wait_until(lambda: app.conns and app.conns[0]["bytes"] >= sent, timeout=20,
                   interval=0.05, what="all %d early bytes at the application" % sent)
        self.assertEqual(app.conns[0]["bytes"], sent)
        self.assertEqual(app.conns[0]["other"], 0)

    def test_a_trickling_application_behind_a_closed_window_costs_its_bytes(self):
        # The other direction: the client gives the proxy no window (0), so what the application
        # writes, a byte at a time, waits in the proxy's send queue. Each of those reads must
        # cost its byte there, not the read buffer it came in.
        count = 3000
        app = TricklingApp(self.mesh.server_ip, 8083, count, 0.0005)
        self.closers.append(app.close)
        c = RawH2Client(self.mesh.server_ip, 15008, self.client_ctx(), self.mesh.client_ip,
                        receive_window=0)
        self.closers.append(c.close)
        sid = c.connect(self.mesh.server_ip + ":8083")
        self.assertEqual(c.streams[sid].status, 200)
        time.sleep(0.3)
        before = peak = rss_kib(self.pid)
        deadline = time.time() + 20
        while app.written < count and time.time() < deadline:
            c.pump(lambda: False, timeout=0.1, quiet=True)
            peak = max(peak, rss_kib(self.pid))
        c.pump(lambda: False, timeout=0.5, quiet=True)
        peak = max(peak, rss_kib(self.pid))
        sys.stderr.write("  %d bytes trickled behind a closed window: proxy RSS %d -> %d KiB "
                         "(+%.1f MiB)\n" % (app.written, before, peak, (peak - before) / 1024))
        self.assertEqual(app.written, count)
        self.assertEqual(len(c.streams[sid].data), 0, "nothing sent beyond the window")
        self.assertLess((peak - before) * 1024, 2 << 20,
                        "%d one-byte reads held behind a closed window grew the proxy by %.1f MiB"
                        % (count, (peak - before) / 1024))
        # Once the window opens, every byte arrives, in order.
        c.tls.sendall(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 1 << 20)))
        c.pump(lambda: len(c.streams[sid].data) >= count, what="the held bytes")
        self.assertEqual(bytes(c.streams[sid].data), b"y" * count)

    def test_200k_tiny_frames_echo_intact_and_in_order(self):
        rng = random.Random(18)
        sizes = [rng.randint(1, 16) for _ in range(200000)]
        blob = os.urandom(sum(sizes))
        c = self.raw_client()
        sid = c.connect(self.mesh.server_ip + ":8080")
        st = c.streams[sid]
        self.assertEqual(st.status, 200)
        t0 = time.time()
        deadline = t0 + 40
        pos = i = 0
        while i < len(sizes):
            self.assertLess(time.time(), deadline, "sent %d of %d frames in time" % (
                i, len(sizes)))
            c.drain()
            c.check_healthy(sid, "after %d frames" % i)
            room = c.window(sid)
            if room < sizes[i]:
                c.pump(lambda: c.window(sid) >= sizes[i], what="window for frame %d" % i)
                continue
            # A batch of frames within the window and at most ~256 KiB on the wire.
            parts, flow = [], 0
            while i < len(sizes) and flow + sizes[i] <= room and len(parts) < 16384:
                n = sizes[i]
                last = i == len(sizes) - 1
                parts.append(frame(DATA, END_STREAM if last else 0, sid, blob[pos:pos + n]))
                pos, flow, i = pos + n, flow + n, i + 1
            c.send_raw(sid, b"".join(parts), flow)
        c.pump(lambda: st.ended or st.reset is not None or c.goaway is not None, timeout=30,
               what="the echo and END_STREAM")
        sys.stderr.write("  %d frames (%d bytes) echoed in %.1f s\n" % (
            len(sizes), len(blob), time.time() - t0))
        self.assertIsNone(c.goaway)
        self.assertIsNone(st.reset)
        self.assertTrue(st.ended)
        self.assertEqual(len(st.data), len(blob))
        self.assertTrue(st.data == blob, "echo identical to what was sent, in order")

    def test_one_byte_per_millisecond_for_ten_seconds(self):
        c = self.raw_client()
        sid = c.connect(self.mesh.server_ip + ":8080")
        st = c.streams[sid]
        self.assertEqual(st.status, 200)
        count = 10000
        payload = bytes(random.Random(5).randrange(256) for _ in range(count))
        t0 = time.time()
        worst_lag = 0
        for i in range(count):
            wait = t0 + i * 0.001 - time.time()
            if wait > 0:
                time.sleep(wait)
            self.assertLess(time.time() - t0, 30, "trickle on schedule")
            c.send_raw(sid, frame(DATA, 0, sid, payload[i:i + 1]), 1)
            c.drain()
            c.check_healthy(sid, "after %d bytes of trickle" % i)
            worst_lag = max(worst_lag, i + 1 - len(st.data))
        c.pump(lambda: len(st.data) >= count, timeout=5, what="the last trickled bytes echoed")
        took = time.time() - t0
        sys.stderr.write("  trickle: %d bytes in %.1f s, echo at most %d bytes behind\n" % (
            count, took, worst_lag))
        # Each byte is written on at once, not held for a batch that never fills: the echo
        # never falls far behind (1,000 bytes is a second, generous for a loaded machine).
        self.assertLess(worst_lag, 1000)
        c.check_healthy(sid, "after the trickle")
        c.send_raw(sid, frame(DATA, END_STREAM, sid), 0)
        c.pump(lambda: st.ended or st.reset is not None, what="END_STREAM after the trickle")
        self.assertIsNone(st.reset)
        self.assertEqual(bytes(st.data), payload)


if __name__ == "__main__":
    unittest.main(verbosity=2)
