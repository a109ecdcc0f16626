"""sockmesh-proxy fed by a fake istiod over Delta xDS (tests/fixtures/fake_istiod).

The resources are built and encoded by Python's protobuf from the repository's proto/ files and
decoded by the proxy's C++ protobuf: every test here also checks the wire format. Two proxies on
loopback learn each other only from the fake; their HBONE certificates come from the built-in CA.
"""
import os
import socket
import sys
import threading
import time
import unittest
import urllib.error

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "fake_istiod"))
import harness  # noqa: E402
from harness import EchoServer, ProxyNode, TempDir, http_get, wait_until  # noqa: E402
from server import FakeIstiod, make_server_tls  # noqa: E402
import ca as fake_ca  # noqa: E402
import xds as fake_xds  # noqa: E402
from istio.security import authorization_pb2 as az  # noqa: E402
from istio.workload import workload_pb2 as wl  # noqa: E402

ADDRESS, AUTHORIZATION = fake_xds.ADDRESS, fake_xds.AUTHORIZATION
SVC_KEY = "default/server.default.svc.cluster.local"
TOKEN = "token-for-the-fake-istiod"


def workload(uid, name, sa, ip, node, services=None, policies=()):
    w = wl.Workload(uid=uid, name=name, namespace="default", service_account=sa,
                    addresses=[socket.inet_aton(ip)], tunnel_protocol=wl.HBONE, node=node,
                    authorization_policies=list(policies), canonical_name=name,
                    workload_name=name + "-deploy")
    for key, ports in (services or {}).items():
        for a, b in ports.items():
            w.services[key].ports.add(service_port=a, target_port=b)
    return wl.Address(workload=w)


def service(name, vip, ports):
    s = wl.Service(name=name, namespace="default", hostname=name + ".default.svc.cluster.local",
                   addresses=[wl.NetworkAddress(network="", address=socket.inet_aton(vip))])
    for a, b in ports.items():
        s.ports.add(service_port=a, target_port=b)
    return wl.Address(service=s)


def deny_principal(name, principal):
    return az.Authorization(
        name=name, namespace="default", scope=az.NAMESPACE, action=az.DENY,
        rules=[az.Rule(clauses=[az.Clause(matches=[
            az.Match(principals=[az.StringMatch(exact=principal)])])])])


def whoami(s):
    return harness.read_line(s)


def readiness(node):
    try:
        return http_get("http://%s:15021/healthz/ready" % node.admin_ip)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class XdsMesh:
    """client c1 (node-a) and server s1 (node-b) plus service VIP .30, all from the fake istiod.
    Addresses in one 127.x.y block: .10 client, .20 server, .5 the fake, .1/.2 admin of A/B."""

    def __init__(self, token=TOKEN, root_ca=None, istio_ca=False, extra=()):
        """istio_ca: the fake also serves Istio's CA on the same address, as istiod does on
        15012, and the proxies get their certificates from it (no --ca-address: it defaults to
        the xDS address); its root signs the fake's serving certificate and every workload's.
        Otherwise certificates come from the built-in CA (test_istio_ca covers the CA alone)."""
        self.block = b = harness.address_block()
        self.client_ip, self.server_ip, self.vip = b + ".10", b + ".20", b + ".30"
        self.tmp = TempDir()
        self.xds = fake_xds.XdsServicer()
        self.ca = None
        if istio_ca:
            self.root = fake_ca.TestRoot("fake-istiod-root")
            self.ca = fake_ca.CaServicer(self.root, TOKEN)
            cert_pem, key_pem = self.root.serving_pair(b + ".5")
            ca = self.tmp.file("root-cert.pem", self.root.pem)
            cert, key = self.tmp.file("istiod.pem", cert_pem.decode()), self.tmp.file(
                "istiod-key.pem", key_pem.decode())
        else:
            ca, cert, key = make_server_tls(self.tmp.path, b + ".5")
        self.fake = FakeIstiod(b + ".5", cert, key, TOKEN).add_servicer(self.xds.add_to)
        if self.ca:
            self.fake.add_servicer(self.ca.add_to)
        self.fake.start()
        self.token_file = self.tmp.file("istio-token", token + "\n")
        self.root_ca = root_ca or ca
        state_dir = os.path.join(self.tmp.path, "ca")

        def xds_args(pod, ip):
            args = ["--xds-address", self.fake.address, "--xds-root-ca", self.root_ca,
                    "--xds-token-file", self.token_file, "--pod-name", pod,
                    "--pod-namespace", "istio-system", "--instance-ip", ip] + list(extra)
            if istio_ca:
                return args + ["--ca-root-ca", self.root_ca, "--cluster-id", "test-cluster"]
            return args + ["--ca-address", ""]

        self.a = ProxyNode("node-a", None, state_dir, b + ".1", self.tmp.path,
                           socks5="%s:15080" % (b + ".1"),
                           extra=["--socks5-clients", "%s=c1" % self.client_ip] +
                           xds_args("ztunnel-a", b + ".1"))
        self.b = ProxyNode("node-b", None, state_dir, b + ".2", self.tmp.path,
                           extra=xds_args("ztunnel-b", b + ".2"))
        self.socks = (b + ".1", 15080)

    def base_resources(self):
        return {
            "c1": workload("c1", "client", "client", self.client_ip, "node-a"),
            "s1": workload("s1", "server", "server", self.server_ip, "node-b",
                           services={SVC_KEY: {80: 8080}}),
            SVC_KEY: service("server", self.vip, {80: 8080}),
        }

    def push_base(self):
        self.xds.push(ADDRESS, self.base_resources())
        self.xds.push(AUTHORIZATION, {})

    def start(self):
        self.a.start(wait=False)
        self.b.start(wait=False)
        self.a.wait_ready()
        self.b.wait_ready()
        return self

    def connect(self, dst_ip=None, dst_port=8080):
        return harness.socks_connect(self.client_ip, self.socks, dst_ip or self.server_ip, dst_port)

    def dump_logs(self):
        return "---- node-a ----\n%s\n---- node-b ----\n%s" % (self.a.logs()[-8000:],
                                                              self.b.logs()[-8000:])

    def cleanup(self):
        self.a.kill()
        self.b.kill()
        self.fake.stop()
        self.tmp.cleanup()


class XdsTestCase(unittest.TestCase):
    mesh_args = {}

    def setUp(self):
        self.mesh = XdsMesh(**self.mesh_args)
        self.servers = [EchoServer(self.mesh.server_ip, 8080, mode="whoami")]

    def tearDown(self):
        result = getattr(self._outcome, "result", None)
        failed = result is not None and any(
            t is self for t, _ in list(result.failures) + list(result.errors))
        if failed or os.environ.get("SOCKMESH_TEST_LOGS"):
            sys.stderr.write(self.mesh.dump_logs())
        for s in self.servers:
            s.close()
        self.mesh.cleanup()

    def start_synced(self):
        self.mesh.push_base()
        self.mesh.start()

    def assert_reaches(self, ip, port, expect_peer_prefix=None):
        s, rep = self.mesh.connect(ip, port)
        self.assertEqual(rep, 0, "SOCKS reply for %s:%d" % (ip, port))
        peer = whoami(s)
        s.close()
        self.assertTrue(peer.startswith((expect_peer_prefix or self.mesh.client_ip) + ":"), peer)

    def workload_uids(self, node):
        return {w["uid"] for w in node.config_dump()["workloads"]}


class InitialSyncTest(XdsTestCase):
    def test_ready_only_after_first_push_then_traffic_between_proxies_learned_from_istiod(self):
        m = self.mesh
        m.xds.hold = True  # subscriptions are not answered until the pushes below
        m.a.start(wait=False)
        m.b.start(wait=False)
        wait_until(lambda: len(m.xds.initial_versions) == 4, what="both proxies subscribed")
        wait_until(lambda: "sockmesh-proxy ready" in m.a.logs(), what="A's listeners open")
        code, body = readiness(m.a)
        self.assertEqual(code, 503, body)
        self.assertIn("xDS sync", body)
        self.assertEqual(m.a.config_dump()["workloads"], [])
        # Workloads alone are not a complete sync: policies must be answered too.
        m.xds.push(ADDRESS, m.base_resources())
        wait_until(lambda: m.a.config_dump()["xds"]["types"][ADDRESS]["acks"] >= 1,
                   what="A ACKed the Address push")
        self.assertEqual(readiness(m.a)[0], 503)
        self.assertEqual(m.a.config_dump()["workloads"], [], "no state before a complete sync")
        m.xds.push(AUTHORIZATION, {})
        m.xds.release()
        m.a.wait_ready()
        m.b.wait_ready()

        self.assert_reaches(m.server_ip, 8080)
        self.assert_reaches(m.vip, 80)

        # What C++ decoded from Python's bytes.
        dump = m.b.config_dump()
        s1 = [w for w in dump["workloads"] if w["uid"] == "s1"][0]
        self.assertEqual(s1["serviceAccount"], "server")
        self.assertEqual(s1["workloadIps"], [m.server_ip])
        self.assertEqual(s1["node"], "node-b")
        self.assertEqual(s1["workloadName"], "server-deploy")
        self.assertEqual(s1["canonicalName"], "server")
        self.assertEqual(s1["clusterId"], "Kubernetes")
        svc = dump["services"][0]
        self.assertEqual(svc["hostname"], "server.default.svc.cluster.local")
        self.assertIn(m.vip, str(svc["vips"]))
        x = dump["xds"]
        self.assertTrue(x["connected"])
        self.assertTrue(x["synced"])
        self.assertEqual(x["types"][ADDRESS]["nacks"], 0)
        # Node id and metadata, as ztunnel sends them.
        ids = sorted(n.id for n in m.xds.nodes)
        self.assertEqual(ids[0], "ztunnel~%s.1~ztunnel-a.istio-system~istio-system.svc."
                                 "cluster.local" % m.block)
        md = {n.id: n.metadata.fields for n in m.xds.nodes}[ids[0]]
        self.assertEqual(md["NODE_NAME"].string_value, "node-a")
        self.assertEqual(md["NAMESPACE"].string_value, "istio-system")
        self.assertEqual(md["CLUSTER_ID"].string_value, "Kubernetes")
        self.assertTrue(all(s.get("clusterid") == "Kubernetes" for s in m.fake.metadata_seen))
        self.assertGreaterEqual(m.a.metric_sum("sockmesh_xds_acks_total",
                                               type="istio.workload.Address"), 2)
        acks = [r for r in m.xds.replies() if r["error"] is None]
        self.assertGreaterEqual(len(acks), 4)


class XdsAndCaTest(XdsTestCase):
    """One istiod address for both: workloads over xDS, certificates from Istio's CA."""
    mesh_args = {"istio_ca": True}

    def test_workloads_from_xds_and_certificates_from_the_ca_on_one_address(self):
        m = self.mesh
        self.start_synced()
        for node, sa in ((m.a, "client"), (m.b, "server")):
            identity = "spiffe://cluster.local/ns/default/sa/" + sa
            wait_until(lambda: any(c["identity"] == identity and c["state"] == "Available"
                                   for c in node.config_dump()["certificates"]),
                       timeout=15, what="%s's certificate from the CA on %s" % (sa, node.name))
            self.assertEqual(node.config_dump()["certificateIssuer"], "istio-ca")
            calls = m.ca.calls_for(identity, "ok")
            self.assertTrue(calls, "the CA signed nothing for %s" % identity)
            self.assertEqual(calls[0]["metadata"].get("clusterid"), "test-cluster")
        # The tunnel between them: the server learnt from xDS, both ends' certificates signed by
        # the fake's root, each side verifying the other against it.
        self.assert_reaches(m.server_ip, 8080)
        wait_until(lambda: "src.identity=spiffe://cluster.local/ns/default/sa/client" in
                   m.b.logs(), what="node-b saw the client's CA-signed identity")
        ok = m.ca.calls_for("spiffe://cluster.local/ns/default/sa/server", "ok")
        self.assertIn(ok[-1]["serial"], {int(c["certChain"][0]["serialNumber"], 16)
                                          for c in m.b.config_dump()["certificates"]})


class MessageLimitTest(XdsTestCase):
    mesh_args = {"extra": ["--xds-max-message-bytes", "65536"]}

    def test_a_push_over_the_message_limit_is_named_with_the_flag_and_counted(self):
        m = self.mesh
        resources = m.base_resources()
        for i in range(1500):  # about 100 bytes each: a push of about 150 KB
            ip = "10.%d.%d.%d" % (100 + i // 65536, (i // 256) % 256, i % 256)
            resources["w%d" % i] = workload("w%d" % i, "bulk-%d" % i, "bulk", ip, "node-c")
        m.xds.push(ADDRESS, resources)
        m.xds.push(AUTHORIZATION, {})
        m.a.start(wait=False)
        wait_until(lambda: "over --xds-max-message-bytes, 65536 bytes" in m.a.logs(),
                   timeout=15, what="the stream ended on the limit, naming the flag")
        wait_until(lambda: 'istio_xds_connection_terminations_total{reason="RESOURCE_EXHAUSTED"}'
                   in m.a.metrics(), timeout=10, what="the termination counted by its reason")
        self.assertNotEqual(readiness(m.a)[0], 200, "ready without a sync")
        self.assertEqual(self.workload_uids(m.a), set())


class LiveChangesTest(XdsTestCase):
    def test_workload_added_then_removed(self):
        self.start_synced()
        m = self.mesh
        ip2 = m.block + ".21"
        self.servers.append(EchoServer(ip2, 8080, mode="whoami"))
        nonce = m.xds.push(ADDRESS, {"s2": workload("s2", "server2", "server", ip2, "node-b")})
        self.assertEqual(len(nonce), 2)
        for n in nonce:
            self.assertIsNone(m.xds.wait_reply(n)["error"])
        wait_until(lambda: "s2" in self.workload_uids(m.a), what="A knows s2")
        wait_until(lambda: any(l["address"] == ip2 + ":15008"
                               for l in m.b.config_dump()["listeners"]), what="B's HBONE on s2")
        self.assert_reaches(ip2, 8080)
        before = m.b.metric_sum("istio_tcp_connections_opened_total")
        self.assertGreaterEqual(before, 1)

        m.xds.push(ADDRESS, removed=["s2"])
        wait_until(lambda: "s2" not in self.workload_uids(m.a) and
                   "s2" not in self.workload_uids(m.b), what="s2 gone from both")
        # No longer a target: B closes its HBONE listener for it.
        wait_until(lambda: not any(l["address"] == ip2 + ":15008"
                                   for l in m.b.config_dump()["listeners"]),
                   what="B's HBONE listener for s2 closed")
        self.assertIn("s1", self.workload_uids(m.a))

    def test_service_vip_added_live_then_reached(self):
        self.start_synced()
        m = self.mesh
        vip2 = m.block + ".31"
        key = "default/web.default.svc.cluster.local"
        s, rep = m.connect(vip2, 81)
        self.assertNotEqual(rep, 0, "nothing serves the VIP before it is pushed")
        m.xds.push(ADDRESS, {
            key: service("web", vip2, {81: 8080}),
            "s1": workload("s1", "server", "server", m.server_ip, "node-b",
                           services={SVC_KEY: {80: 8080}, key: {81: 8080}}),
        })
        wait_until(lambda: any(sv["hostname"] == "web.default.svc.cluster.local"
                               for sv in m.a.config_dump()["services"]), what="A knows web")
        self.assert_reaches(vip2, 81)

    def test_policy_push_closes_live_connection_and_refuses_new(self):
        self.start_synced()
        m = self.mesh
        s, rep = m.connect()
        self.assertEqual(rep, 0)
        whoami(s)
        s.sendall(b"ping")
        self.assertEqual(harness.recv_exact(s, 4), b"ping")
        [m.xds.wait_reply(n) for n in m.xds.push(
            AUTHORIZATION, {"default/deny-client": deny_principal(
                "deny-client", "cluster.local/ns/default/sa/client")})]
        s.settimeout(10)
        t0 = time.time()
        try:
            closed = s.recv(10) == b""
        except OSError:
            closed = True
        self.assertTrue(closed, "live connection closed once the pushed policy denies it")
        self.assertLess(time.time() - t0, 8)
        self.assertIn("policy now denies", m.b.logs())
        s2, rep = m.connect()
        self.assertEqual(rep, 2, "a new connection is refused by the pushed policy")
        # And removed again: allowed again.
        [m.xds.wait_reply(n) for n in m.xds.push(AUTHORIZATION, removed=["default/deny-client"])]
        wait_until(lambda: not m.b.config_dump()["policies"], what="policy removed on B")
        self.assert_reaches(m.server_ip, 8080)


class NackTest(XdsTestCase):
    def test_malformed_resource_is_nacked_and_nothing_changes(self):
        self.start_synced()
        m = self.mesh
        # Named to sort after the good one: the response carries s3 first, then the bad one.
        bad = workload("zbad", "bad", "x", "10.0.0.1", "node-b")
        bad.workload.addresses[0] = b"\x0a\x00\x01"  # three bytes: not an IP
        good = workload("s3", "server3", "server", m.block + ".22", "node-b")
        nonces = m.xds.push(ADDRESS, {"s3": good, "zbad": bad})
        for n in nonces:
            r = m.xds.wait_reply(n)
            self.assertIsNotNone(r["error"], "NACK expected")
            self.assertIn("'zbad'", r["error"])
            self.assertIn("workload.addresses[0]", r["error"])
            self.assertIn("3", r["error"])
        # All or nothing: the good resource of the same response is not applied either.
        self.assertNotIn("s3", self.workload_uids(m.a))
        self.assertNotIn("zbad", self.workload_uids(m.a))
        x = m.a.config_dump()["xds"]["types"][ADDRESS]
        self.assertEqual(x["nacks"], 1)
        self.assertIn("workload.addresses[0]", x["lastNack"]["error"])
        self.assertEqual(m.a.metric_sum("sockmesh_xds_nacks_total",
                                        type="istio.workload.Address"), 1)
        self.assert_reaches(m.server_ip, 8080)
        # Nothing of the NACKed response is left behind to surface with the next good one.
        s4 = workload("s4", "server4", "server", m.block + ".24", "node-b")
        [m.xds.wait_reply(n) for n in m.xds.push(ADDRESS, {"s4": s4}, removed=["zbad"])]
        wait_until(lambda: "s4" in self.workload_uids(m.a), what="s4 applied")
        self.assertNotIn("s3", self.workload_uids(m.a))

        # Bytes that are no Address at all.
        nonces = m.xds.push(ADDRESS, {"junk": b"\xff\xff\xff"})
        for n in nonces:
            self.assertIn("not a valid istio.workload.Address", m.xds.wait_reply(n)["error"])
        # A bad policy field.
        p = deny_principal("p", "cluster.local/ns/default/sa/client")
        p.rules[0].clauses[0].matches[0].destination_ports.append(70000)
        nonces = m.xds.push(AUTHORIZATION, {"default/p": p})
        for n in nonces:
            err = m.xds.wait_reply(n)["error"]
            self.assertIn("authorization.rules[0].clauses[0].matches[0].destination_ports[0]", err)
        self.assertEqual(m.b.config_dump()["policies"], [])
        # The next good push is applied (the bad ones are dropped from the fake first).
        nonces = m.xds.push(ADDRESS, {"s3": good}, removed=["zbad", "junk"])
        for n in nonces:
            self.assertIsNone(m.xds.wait_reply(n)["error"])
        wait_until(lambda: "s3" in self.workload_uids(m.a), what="s3 applied")


class OutageTest(XdsTestCase):
    def test_istiod_away_for_10s_under_traffic(self):
        m = self.mesh
        m.xds.push(ADDRESS, dict(m.base_resources(), gone=workload(
            "gone", "gone", "server", m.block + ".23", "node-b")))
        m.xds.push(AUTHORIZATION, {})
        m.start()
        self.assertIn("gone", self.workload_uids(m.a))
        streams_before = m.xds.streams_opened

        live, rep = m.connect()
        self.assertEqual(rep, 0)
        whoami(live)
        live.settimeout(5)
        echo_errors = []
        stop = threading.Event()

        def keep_talking():
            i = 0
            while not stop.is_set() and i < 200:
                i += 1
                msg = b"tick%04d" % i
                try:
                    live.sendall(msg)
                    if harness.recv_exact(live, len(msg)) != msg:
                        echo_errors.append("bad echo")
                except OSError as e:
                    echo_errors.append(repr(e))
                    return
                time.sleep(0.2)

        talker = threading.Thread(target=keep_talking)
        talker.start()
        m.fake.stop()
        # Meanwhile istiod deletes a workload; the proxies learn it on reconnect.
        m.xds.push(ADDRESS, removed=["gone"])
        t_end = time.time() + 10
        new_ok = 0
        while time.time() < t_end:
            s, rep = m.connect()
            self.assertEqual(rep, 0, "a new connection to a known workload during the outage")
            self.assertTrue(whoami(s).startswith(m.client_ip + ":"))
            s.close()
            new_ok += 1
            time.sleep(0.5)
        self.assertGreaterEqual(new_ok, 10)
        self.assertFalse(m.a.config_dump()["xds"]["connected"])
        self.assertIn("gone", self.workload_uids(m.a), "the last state is kept meanwhile")
        self.assertIn("ended", m.a.logs())
        m.fake.start()
        wait_until(lambda: "gone" not in self.workload_uids(m.a) and
                   "gone" not in self.workload_uids(m.b), timeout=20,
                   what="both resynced, with the delete made during the outage")
        stop.set()
        talker.join()
        self.assertEqual(echo_errors, [], "the live connection carried on through the outage")
        live.close()
        self.assertGreaterEqual(m.xds.streams_opened, streams_before + 2)
        # The reconnecting proxy told the fake what it held.
        self.assertTrue(any("gone" in iv for t, iv in m.xds.initial_versions if t == ADDRESS))
        self.assertTrue(m.a.config_dump()["xds"]["connected"])
        self.assertGreaterEqual(m.a.metric_sum("istio_xds_connection_terminations_total"), 1)


class WrongTokenTest(XdsTestCase):
    mesh_args = {"token": "not-the-token"}

    def test_wrong_token_is_named(self):
        m = self.mesh
        m.push_base()
        m.a.start(wait=False)
        wait_until(lambda: "UNAUTHENTICATED" in m.a.config_dump()["xds"]["lastError"],
                   what="the refusal in /config_dump")
        err = m.a.config_dump()["xds"]["lastError"]
        self.assertIn("bearer token was not accepted", err)
        self.assertIn(m.token_file, err)
        self.assertIn("istiod refused the token", m.a.logs())
        self.assertEqual(readiness(m.a)[0], 503)
        self.assertGreaterEqual(m.a.metric_sum("istio_xds_connection_terminations_total",
                                               reason="UNAUTHENTICATED"), 1)


class WrongRootTest(XdsTestCase):
    def setUp(self):
        tmp = TempDir()
        self.other_tmp = tmp
        other_ca, _, _ = make_server_tls(tmp.path, "127.0.0.1", name="other")
        self.mesh_args = {"root_ca": other_ca}
        super().setUp()

    def tearDown(self):
        super().tearDown()
        self.other_tmp.cleanup()

    def test_wrong_root_ca_is_named(self):
        m = self.mesh
        m.push_base()
        m.a.start(wait=False)
        wait_until(lambda: "TLS with istiod failed" in m.a.config_dump()["xds"]["lastError"],
                   what="the TLS failure in /config_dump")
        err = m.a.config_dump()["xds"]["lastError"]
        self.assertIn(m.root_ca, err)
        self.assertEqual(readiness(m.a)[0], 503)
        self.assertEqual(m.xds.streams_opened, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
