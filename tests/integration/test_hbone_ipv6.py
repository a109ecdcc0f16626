#!/usr/bin/python3
"""HBONE over IPv6: two sockmesh-proxy processes (nodes A and B) whose workloads have IPv6
addresses, client -> A (SOCKS5, IPv6 target) -> HBONE to [server]:15008 -> B -> server. IPv6
loopback has one address only, so the test makes a network namespace of its own with several
addresses on its lo (root needed: label privileged), and runs its body inside it.

Checks: bytes both ways intact, the server sees the client's own IPv6 address, both proxies log
and count the connection with the right identities, and an IPv6 CIDR in a Deny policy refuses."""
import os
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BUILD_DIR, PROXY_BIN, EchoServer, ProxyNode, TempDir, recv_all,  # noqa: E402
                     socks_connect, transfer_and_check, wait_until)

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


class HboneIpv6(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = TempDir()
        cls.config = cls.tmp.file("mesh.yaml", WORKLOADS)
        state = os.path.join(cls.tmp.path, "state")
        # Bracketed metrics/readiness addresses: ProxyNode writes "<admin_ip>:port" and URLs from
        # them. Admin binds loopback only, and IPv6 has one loopback address: IPv4's here.
        cls.a = ProxyNode("node-a", cls.config, state, "[%s]" % NODE_A, cls.tmp.path,
                          socks5="[%s]:15080" % NODE_A, admin="127.0.0.1:15000",
                          extra=["--socks5-clients", "%s=c1,%s=o1" % (CLIENT, OTHER)])
        cls.b = ProxyNode("node-b", cls.config, state, "[%s]" % NODE_B, cls.tmp.path,
                          admin="127.0.0.2:15000")
        try:
            cls.a.start()
            cls.b.start()
        except Exception:
            cls.tearDownClass()
            raise
        cls.server = EchoServer(SERVER, APP_PORT)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "server", None):
            cls.server.close()
        for node in (cls.a, cls.b):
            node.terminate()
            node.kill()
            if os.environ.get("SOCKMESH_TEST_LOGS"):
                sys.stderr.write(node.logs()[-4000:])
        cls.tmp.cleanup()

    def socks(self, source):
        return socks_connect(source, (NODE_A, 15080), SERVER, APP_PORT)

    def test_a_tunnel_over_ipv6_carries_bytes_both_ways_and_keeps_the_client_address(self):
        payload = os.urandom(4 << 20)
        sock, code = self.socks(CLIENT)
        self.assertEqual(code, 0, "SOCKS5 CONNECT refused")
        with sock:
            self.assertTrue(transfer_and_check(sock, payload), "the echo differs")
        self.assertIn(CLIENT, [p[0] for p in self.server.peers],
                      "the server did not see the client's address")
        principal = "spiffe://cluster.local/ns/v6/sa/client"
        wait_until(lambda: self.b.metric_sum("istio_tcp_connections_closed_total",
                                             reporter="destination",
                                             source_principal=principal) >= 1,
                   timeout=5, what="node B to count the closed connection")
        self.assertGreaterEqual(self.a.metric_sum("istio_tcp_sent_bytes_total",
                                                  reporter="source", source_principal=principal),
                                len(payload))
        self.assertIn("dst.hbone_addr=[%s]:15008" % SERVER, self.a.logs())
        self.assertIn("src.addr=[%s]:" % CLIENT, self.b.logs())

    def test_a_deny_policy_with_an_ipv6_cidr_refuses_that_source_only(self):
        self.tmp.file("mesh.yaml", WORKLOADS + DENY_OTHER)
        try:
            wait_until(lambda: any(p["name"] == "deny-other-v6"
                                   for p in self.b.config_dump().get("policies", [])),
                       timeout=10, what="node B to load the Deny policy")
            denied = self.b.metric_sum("istio_tcp_connections_closed_total",
                                       response_flags="DENY")
            sock, code = self.socks(OTHER)
            if code == 0:
                # The tunnel is refused at B: A answers the SOCKS5 client with a failure, or
                # closes without echoing.
                with sock:
                    sock.sendall(b"x" * 1024)
                    sock.shutdown(socket.SHUT_WR)
                    try:
                        echoed = recv_all(sock)
                    except ConnectionResetError:
                        echoed = b""
                    self.assertEqual(echoed, b"", "bytes went through a tunnel policy denies")
            wait_until(lambda: self.b.metric_sum("istio_tcp_connections_closed_total",
                                                 response_flags="DENY") > denied,
                       timeout=5, what="node B to count the denied connection")
            sock, code = self.socks(CLIENT)
            self.assertEqual(code, 0, "the policy denied a source it does not name")
            with sock:
                self.assertTrue(transfer_and_check(sock, b"y" * 1024))
        finally:
            self.tmp.file("mesh.yaml", WORKLOADS)


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
