"""The same-node fast path outside in-pod mode: node A's SOCKS5 client connects to a second
workload local to node A (the config says so), on loopback. With --same-node-fast-path (default)
node A authorizes and dials it itself, logging both sides with path=same-node and counting both
reporters; with the flag off the same connection goes through HBONE to A's own 15008. A Deny
policy refuses it (SOCKS5 'not allowed by ruleset') and closes a live one."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import EchoServer, TwoNodeMesh, transfer_and_check, wait_until  # noqa: E402

DENY_CLIENT_TO_LOCAL = """- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: ["cluster.local/ns/default/sa/client"]
"""


class SameNode(unittest.TestCase):
    extra_a = ()
    # (direction, path, relay) of the two records of one live connection in A's /config_dump.
    live_records = ()
    relayed_plainly = False  # the relay of live_records is the plain relay's choice

    def setUp(self):
        self.mesh = TwoNodeMesh(extra_a=self.extra_a)
        self.local_ip = self.mesh.block + ".40"
        self.mesh.extra_workloads = harness.workload_yaml(
            "l1", "local", "default", "local", self.local_ip, "node-a") + "\n"
        self.mesh.set_policies("")  # rewrites both configs with the extra workload
        self.server = EchoServer(self.local_ip, 8080, mode="whoami")
        self.mesh.start()

    def tearDown(self):
        harness.show_logs_if_failed(self, self.mesh)
        self.mesh.stop()
        self.server.close()
        self.mesh.cleanup()

    def access_lines(self, *needles):
        return [ln for ln in self.mesh.a.logs().splitlines()
                if " access " in ln and all(n in ln for n in needles)]

    def talk(self, size):
        s, rep = self.mesh.connect(self.local_ip, 8080)
        self.assertEqual(rep, 0, "SOCKS5 reply %d" % rep)
        peer = harness.read_line(s)
        self.assertTrue(peer.startswith(self.mesh.client_ip + ":"), "the app saw %s" % peer)
        self.assertTrue(transfer_and_check(s, os.urandom(size)))
        s.close()

    def live_connection(self):
        """A connection to the local workload that has carried one echoed ping, left open."""
        s, rep = self.mesh.connect(self.local_ip, 8080)
        self.assertEqual(rep, 0)
        harness.read_line(s)
        s.sendall(b"ping")
        self.assertEqual(harness.recv_exact(s, 4), b"ping")
        return s

    def live(self):
        return [c for c in self.mesh.a.config_dump()["connections"]
                if c["dst"] == "%s:8080" % self.local_ip]

    def check_config_dump_says_which_path_a_live_connection_took(self):
        s = self.live_connection()
        expected = list(self.live_records)
        if self.relayed_plainly:
            # The relay the proxy chose, as its metric counted it (splice or copy).
            chosen = [r for r in ("splice", "copy") if self.mesh.a.metric_sum(
                "sockmesh_plain_relays_total", relay=r) == 1]
            self.assertEqual(len(chosen), 1, "one plain relay counted")
            expected = [(d, p, chosen[0]) for d, p, _ in expected]
        wait_until(lambda: sorted((c["direction"], c["path"], c["relay"]) for c in self.live())
                   == sorted(expected), what="both records of the live connection "
                   "with their path: %s" % (self.live(),))
        for c in self.live():
            self.assertEqual(c["src"].rsplit(":", 1)[0], self.mesh.client_ip, c)
            self.assertEqual(c["bytesSent"], 4, c)  # the ping; the echo and whoami came back
            self.assertGreaterEqual(c["bytesReceived"], 4, c)
            self.assertEqual(c["srcIdentity"], "spiffe://cluster.local/ns/default/sa/client", c)
        s.close()
        wait_until(lambda: self.live() == [], what="the closed connection gone from the dump")


class FastPath(SameNode):
    live_records = (("inbound", "same-node", None), ("outbound", "same-node", None))
    relayed_plainly = True

    def test_config_dump_says_which_path_a_live_connection_took(self):
        self.check_config_dump_says_which_path_a_live_connection_took()

    def test_a_local_destination_is_served_without_a_tunnel_and_logged_on_both_sides(self):
        size = 300000
        self.talk(size)
        target = "dst.addr=%s:8080" % self.local_ip
        wait_until(lambda: len(self.access_lines(target, "path=same-node")) == 2,
                   what="both access-log lines")
        for line in self.access_lines(target):
            self.assertIn(" path=same-node", line)
            self.assertNotIn("dst.hbone_addr", line)
            self.assertIn(" bytes_sent=%d " % size, line)
            self.assertIn("src.identity=spiffe://cluster.local/ns/default/sa/client", line)
        for reporter in ("source", "destination"):
            self.assertEqual(self.mesh.a.metric_sum(
                "istio_tcp_received_bytes_total", reporter=reporter,
                destination_principal="spiffe://cluster.local/ns/default/sa/local",
                connection_security_policy="mutual_tls"), size)
        self.assertEqual(self.mesh.a.metric_sum("sockmesh_same_node_fast_path_total"), 1)
        self.assertEqual(self.mesh.a.metric_sum("sockmesh_pool_connections_opened_total"), 0,
                         "no HBONE connection was needed")
        self.assertNotIn("direction=inbound", self.mesh.b.logs(), "node B saw nothing")

    def test_a_deny_policy_refuses_a_new_connection_and_closes_a_live_one(self):
        s = self.live_connection()
        self.mesh.set_policies(DENY_CLIENT_TO_LOCAL)
        s.settimeout(10)
        t0 = time.time()
        try:
            closed = s.recv(10) == b""
        except (ConnectionResetError, OSError):
            closed = True
        s.close()
        self.assertTrue(closed, "the live connection survived the Deny policy")
        self.assertLess(time.time() - t0, 8)
        s2, rep = self.mesh.connect(self.local_ip, 8080)
        self.assertEqual(rep, 2, "SOCKS5 'not allowed by ruleset' for a policy denial")
        s2.close()
        # The access-log lines are written as the proxy's records close, which may be a moment
        # after the client saw its socket close (a CI run on 2026-12-05 checked too early).
        wait_until(lambda: self.access_lines("path=same-node", "policy now denies"),
                   what="the access-log line of the live connection's close")
        wait_until(lambda: self.access_lines("path=same-node", "direction=outbound",
                                             "not authorized"),
                   what="the access-log line of the refused connection")
        wait_until(lambda: self.mesh.a.metric_sum(
            "istio_tcp_connections_closed_total", response_flags="DENY") >= 2,
            what="DENY counted by both reporters")

    def test_a_dry_run_deny_is_logged_and_not_enforced(self):
        # Every admission path logs the dry-run verdict: the fast path here, inbound HBONE to
        # A's own 15008 in FastPathOff, which runs this test too.
        self.mesh.set_policies(DENY_CLIENT_TO_LOCAL + "  dryRun: true\n")
        wait_until(lambda: [p["dryRun"] for p in self.mesh.a.config_dump()["policies"]] == [True],
                   what="the dry-run policy loaded")
        self.talk(4096)
        wait_until(lambda: "dry run would deny: denied by policy default/deny-client "
                   "(enforced: allow)" in self.mesh.a.logs(), what="the dry-run verdict logged")
        self.assertEqual(self.mesh.a.metric_sum("istio_tcp_connections_closed_total",
                                                response_flags="DENY"), 0)


class FastPathOff(SameNode):
    extra_a = ("--same-node-fast-path", "false")
    live_records = (("inbound", "hbone", "tunnel"), ("outbound", "hbone", "tunnel"))

    def test_config_dump_says_which_path_a_live_connection_took(self):
        self.check_config_dump_says_which_path_a_live_connection_took()
    test_a_dry_run_deny_is_logged_and_not_enforced = \
        FastPath.test_a_dry_run_deny_is_logged_and_not_enforced

    def test_a_local_destination_goes_through_the_proxys_own_15008(self):
        self.talk(100000)
        wait_until(lambda: len(self.access_lines("dst.addr=%s:8080" % self.local_ip)) == 2,
                   what="both access-log lines")
        for line in self.access_lines("dst.addr=%s:8080" % self.local_ip):
            self.assertNotIn(" path=", line)
            self.assertIn("dst.hbone_addr=%s:15008" % self.local_ip, line)
        self.assertEqual(self.mesh.a.metric_sum("sockmesh_same_node_fast_path_total"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
