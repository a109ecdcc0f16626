#!/usr/bin/python3
"""The benchmark's own tools, which its verdicts rest on: sockmesh-loadgen's TLS floor relays
(mutual TLS 1.3 between two relays) must carry bytes intact and refuse a peer from another CA, so
must its HTTP/2 floor relays (HTTP/2 CONNECT inside that TLS), and its churn mode must count
failed tunnels rather than stop at the first. Real processes on
loopback; certificates from the openssl command line, as bench/run.py makes them."""
import json
import os
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from harness import BUILD_DIR, TcpServer, TempDir, address_block, wait_until  # noqa: E402
from run import make_pki  # noqa: E402  (bench/run.py: a CA, a server and a client certificate)

LOADGEN = os.path.join(BUILD_DIR, "bench", "sockmesh-loadgen")


def port_open(ip, port):
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


class BenchTools(unittest.TestCase):
    def setUp(self):
        self.tmp = TempDir()
        self.addCleanup(self.tmp.cleanup)
        self.block = address_block()
        self.ip = lambda n: "%s.%d" % (self.block, n)
        self.procs = []
        self.addCleanup(self.stop_all)
        self.server = "%s:8080" % self.ip(20)
        self.start("server", [LOADGEN, "server", "--listen", self.server, "--max-seconds", "120"])
        wait_until(lambda: port_open(self.ip(20), 8080), what="loadgen server")

    def stop_all(self):
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)

    def start(self, name, argv):
        log = open(os.path.join(self.tmp.path, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append((p, name))
        return p

    def log_of(self, name):
        with open(os.path.join(self.tmp.path, name + ".log"), errors="replace") as f:
            return f.read()

    def client(self, *args, target=None):
        argv = [LOADGEN, "client", "--via", "tcp", "--target", target or "%s:17021" % self.ip(45),
                "--bind", self.ip(10), "--timeout", "20"] + list(args)
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        lines = r.stdout.decode().strip().splitlines()
        return r.returncode, (json.loads(lines[-1]) if lines else None), r.stderr.decode()

    def tls_relays(self, client_pki, server_pki, h2_listen=False, h2_to=False, loop="epoll",
                   to=None):
        self.start("relay2", [LOADGEN, "relay", "--listen", "%s:17022" % self.ip(46),
                              "--to", to or self.server, "--max-seconds", "120", "--tls-listen",
                              "%s,%s,%s" % (server_pki["server_cert"], server_pki["server_key"],
                                            server_pki["ca"]), "--loop", loop] +
                   (["--h2", "yes"] if h2_listen else []))
        self.start("relay1", [LOADGEN, "relay", "--listen", "%s:17021" % self.ip(45),
                              "--to", "%s:17022" % self.ip(46), "--max-seconds", "120",
                              "--tls-to", "%s,%s,%s" % (client_pki["client_cert"],
                                                        client_pki["client_key"],
                                                        client_pki["ca"]), "--loop", loop] +
                   (["--h2", "yes"] if h2_to else []))
        wait_until(lambda: port_open(self.ip(46), 17022), what="relay 2")
        wait_until(lambda: port_open(self.ip(45), 17021), what="relay 1")

    def pki(self, name):
        d = os.path.join(self.tmp.path, name)
        os.makedirs(d)
        return make_pki(d, "relay.test")

    def test_tls_floor_relays_carry_bytes_intact(self):
        pki = self.pki("mesh")
        self.tls_relays(pki, pki)
        rc, res, err = self.client("--mode", "throughput", "--bytes", "16M", "--streams", "2")
        # The client fails unless the sink's count of each stream's bytes (its ack) matches.
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["bytes"], 16 << 20)
        rc, res, err = self.client("--mode", "pingpong", "--size", "3000", "--iters", "300",
                                   "--warmup", "10")
        self.assertEqual(rc, 0, err)  # each echo is compared with what was sent
        self.assertEqual(res["iters"], 300)
        rc, res, err = self.client("--mode", "churn", "--conns", "200", "--streams", "4",
                                   "--seconds", "30")
        self.assertEqual(rc, 0, err)
        self.assertEqual((res["conns"], res["failures"]), (200, 0), res["first_error"])

    def test_h2_floor_relays_carry_bytes_intact(self):
        self.h2_relays_carry_bytes_intact("epoll")

    def test_h2_floor_relays_on_asio_carry_bytes_intact(self):
        # (ta) of the cluster bench: the same relays, woken by asio's reactor.
        self.h2_relays_carry_bytes_intact("asio")

    def h2_relays_carry_bytes_intact(self, loop):
        pki = self.pki("mesh")
        self.tls_relays(pki, pki, h2_listen=True, h2_to=True, loop=loop)
        # 40 MiB in one stream: more than the 16 MiB connection window and the 4 MiB stream
        # window, so the sender waits for WINDOW_UPDATEs, and frames are up to 256 KiB.
        rc, res, err = self.client("--mode", "throughput", "--bytes", "40M", "--streams", "1")
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["bytes"], 40 << 20)
        rc, res, err = self.client("--mode", "throughput", "--bytes", "16M", "--streams", "4")
        self.assertEqual(rc, 0, err)
        rc, res, err = self.client("--mode", "pingpong", "--size", "70000", "--iters", "200",
                                   "--warmup", "10")
        self.assertEqual(rc, 0, err)  # each echo is compared with what was sent
        self.assertEqual(res["iters"], 200)
        rc, res, err = self.client("--mode", "churn", "--conns", "200", "--streams", "4",
                                   "--seconds", "30")
        self.assertEqual(rc, 0, err)
        self.assertEqual((res["conns"], res["failures"]), (200, 0), res["first_error"])

    def test_h2_floor_relays_on_asio_wait_for_a_slow_reader(self):
        # asio makes every socket it waits on non-blocking: a send that finds the server's socket
        # full must wait for room, not end the connection.
        size = 16 << 20
        got = []

        # The relays' readiness probes (tls_relays) reach this server too, as connections that
        # end at once: TcpServer serves each connection on its own.
        class SlowReader(TcpServer):
            def _serve(self, conn, _addr, _record):
                with conn:
                    conn.settimeout(20)
                    time.sleep(1.0)  # the relay's sends meet a full socket meanwhile
                    n = 0
                    while n < size:
                        chunk = conn.recv(1 << 20)
                        if not chunk:
                            break
                        n += len(chunk)
                    got.append(n)
                    if n == size:
                        conn.sendall(b"ok")

        server = SlowReader(self.ip(21), 8081)
        self.addCleanup(server.close)
        pki = self.pki("mesh")
        self.tls_relays(pki, pki, h2_listen=True, h2_to=True, loop="asio",
                        to="%s:8081" % self.ip(21))
        with socket.create_connection((self.ip(45), 17021), timeout=20) as c:
            c.sendall(b"x" * size)
            reply = c.recv(2)
        self.assertEqual(reply, b"ok", self.log_of("relay1") + self.log_of("relay2"))
        self.assertIn(size, got)

    def test_h2_floor_relay_speaks_http2_only_to_http2(self):
        # The HTTP/2 server relay gets TLS with no HTTP/2 preface inside: it must not relay it.
        pki = self.pki("mesh")
        self.tls_relays(pki, pki, h2_listen=True, h2_to=False)
        rc, res, err = self.client("--mode", "pingpong", "--iters", "5", "--warmup", "0")
        self.assertNotEqual(rc, 0, "bytes without HTTP/2 framing crossed an HTTP/2 relay")
        wait_until(lambda: "nghttp2" in self.log_of("relay2"), timeout=5,
                   what="relay 2 to log the HTTP/2 error")
        self.assertIsNone(next(p for p, n in self.procs if n == "relay2").poll(),
                          "relay 2 exited on a peer that does not speak HTTP/2")

    def test_tls_relays_of_different_cas_do_not_connect(self):
        self.tls_relays(self.pki("other"), self.pki("mesh"))
        rc, res, err = self.client("--mode", "pingpong", "--iters", "5", "--warmup", "0")
        self.assertNotEqual(rc, 0, "the echo went through a relay pair that shares no CA")
        # relay 1 checks relay 2's certificate against a CA that did not sign it.
        wait_until(lambda: "certificate verify failed" in self.log_of("relay1"),
                   timeout=5, what="relay 1 to log the failed verification")
        for name in ("relay1", "relay2"):
            self.assertIsNone(next(p for p, n in self.procs if n == name).poll(),
                              "%s exited on a failed handshake" % name)

    def test_churn_counts_failed_tunnels_and_goes_on(self):
        rc, res, err = self.client("--mode", "churn", "--conns", "50", "--streams", "2",
                                   "--seconds", "20", target="%s:9" % self.ip(30))
        self.assertEqual(rc, 0, err)
        self.assertEqual((res["conns"], res["failures"]), (0, 50))
        self.assertIn("connect", res["first_error"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
