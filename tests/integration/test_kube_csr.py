"""Certificates from the Kubernetes CSR API (issue 12, the third issuer), with real proxies and a
fake API server (tests/fixtures/fake_kube_api/csr_api.py) over HTTPS:

- two proxies with --ca-provider kubernetes carry HBONE traffic under certificates the fake's
  signer issued; each CSR named the signer, the four usages, expirationSeconds = the TTL and a
  P-256/SHA-256 CSR with the SPIFFE ID, and each was deleted afterwards;
- a Denied CSR gives an error naming the CSR, the reason and the message; the CSR is deleted;
- a certificate issued for another identity is refused (and the CSR deleted);
- a CSR nobody approves times out (--k8s-csr-timeout) with an error saying so, and is deleted;
- a watch the server ends early is started again (one CSR); a short TTL asks for 600 s;
- a wrong token is refused with the API's reason; SIGTERM ends a watch at once, and deletes.
"""
import os
import sys
import time
import unittest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "fake_kube_api"))
import csr_api  # noqa: E402
from harness import EchoServer, TwoNodeMesh, recv_exact, wait_until  # noqa: E402

TD = "spiffe://cluster.local/ns/default/sa/"
CLIENT = TD + "client"
SERVER = TD + "server"
TOKEN = "kube-token-5678"
SIGNER = "example.com/sockmesh-test"


class KubeMesh(TwoNodeMesh):
    """TwoNodeMesh whose nodes get their certificates through a fake CSR API on <block>.6."""

    def __init__(self, mode="approve", ttl="1h", csr_timeout="10s"):
        super().__init__()
        self.root = csr_api.TestRoot("fake-kube-signer-root")
        self.api = csr_api.FakeCsrApi(self.block + ".6", self.root, TOKEN, SIGNER, mode=mode)
        self.root_file = self.tmp.file("root-cert.pem", self.root.pem)
        self.token_file = self.tmp.file("sa-token", TOKEN + "\n")
        for node in (self.a, self.b):
            node.args += ["--ca-provider", "kubernetes", "--k8s-api-server", self.api.address,
                          "--k8s-api-ca", self.api.api_ca_file, "--k8s-token-file",
                          self.token_file, "--k8s-signer-name", SIGNER, "--ca-root-ca",
                          self.root_file, "--secret-ttl", ttl, "--k8s-csr-timeout", csr_timeout,
                          "--certificate-check-ms", "500"]

    def cleanup(self):
        super().cleanup()
        self.api.stop()


class KubeCsrTest(unittest.TestCase):
    mesh = None

    def tearDown(self):
        if self.mesh is None:
            return
        result = getattr(self._outcome, "result", None)
        failed = result is not None and any(
            t is self for t, _ in list(result.failures) + list(result.errors))
        if failed or os.environ.get("SOCKMESH_TEST_LOGS"):
            sys.stderr.write(self.mesh.dump_logs())
            sys.stderr.write("\n---- fake API: created %r\ndeleted %r\n" % (
                [(c["name"], c["identity"], c["problems"]) for c in self.mesh.api.created],
                self.mesh.api.deleted))
        self.mesh.stop()
        if getattr(self, "server", None):
            self.server.close()
        self.mesh.cleanup()

    def wait_valid(self, node, identity, timeout=15):
        def valid():
            for c in node.config_dump()["certificates"]:
                if c["identity"] == identity and c["state"] == "Available":
                    return c
            return None
        return wait_until(valid, timeout=timeout, what="%s valid on %s" % (identity, node.name))

    def wait_error(self, node, *parts, timeout=10):
        def seen():
            for c in node.config_dump()["certificates"]:
                if c["identity"] == SERVER and c["state"].startswith("Unavailable: "):
                    return c["lastError"]
            return None
        err = wait_until(seen, timeout=timeout, what="issuance failure on %s" % node.name)
        for p in parts:
            self.assertIn(p, err)
        self.assertIn(parts[0], node.logs())
        return err

    def assert_all_deleted(self, identity):
        created = self.mesh.api.created_for(identity)
        self.assertTrue(created, "no CSR for %s" % identity)
        wait_until(lambda: all(c["name"] in self.mesh.api.deleted_names() for c in created),
                   timeout=5, what="every CSR of %s deleted" % identity)
        return created

    def test_traffic_with_certificates_from_the_csr_api(self):
        t0 = time.monotonic()
        m = self.mesh = KubeMesh()
        # A CA address too (as --xds-address would give): --ca-provider kubernetes wins, and the
        # log says the address is ignored.
        m.a.args += ["--ca-address", "https://127.0.0.1:1"]
        self.server = EchoServer(m.server_ip, 8080)
        m.start()
        self.wait_valid(m.a, CLIENT)
        cert_b = self.wait_valid(m.b, SERVER)
        sys.stderr.write("both certificates through the CSR API after %.2f s\n" %
                         (time.monotonic() - t0))
        s, rep = m.connect()
        self.assertEqual(rep, 0)
        text = b"hello under a Kubernetes signer's certificate"
        s.sendall(text)
        self.assertEqual(recv_exact(s, len(text)), text)
        s.close()
        wait_until(lambda: "src.identity=" + CLIENT in m.b.logs(), what="B saw the client")
        wait_until(lambda: "dst.identity=" + SERVER in m.a.logs(), what="A saw the server")
        for identity in (CLIENT, SERVER):
            created = self.assert_all_deleted(identity)
            c = created[0]
            self.assertEqual(c["problems"], [])
            self.assertEqual(c["signerName"], SIGNER)
            self.assertEqual(set(c["usages"]), csr_api.USAGES)
            self.assertEqual(c["expirationSeconds"], 3600)
            self.assertEqual((c["csr_curve"], c["csr_sig"]), ("secp256r1", "sha256"))
            self.assertTrue(c["csr_signature_valid"])
            self.assertEqual(c["content_type"], "application/json")
        issued = [c for c in m.api.created_for(SERVER) if "serial" in c]
        self.assertEqual(int(cert_b["certChain"][0]["serialNumber"], 16), issued[-1]["serial"])
        self.assertEqual(m.b.config_dump()["certificateIssuer"], "kubernetes-csr")
        self.assertIn("identities: Kubernetes CSR API at " + m.api.address, m.a.logs())
        self.assertIn("(--ca-provider kubernetes; ignored: CA address https://127.0.0.1:1)",
                      m.a.logs())
        self.assertGreaterEqual(m.a.metric_sum("sockmesh_certificate_fetches_total",
                                               result="ok"), 1)

    def failing_node(self, **kw):
        self.mesh = KubeMesh(**kw)
        self.mesh.b.start()
        return self.mesh

    def test_denied_csr(self):
        m = self.failing_node(mode="deny")
        err = self.wait_error(m.b, "was Denied (reason: TestSaysDenied, message: the test's "
                              "signer said no)", SIGNER, "CSR sockmesh-")
        name = m.api.created_for(SERVER)[0]["name"]
        self.assertIn(SERVER, err)
        self.assertIn(name, m.b.logs())
        self.assert_all_deleted(SERVER)
        self.assertGreaterEqual(m.b.metric_sum("sockmesh_certificate_fetches_total",
                                               result="failed"), 1)

    def test_failed_csr(self):
        m = self.failing_node(mode="fail")
        self.wait_error(m.b, "was Failed (reason: TestSaysFailed")
        self.assert_all_deleted(SERVER)

    def test_csr_deleted_by_someone_else(self):
        m = self.failing_node(mode="vanish")
        self.wait_error(m.b, "was deleted before a certificate was issued", "CSR sockmesh-")

    def test_certificate_for_another_identity_is_refused(self):
        self.mesh = KubeMesh()
        self.mesh.api.wrong_identity = TD + "someone-else"
        self.mesh.b.start()
        self.wait_error(self.mesh.b, "the issued certificate is refused",
                        TD + "someone-else", SERVER)
        self.assert_all_deleted(SERVER)
        for c in self.mesh.b.config_dump()["certificates"]:
            self.assertNotEqual(c["state"], "Available", c)

    def test_watch_that_ends_early_is_watched_again(self):
        m = self.mesh = KubeMesh(ttl="30s")
        m.api.close_watches = 2
        m.b.start()
        self.wait_valid(m.b, SERVER)
        name = m.api.created_for(SERVER)[0]["name"]
        self.assertEqual(len(m.api.created_for(SERVER)), 1, "one CSR, watched three times")
        self.assertEqual([w["name"] for w in m.api.watches], [name] * 3)
        self.assertEqual(m.api.created_for(SERVER)[0]["expirationSeconds"], 600,
                         "a TTL under the API's minimum asks for 600 s")
        self.assertIn("below the CSR API's minimum expirationSeconds", m.b.logs())
        self.assert_all_deleted(SERVER)

    def test_wrong_token(self):
        m = self.mesh = KubeMesh()
        m.tmp.file("sa-token", "not-the-token\n")
        m.b.start()
        self.wait_error(m.b, "the Kubernetes API refused CSR sockmesh-",
                        "HTTP 401 (Unauthorized: fake kube-apiserver: bad bearer token)",
                        "check the token in " + m.token_file)
        self.assertFalse(m.api.created, "nothing created without the token")

    def test_watch_timeout(self):
        t0 = time.monotonic()
        m = self.failing_node(mode="never", csr_timeout="2s")
        err = self.wait_error(m.b, "was neither approved nor denied within 2000 ms", SIGNER)
        took = time.monotonic() - t0
        sys.stderr.write("approval timeout reported after %.2f s\n" % took)
        self.assertIn("CSR sockmesh-", err)
        self.assert_all_deleted(SERVER)

    def test_sigterm_during_a_watch(self):
        m = self.failing_node(mode="never", csr_timeout="60s")
        wait_until(lambda: m.api.watches, timeout=10, what="a watch in flight")
        t0 = time.monotonic()
        code = m.b.terminate(timeout=15)
        took = time.monotonic() - t0
        sys.stderr.write("SIGTERM to exit with a CSR watch in flight: %.2f s\n" % took)
        self.assertEqual(code, 0, m.b.logs()[-2000:])
        self.assertLess(took, 5.0)
        self.assertIn(m.api.watches[0]["name"], m.api.deleted_names())


if __name__ == "__main__":
    unittest.main(verbosity=2)
