"""What the proxy trusts (issue 14, items 3, 5, 8 and 9's SOCKS5 log point), with real proxies:

- a rotated root-cert.pem applies to new handshakes while a live tunnel keeps running;
- a pooled HBONE connection verified for one service is not reused for another service that
  accepts other identities;
- the proxy refuses to connect to its own listeners, and passthrough never reaches loopback;
- SOCKS5 speaks only for the workloads --socks5-clients grants, and logs hostnames escaped.
"""
import os
import socket
import ssl
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import EchoServer, TwoNodeMesh, recv_exact, wait_until, workload_yaml  # noqa: E402

TD = "spiffe://cluster.local/ns/default/sa/"


class TrustTest(unittest.TestCase):
    def make_mesh(self):
        raise NotImplementedError

    def setUp(self):
        self.mesh = self.make_mesh()
        self.server = EchoServer(self.mesh.server_ip, 8080)
        self.extra_servers = []
        self.mesh.start()

    def tearDown(self):
        harness.show_logs_if_failed(self, self.mesh)
        self.mesh.stop()
        self.server.close()
        for s in self.extra_servers:
            s.close()
        self.mesh.cleanup()

    def echo(self, s, text):
        s.sendall(text)
        return recv_exact(s, len(text)) == text


# ---------------------------------------------------------------------------------------------
# Item 3: trust roots follow root-cert.pem

class FileCertMesh(TwoNodeMesh):
    """TwoNodeMesh whose nodes load mounted certificates (--certs-dir) from two CAs' making."""

    def __init__(self):
        super().__init__()
        d = self.tmp.path
        self.old_ca = harness.make_ca(d, "old-root")
        self.new_ca = harness.make_ca(d, "new-root")
        self.certs_a = os.path.join(d, "certs-a")
        self.certs_b = os.path.join(d, "certs-b")
        self.install(self.certs_a, "client", self.old_ca, "client-old")
        self.install(self.certs_b, "server", self.old_ca, "server-old")
        self.set_roots(self.certs_a, [self.old_ca, self.new_ca])  # A trusts B's server throughout
        self.set_roots(self.certs_b, [self.old_ca])
        for node, certs in ((self.a, self.certs_a), (self.b, self.certs_b)):
            node.args += ["--certs-dir", certs, "--certificate-check-ms", "200"]

    def install(self, certs, sa, ca, name):
        cert, key = harness.issue_leaf(self.tmp.path, name, ca[0], ca[1], TD + sa)
        target = os.path.join(certs, "default", sa)
        os.makedirs(target, exist_ok=True)
        for src, dst in ((cert, "cert-chain.pem"), (key, "key.pem")):
            with open(src) as f:
                text = f.read()
            tmp = os.path.join(target, dst + ".tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.rename(tmp, os.path.join(target, dst))

    @staticmethod
    def set_roots(certs, cas=None, text=None):
        os.makedirs(certs, exist_ok=True)
        if text is None:
            text = ""
            for ca in cas:
                with open(ca[0]) as f:
                    text += f.read()
        tmp = os.path.join(certs, "root-cert.pem.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(certs, "root-cert.pem"))


class RootRotationTest(TrustTest):
    def make_mesh(self):
        return FileCertMesh()

    def hbone_handshake(self, ca, name):
        """A TLS client with a client certificate from `ca` against node B's HBONE listener.
        True when B accepted it: B's HTTP/2 SETTINGS arrive after our preface."""
        cert, key = harness.issue_leaf(self.mesh.tmp.path, name, ca[0], ca[1], TD + "client")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((self.mesh.server_ip, 15008), timeout=5)
        try:
            tls = ctx.wrap_socket(raw)
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            head = tls.recv(9)  # TLS 1.3: a refused client certificate shows on this first read
            return len(head) == 9 and head[3] == 4  # a SETTINGS frame
        except (ssl.SSLError, ConnectionResetError, OSError):
            return False
        finally:
            raw.close()

    def wait_roots(self, what):
        wait_until(lambda: self.mesh.b.logs().count("reloaded mounted trust roots") >= what,
                   timeout=10, what="root-cert.pem reloaded %d times" % what)

    def test_root_swap_under_traffic(self):
        m = self.mesh
        live, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(live, b"before"))
        self.assertTrue(self.hbone_handshake(m.old_ca, "c-old-1"))
        self.assertFalse(self.hbone_handshake(m.new_ca, "c-new-1"), "new root not trusted yet")

        # Rotation step 1: a bundle holding both roots. Clients under either are accepted.
        m.set_roots(m.certs_b, [m.old_ca, m.new_ca])
        self.wait_roots(1)
        wait_until(lambda: self.hbone_handshake(m.new_ca, "c-new-2"), timeout=5,
                   what="client under the new root accepted")
        self.assertTrue(self.hbone_handshake(m.old_ca, "c-old-2"))
        self.assertTrue(self.echo(live, b"during"))

        # Step 2: the new root alone. Clients under the old root are refused from now on.
        m.set_roots(m.certs_b, [m.new_ca])
        self.wait_roots(2)
        wait_until(lambda: not self.hbone_handshake(m.old_ca, "c-old-3"), timeout=5,
                   what="client under the old root refused")
        self.assertTrue(self.hbone_handshake(m.new_ca, "c-new-3"))
        self.assertIn("trust roots replaced (generation 3", m.b.logs())
        wait_until(lambda: "peer certificate rejected" in m.b.logs(), what="refusal logged")
        # The tunnel made under the old root is not re-verified and keeps carrying bytes.
        self.assertTrue(self.echo(live, b"after"))

        # A bad bundle (a workload certificate, not a CA) is refused; the new root stays.
        leaf, _ = harness.issue_leaf(m.tmp.path, "not-a-ca", m.new_ca[0], m.new_ca[1], TD + "x")
        with open(leaf) as f:
            m.set_roots(m.certs_b, text=f.read())
        wait_until(lambda: "keeping previous trust roots" in m.b.logs(), what="bad bundle refused")
        self.assertIn("is not a CA", m.b.logs())
        time.sleep(0.5)  # a few more checks: still refused
        self.assertTrue(self.hbone_handshake(m.new_ca, "c-new-4"))
        self.assertFalse(self.hbone_handshake(m.old_ca, "c-old-4"))
        # Garbage that does not parse at all: refused the same way.
        m.set_roots(m.certs_b, text="not a certificate\n")
        wait_until(lambda: "no PEM certificate found" in m.b.logs(), what="garbage refused")
        self.assertTrue(self.hbone_handshake(m.new_ca, "c-new-5"))
        self.assertEqual(m.b.logs().count("trust roots replaced"), 2, "no bad bundle installed")
        self.assertTrue(self.echo(live, b"still"))
        live.close()


# ---------------------------------------------------------------------------------------------
# Item 5: the pool does not lend a connection verified for one service to another

class TwoServiceMesh(TwoNodeMesh):
    """The server runs as "actual" (B's view); A believes it runs as "expected". Service one
    (VIP .30) lists "actual" among its SANs; service two (VIP .31) lists none."""

    def __init__(self):
        super().__init__(server_sa="actual", server_sa_seen_by_a="expected")

    def config(self, server_sa, policies=None):
        one = "default/one.default.svc.cluster.local"
        two = "default/two.default.svc.cluster.local"
        text = "workloads:\n"
        text += workload_yaml("c1", "client", "default", "client", self.client_ip, "node-a") + "\n"
        text += workload_yaml("s1", "server", "default", server_sa, self.server_ip, "node-b",
                              services={one: {80: 8080}, two: {80: 8080}}) + "\n"
        text += ("services:\n"
                 "- name: one\n  namespace: default\n  hostname: one.default.svc.cluster.local\n"
                 "  vips: [\"/%s\"]\n  ports: {80: 8080}\n  subjectAltNames: [\"%s\"]\n"
                 "- name: two\n  namespace: default\n  hostname: two.default.svc.cluster.local\n"
                 "  vips: [\"/%s\"]\n  ports: {80: 8080}\n"
                 % (self.vip, TD + "actual", self.block + ".31"))
        return text


class PoolIdentityTest(TrustTest):
    def make_mesh(self):
        return TwoServiceMesh()

    def test_connection_for_one_service_is_not_reused_for_another(self):
        m = self.mesh
        first, rep = m.connect(m.vip, 80)
        self.assertEqual(rep, 0, "service one accepts the server's identity")
        self.assertTrue(self.echo(first, b"one"))
        # The first tunnel keeps its HBONE connection open and usable for more streams.
        second, rep = m.connect(m.block + ".31", 80)
        self.assertNotEqual(rep, 0, "service two must not ride service one's connection")
        wait_until(lambda: ("presented identity %sactual, expected %sexpected" % (TD, TD))
                   in m.a.logs(), what="identity mismatch logged")
        self.assertGreaterEqual(m.a.metric_sum("sockmesh_pool_identity_mismatch_total"), 1)
        self.assertTrue(self.echo(first, b"still one"))
        again, rep = m.connect(m.vip, 80)
        self.assertEqual(rep, 0, "service one still works")
        for s in (first, again):
            s.close()


# ---------------------------------------------------------------------------------------------
# Item 8: loops and loopback

class LoopTest(TrustTest):
    """Node A's admin on a non-default port (16000); a workload "hostnet" on node B shares B's
    admin address, as a hostNetwork pod shares its node's; a plain TCP server on loopback."""

    def setUp(self):
        # Build the mesh on a known block so that the extra workloads can name its addresses.
        self.block = harness.address_block()
        b = self.block
        original = harness.address_block
        harness.address_block = lambda: b
        try:
            extra = "\n".join([
                workload_yaml("h1", "hostnet", "default", "hostnet", b + ".2", "node-b"),
                workload_yaml("o1", "other", "default", "other", b + ".11", "node-a"),
                workload_yaml("o2", "mapped", "default", "mapped", b + ".12", "node-a"),
            ]) + "\n"
            self.mesh = TwoNodeMesh(extra_workloads=extra,
                                    extra_a=["--admin", b + ".1:16000", "--socks5-clients",
                                             "%s=c1,%s=c1" % (b + ".10", b + ".12")])
        finally:
            harness.address_block = original
        self.server = EchoServer(self.mesh.server_ip, 8080)
        self.outside = EchoServer(b + ".50", 9000)  # on loopback, not a workload
        self.extra_servers = [self.outside]
        self.mesh.start()  # readiness stays on 15021, which is what start() waits for

    def refused(self, dst_ip, port, logged):
        s, rep = self.mesh.connect(dst_ip, port)
        if rep == 0:
            s.close()
        self.assertNotEqual(rep, 0, "%s:%d must be refused" % (dst_ip, port))
        wait_until(lambda: logged in self.mesh.a.logs() + self.mesh.b.logs(),
                   what="'%s' logged" % logged)

    def test_proxy_refuses_its_own_listeners(self):
        a = self.mesh.a.admin_ip
        # admin (on a non-default port), metrics, readiness, SOCKS5
        for port in (16000, 15020, 15021, 15080):
            self.refused(a, port, "destination %s:%d is one of the proxy's own listeners" % (a, port))
        self.assertGreaterEqual(self.mesh.a.metric_sum("sockmesh_outbound_loop_refused_total"), 4)

    def test_inbound_refuses_the_nodes_own_admin_port(self):
        # hostnet shares node B's admin address: a tunnel to hostnet:15000 would reach B's admin.
        b_admin = self.mesh.b.admin_ip
        self.refused(b_admin, 15000, "target port 15000 is the proxy's own")

    def test_passthrough_never_reaches_loopback(self):
        self.refused(self.block + ".50", 9000, "refused: loopback destination")
        self.assertGreaterEqual(
            self.mesh.a.metric_sum("sockmesh_outbound_loopback_refused_total"), 1)
        self.assertEqual(self.outside.peers, [], "nothing reached the loopback server")

    def test_socks5_speaks_only_for_granted_workloads(self):
        m = self.mesh
        s, rep = m.connect()
        self.assertEqual(rep, 0, "the client's own address, granted to c1")
        s.close()
        # A local workload's address that no grant names.
        s, rep = harness.socks_connect(self.block + ".11", m.socks, m.server_ip, 8080)
        self.assertEqual(rep, 2, "not allowed")
        wait_until(lambda: "source %s.11 is not listed in --socks5-clients" % self.block
                   in m.a.logs(), what="refusal logged")
        # Granted to c1, but the address belongs to another workload.
        s, rep = harness.socks_connect(self.block + ".12", m.socks, m.server_ip, 8080)
        self.assertEqual(rep, 2)
        wait_until(lambda: "is not an address of local workload c1" in m.a.logs(),
                   what="mismatch logged")
        # Any other 127.x address.
        s, rep = harness.socks_connect(self.block + ".77", m.socks, m.server_ip, 8080)
        self.assertEqual(rep, 2)
        self.assertGreaterEqual(m.a.metric_sum("sockmesh_socks5_refused_total"), 3)


# ---------------------------------------------------------------------------------------------
# Item 9 (one point): peer-supplied text in SOCKS5 log lines

class Socks5LogTest(TrustTest):
    def make_mesh(self):
        return TwoNodeMesh()

    def test_hostname_is_logged_escaped(self):
        m = self.mesh
        host = b"evil\nINFO [socks5] forged line\x1b[31m\\\xff"
        s = socket.create_connection(m.socks, timeout=5, source_address=(m.client_ip, 0))
        s.sendall(b"\x05\x01\x00")
        self.assertEqual(recv_exact(s, 2), b"\x05\x00")
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + struct.pack(">H", 80))
        rep = recv_exact(s, 10)
        s.close()
        self.assertEqual(rep[1], 4, "host unreachable")
        expected = 'unknown host "evil\\x0aINFO [socks5] forged line\\x1b[31m\\x5c\\xff"'
        wait_until(lambda: expected in m.a.logs(), what="escaped hostname logged")
        self.assertNotIn("\nINFO [socks5] forged line", m.a.logs())
        self.assertNotIn("\x1b[31m", m.a.logs())


if __name__ == "__main__":
    unittest.main(verbosity=2)
