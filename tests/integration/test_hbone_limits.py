"""Limits of the HBONE server (issue #14, items 4 and 10) and of its client, on real proxies:

  * connections: a cap per source IP (checked before TLS) under a flood of 10,000 connections
    from one address while another source keeps tunnelling; idle connections closed; a peer
    whose identity no port lets in loses its connection after the first refusal;
  * HTTP/2 abuse: a stream over MAX_CONCURRENT_STREAMS is refused alone (REFUSED_STREAM, RFC 9113
    5.1.2), rapid reset and CONTINUATION floods end in GOAWAY(ENHANCE_YOUR_CALM), an oversized
    header list gets 431;
  * the HBONE client says SETTINGS_ENABLE_PUSH=0.

Frames are written by hand (hpack for the header blocks) over Python's ssl. Run with
/usr/bin/python3 (hpack and h2 live there); without them the tests are skipped (77).
"""
import os
import resource
import selectors
import socket
import ssl
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import TwoNodeMesh, wait_until  # noqa: E402

try:
    import hpack
    import test_interop_h2 as interop
except ImportError:  # pragma: no cover - only on an interpreter without python3-h2
    if __name__ == "__main__":
        sys.stderr.write("python3-h2/hpack are not available to %s; skipping\n" % sys.executable)
        sys.exit(77)
    raise

TD = interop.TD
CLIENT_ID = interop.CLIENT_ID
PREFACE = interop.PREFACE
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x8, 0x7, 0xB
IO_TIMEOUT = 10.0


def frame(ftype, flags, sid, payload=b""):
    return interop.frame(ftype, flags, sid, payload)


class RawH2:
    """A hand-driven HTTP/2 client on one TLS connection: frames go out exactly as written."""

    def __init__(self, ip, port, ctx, source_ip):
        raw = socket.create_connection((ip, port), timeout=IO_TIMEOUT,
                                       source_address=(source_ip, 0))
        self.tls = ctx.wrap_socket(raw)
        self.enc = hpack.Encoder()
        self.buf = b""
        self.frames = []  # (type, flags, stream, payload) as received
        self.eof = False
        self.server_settings = None
        self.tls.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.pump(lambda: self.server_settings is not None, what="server SETTINGS")

    def send(self, data):
        self.tls.sendall(data)

    def block(self, authority, extra=()):
        return self.enc.encode([(":method", "CONNECT"), (":authority", authority)] + list(extra))

    def connect_frame(self, sid, authority, extra=()):
        return frame(HEADERS, END_HEADERS, sid, self.block(authority, extra))

    def pump(self, until, timeout=IO_TIMEOUT, what="condition", quiet=False):
        deadline = time.time() + timeout
        while not until():
            left = deadline - time.time()
            if left <= 0 or self.eof:
                if quiet:
                    return False
                raise AssertionError("raw h2: %s did not happen (eof=%s, frames: %s)" % (
                    what, self.eof, self.summary()))
            self.tls.settimeout(min(left, 0.5))
            try:
                d = self.tls.recv(65536)
            except socket.timeout:
                continue
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                self.eof = True
                continue
            if not d:
                self.eof = True
                continue
            self.buf += d
            got = interop.parse_frames(self.buf)
            used = sum(9 + len(p) for _, _, _, p in got)
            self.buf = self.buf[used:]
            for f in got:
                self.frames.append(f)
                if f[0] == SETTINGS and not f[1] & ACK:
                    self.server_settings = {
                        int.from_bytes(f[3][i:i + 2], "big"): int.from_bytes(f[3][i + 2:i + 6],
                                                                           "big")
                        for i in range(0, len(f[3]), 6)}
                    self.send(frame(SETTINGS, ACK, 0))
        return True

    def rst_codes(self, sid):
        return [int.from_bytes(p[:4], "big") for t, _, s, p in self.frames
                if t == RST_STREAM and s == sid]

    def goaway_codes(self):
        return [int.from_bytes(p[4:8], "big") for t, _, _, p in self.frames if t == GOAWAY]

    def statuses(self):
        """{stream: :status} of the response HEADERS received (decoded in order)."""
        dec, out = hpack.Decoder(), {}
        for t, flags, sid, p in self.frames:
            if t == HEADERS:
                out[sid] = dict(dec.decode(p)).get(":status")
        return out

    def summary(self):
        names = {DATA: "DATA", HEADERS: "HEADERS", RST_STREAM: "RST", SETTINGS: "SETTINGS",
                 PING: "PING", GOAWAY: "GOAWAY"}
        out = [names.get(t, t) for t, _, _, _ in self.frames[-12:]]
        return "%d frames, last %s, GOAWAY codes %s" % (len(self.frames), out,
                                                         self.goaway_codes())

    def close(self):
        try:
            self.tls.close()
        except OSError:
            pass


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class LimitsBase(unittest.TestCase):
    extra_a = ()
    extra_b = ()
    policies = ""

    def setUp(self):
        self.closers = []
        self.mesh = TwoNodeMesh(policies=self.policies, extra_a=self.extra_a,
                                 extra_b=self.extra_b)
        self.block = self.mesh.block
        try:
            self.echo = harness.EchoServer(self.mesh.server_ip, 8080)
            self.closers.append(self.echo.close)
            self.mesh.start()
            self.ca_cert = os.path.join(self.mesh.state_dir, "ca-cert.pem")
            self.ca_key = os.path.join(self.mesh.state_dir, "ca-key.pem")
            self.client_cert = harness.issue_leaf(self.mesh.tmp.path, "pyclient", self.ca_cert,
                                                  self.ca_key, CLIENT_ID)
        except BaseException:
            sys.stderr.write(self.mesh.dump_logs())
            self.close_all()
            raise

    def tearDown(self):
        harness.show_logs_if_failed(self, self.mesh)
        self.close_all()

    def close_all(self):
        harness.close_mesh(self.closers, self.mesh)

    def ctx(self):
        return interop.tls_client_context(self.ca_cert, *self.client_cert)

    def raw(self, source_ip=None):
        c = RawH2(self.mesh.server_ip, 15008, self.ctx(), source_ip or self.mesh.client_ip)
        self.closers.append(c.close)
        return c

    def target(self):
        return "%s:8080" % self.mesh.server_ip

    def assert_tunnel_works(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0, "SOCKS reply %s" % harness.SOCKS_REPLIES.get(rep, rep))
        try:
            self.assertTrue(harness.transfer_and_check(s, os.urandom(50000)), "echo through A->B")
        finally:
            s.close()

    def b_metric(self, name, **labels):
        return self.mesh.b.metric_sum(name, **labels)

    def assert_b_alive(self):
        self.assertIsNone(self.mesh.b.proc.poll(), "node B exited:\n" + self.mesh.b.logs()[-3000:])


class ConnectionCapTest(LimitsBase):
    PER_SOURCE = 200
    FLOOD = 10000
    extra_b = ("--hbone-max-connections-per-source", str(PER_SOURCE))

    def test_10000_connections_from_one_source_are_capped_and_others_are_served(self):
        if raise_nofile(self.FLOOD + 1000) < self.FLOOD + 500:
            self.skipTest("RLIMIT_NOFILE too low for %d sockets" % self.FLOOD)
        flood_ip = self.block + ".60"
        sel = selectors.DefaultSelector()
        socks, closed = [], set()
        started = time.time()
        try:
            # First, connections that finish TLS and HTTP/2 and then sit idle, up to the cap.
            held = [self.raw(flood_ip) for _ in range(self.PER_SOURCE)]
            # Then the rest of the flood: plain TCP connections that would sit in the handshake.
            for i in range(self.FLOOD - self.PER_SOURCE):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.bind((flood_ip, 0))
                try:
                    s.connect((self.mesh.server_ip, 15008))
                except BlockingIOError:
                    pass
                socks.append(s)
                sel.register(s, selectors.EVENT_READ, i)
                if i % 500 == 499:
                    # The flood comes in waves, so that the listen backlog does not decide; while
                    # it lasts, another source still tunnels through B.
                    self.drain_closed(sel, closed, 2.0)
                    if i % 2500 == 2499:
                        self.assert_tunnel_works()
            wait_until(lambda: self.drain_closed(sel, closed, 0.5) >= len(socks), timeout=30,
                       what="every connection over the cap closed")
            flood_s = time.time() - started
            self.assertEqual(len(closed), self.FLOOD - self.PER_SOURCE)
            refused = self.b_metric("sockmesh_hbone_connections_refused_total",
                                    reason="per_source")
            self.assertGreaterEqual(refused, self.FLOOD - self.PER_SOURCE)
            # The held ones are still there and still served.
            for c in held[:5]:
                c.send(frame(PING, 0, 0, b"12345678"))
                self.assertTrue(c.pump(lambda: any(t == PING and f & ACK for t, f, _, _ in c.frames),
                                       what="PING ACK"))
            self.assertFalse(any(c.eof for c in held))
            self.assert_tunnel_works()
            # Another source gets a fresh HBONE connection of its own.
            other = self.raw(self.block + ".61")
            other.send(other.connect_frame(1, self.target()))
            other.pump(lambda: other.statuses().get(1) is not None, what="answer on stream 1")
            self.assertEqual(other.statuses()[1], "200")
            # Once the held connections go, the source may connect again.
            for c in held:
                c.close()
            wait_until(lambda: self.try_tls(flood_ip), timeout=10,
                       what="a new connection from the flooding source after it closed its own")
            self.assert_b_alive()
            self.assertIn("connections open from this address", self.mesh.b.logs())
            sys.stderr.write("flood of %d from one source: %.1f s, %d refused\n" % (
                self.FLOOD, flood_s, refused))
        finally:
            for s in socks:
                s.close()
            sel.close()

    def try_tls(self, source_ip):
        try:
            c = RawH2(self.mesh.server_ip, 15008, self.ctx(), source_ip)
        except (OSError, AssertionError):
            return False
        c.close()
        return True

    @staticmethod
    def drain_closed(sel, closed, timeout):
        """Reads every socket the proxy closed (RST or FIN) within timeout; the count so far."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            events = sel.select(timeout=max(0.0, min(0.2, deadline - time.time())))
            if not events:
                break
            for key, _ in events:
                s = key.fileobj
                try:
                    d = s.recv(1)
                except BlockingIOError:
                    continue
                except OSError:
                    d = b""
                if not d:
                    sel.unregister(s)
                    closed.add(key.data)
        return len(closed)


class IdleTimeoutTest(LimitsBase):
    extra_b = ("--hbone-idle-timeout-ms", "1500")
    extra_a = ("--pool-idle-timeout-ms", "500")

    def test_client_pool_drops_its_idle_connection(self):
        self.assert_tunnel_works()
        self.assertEqual(self.mesh.a.metric_sum("sockmesh_pool_connections"), 1)
        wait_until(lambda: self.mesh.a.metric_sum("sockmesh_pool_connections") == 0, timeout=5,
                   what="A's pool released its idle connection")
        # Released by the client (500 ms), not by B's idle close (1500 ms).
        self.assertEqual(self.b_metric("sockmesh_hbone_h2_limits_total", limit="idle"), 0)
        self.assert_tunnel_works()

    def test_connection_without_streams_is_closed_even_when_it_pings(self):
        c = self.raw()
        opened = time.time()
        # PINGs are answered but are not use: the connection goes at the idle timeout.
        while not c.eof and time.time() - opened < 8:
            c.send(frame(PING, 0, 0, b"keepaliv"))
            c.pump(lambda: False, timeout=0.3, quiet=True)
        lasted = time.time() - opened
        self.assertTrue(c.eof, "still open after %.1f s: %s" % (lasted, c.summary()))
        self.assertIn(0, c.goaway_codes(), "a GOAWAY(NO_ERROR) before the close")
        self.assertGreaterEqual(lasted, 1.4)
        self.assertEqual(self.b_metric("sockmesh_hbone_h2_limits_total", limit="idle"), 1)

    def test_connection_with_an_open_tunnel_is_kept(self):
        c = self.raw()
        c.send(c.connect_frame(1, self.target()))
        c.pump(lambda: c.statuses().get(1) is not None, what="answer on stream 1")
        c.pump(lambda: False, timeout=3.0, quiet=True)
        self.assertFalse(c.eof, c.summary())
        # After the tunnel ends, the clock starts.
        c.send(frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))
        self.assertTrue(c.pump(lambda: c.eof, timeout=6.0, quiet=True), c.summary())


class DeniedIdentityTest(LimitsBase):
    # Only an identity nobody has is let in: the client is denied on every port.
    policies = ("- name: only-nobody\n  namespace: default\n  scope: Namespace\n"
                "  action: Allow\n  rules:\n  - - - principals: [\"cluster.local/ns/default/sa/nobody\"]\n")

    def test_connection_closed_after_its_first_refused_stream(self):
        c = self.raw()
        c.send(c.connect_frame(1, self.target()))
        c.pump(lambda: c.statuses().get(1) is not None, what="answer on stream 1")
        self.assertEqual(c.statuses()[1], "403")
        self.assertTrue(c.pump(lambda: c.eof, timeout=5.0, quiet=True),
                        "connection still open after a refusal: " + c.summary())
        self.assertIn(0, c.goaway_codes())
        self.assertEqual(self.b_metric("sockmesh_hbone_denied_connections_closed_total"), 1)
        self.assert_b_alive()


class PortDeniedIdentityTest(LimitsBase):
    # The client may reach port 9999 only: a refusal on 8080 must not close its connection.
    policies = ("- name: client-9999\n  namespace: default\n  scope: Namespace\n"
                "  action: Allow\n  rules:\n  - - - principals: [\"cluster.local/ns/default/sa/client\"]\n"
                "    - - destinationPorts: [9999]\n")

    def test_connection_kept_when_another_port_would_be_allowed(self):
        c = self.raw()
        c.send(c.connect_frame(1, self.target()))
        c.pump(lambda: c.statuses().get(1) is not None, what="answer on stream 1")
        self.assertEqual(c.statuses()[1], "403")
        c.pump(lambda: False, timeout=1.5, quiet=True)
        self.assertFalse(c.eof, c.summary())
        self.assertEqual(c.goaway_codes(), [])


class H2AbuseTest(LimitsBase):
    def test_stream_over_max_concurrent_streams_is_refused_alone(self):
        c = self.raw()
        limit = c.server_settings.get(0x3)
        self.assertEqual(limit, 100, c.server_settings)
        sids = [1 + 2 * i for i in range(limit + 1)]
        c.send(b"".join(c.connect_frame(s, self.target()) for s in sids))
        extra = sids[-1]
        c.pump(lambda: c.rst_codes(extra) or c.goaway_codes(), what="refusal of the extra stream")
        self.assertEqual(c.goaway_codes(), [], "no connection error: " + c.summary())
        self.assertEqual(c.rst_codes(extra), [REFUSED_STREAM])
        # The others are tunnels; after one ends, a new stream is served on the same connection.
        c.pump(lambda: len([s for s in sids[:-1] if c.statuses().get(s)]) == limit,
               what="answers to the first %d" % limit)
        self.assertEqual({c.statuses()[s] for s in sids[:-1]}, {"200"})
        c.send(frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))
        nxt = extra + 2
        time.sleep(0.2)
        c.send(c.connect_frame(nxt, self.target()))
        c.pump(lambda: c.statuses().get(nxt) is not None, what="answer to a later stream")
        self.assertEqual(c.statuses()[nxt], "200")
        self.assertGreaterEqual(self.b_metric("sockmesh_hbone_h2_limits_total",
                                              limit="refused_stream"), 1)

    def test_rapid_reset_gets_enhance_your_calm(self):
        c = self.raw()
        burst = []
        for i in range(3000):
            sid = 1 + 2 * i
            burst.append(c.connect_frame(sid, self.target()))
            burst.append(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
        try:
            c.send(b"".join(burst))
        except OSError:
            pass  # the proxy may close before it has read everything
        c.pump(lambda: c.eof, timeout=15, what="the connection closed")
        self.assertIn(ENHANCE_YOUR_CALM, c.goaway_codes(), c.summary())
        self.assertEqual(self.b_metric("sockmesh_hbone_h2_limits_total", limit="rapid_reset"), 1)
        self.assert_b_alive()
        self.assert_tunnel_works()

    def test_continuation_flood_gets_enhance_your_calm(self):
        c = self.raw()
        block = c.block(self.target())
        flood = frame(HEADERS, 0, 1, block[:4])
        flood += b"".join(frame(CONTINUATION, 0, 1) for _ in range(50))
        c.send(flood)
        c.pump(lambda: c.eof, timeout=10, what="the connection closed")
        self.assertIn(ENHANCE_YOUR_CALM, c.goaway_codes(), c.summary())
        self.assertEqual(self.b_metric("sockmesh_hbone_h2_limits_total",
                                       limit="continuation_flood"), 1)
        self.assert_b_alive()

    def test_a_few_continuations_are_fine(self):
        c = self.raw()
        block = c.block(self.target(), [("x-pad", "p" * 300)])
        parts = [block[i:i + 64] for i in range(0, len(block), 64)]
        self.assertLessEqual(len(parts) - 1, 8)
        data = frame(HEADERS, 0, 1, parts[0])
        for i, p in enumerate(parts[1:]):
            data += frame(CONTINUATION, END_HEADERS if i == len(parts) - 2 else 0, 1, p)
        c.send(data)
        c.pump(lambda: c.statuses().get(1) is not None, what="answer on stream 1")
        self.assertEqual(c.statuses()[1], "200")

    def test_header_list_over_the_cap_gets_431(self):
        c = self.raw()
        cap = c.server_settings.get(0x6)
        self.assertEqual(cap, 16384, c.server_settings)
        c.send(c.connect_frame(1, self.target(), [("x-big", "b" * (cap + 100))]))
        c.pump(lambda: c.statuses().get(1) is not None, what="answer on stream 1")
        self.assertEqual(c.statuses()[1], "431")
        self.assertEqual(c.goaway_codes(), [])


class ClientSettingsTest(interop.PyServerBase):
    server_sa = "pyserver"

    def test_hbone_client_disables_server_push(self):
        s, rep = self.socks(9090)
        self.assertEqual(rep, 0)
        s.sendall(b"ping")
        self.assertEqual(harness.recv_exact(s, 4), b"ping")
        s.close()
        conn = self.py.conns[0]
        settings = conn.get("settings", {})
        self.assertEqual(settings.get(0x2), 0, "SETTINGS_ENABLE_PUSH in the client's SETTINGS: %r"
                         % settings)


if __name__ == "__main__":
    unittest.main(verbosity=2)
