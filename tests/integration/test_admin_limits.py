"""The proxy's own HTTP listeners (admin 15000, metrics 15020, readiness 15021) and its ZDS peer,
as an attacker on the node would try them: the admin port off loopback, /logging with made-up
scopes, clients that connect and send nothing until the proxy runs out of descriptors, requests
too large, and a process other than the agent serving the ZDS socket."""
import os
import socket
import sys
import time
import unittest
import urllib.error

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import TwoNodeMesh, EchoServer, TempDir, http_get, http_post, wait_until  # noqa: E402

MAX_CONNECTIONS = 8
TIMEOUT_MS = 1000
FD_LIMIT = 256
SLOW_CLIENTS = 300  # more than FD_LIMIT: without a cap they would take every descriptor


class AdminLimitsTest(unittest.TestCase):
    def setUp(self):
        limits = ("--http-max-connections", str(MAX_CONNECTIONS),
                  "--http-request-timeout-ms", str(TIMEOUT_MS))
        self.mesh = TwoNodeMesh(extra_a=limits, extra_b=limits)
        # Node B runs with few descriptors, so that slow clients could exhaust them.
        self.mesh.b.args = ["prlimit", "--nofile=%d:%d" % (FD_LIMIT, FD_LIMIT), "--"] + \
            self.mesh.b.args
        self.server = EchoServer(self.mesh.server_ip, 8080)
        self.mesh.start()
        self.idle = []

    def tearDown(self):
        for s in self.idle:
            s.close()
        harness.show_logs_if_failed(self, self.mesh)
        self.mesh.stop()
        self.server.close()
        self.mesh.cleanup()

    def admin(self, node, path):
        return "http://%s:15000%s" % (node.admin_ip, path)

    def test_logging_accepts_known_scopes_only_and_stores_nothing_else(self):
        b = self.mesh.b
        with self.assertRaises(urllib.error.HTTPError) as e:
            http_post(self.admin(b, "/logging?no_such_scope_1=debug"))
        self.assertEqual(e.exception.code, 400)
        body = e.exception.read().decode()
        self.assertIn("unknown scope 'no_such_scope_1'", body)
        self.assertIn("nothing was changed", body)
        # A known scope next to an unknown one: all or nothing.
        with self.assertRaises(urllib.error.HTTPError):
            http_post(self.admin(b, "/logging?access=warn&other_2=debug"))
        _, levels = http_get(self.admin(b, "/logging"))
        self.assertNotIn("no_such_scope_1", levels)
        self.assertNotIn("other_2", levels)
        self.assertNotIn("access=", levels)
        status, levels = http_post(self.admin(b, "/logging?access=warn"))
        self.assertEqual(status, 200)
        self.assertIn("access=warn", levels)

    def test_slow_clients_neither_exhaust_descriptors_nor_stall_scrapes_or_tunnels(self):
        b = self.mesh.b
        # Clients that connect and send nothing: to metrics and readiness alike.
        for i in range(SLOW_CLIENTS):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect((b.admin_ip, 15020 if i % 2 == 0 else 15021))
            except OSError:
                s.close()
                continue
            self.idle.append(s)
        time.sleep(0.2)
        # A scrape and a tunnel still work at once (the listeners keep accepting).
        start = time.time()
        status, text = http_get("http://%s:15020/metrics" % b.admin_ip, timeout=3)
        self.assertEqual(status, 200)
        self.assertIn("sockmesh_http_connections_shed_total", text)
        s, rep = self.mesh.connect()
        self.assertEqual(rep, 0, "tunnel through B with %d slow clients" % len(self.idle))
        s.sendall(b"ping")
        self.assertEqual(harness.recv_exact(s, 4), b"ping")
        s.close()
        self.assertLess(time.time() - start, 5)
        self.assertGreater(b.metric_sum("sockmesh_http_connections_shed_total",
                                        listener="metrics", reason="idle_evicted"), 0)
        # The ones that were let in are closed when their request does not arrive in time.
        deadline = time.time() + TIMEOUT_MS / 1000.0 + 3
        closed = 0
        for s in self.idle:
            s.settimeout(max(0.01, deadline - time.time()))
            try:
                if s.recv(1) == b"":
                    closed += 1
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                break
        self.assertEqual(closed, len(self.idle), "idle clients still open after the deadline")
        wait_until(lambda: b.metric_sum("sockmesh_http_requests_rejected_total",
                                        listener="metrics", reason="timeout") > 0,
                   what="timeouts counted")

    def test_a_request_too_large_gets_413(self):
        s = socket.create_connection((self.mesh.b.admin_ip, 15020), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        reply = harness.recv_all(s).decode(errors="replace")
        s.close()
        self.assertTrue(reply.startswith("HTTP/1.1 413"), reply[:200])
        self.assertIn("request too large", reply)


class AdminAddressTest(unittest.TestCase):
    def test_admin_listener_off_loopback_is_refused(self):
        tmp = TempDir()
        try:
            node = harness.ProxyNode("node-x", tmp.file("c.yaml", "workloads: []\n"),
                                     os.path.join(tmp.path, "ca"), harness.address_block() + ".1",
                                     tmp.path, extra=("--admin", "0.0.0.0:0"))
            node.start(wait=False)
            try:
                code = node.proc.wait(10)
            except Exception:  # noqa: BLE001 - still running: the refusal is missing
                node.kill()
                self.fail("the proxy started with its admin listener on 0.0.0.0")
            self.assertEqual(code, 2)
            self.assertIn("loopback", node.logs())
        finally:
            tmp.cleanup()


class ZdsPeerTest(unittest.TestCase):
    """The ZDS socket's server hands the proxy pods' network namespaces: only root or the
    proxy's own user may be that server."""

    def serve_zds_as(self, uid, path):
        """Forks a ZDS 'server' running as uid; returns (pid, read end of a pipe that gets the
        first packet the proxy sent, or b'closed' / b'none')."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                if uid != os.getuid():
                    os.setgid(uid)
                    os.setuid(uid)
                srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                srv.bind(path)
                srv.listen(4)
                srv.settimeout(10)
                c, _ = srv.accept()
                c.settimeout(5)
                try:
                    data = c.recv(65536)
                    os.write(w, b"hello" if data else b"closed")
                except socket.timeout:
                    os.write(w, b"none")
            finally:
                os._exit(0)
        os.close(w)
        return pid, r

    def run_case(self, uid, expect_log=None):
        tmp = TempDir()
        os.chmod(tmp.path, 0o777)
        path = os.path.join(tmp.path, "zds.sock")
        pid, r = self.serve_zds_as(uid, path)
        wait_until(lambda: os.path.exists(path), what="ZDS socket")
        block = harness.address_block()
        node = harness.ProxyNode("node-z", tmp.file("c.yaml", "workloads: []\n"),
                                 os.path.join(tmp.path, "ca"), block + ".1", tmp.path,
                                 extra=("--zds-socket", path, "--bpf-pin-root", "off"))
        try:
            node.start(wait=False)
            got = os.read(r, 16)
            os.waitpid(pid, 0)
            if expect_log:
                wait_until(lambda: expect_log in node.logs(), what="log: " + expect_log)
            return got
        finally:
            node.kill()
            os.close(r)
            tmp.cleanup()

    def test_a_zds_server_of_another_uid_is_refused(self):
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to run the fake agent as another uid")
        got = self.run_case(65534)
        self.assertEqual(got, b"closed", "the proxy spoke to a ZDS server running as uid 65534")
        self.run_case(65534, expect_log="runs as uid 65534, neither root nor this proxy's uid")

    def test_a_zds_server_of_the_same_uid_is_served(self):
        got = self.run_case(os.getuid())
        self.assertEqual(got, b"hello")


if __name__ == "__main__":
    if not os.path.exists(harness.PROXY_BIN):
        print("sockmesh-proxy not built")
        sys.exit(77)
    unittest.main(verbosity=2)
