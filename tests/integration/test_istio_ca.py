"""Certificates from Istio's CA (issue 12, CA half), with real proxies and a fake CA
(tests/fixtures/fake_istiod/ca.py) speaking the wire format built from proto/:

- two proxies whose certificates come from the CA carry HBONE traffic, each seeing the other's
  identity; the CA saw a P-256/SHA-256 CSR, the token, clusterid, ImpersonatedIdentity, the TTL;
- 20 s certificates rotate under traffic: a live tunnel survives, new handshakes get a new serial;
- a refusing CA leaves the old certificate in use and is retried with backoff from 500 ms;
- a wrong token, a wrong CA root, a chain for another identity and a chain under an unrelated
  root each give an error that names the cause.
"""
import os
import socket
import ssl
import sys
import time
import unittest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "fake_istiod"))
import ca as fake_ca  # noqa: E402
from harness import EchoServer, TwoNodeMesh, recv_exact, wait_until, workload_yaml  # noqa: E402

TD = "spiffe://cluster.local/ns/default/sa/"
CLIENT = TD + "client"
SERVER = TD + "server"
TOKEN = "test-token-1234"


class CaMesh(TwoNodeMesh):
    """TwoNodeMesh whose nodes get their certificates from a fake CA on <block>.5."""

    def __init__(self, ttl="1h", token=TOKEN, root_for_proxy=None):
        super().__init__()
        self.root = fake_ca.TestRoot("fake-istio-root")
        self.servicer = fake_ca.CaServicer(self.root, TOKEN)
        self.ca = fake_ca.MiniCaServer(self.block + ".5", self.servicer)
        self.root_file = self.tmp.file("root-cert.pem", self.root.pem)
        self.token_file = self.tmp.file("istio-token", token + "\n")
        root_file = self.root_file
        if root_for_proxy is not None:
            root_file = self.tmp.file("other-root.pem", root_for_proxy.pem)
        for node in (self.a, self.b):
            node.args += ["--ca-address", self.ca.address, "--ca-root-ca", root_file,
                          "--xds-token-file", self.token_file, "--cluster-id", "test-cluster",
                          "--secret-ttl", ttl, "--certificate-check-ms", "500"]

    def cleanup(self):
        super().cleanup()
        self.ca.stop()


def served_serial(ip, port=15008):
    """The serial (an int) of the certificate a TLS server at ip:port presents."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection((ip, port), timeout=5)
    with ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509
    return x509.load_der_x509_certificate(der).serial_number


class CaTest(unittest.TestCase):
    mesh = None

    def tearDown(self):
        if self.mesh is None:
            return
        result = getattr(self._outcome, "result", None)
        failed = result is not None and any(
            t is self for t, _ in list(result.failures) + list(result.errors))
        if failed or os.environ.get("SOCKMESH_TEST_LOGS"):
            sys.stderr.write(self.mesh.dump_logs())
            sys.stderr.write("\n---- fake CA calls ----\n%r\n" % [
                (c["identity"], c["result"]) for c in self.mesh.servicer.calls])
        self.mesh.stop()
        if getattr(self, "server", None):
            self.server.close()
        self.mesh.cleanup()

    def start_mesh(self, **kw):
        self.mesh = CaMesh(**kw)
        self.server = EchoServer(self.mesh.server_ip, 8080)
        self.mesh.start()
        return self.mesh

    def wait_valid(self, node, identity, timeout=15):
        def valid():
            for c in node.config_dump()["certificates"]:
                if c["identity"] == identity and c["state"] == "Available":
                    return c
            return None
        return wait_until(valid, timeout=timeout, what="%s valid on %s" % (identity, node.name))

    def echo(self, s, text):
        s.sendall(text)
        return recv_exact(s, len(text)) == text

    def test_traffic_with_certificates_from_the_ca(self):
        m = self.start_mesh()
        self.wait_valid(m.a, CLIENT)
        cert_b = self.wait_valid(m.b, SERVER)
        s, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(s, b"hello through the CA's certificates"))
        s.close()
        # Each side saw the other's identity, from certificates only the fake CA signed.
        wait_until(lambda: "src.identity=" + CLIENT in m.b.logs(), what="B saw the client")
        wait_until(lambda: "dst.identity=" + SERVER in m.a.logs(), what="A saw the server")
        ok = m.servicer.calls_for(SERVER, "ok")
        self.assertEqual(served_serial(m.server_ip), ok[-1]["serial"])
        # /config_dump in ztunnel's shape: the chain leaf first, the CA's root.
        self.assertEqual(int(cert_b["certChain"][0]["serialNumber"], 16), ok[-1]["serial"])
        self.assertTrue(cert_b["certChain"][0]["expirationTime"].endswith("Z"))
        self.assertEqual([r["pem"] for r in cert_b["rootCerts"]], [m.root.pem])
        self.assertEqual(m.b.config_dump()["certificateIssuer"], "istio-ca")
        call = m.servicer.calls_for(CLIENT, "ok")[0]
        self.assertEqual(call["metadata"].get("authorization"), "Bearer " + TOKEN)
        self.assertEqual(call["metadata"].get("clusterid"), "test-cluster")
        self.assertEqual(call["request_metadata"], {"ImpersonatedIdentity": CLIENT})
        self.assertEqual(call["ttl"], 3600)
        self.assertEqual((call["csr_curve"], call["csr_sig"]), ("secp256r1", "sha256"))
        self.assertTrue(call["csr_signature_valid"])
        self.assertGreaterEqual(m.a.metric_sum("sockmesh_certificate_fetches_total",
                                               result="ok"), 1)
        self.assertIn("identities: Istio CA at " + m.ca.address[len("https://"):], m.a.logs())

    def test_rotation_under_traffic(self):
        m = self.start_mesh(ttl="20s")
        self.wait_valid(m.a, CLIENT)  # the client side needs its certificate too
        self.wait_valid(m.b, SERVER)
        first = served_serial(m.server_ip)
        live, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(live, b"before"))
        # Renewal at half-life (10 s); keep the tunnel busy meanwhile.
        deadline = time.time() + 25
        while len(m.servicer.calls_for(SERVER, "ok")) < 2 and time.time() < deadline:
            self.assertTrue(self.echo(live, b"tick"))
            time.sleep(0.5)
        calls = m.servicer.calls_for(SERVER, "ok")
        self.assertGreaterEqual(len(calls), 2, "no renewal within 25 s")
        spacing = calls[1]["time"] - calls[0]["time"]
        sys.stderr.write("20 s certificate renewed after %.2f s\n" % spacing)
        self.assertTrue(8 <= spacing <= 13, "renewed after %.1f s, not at half-life" % spacing)
        wait_until(lambda: served_serial(m.server_ip) == calls[1]["serial"], timeout=5,
                   what="new handshakes present the renewed certificate")
        self.assertNotEqual(first, calls[1]["serial"])
        self.assertTrue(self.echo(live, b"after rotation"), "live tunnel broke")
        fresh, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(fresh, b"new connection"))
        fresh.close()
        live.close()

    def test_refusing_ca_keeps_old_certificate_and_backs_off(self):
        m = self.start_mesh(ttl="20s")
        self.wait_valid(m.a, CLIENT)  # the client side needs its certificate too
        self.wait_valid(m.b, SERVER)
        first = m.servicer.calls_for(SERVER, "ok")[0]
        m.servicer.refuse = True
        # The renewal at 10 s fails; retries follow at +0.5, +1, +2, +4 s.
        wait_until(lambda: len(m.servicer.calls_for(SERVER, "refused")) >= 4, timeout=20,
                   interval=0.1, what="four refused attempts")
        self.assertEqual(served_serial(m.server_ip), first["serial"], "old certificate in use")
        s, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(s, b"still served"))
        s.close()
        m.servicer.refuse = False
        ok2 = wait_until(lambda: len(m.servicer.calls_for(SERVER, "ok")) >= 2 and
                         m.servicer.calls_for(SERVER, "ok")[1], timeout=15,
                         what="success after the CA recovered")
        refused = m.servicer.calls_for(SERVER, "refused")
        times = [c["time"] for c in refused] + [ok2["time"]]
        gaps = [b - a for a, b in zip(times, times[1:])]
        sys.stderr.write("refused attempts' gaps (s): %s\n" % ["%.2f" % g for g in gaps])
        expected = [0.5, 1, 2, 4, 8]
        for got, want in zip(gaps, expected):
            self.assertTrue(want * 0.8 <= got <= want + 1.0,
                            "gaps %r do not follow 0.5 s doubling" % gaps)
        wait_until(lambda: served_serial(m.server_ip) == ok2["serial"], timeout=5,
                   what="renewed certificate served")
        self.assertGreaterEqual(m.b.metric_sum("sockmesh_certificate_fetches_total",
                                               result="failed"), 4)
        self.assertIn("fake CA: told to refuse", m.b.logs())

    def test_sigterm_ends_a_ca_call_in_flight_at_once(self):
        # A CA that takes the call and never answers (a hung istiod). The call's deadline is
        # 10 s; a stopping proxy cancels it instead of waiting that out.
        m = self.start_mesh()
        self.wait_valid(m.b, SERVER)
        m.servicer.hang.set()
        self.addCleanup(m.servicer.hang.clear)
        # A new local workload: its certificate is fetched in the background, and the call hangs.
        m.extra_workloads = workload_yaml("l1", "late", "default", "late", m.block + ".21",
                                          "node-b") + "\n"
        m.tmp.file("b.yaml", m.config(m.server_sa))
        wait_until(lambda: m.servicer.calls_for(TD + "late", "held"), timeout=10,
                   what="a CA call held by the fake")
        t0 = time.monotonic()
        code = m.b.terminate(timeout=15)
        took = time.monotonic() - t0
        sys.stderr.write("SIGTERM to exit with a CA call in flight: %.2f s\n" % took)
        self.assertEqual(code, 0, m.b.logs()[-2000:])
        self.assertLess(took, 5.0, "SIGTERM took %.1f s with a CA call in flight" % took)

    def test_root_file_is_watched(self):
        # The CA moves to a new root before the proxies' root file says so: its chains are
        # refused. Once the file holds both roots, the proxies reload it (no restart), the
        # retries succeed, and new connections trust certificates under the new root.
        new_root = fake_ca.TestRoot("fake-istio-root-2")
        m = CaMesh()
        m.servicer.unrelated_root = new_root
        self.mesh = m
        self.server = EchoServer(m.server_ip, 8080)
        m.start()
        self.wait_error(m.b, "does not chain to the configured root")
        m.tmp.file("root-cert.pem", m.root.pem + new_root.pem)
        wait_until(lambda: "reloaded CA roots" in m.b.logs() and "reloaded CA roots" in m.a.logs(),
                   what="both proxies reloaded the root file")
        cert_b = self.wait_valid(m.b, SERVER)
        self.wait_valid(m.a, CLIENT)
        self.assertEqual(len(cert_b["rootCerts"]), 2)
        s, rep = m.connect()
        self.assertEqual(rep, 0)
        self.assertTrue(self.echo(s, b"under the new root"))
        s.close()
        self.assertEqual(served_serial(m.server_ip), m.servicer.calls_for(SERVER, "ok")[-1]["serial"])

    def test_new_local_workload_gets_its_certificate_before_any_connection(self):
        m = self.start_mesh()
        self.wait_valid(m.b, SERVER)
        late = TD + "late"
        m.extra_workloads = workload_yaml("l1", "late", "default", "late", m.block + ".21",
                                          "node-b") + "\n"
        m.tmp.file("b.yaml", m.config(m.server_sa))
        cert = self.wait_valid(m.b, late)
        self.assertEqual(int(cert["certChain"][0]["serialNumber"], 16),
                         m.servicer.calls_for(late, "ok")[0]["serial"])

    def failing_mesh(self, **kw):
        self.mesh = CaMesh(**kw)
        self.mesh.b.start()
        return self.mesh

    def wait_error(self, node, *parts):
        def seen():
            for c in node.config_dump()["certificates"]:
                if c["identity"] == SERVER and c["state"].startswith("Unavailable: "):
                    self.assertEqual(c["state"], "Unavailable: " + c["lastError"])
                    return c["lastError"]
            return None
        err = wait_until(seen, timeout=10, what="issuance failure on %s" % node.name)
        for p in parts:
            self.assertIn(p, err)
        self.assertIn(parts[0], node.logs())
        return err

    def test_wrong_token(self):
        m = self.failing_mesh(token="not-the-token")
        self.wait_error(m.b, "refused our credentials", "UNAUTHENTICATED",
                        "the bearer token was not accepted", m.token_file)
        self.assertTrue(m.servicer.calls_for(SERVER, "unauthenticated"))
        self.assertFalse(m.servicer.calls_for(SERVER, "ok"))

    def test_wrong_root_ca(self):
        m = self.failing_mesh(root_for_proxy=fake_ca.TestRoot("someone-else"))
        self.wait_error(m.b, "does not verify against the CA root", "other-root.pem")
        self.assertFalse(m.servicer.calls, "no call got through TLS")

    def test_chain_for_another_identity_is_rejected(self):
        m = CaMesh()
        m.servicer.wrong_identity = TD + "someone-else"
        self.mesh = m
        m.b.start()
        self.wait_error(m.b, "the CA issued a certificate for " + TD + "someone-else" +
                        ", not for " + SERVER)

    def test_chain_under_unrelated_root_is_rejected(self):
        m = CaMesh()
        m.servicer.unrelated_root = fake_ca.TestRoot("unrelated")
        self.mesh = m
        m.b.start()
        self.wait_error(m.b, "does not chain to the configured root")


if __name__ == "__main__":
    unittest.main(verbosity=2)
