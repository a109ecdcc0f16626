#!/usr/bin/python3
"""HBONE over IPv6: two sockmesh-proxy processes (nodes A and B) whose workloads have IPv6
addresses, client -> A (SOCKS5, IPv6 target) -> HBONE to [server]:15008 -> B -> server. IPv6
loopback has one address only, so the test makes a network namespace of its own with several
addresses on its lo (root needed: label privileged), and runs its body inside it.

Checks: bytes both ways intact, the server sees the client's own IPv6 address, both proxies log
and count the connection with the right identities, and an IPv6 CIDR in a Deny policy refuses."""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD_DIR, PROXY_BIN, TempDir, wait_until  # noqa: E402

SKIP_EXIT = 77
PREFIX = "fd00:5ee"
NODE_A, NODE_B = PREFIX + "::1", PREFIX + "::2"
CLIENT, SERVER, OTHER = PREFIX + "::10", PREFIX + "::20", PREFIX + "::30"
APP_PORT = 8080

WORKLOADS = """workloads:
- uid: c1
  name: client
  namespace: v6
  serviceAccount: client
  workloadIps: ["%s"]
  protocol: HBONE
  node: node-a
- uid: o1
  name: other
  namespace: v6
  serviceAccount: other
  workloadIps: ["%s"]
  protocol: HBONE
  node: node-a
- uid: s1
  name: server
  namespace: v6
  serviceAccount: server
  workloadIps: ["%s"]
  protocol: HBONE
  node: node-b
""" % (CLIENT, OTHER, SERVER)

DENY_OTHER = """policies:
- name: deny-other-v6
  namespace: v6
  scope: Namespace
  action: Deny
  rules: [[[{sourceIps: ["%s/128"]}]]]
""" % OTHER


class EchoServer6:
    """Echoes each connection until EOF; remembers the peer addresses it accepted."""

    def __init__(self, ip, port):
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.peers = []
        self.stopped = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        deadline = time.time() + 300
        while not self.stopped and time.time() < deadline:
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.peers.append(addr[0])
            threading.Thread(target=self.echo, args=(conn,), daemon=True).start()

    @staticmethod
    def echo(conn):
        conn.settimeout(30)
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self):
        self.stopped = True
        self.sock.close()


def socks5_connect(src_ip, proxy_ip, dst_ip, dst_port, timeout=10):
    """A SOCKS5 CONNECT to an IPv6 target (ATYP 4) from src_ip; returns (socket, reply code)."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src_ip, 0))
    s.connect((proxy_ip, 15080))
    s.sendall(b"\x05\x01\x00")
    if s.recv(2) != b"\x05\x00":
        raise AssertionError("SOCKS5: no-auth refused")
    s.sendall(b"\x05\x01\x00\x04" + socket.inet_pton(socket.AF_INET6, dst_ip) +
              struct.pack("!H", dst_port))
    reply = b""
    while len(reply) < 4:
        chunk = s.recv(4 - len(reply))
        if not chunk:
            break
        reply += chunk
    if len(reply) < 2:
        raise AssertionError("SOCKS5: no reply")
    if reply[1] == 0:  # the bound address that follows: IPv4 (6 more bytes) or IPv6 (18)
        rest = 6 if reply[3] == 1 else 18
        while rest > 0:
            rest -= len(s.recv(rest))
    return s, reply[1]


def echo_through(sock, payload):
    got = bytearray()

    def reader():
        while True:
            data = sock.recv(65536)
            if not data:
                return
            got.extend(data)
    t = threading.Thread(target=reader)
    t.start()
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    t.join(30)
    return bytes(got)


class HboneIpv6(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = TempDir()
        cls.config = cls.tmp.file("mesh.yaml", WORKLOADS)
        cls.procs = {}
        for name, ip, extra in (("node-a", NODE_A, ["--socks5", "[%s]:15080" % NODE_A]),
                                ("node-b", NODE_B, [])):
            log = open(os.path.join(cls.tmp.path, name + ".log"), "wb")
            cls.procs[name] = subprocess.Popen(
                [PROXY_BIN, "--node", name, "--config", cls.config,
                 "--state-dir", os.path.join(cls.tmp.path, "state"),
                 "--admin", "[%s]:15000" % ip, "--metrics", "[%s]:15020" % ip,
                 "--readiness", "[%s]:15021" % ip, "--config-poll-ms", "100",
                 "--log-level", "info"] + extra, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        for name, ip in (("node-a", NODE_A), ("node-b", NODE_B)):
            wait_until(lambda ip=ip, name=name: cls.alive(name) and
                       cls.http(ip, 15021, "/healthz/ready").startswith("ready"),
                       timeout=15, what="%s ready" % name)
        cls.server = EchoServer6(SERVER, APP_PORT)

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        for p in cls.procs.values():
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if os.environ.get("SOCKMESH_TEST_LOGS"):
            for name in cls.procs:
                sys.stderr.write(cls.log(name)[-4000:])
        cls.tmp.cleanup()

    @classmethod
    def alive(cls, name):
        if cls.procs[name].poll() is not None:
            raise AssertionError("%s exited:\n%s" % (name, cls.log(name)[-3000:]))
        return True

    @classmethod
    def log(cls, name):
        with open(os.path.join(cls.tmp.path, name + ".log"), errors="replace") as f:
            return f.read()

    @staticmethod
    def http(ip, port, path):
        s = socket.create_connection((ip, port), timeout=3)
        with s:
            s.sendall(("GET %s HTTP/1.0\r\nHost: x\r\n\r\n" % path).encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data.split(b"\r\n\r\n", 1)[1].decode()

    def metric(self, ip, name, **labels):
        total = 0.0
        for line in self.http(ip, 15020, "/metrics").splitlines():
            if line.startswith(name) and all('%s="%s"' % kv in line for kv in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def test_a_tunnel_over_ipv6_carries_bytes_both_ways_and_keeps_the_client_address(self):
        payload = os.urandom(4 << 20)
        sock, code = socks5_connect(CLIENT, NODE_A, SERVER, APP_PORT)
        with sock:
            self.assertEqual(code, 0, "SOCKS5 CONNECT refused")
            self.assertEqual(echo_through(sock, payload), payload)
        self.assertIn(CLIENT, self.server.peers, "the server did not see the client's address")
        principal = "spiffe://cluster.local/ns/v6/sa/client"
        wait_until(lambda: self.metric(NODE_B, "istio_tcp_connections_closed_total",
                                       reporter="destination", source_principal=principal) >= 1,
                   timeout=5, what="node B to count the closed connection")
        self.assertGreaterEqual(self.metric(NODE_A, "istio_tcp_sent_bytes_total",
                                            reporter="source", source_principal=principal),
                                len(payload))
        self.assertIn("dst.hbone_addr=[%s]:15008" % SERVER, self.log("node-a"))
        self.assertIn("src.addr=[%s]:" % CLIENT, self.log("node-b"))

    def test_a_deny_policy_with_an_ipv6_cidr_refuses_that_source_only(self):
        with open(self.config + ".tmp", "w") as f:
            f.write(WORKLOADS + DENY_OTHER)
        os.replace(self.config + ".tmp", self.config)

        def policy_loaded():
            dump = json.loads(self.http(NODE_B, 15000, "/config_dump"))
            return any(p["name"] == "deny-other-v6" for p in dump.get("policies", []))
        try:
            wait_until(policy_loaded, timeout=10, what="node B to load the Deny policy")
            denied = self.metric(NODE_B, "istio_tcp_connections_closed_total",
                                 response_flags="DENY")
            sock, code = socks5_connect(OTHER, NODE_A, SERVER, APP_PORT)
            with sock:
                # The tunnel is refused at B: A answers the SOCKS5 client with a failure, or
                # closes without echoing.
                if code == 0:
                    self.assertEqual(echo_through(sock, b"x" * 1024), b"",
                                     "bytes went through a tunnel that policy denies")
            wait_until(lambda: self.metric(NODE_B, "istio_tcp_connections_closed_total",
                                           response_flags="DENY") > denied,
                       timeout=5, what="node B to count the denied connection")
            sock, code = socks5_connect(CLIENT, NODE_A, SERVER, APP_PORT)
            with sock:
                self.assertEqual(code, 0, "the policy denied a source it does not name")
                self.assertEqual(echo_through(sock, b"y" * 1024), b"y" * 1024)
        finally:
            with open(self.config + ".tmp", "w") as f:
                f.write(WORKLOADS)
            os.replace(self.config + ".tmp", self.config)


def outside():
    """Make the namespace, run this file inside it, remove the namespace."""
    if os.geteuid() != 0:
        sys.stderr.write("\n!!! SKIPPING the IPv6 HBONE test: not root (it makes a network "
                         "namespace with IPv6 addresses)\n\n")
        return SKIP_EXIT
    if not os.access(PROXY_BIN, os.X_OK):
        sys.stderr.write("\n!!! SKIPPING the IPv6 HBONE test: %s not built\n\n" % PROXY_BIN)
        return SKIP_EXIT
    ns = "sm-v6-%d" % os.getpid()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        for ip in (NODE_A, NODE_B, CLIENT, SERVER, OTHER):
            # nodad: usable at once, without duplicate address detection's delay
            subprocess.run(["ip", "-n", ns, "-6", "addr", "add", ip + "/128", "dev", "lo",
                            "nodad"], check=True)
        env = dict(os.environ, SOCKMESH_BUILD_DIR=BUILD_DIR, SOCKMESH_V6_INSIDE="1")
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable,
                               os.path.abspath(__file__)] + sys.argv[1:], env=env,
                              timeout=300).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns])


if __name__ == "__main__":
    if os.environ.get("SOCKMESH_V6_INSIDE") != "1":
        sys.exit(outside())
    unittest.main(verbosity=2)
