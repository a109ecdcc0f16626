"""Interoperability with an independent HTTP/2 implementation: Debian's python3-h2 (4.1.0) over
Python's ssl module, on both ends of an HBONE tunnel.

  * python-h2 as the HBONE client, speaking straight to node B's inbound port 15008;
  * python-h2 as the HBONE server of a third workload, reached through node A's outbound.

Run with /usr/bin/python3 (the interpreter that has h2); without h2 the tests are skipped (77).
"""
import os
import socket
import ssl
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import TwoNodeMesh, wait_until  # noqa: E402

try:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings
except ImportError:  # pragma: no cover - only on an interpreter without python3-h2
    if __name__ == "__main__":
        sys.stderr.write("python3-h2 is not available to %s; skipping\n" % sys.executable)
        sys.exit(77)
    raise

TD = "spiffe://cluster.local/ns/default/sa/"
CLIENT_ID = TD + "client"
SERVER_ID = TD + "server"
PYSERVER_ID = TD + "pyserver"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# HTTP/2 frame types and error codes (RFC 9113) used when we write frames by hand.
DATA, HEADERS, SETTINGS, GOAWAY = 0x0, 0x1, 0x4, 0x7
END_STREAM, END_HEADERS = 0x1, 0x4
ERROR_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
               6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR"}

IO_TIMEOUT = 10.0  # any single wait for the proxy


def frame(ftype, flags, stream_id, payload=b"", length=None):
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + struct.pack(">BBI", ftype, flags, stream_id) + payload


def parse_frames(buf):
    """[(type, flags, stream, payload)] of the complete frames in buf."""
    out, i = [], 0
    while i + 9 <= len(buf):
        n = int.from_bytes(buf[i:i + 3], "big")
        if i + 9 + n > len(buf):
            break
        ftype, flags, sid = buf[i + 3], buf[i + 4], int.from_bytes(buf[i + 5:i + 9], "big")
        out.append((ftype, flags, sid & 0x7FFFFFFF, bytes(buf[i + 9:i + 9 + n])))
        i += 9 + n
    return out


def uri_sans(cert):
    return [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]


def tls_client_context(ca_cert, cert, key, alpn=("h2",)):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # SPIFFE: the identity is the URI SAN, checked by the test
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(ca_cert)
    ctx.load_cert_chain(cert, key)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


# ---------------------------------------------------------------------------------------------
# Peers

class RecordingEcho(harness.TcpServer):
    """TCP echo server that records, per connection, the peer, the bytes and whether FIN came."""

    def __init__(self, ip, port):
        self.conns = []
        self.lock = threading.Lock()
        super().__init__(ip, port, backlog=64)

    def _track(self, addr):
        rec = {"peer": addr, "data": b"", "fin": False, "closed": False}
        with self.lock:
            self.conns.append(rec)
        return rec

    def _serve(self, c, addr, rec):
        c.settimeout(0.2)
        deadline = time.time() + 60
        try:
            while not self.stopped and time.time() < deadline:
                try:
                    d = c.recv(65536)
                except socket.timeout:
                    continue
                if not d:
                    rec["fin"] = True
                    c.shutdown(socket.SHUT_WR)  # echo done: close our side too
                    break
                rec["data"] += d
                c.sendall(d)
        except OSError:
            pass
        finally:
            rec["closed"] = True
            c.close()


class CloseFirstServer(harness.TcpServer):
    """TCP server that closes its sending side at once (FIN first), then counts what it reads."""

    def __init__(self, ip, port):
        self.conns = []
        super().__init__(ip, port, backlog=64)

    def _track(self, addr):
        rec = {"bytes": 0, "fin": False}
        self.conns.append(rec)
        return rec

    def _serve(self, c, addr, rec):
        c.settimeout(0.2)
        deadline = time.time() + 60
        try:
            c.shutdown(socket.SHUT_WR)
            while not self.stopped and time.time() < deadline:
                try:
                    d = c.recv(1 << 20)
                except socket.timeout:
                    continue
                if not d:
                    rec["fin"] = True
                    break
                rec["bytes"] += len(d)
        except OSError:
            pass
        finally:
            c.close()


class Stream:
    def __init__(self):
        self.status = None
        self.headers = {}
        self.data = b""
        self.ended = False
        self.reset = None  # RST_STREAM error code


class H2Client:
    """python-h2 as an HBONE client on one TLS connection, driven synchronously by pump()."""

    def __init__(self, ip, port, ctx, source_ip, auto_ack=True, settings=None):
        raw = socket.create_connection((ip, port), timeout=IO_TIMEOUT,
                                       source_address=(source_ip, 0))
        try:
            self.tls = ctx.wrap_socket(raw)
        except Exception:
            raw.close()
            raise
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8",
                                        validate_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config=cfg)
        self.streams = {}
        self.goaway = None  # error code of a GOAWAY from the proxy
        self.eof = False
        self.remote_settings = False
        self.auto_ack = auto_ack
        self.unacked = {}  # stream id -> received bytes not yet acknowledged
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.flush()
        self.pump(lambda: self.remote_settings, what="server SETTINGS")

    def flush(self):
        out = self.conn.data_to_send()
        if out:
            self.tls.sendall(out)

    def pump(self, until, timeout=IO_TIMEOUT, what="condition", quiet=False):
        """Reads and handles frames until until() is true; fails after timeout (or, quiet,
        returns)."""
        deadline = time.time() + timeout
        while not until():
            left = deadline - time.time()
            if left <= 0 or self.eof:
                if quiet and not self.eof:
                    return
                raise AssertionError("h2 client: %s did not happen (eof=%s goaway=%s)" % (
                    what, self.eof, self.goaway))
            self.tls.settimeout(min(left, 1.0))
            try:
                d = self.tls.recv(65536)
            except socket.timeout:
                continue
            if not d:
                self.eof = True
                continue
            self.handle(self.conn.receive_data(d))
            self.flush()

    def handle(self, events):
        for ev in events:
            st = self.streams.get(getattr(ev, "stream_id", None))
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                self.remote_settings = True
            elif isinstance(ev, h2.events.ResponseReceived):
                st.headers = dict(ev.headers)
                st.status = int(st.headers[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                st.data += ev.data
                if self.auto_ack:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                else:
                    self.unacked[ev.stream_id] = (self.unacked.get(ev.stream_id, 0) +
                                                  ev.flow_controlled_length)
            elif isinstance(ev, h2.events.StreamEnded):
                st.ended = True
            elif isinstance(ev, h2.events.StreamReset):
                if st is not None:
                    st.reset = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = ev.error_code

    def request(self, headers, end_stream=False):
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = Stream()
        self.conn.send_headers(sid, headers, end_stream=end_stream)
        self.flush()
        return sid

    def connect(self, authority, extra=()):
        return self.request([(":method", "CONNECT"), (":authority", authority)] + list(extra))

    def send(self, sid, data, end_stream=False):
        self.send_flow_controlled(sid, data, end_stream)

    def send_flow_controlled(self, sid, data, end_stream=False, timeout=IO_TIMEOUT):
        """Sends data within the peer's flow-control windows, waiting for WINDOW_UPDATEs."""
        deadline = time.time() + timeout
        if not data and end_stream:
            self.conn.end_stream(sid)
        while data:
            n = min(len(data), self.conn.local_flow_control_window(sid),
                    self.conn.max_outbound_frame_size)
            if n <= 0:
                self.pump(lambda: self.conn.local_flow_control_window(sid) > 0,
                          timeout=max(0.1, deadline - time.time()), what="window to send")
                continue
            self.conn.send_data(sid, data[:n], end_stream=end_stream and n == len(data))
            data = data[n:]
            self.flush()
        self.flush()

    def ack(self, sid):
        n = self.unacked.pop(sid, 0)
        if n:
            self.conn.acknowledge_received_data(n, sid)
            self.flush()

    def wait(self, seconds):
        """Handles whatever arrives for `seconds`."""
        self.pump(lambda: False, timeout=seconds, quiet=True)

    def answered(self, sid):
        st = self.streams[sid]
        return st.status is not None or st.reset is not None

    def close(self):
        try:
            self.conn.close_connection()
            self.flush()
        except Exception:  # noqa: BLE001 - best effort on teardown
            pass
        try:
            self.tls.close()
        except OSError:
            pass


class PyHboneServer(harness.TcpServer):
    """python-h2 as an HBONE server on ip:port: mutual TLS 1.3, ALPN h2, CONNECT -> 200 + echo.

    Records every TLS connection (peer, TLS version, ALPN, client URI SANs, why it was dropped) and
    every request (its headers). Targets on port 9403 are answered 403; on port 9100 the server
    greets with b"bye", ends its side at once, and keeps reading (a half-close from the server)."""

    def __init__(self, ip, port, ca_cert, cert, key, expect_client):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.load_verify_locations(ca_cert)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["h2"])
        self.expect_client = expect_client
        self.conns = []
        self.requests = []
        super().__init__(ip, port, backlog=16)

    def _track(self, addr):
        rec = {"peer": addr, "tls": None, "alpn": None, "client_ids": [], "error": None,
               "streams": 0}
        self.conns.append(rec)
        return rec

    def _serve(self, raw, addr, rec):
        raw.settimeout(5)
        try:
            tls = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as e:
            rec["error"] = "handshake: %s" % e
            raw.close()
            return
        try:
            rec["tls"] = tls.version()
            rec["alpn"] = tls.selected_alpn_protocol()
            rec["client_ids"] = uri_sans(tls.getpeercert() or {})
            # Python's ssl completes the handshake without a common protocol: check it here.
            if rec["alpn"] != "h2":
                rec["error"] = "ALPN %r" % rec["alpn"]
                return
            if rec["client_ids"] != [self.expect_client]:
                rec["error"] = "client identity %r" % rec["client_ids"]
                return
            self._h2(tls, rec)
        except Exception as e:  # noqa: BLE001 - recorded for the test to see
            rec["error"] = "%s: %s" % (type(e).__name__, e)
        finally:
            tls.close()

    def _h2(self, tls, rec):
        cfg = h2.config.H2Configuration(client_side=False, header_encoding="utf-8",
                                        validate_inbound_headers=False)
        conn = h2.connection.H2Connection(config=cfg)
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())
        pending, ending, modes = {}, set(), {}

        def flush_stream(sid):
            buf = pending.get(sid, b"")
            while buf:
                n = min(len(buf), conn.local_flow_control_window(sid),
                        conn.max_outbound_frame_size)
                if n <= 0:
                    break
                conn.send_data(sid, buf[:n])
                buf = buf[n:]
            pending[sid] = buf
            if not buf and sid in ending:
                ending.discard(sid)
                conn.end_stream(sid)

        tls.settimeout(0.2)
        deadline = time.time() + 120
        while not self.stopped and time.time() < deadline:
            try:
                d = tls.recv(65536)
            except socket.timeout:
                continue
            if not d:
                return
            for ev in conn.receive_data(d):
                if isinstance(ev, h2.events.RemoteSettingsChanged):
                    rec.setdefault("settings", {}).update(
                        {int(k): v.new_value for k, v in ev.changed_settings.items()})
                elif isinstance(ev, h2.events.RequestReceived):
                    hdrs = dict(ev.headers)
                    self.requests.append({"stream": ev.stream_id, "headers": hdrs,
                                          "data": b"", "ended": False})
                    rec["streams"] += 1
                    port = hdrs.get(":authority", "").rpartition(":")[2]
                    if hdrs.get(":method") != "CONNECT":
                        conn.send_headers(ev.stream_id, [(":status", "405")], end_stream=True)
                    elif port == "9403":
                        conn.send_headers(ev.stream_id, [(":status", "403"),
                                                         ("sockmesh-error", "python says no")],
                                          end_stream=True)
                    elif port == "9100":
                        modes[ev.stream_id] = "bye"
                        conn.send_headers(ev.stream_id, [(":status", "200")])
                        conn.send_data(ev.stream_id, b"bye", end_stream=True)
                    else:
                        modes[ev.stream_id] = "echo"
                        conn.send_headers(ev.stream_id, [(":status", "200")])
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    req = self._request(ev.stream_id)
                    req["data"] += ev.data
                    if modes.get(ev.stream_id) == "echo":
                        pending[ev.stream_id] = pending.get(ev.stream_id, b"") + ev.data
                        flush_stream(ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    self._request(ev.stream_id)["ended"] = True
                    if modes.get(ev.stream_id) == "echo":
                        ending.add(ev.stream_id)
                        flush_stream(ev.stream_id)
                elif isinstance(ev, h2.events.WindowUpdated):
                    for sid in list(pending):
                        if modes.get(sid) == "echo":
                            flush_stream(sid)
                elif isinstance(ev, h2.events.StreamReset):
                    pending.pop(ev.stream_id, None)
                    modes.pop(ev.stream_id, None)
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    tls.sendall(conn.data_to_send())
                    return
            out = conn.data_to_send()
            if out:
                tls.sendall(out)

    def _request(self, sid):
        for r in reversed(self.requests):
            if r["stream"] == sid:
                return r
        raise AssertionError("no request for stream %d" % sid)


# ---------------------------------------------------------------------------------------------
# Tests

class InteropTest(unittest.TestCase):
    def extra_workloads(self, block):
        """Workload YAML added to both nodes' configs (needs the mesh's address block)."""
        return ""

    def setUp(self):
        self.closers = []
        self.mesh = TwoNodeMesh()
        self.block = self.mesh.block
        try:
            # TwoNodeMesh picks the block itself: add the extra workloads to its configs before
            # the nodes start (what TwoNodeMesh(extra_workloads=...) does with a known block).
            extra = self.extra_workloads(self.block)
            if extra:
                self.mesh.extra_workloads = extra
                self.mesh.tmp.file("a.yaml", self.mesh.config(self.mesh.server_sa_seen_by_a))
                self.mesh.tmp.file("b.yaml", self.mesh.config(self.mesh.server_sa))
            self.echo = RecordingEcho(self.mesh.server_ip, 8080)
            self.closers.append(self.echo.close)
            self.mesh.start()
            self.ca_cert = os.path.join(self.mesh.state_dir, "ca-cert.pem")
            self.ca_key = os.path.join(self.mesh.state_dir, "ca-key.pem")
            self.client_cert = harness.issue_leaf(self.mesh.tmp.path, "pyclient", self.ca_cert,
                                                  self.ca_key, CLIENT_ID)
            self.more_setup()
        except BaseException:
            sys.stderr.write(self.mesh.dump_logs())
            self.close_all()  # tearDown does not run when setUp fails
            raise

    def more_setup(self):
        pass

    def tearDown(self):
        harness.show_logs_if_failed(self, self.mesh)
        self.close_all()

    def close_all(self):
        harness.close_mesh(self.closers, self.mesh)

    # -- helpers

    def client_ctx(self, alpn=("h2",)):
        return tls_client_context(self.ca_cert, *self.client_cert, alpn=alpn)

    def h2_client(self):
        c = H2Client(self.mesh.server_ip, 15008, self.client_ctx(), self.mesh.client_ip)
        self.closers.append(c.close)
        return c

    def raw_tls(self, alpn=("h2",)):
        raw = socket.create_connection((self.mesh.server_ip, 15008), timeout=IO_TIMEOUT,
                                       source_address=(self.mesh.client_ip, 0))
        tls = self.client_ctx(alpn).wrap_socket(raw)
        self.closers.append(tls.close)
        return tls

    def read_until_closed(self, s, timeout=IO_TIMEOUT):
        """Bytes read until the peer closes; (bytes, how it ended)."""
        buf = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            s.settimeout(max(0.05, min(1.0, deadline - time.time())))
            try:
                d = s.recv(65536)
            except socket.timeout:
                continue
            except (ssl.SSLError, ConnectionResetError) as e:
                return buf, "error: %s" % e
            if not d:
                return buf, "eof"
            buf += d
        return buf, "still open after %.0fs" % timeout

    def goaway_codes(self, frames):
        return [int.from_bytes(p[4:8], "big") for t, _, _, p in frames if t == GOAWAY]

    def assert_b_alive(self):
        self.assertIsNone(self.mesh.b.proc.poll(), "node B exited:\n" + self.mesh.b.logs()[-3000:])

    def good_connect(self, client, payload=b"still serving"):
        """A CONNECT to the echo server on an existing client; checks the echo and the close."""
        sid = client.connect("%s:8080" % self.mesh.server_ip)
        client.pump(lambda: client.answered(sid), what="answer to CONNECT")
        st = client.streams[sid]
        self.assertEqual(st.status, 200, st.headers)
        client.send(sid, payload, end_stream=True)
        client.pump(lambda: st.ended or st.reset is not None, what="END_STREAM after echo")
        self.assertEqual(st.data, payload)
        self.assertIsNone(st.reset)

    def assert_b_serves_new_connection(self):
        self.assert_b_alive()
        c = self.h2_client()
        self.good_connect(c)
        c.close()


class H2ClientTest(InteropTest):
    def extra_workloads(self, block):
        # A second workload on node B, to provoke 421 (target is not the dialled workload).
        self.other_ip = block + ".50"
        return harness.workload_yaml("o1", "other", "default", "other", self.other_ip,
                                     "node-b") + "\n"

    def test_tls_identity_alpn_and_several_echo_streams_with_half_close(self):
        c = self.h2_client()
        # TLS as HBONE wants it, and the server is who the mesh says it is.
        self.assertEqual(c.tls.version(), "TLSv1.3")
        self.assertEqual(c.tls.selected_alpn_protocol(), "h2")
        cert = c.tls.getpeercert()  # non-empty only because it chained to the mesh root
        self.assertTrue(cert, "server certificate verified against the mesh root")
        self.assertEqual(uri_sans(cert), [SERVER_ID])
        # The check is real: trusting another root, the same handshake fails.
        foreign_ca, _ = harness.make_ca(self.mesh.tmp.path, "foreign")
        raw = socket.create_connection((self.mesh.server_ip, 15008), timeout=IO_TIMEOUT,
                                       source_address=(self.mesh.client_ip, 0))
        try:
            with self.assertRaises(ssl.SSLCertVerificationError):
                tls_client_context(foreign_ca, *self.client_cert).wrap_socket(raw)
        finally:
            raw.close()

        n = 5
        authority = "%s:8080" % self.mesh.server_ip
        sids = [c.connect(authority) for _ in range(n)]
        c.pump(lambda: all(c.answered(s) for s in sids), what="answers to %d CONNECTs" % n)
        for s in sids:
            st = c.streams[s]
            self.assertEqual(st.status, 200, st.headers)
            self.assertFalse(st.ended, "a tunnel stays open after 200")
        # Interleaved round trips, each stream with its own bytes.
        for rnd in range(3):
            for i, s in enumerate(sids):
                c.send(s, b"round %d stream %d;" % (rnd, i))
            want = {s: b"".join(b"round %d stream %d;" % (r, i) for r in range(rnd + 1))
                    for i, s in enumerate(sids)}
            c.pump(lambda: all(c.streams[s].data == want[s] for s in sids),
                   what="echo of round %d" % rnd)
        # A larger transfer on one stream (flow control across several frames).
        big = os.urandom(300000)
        c.send(sids[0], big)
        base = want[sids[0]]
        c.pump(lambda: len(c.streams[sids[0]].data) >= len(base) + len(big), what="300 kB echo")
        self.assertEqual(c.streams[sids[0]].data, base + big)
        # Half-close: END_STREAM from python reaches the echo server as FIN; the server echoes
        # the last bytes, closes, and python sees END_STREAM.
        for i, s in enumerate(sids):
            self.assertFalse(c.streams[s].ended)
            c.send(s, b"last words %d" % i, end_stream=True)
        c.pump(lambda: all(c.streams[s].ended for s in sids), what="END_STREAM on every stream")
        for i, s in enumerate(sids):
            st = c.streams[s]
            self.assertTrue(st.data.endswith(b"last words %d" % i), st.data[-40:])
            self.assertIsNone(st.reset, "stream %d reset" % s)
        wait_until(lambda: len(self.echo.conns) == n and all(r["fin"] for r in self.echo.conns),
                   what="FIN at the echo server for every stream")
        for r in self.echo.conns:
            # The proxy dials from the client's address (source IP preserved).
            self.assertEqual(r["peer"][0], self.mesh.client_ip)
        self.assertIsNone(c.goaway)
        # The connection is still good for more streams after those closed.
        self.good_connect(c)
        wait_until(lambda: self.mesh.b.logs().count("direction=inbound") >= n + 1,
                   what="access log lines on B")
        self.assertIn("src.identity=" + CLIENT_ID, self.mesh.b.logs())

    def test_refusals_carry_status_and_reason_and_keep_the_connection(self):
        c = self.h2_client()
        ip = self.mesh.server_ip
        cases = [
            ("GET", [(":method", "GET"), (":scheme", "https"), (":path", "/"),
                     (":authority", ip + ":8080")], 405),
            ("bad authority", [(":method", "CONNECT"), (":authority", "nonsense")], 400),
            ("proxy port", [(":method", "CONNECT"), (":authority", ip + ":15008")], 508),
            ("not local", [(":method", "CONNECT"), (":authority", self.block + ".99:8080")], 404),
            ("other workload", [(":method", "CONNECT"), (":authority", self.other_ip + ":8080")],
             421),
            ("oversized headers", [(":method", "CONNECT"), (":authority", ip + ":8080"),
                                   ("x-padding", "p" * 20000)], 431),
        ]
        for name, headers, want in cases:
            with self.subTest(name):
                sid = c.request(headers, end_stream=(want == 405))
                c.pump(lambda: c.answered(sid), what="answer to %s" % name)
                st = c.streams[sid]
                self.assertEqual(st.status, want, "%s: %r (reset %r)" % (name, st.headers,
                                                                        st.reset))
                self.assertTrue(st.headers.get("sockmesh-error"),
                                "%s: no sockmesh-error header in %r" % (name, st.headers))
                # A refusal is final: the stream ends (END_STREAM on the HEADERS, then a
                # RST_STREAM NO_ERROR so that we stop sending).
                c.pump(lambda: st.ended or st.reset is not None, what="end of %s" % name)
                self.assertIn(st.reset, (None, 0))
                self.assertIsNone(c.goaway, "%s: GOAWAY %r" % (name, c.goaway))
        self.assertEqual(self.echo.conns, [], "no refused CONNECT reached the application")
        # Same connection, good CONNECT afterwards.
        self.good_connect(c)
        self.assert_b_alive()
        logs = self.mesh.b.logs()
        for status in (405, 400, 508, 404, 421, 431):
            self.assertIn(": %d " % status, logs)

    def test_connect_with_end_stream_on_headers(self):
        # A client with nothing to send may end its side in the CONNECT's HEADERS frame. The
        # application must see FIN, and its close must come back as END_STREAM.
        c = self.h2_client()
        sid = c.request([(":method", "CONNECT"), (":authority", self.mesh.server_ip + ":8080")],
                        end_stream=True)
        c.pump(lambda: c.answered(sid), what="answer to CONNECT")
        st = c.streams[sid]
        self.assertEqual(st.status, 200, st.headers)
        wait_until(lambda: len(self.echo.conns) == 1, what="tunnel reached the echo server")
        wait_until(lambda: self.echo.conns[0]["fin"], timeout=5,
                   what="FIN at the echo server for END_STREAM on the CONNECT HEADERS")
        c.pump(lambda: st.ended or st.reset is not None, what="END_STREAM back")
        self.assertEqual(st.data, b"")
        self.assertIsNone(st.reset)

    def test_data_sent_before_the_200_is_not_lost(self):
        # DATA right behind the CONNECT, before the answer (one flush, one TLS record): the
        # bytes must reach the application, or the stream must be refused, never silently lost.
        c = self.h2_client()
        sid = c.connect(self.mesh.server_ip + ":8080")
        c.send(sid, b"early bytes")
        c.pump(lambda: c.answered(sid), what="answer to CONNECT")
        st = c.streams[sid]
        self.assertEqual(st.status, 200, st.headers)
        try:
            c.pump(lambda: len(st.data) >= 11 or st.reset is not None, timeout=3,
                   what="echo of the early bytes")
        except AssertionError:
            pass
        self.assertEqual(st.data, b"early bytes", "early DATA reached the application (got %r, "
                         "echo server saw %r)" % (st.data, [r["data"] for r in self.echo.conns]))
        c.send(sid, b" and later ones", end_stream=True)
        c.pump(lambda: st.ended or st.reset is not None, what="END_STREAM")
        self.assertEqual(st.data, b"early bytes and later ones")

    def test_early_data_on_a_refused_connect_is_discarded(self):
        # DATA right behind a CONNECT that will be refused (404): dropped, its flow-control
        # credit returned, and the connection goes on serving.
        c = self.h2_client()
        sid = c.connect(self.block + ".99:8080")
        c.send_flow_controlled(sid, os.urandom(1 << 20))
        c.pump(lambda: c.answered(sid), what="answer to CONNECT")
        self.assertEqual(c.streams[sid].status, 404)
        self.assertEqual(c.streams[sid].data, b"")
        for _ in range(3):
            self.good_connect(c, os.urandom(100000))
        self.assertEqual(len(self.echo.conns), 3)

    def test_client_reset_closes_the_upstream_connection(self):
        c = self.h2_client()
        sid = c.connect(self.mesh.server_ip + ":8080")
        c.pump(lambda: c.answered(sid), what="answer to CONNECT")
        st = c.streams[sid]
        self.assertEqual(st.status, 200)
        c.send(sid, b"ping")
        c.pump(lambda: st.data == b"ping", what="echo")
        c.conn.reset_stream(sid, error_code=8)  # CANCEL
        c.flush()
        wait_until(lambda: self.echo.conns[0]["closed"], timeout=5,
                   what="upstream connection closed after RST_STREAM")
        self.good_connect(c)

    def test_proxy_respects_the_clients_flow_control_window(self):
        # python-h2 advertises a 16 KiB stream window and gives nothing back until told to: the
        # proxy must stop at the window (h2 would fail the connection if it did not).
        window = 16384
        c = H2Client(self.mesh.server_ip, 15008, self.client_ctx(), self.mesh.client_ip,
                     auto_ack=False,
                     settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.closers.append(c.close)
        sid = c.connect(self.mesh.server_ip + ":8080")
        c.pump(lambda: c.answered(sid), what="answer to CONNECT")
        st = c.streams[sid]
        self.assertEqual(st.status, 200)
        payload = os.urandom(200000)
        c.send(sid, payload, end_stream=True)
        c.pump(lambda: len(st.data) >= window, what="first window of echo")
        c.wait(1.0)
        self.assertEqual(len(st.data), window, "proxy sent exactly one stream window")
        self.assertIsNone(c.goaway)
        deadline = time.time() + 30
        while not st.ended and time.time() < deadline:
            c.ack(sid)
            c.pump(lambda: c.unacked.get(sid, 0) > 0 or st.ended, what="more echo")
        self.assertTrue(st.ended, "all echoed within the time")
        self.assertEqual(st.data, payload)

    def test_connection_window_comes_back_after_streams_that_close_early(self):
        # The application closes its side first (FIN -> END_STREAM), then the client sends a
        # body and END_STREAM: the stream closes at the proxy while the body is still on its way
        # to the application. Once those bytes are written, the proxy must give the
        # connection-level window back, or a long-lived connection starves and stalls.
        #
        # The proxy returns connection window in WINDOW_UPDATEs of at least half its window
        # (nghttp2's rule), so without a leak the window we see is never more than half below
        # its full size, whatever we sent. We send 1.5 windows' worth in such streams.
        app = CloseFirstServer(self.mesh.server_ip, 8081)
        self.closers.append(app.close)
        c = self.h2_client()
        c.pump(lambda: c.conn.outbound_flow_control_window > 65535,
               what="proxy's connection window opened")
        full = c.conn.outbound_flow_control_window
        body = os.urandom(256 * 1024)
        rounds = (full * 3 // 2) // len(body)
        for i in range(rounds):
            sid = c.connect(self.mesh.server_ip + ":8081")
            c.pump(lambda: c.answered(sid), what="answer to CONNECT")
            st = c.streams[sid]
            self.assertEqual(st.status, 200)
            c.pump(lambda: st.ended, what="END_STREAM for the application's FIN")
            c.send_flow_controlled(sid, body, end_stream=True)
            wait_until(lambda: len(app.conns) == i + 1 and app.conns[i]["fin"], interval=0.005,
                       what="body and FIN at the application (stream %d)" % (i + 1))
            self.assertEqual(app.conns[i]["bytes"], len(body))
        c.wait(1.0)  # let the last WINDOW_UPDATEs arrive
        deficit = full - c.conn.outbound_flow_control_window
        self.assertLess(deficit, full // 2,
                        "after %d streams (%d MiB delivered) the proxy still holds back %d of "
                        "its %d-byte connection window" % (rounds, rounds * len(body) >> 20,
                                                           deficit, full))

    def test_malformed_request_is_reset_and_the_connection_stays(self):
        # GET without :path and :scheme is not a valid HTTP/2 request (RFC 9113 8.3.1): the
        # stream must be reset (PROTOCOL_ERROR) without taking the connection down.
        c = self.h2_client()
        sid = c.request([(":method", "GET"), (":authority", self.mesh.server_ip + ":8080")],
                        end_stream=True)
        c.pump(lambda: c.answered(sid), what="answer to a malformed request")
        st = c.streams[sid]
        self.assertIsNone(st.status)
        self.assertEqual(st.reset, 1, "RST_STREAM PROTOCOL_ERROR")
        self.good_connect(c)


class AlpnTest(InteropTest):
    def test_client_offering_only_http11_is_refused(self):
        with self.assertRaises((ssl.SSLError, OSError)) as cm:
            tls = self.raw_tls(alpn=("http/1.1",))
            tls.sendall(PREFACE)
            data, how = self.read_until_closed(tls)
            if data == b"":
                raise ConnectionResetError("closed without serving: " + how)
        sys.stderr.write("  http/1.1 only: %s\n" % cm.exception)
        wait_until(lambda: "client did not offer ALPN h2" in self.mesh.b.logs(),
                   what="ALPN refusal logged on B")
        self.assert_b_serves_new_connection()

    def test_client_offering_no_alpn_is_closed_without_serving(self):
        # Without ALPN the TLS handshake itself may complete; the proxy must then close.
        served = None
        try:
            tls = self.raw_tls(alpn=None)
            self.assertIsNone(tls.selected_alpn_protocol())
            tls.sendall(PREFACE + frame(SETTINGS, 0, 0))
            data, how = self.read_until_closed(tls)
            served = data
        except (ssl.SSLError, OSError):
            served = b""
        self.assertEqual(served, b"", "no HTTP/2 byte for a client without ALPN h2")
        wait_until(lambda: "ALPN h2 was not negotiated" in self.mesh.b.logs(),
                   what="ALPN refusal logged on B")
        self.assert_b_serves_new_connection()


class MalformedInputTest(InteropTest):
    def send_and_collect(self, payload):
        tls = self.raw_tls()
        self.assertEqual(tls.selected_alpn_protocol(), "h2")
        tls.sendall(payload)
        data, how = self.read_until_closed(tls)
        tls.close()
        return parse_frames(data), how

    def check_goaway(self, payload, want_code, what):
        frames, how = self.send_and_collect(payload)
        codes = self.goaway_codes(frames)
        self.assertTrue(codes, "%s: no GOAWAY (frames %r, ended %s)" % (
            what, [(t, f, s) for t, f, s, _ in frames], how))
        self.assertEqual(codes[-1], want_code, "%s: GOAWAY %s, expected %s" % (
            what, ERROR_NAMES.get(codes[-1], codes[-1]), ERROR_NAMES[want_code]))
        self.assertEqual(how, "eof", "%s: connection closed after GOAWAY" % what)
        self.assert_b_serves_new_connection()

    def test_garbage_instead_of_preface(self):
        self.check_goaway(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1, "garbage preface")

    def test_headers_with_bad_hpack(self):
        # Indexed header field with index 0: a decoding error (RFC 7541 6.1).
        bad = frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x80")
        self.check_goaway(PREFACE + frame(SETTINGS, 0, 0) + bad, 9, "HPACK index 0")

    def test_headers_with_index_beyond_table(self):
        bad = frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xbf\x40")  # index 127+, no table
        self.check_goaway(PREFACE + frame(SETTINGS, 0, 0) + bad, 9, "HPACK index out of range")

    def test_frame_larger_than_max_frame_size(self):
        # A length of 16 MiB - 1: above anything the proxy advertised (256 KiB at most).
        big = frame(DATA, 0, 1, b"x" * 100, length=0xFFFFFF)
        self.check_goaway(PREFACE + frame(SETTINGS, 0, 0) + big, 6, "oversized frame")

    def test_headers_on_even_stream_id(self):
        # Clients open odd streams only (RFC 9113 5.1.1).
        hpack = b"\x82\x84\x87"  # :method GET, :path /, :scheme https (static table)
        bad = frame(HEADERS, END_HEADERS | END_STREAM, 2, hpack)
        self.check_goaway(PREFACE + frame(SETTINGS, 0, 0) + bad, 1, "even stream id")

    def test_plaintext_garbage_on_hbone_port(self):
        s = socket.create_connection((self.mesh.server_ip, 15008), timeout=IO_TIMEOUT,
                                     source_address=(self.mesh.client_ip, 0))
        self.closers.append(s.close)
        s.sendall(b"\x16\x03\x01\x00\x05hello" + os.urandom(2000))
        data, how = self.read_until_closed(s)
        self.assertNotEqual(how.split()[0], "still", "closed")
        self.assert_b_serves_new_connection()


class PyServerBase(InteropTest):
    server_sa = None  # the identity the python server's certificate carries

    def extra_workloads(self, block):
        # A third workload on a node of its own ("node-py"), served by python-h2.
        self.py_ip = block + ".40"
        return harness.workload_yaml("p1", "pyserver", "default", "pyserver", self.py_ip,
                                     "node-py") + "\n"

    def more_setup(self):
        cert, key = harness.issue_leaf(self.mesh.tmp.path, "pyserver", self.ca_cert, self.ca_key,
                                       TD + self.server_sa)
        self.py = PyHboneServer(self.py_ip, 15008, self.ca_cert, cert, key, CLIENT_ID)
        self.closers.append(self.py.close)

    def socks(self, port):
        s, rep = self.mesh.connect(self.py_ip, port)
        if rep == 0:
            self.closers.append(s.close)
        return s, rep


class PyServerTest(PyServerBase):
    server_sa = "pyserver"

    def test_outbound_tunnels_to_python_server_and_echoes(self):
        s, rep = self.socks(9090)
        self.assertEqual(rep, 0, "SOCKS reply (%s)" % harness.SOCKS_REPLIES.get(rep, rep))
        for i in range(3):
            msg = b"hello python %d" % i
            s.sendall(msg)
            self.assertEqual(harness.recv_exact(s, len(msg)), msg)
        payload = os.urandom(200000)
        self.assertTrue(harness.transfer_and_check(s, payload), "200 kB echoed, then EOF")
        s.close()

        self.assertEqual(len(self.py.conns), 1, self.py.conns)
        conn = self.py.conns[0]
        self.assertIsNone(conn["error"], conn)
        self.assertEqual(conn["tls"], "TLSv1.3")
        self.assertEqual(conn["alpn"], "h2")
        self.assertEqual(conn["client_ids"], [CLIENT_ID])
        self.assertEqual(len(self.py.requests), 1)
        req = self.py.requests[0]
        hdrs = req["headers"]
        self.assertEqual(hdrs.get(":method"), "CONNECT")
        self.assertEqual(hdrs.get(":authority"), "%s:9090" % self.py_ip)
        self.assertNotIn(":path", hdrs)
        self.assertNotIn(":scheme", hdrs)
        self.assertRegex(hdrs.get("forwarded", ""),
                         r'^for="%s:\d+"$' % self.mesh.client_ip.replace(".", r"\."))
        self.assertIn("k8s.namespace.name=default", hdrs.get("baggage", ""))
        self.assertTrue(req["ended"], "the client's FIN arrived as END_STREAM")
        self.assertTrue(req["data"].endswith(payload))

    def test_streams_share_the_pooled_connection(self):
        socks = []
        for i in range(4):
            s, rep = self.socks(9090)
            self.assertEqual(rep, 0)
            socks.append(s)
        for i, s in enumerate(socks):
            s.sendall(b"stream %d" % i)
        for i, s in enumerate(socks):
            self.assertEqual(harness.recv_exact(s, len(b"stream %d" % i)), b"stream %d" % i)
        for s in socks:
            s.close()
        self.assertEqual(len(self.py.requests), 4)
        # One pool per worker (2 workers): at most two TLS connections for four streams.
        self.assertLessEqual(len(self.py.conns), 2, self.py.conns)
        self.assertEqual(sum(c["streams"] for c in self.py.conns), 4)

    def test_server_half_close_reaches_the_client_and_client_can_still_send(self):
        s, rep = self.socks(9100)
        self.assertEqual(rep, 0)
        # The python server sent b"bye" with END_STREAM: the client sees the bytes, then EOF.
        s.settimeout(IO_TIMEOUT)
        self.assertEqual(harness.recv_all(s), b"bye")
        # The other direction is still open: what the client sends now reaches the server.
        s.sendall(b"after your close")
        s.shutdown(socket.SHUT_WR)
        wait_until(lambda: self.py.requests and self.py.requests[0]["ended"],
                   what="client's END_STREAM at the python server")
        self.assertEqual(self.py.requests[0]["data"], b"after your close")

    def test_refusal_from_python_server_is_reported_to_the_client(self):
        s, rep = self.socks(9403)
        self.assertEqual(rep, 2, "403 from the server -> SOCKS 'not allowed by ruleset'")
        wait_until(lambda: "answered 403: python says no" in self.mesh.a.logs(),
                   what="403 logged on A")


class PyServerWrongIdentityTest(PyServerBase):
    server_sa = "someoneelse"

    def test_outbound_refuses_server_with_unexpected_identity(self):
        s, rep = self.socks(9090)
        self.assertNotEqual(rep, 0, "A must not tunnel to a server with the wrong identity")
        wait_until(lambda: ("presented identity %s, expected %s" % (TD + "someoneelse",
                                                                    PYSERVER_ID))
                   in self.mesh.a.logs(), what="identity mismatch logged on A")
        self.assertEqual(self.py.requests, [], "no CONNECT sent to the impostor")
        self.assertGreaterEqual(self.mesh.a.metric_sum(
            "istio_tcp_connections_closed_total", response_flags="TLS_FAILURE"), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
