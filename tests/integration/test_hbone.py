"""Two sockmesh-proxy processes on loopback: client -> A (SOCKS5) -> HBONE -> B -> server."""
import concurrent.futures
import os
import select
import socket
import ssl
import sys
import threading
import time
import unittest
import urllib.error

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import (TwoNodeMesh, EchoServer, http_get, http_post, transfer_and_check,  # noqa: E402
                     wait_until)

DENY_CLIENT = """- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: ["cluster.local/ns/default/sa/client"]
"""


class MeshTest(unittest.TestCase):
    mesh_args = {}

    def setUp(self):
        self.mesh = TwoNodeMesh(**self.mesh_args)
        self.server = EchoServer(self.mesh.server_ip, 8080, mode="whoami")
        self.mesh.start()

    def tearDown(self):
        harness.show_logs_if_failed(self, self.mesh)
        self.mesh.stop()
        self.server.close()
        self.mesh.cleanup()

    def whoami(self, s):
        return harness.read_line(s)


class PoolLimitTest(MeshTest):
    # ztunnel's variable for the pool's streams per connection; one worker, so that one pool
    # sees every stream.
    mesh_args = {"extra_a": ["--workers", "1"],
                 "env_a": {"POOL_MAX_STREAMS_PER_CONNECTION": "3"}}

    def test_a_full_connection_makes_the_pool_open_another(self):
        held = []
        try:
            for _ in range(7):  # held open together: 3 + 3 + 1 streams
                s, rep = self.mesh.connect()
                self.assertEqual(rep, 0)
                self.whoami(s)
                held.append(s)
            self.assertEqual(self.mesh.a.metric_sum("sockmesh_pool_connections_opened_total"), 3)
            for s in held:
                self.assertTrue(transfer_and_check(s, os.urandom(70000)))
        finally:
            for s in held:
                s.close()
        # Room freed by closed streams is used again: no fourth connection.
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        s.close()
        self.assertEqual(self.mesh.a.metric_sum("sockmesh_pool_connections_opened_total"), 3)


class TunnelTest(MeshTest):
    def test_direct_and_vip_reach_server_with_client_ip(self):
        for dst, port in ((self.mesh.server_ip, 8080), (self.mesh.vip, 80)):
            s, rep = self.mesh.connect(dst, port)
            self.assertEqual(rep, 0, "SOCKS reply for %s:%d" % (dst, port))
            peer = self.whoami(s)
            # Source IP preserved: the server sees the client pod's address, not the proxy's.
            self.assertTrue(peer.startswith(self.mesh.client_ip + ":"), peer)
            self.assertTrue(transfer_and_check(s, b"x" * 100000))
            s.close()
        # Both ends counted the connections with Istio's labels.
        wait_until(lambda: self.mesh.b.metric_sum(
            "istio_tcp_connections_closed_total", reporter="destination",
            source_principal="spiffe://cluster.local/ns/default/sa/client",
            destination_principal="spiffe://cluster.local/ns/default/sa/server",
            connection_security_policy="mutual_tls") >= 2, what="closed connections on B")
        self.assertGreaterEqual(self.mesh.a.metric_sum(
            "istio_tcp_connections_opened_total", reporter="source",
            destination_service="server.default.svc.cluster.local"), 1)
        self.assertGreaterEqual(self.mesh.b.metric_sum(
            "istio_tcp_received_bytes_total", reporter="destination"), 200000)
        # One access-log line per connection, on each side.
        wait_until(lambda: self.mesh.b.logs().count("direction=inbound") >= 2, what="access log")
        self.assertIn("src.identity=spiffe://cluster.local/ns/default/sa/client",
                      self.mesh.a.logs())

    def test_64mib_both_ways_with_checksum(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        payload = os.urandom(64 * 1024 * 1024)
        self.assertTrue(transfer_and_check(s, payload), "64 MiB echoed intact")
        s.close()

    def test_200_concurrent_streams_share_pooled_connections(self):
        n = 200

        def one(i):
            s, rep = self.mesh.connect()
            if rep != 0:
                return "reply %d" % rep
            self.whoami(s)
            payload = os.urandom(4096 + i)
            ok = transfer_and_check(s, payload)
            s.close()
            return ok

        # Open all streams first so that they are concurrent, then transfer.
        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
            results = list(ex.map(one, range(n)))
        self.assertEqual(results, [True] * n)
        opened = self.mesh.a.metric_sum("sockmesh_pool_connections_opened_total")
        # Up to 100 streams per connection, one pool per worker (2 workers): far fewer
        # connections than streams, but at least one.
        self.assertGreaterEqual(opened, 1)
        self.assertLessEqual(opened, 8, "pooled connections for 200 streams")

    def test_half_close_is_passed_through(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)  # FIN -> END_STREAM -> FIN at the server
        got = harness.recv_all(s)  # the server echoes, then closes its side
        self.assertEqual(got, b"last words")
        s.close()

    def test_after_backpressure_the_servers_socket_is_not_watched_for_writability(self):
        # The server stalls, so node-b's writes to it wait (asio adds EPOLLOUT to the socket's
        # epoll registration for that); once it reads again, node-b's next wait to read it must
        # not ask for writability, or every later message would wake node-b for nothing.
        go = threading.Event()

        class Stalling(EchoServer):
            def _serve(self, c, addr, record):
                go.wait(30)  # then echoes
                super()._serve(c, addr, record)
        server = Stalling(self.mesh.server_ip, 8081)
        self.addCleanup(server.close)
        s, rep = self.mesh.connect(dst_port=8081)
        self.assertEqual(rep, 0)
        payload = os.urandom(16 << 20)
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        dialled = lambda: harness.epoll_events(  # noqa: E731
            self.mesh.b.proc.pid, harness.socket_inodes(self.mesh.server_ip, 8081))
        wait_until(lambda: any(e & select.EPOLLOUT for e in dialled().values()), 10,
                   what="node-b waiting for the stalled server to take more")
        go.set()
        got = harness.recv_exact(s, len(payload))
        sender.join(10)
        self.assertEqual(got, payload)
        for i in range(3):
            s.sendall(b"ping %d" % i)
            self.assertEqual(harness.recv_exact(s, 6), b"ping %d" % i)
        seen = [{}]

        def without_epollout():
            seen[0] = dialled()
            return seen[0] and not any(e & select.EPOLLOUT for e in seen[0].values())
        try:
            wait_until(without_epollout, 5, what="no EPOLLOUT on the server's socket")
        except AssertionError:
            self.fail("node-b still watches the server's socket for writability: %s" %
                      {fd: hex(e) for fd, e in seen[0].items()})
        s.close()

    def test_unknown_source_is_refused(self):
        # 127.x.y.99 is not a workload: the proxy has no identity to present for it.
        s, rep = self.mesh.connect(source_ip=self.mesh.block + ".99")
        self.assertNotEqual(rep, 0)


class PolicyTest(MeshTest):
    def test_deny_policy_refuses_and_is_counted(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        s.close()
        self.mesh.set_policies(DENY_CLIENT)
        wait_until(lambda: len(self.mesh.b.config_dump()["policies"]) == 1, what="policy loaded")
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 2, "SOCKS5 'not allowed by ruleset' for a policy denial")
        wait_until(lambda: self.mesh.b.metric_sum(
            "istio_tcp_connections_closed_total", response_flags="DENY") >= 1,
            what="DENY counted on B")
        self.assertIn("denied by policy", self.mesh.b.logs())

    def test_dry_run_deny_is_logged_and_not_enforced(self):
        self.mesh.set_policies(DENY_CLIENT + "  dryRun: true\n")
        wait_until(lambda: len(self.mesh.b.config_dump()["policies"]) == 1, what="policy loaded")
        dumped = self.mesh.b.config_dump()["policies"][0]
        self.assertEqual((dumped["name"], dumped["dryRun"]), ("deny-client", True))
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0, "a dry-run Deny must not refuse the connection")
        self.whoami(s)
        s.sendall(b"still here")
        self.assertEqual(harness.recv_exact(s, 10), b"still here")
        s.close()
        wait_until(lambda: "dry run would deny: denied by policy default/deny-client "
                   "(enforced: allow)" in self.mesh.b.logs(), what="the dry-run verdict logged")
        self.assertEqual(self.mesh.b.metric_sum("istio_tcp_connections_closed_total",
                                                response_flags="DENY"), 0)
        # The same policy enforced now refuses: the dry run predicted it.
        self.mesh.set_policies(DENY_CLIENT)
        wait_until(lambda: not self.mesh.b.config_dump()["policies"][0]["dryRun"],
                   what="the enforced policy loaded")
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 2)

    def test_policy_change_closes_live_connection(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        s.sendall(b"ping")
        self.assertEqual(harness.recv_exact(s, 4), b"ping")
        self.mesh.set_policies(DENY_CLIENT)
        s.settimeout(10)
        t0 = time.time()
        try:
            closed = s.recv(10) == b""
        except (ConnectionResetError, OSError):
            closed = True
        self.assertTrue(closed, "live connection closed after the policy began to deny it")
        self.assertLess(time.time() - t0, 8)
        self.assertIn("policy now denies", self.mesh.b.logs())


class IdentityTest(MeshTest):
    # Node A believes the server runs as "imposter"; B presents the real "server" certificate.
    mesh_args = {"server_sa_seen_by_a": "imposter"}

    def test_client_rejects_unexpected_server_identity(self):
        s, rep = self.mesh.connect()
        self.assertNotEqual(rep, 0)
        wait_until(lambda: "expected spiffe://cluster.local/ns/default/sa/imposter"
                   in self.mesh.a.logs(), what="identity mismatch logged")
        self.assertGreaterEqual(self.mesh.a.metric_sum(
            "istio_tcp_connections_closed_total", response_flags="TLS_FAILURE"), 1)


class ForeignCaTest(MeshTest):
    def assert_client_rejected(self, cert, key, logged):
        """A TLS client presenting cert/key is refused by node B, which logs `logged`."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((self.mesh.server_ip, 15008), timeout=5)
        with self.assertRaises((ssl.SSLError, ConnectionResetError, OSError)):
            tls = ctx.wrap_socket(raw)
            # TLS 1.3: the client learns of the rejection on its first read.
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            if tls.recv(100) == b"":
                raise ConnectionResetError("closed")
        raw.close()
        wait_until(lambda: logged in self.mesh.b.logs(), what="'%s' logged on B" % logged)

    def test_client_certificate_from_another_ca_is_rejected(self):
        d = self.mesh.tmp.path
        ca_cert, ca_key = harness.make_ca(d, "foreign")
        cert, key = harness.issue_leaf(d, "intruder", ca_cert, ca_key,
                                       "spiffe://cluster.local/ns/default/sa/client")
        self.assert_client_rejected(cert, key, "peer certificate rejected")

    def test_wrong_trust_domain_is_rejected(self):
        # Signed by the mesh's own root, but for another trust domain.
        ca_cert = os.path.join(self.mesh.state_dir, "ca-cert.pem")
        ca_key = os.path.join(self.mesh.state_dir, "ca-key.pem")
        cert, key = harness.issue_leaf(self.mesh.tmp.path, "otherdomain", ca_cert, ca_key,
                                       "spiffe://evil.example/ns/default/sa/client")
        self.assert_client_rejected(cert, key, 'expected "cluster.local"')


class AdminTest(MeshTest):
    def test_logging_applies_the_default_first_and_all_or_nothing(self):
        base = "http://%s:15000/logging" % self.mesh.a.admin_ip
        status, body = http_post(base + "?access=warn&level=debug")
        self.assertEqual(status, 200)
        self.assertIn("default=debug", body)
        self.assertIn("access=warn", body, "the default must not reset a scope set with it")
        with self.assertRaises(urllib.error.HTTPError) as refused:
            http_post(base + "?access=error&pool=loud")
        self.assertEqual(refused.exception.code, 400)
        self.assertIn("nothing was changed", refused.exception.read().decode())
        self.assertIn("access=warn", http_get(base)[1], "a refused request changed a level")

    def test_config_dump_lists_service_endpoints_as_ztunnel_does(self):
        services = self.mesh.a.config_dump()["services"]
        self.assertEqual([s["hostname"] for s in services], ["server.default.svc.cluster.local"])
        self.assertEqual(services[0]["endpoints"], {
            "s1": {"workloadUid": "s1", "service": "default/server.default.svc.cluster.local",
                   "port": {"80": 8080}, "status": "Healthy"}})


class DrainTest(MeshTest):
    mesh_args = {"extra_b": ("--drain-timeout-ms", "3000")}

    def test_sigterm_lets_live_stream_finish_then_exits(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        self.mesh.b.proc.send_signal(harness.signal.SIGTERM)
        time.sleep(0.3)
        # The live stream still works during the drain.
        s.sendall(b"still here")
        self.assertEqual(harness.recv_exact(s, 10), b"still here")
        s.close()
        rc = self.mesh.b.proc.wait(10)
        self.assertEqual(rc, 0)
        self.assertIn("draining", self.mesh.b.logs())

    def test_drain_deadline_closes_what_is_left(self):
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0)
        self.whoami(s)
        t0 = time.time()
        self.mesh.b.proc.send_signal(harness.signal.SIGTERM)
        # New connections are refused while draining...
        time.sleep(0.3)
        s2, rep2 = self.mesh.connect()
        self.assertNotEqual(rep2, 0, "a new tunnel during drain")
        # ...and the stream that never ends is closed at the 3 s deadline, not left hanging.
        s.settimeout(10)
        try:
            ended = s.recv(10) == b""
        except OSError:
            ended = True
        self.assertTrue(ended)
        rc = self.mesh.b.proc.wait(10)
        elapsed = time.time() - t0
        self.assertEqual(rc, 0)
        self.assertGreaterEqual(elapsed, 2.5)
        self.assertLess(elapsed, 8)
        self.assertIn("drain deadline reached", self.mesh.b.logs())


if __name__ == "__main__":
    unittest.main(verbosity=2)
