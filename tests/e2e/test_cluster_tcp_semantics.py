#!/usr/bin/python3
"""TCP's semantics through the mesh, on every path, against the same flow between two pods outside
the mesh: an abort stays an abort (both sides), a server that half-closes first still reads what
the client sends after that FIN, a reconnect from a just-used port connects at once
(and a churn through a narrow port range never hangs), a stalled reader stops its writer after a
bounded amount, a blocking recv() waits while its send buffer drains (no EAGAIN), request and
response in lockstep come back intact (and leave the bypass across nodes), and sockets of
different network namespaces are never paired by the bypass.

One cluster (cluster.demo_topology, without the echo servers) serves every test of a class; the
classes run it with the sockmap bypass on and off. Probes: scripts/lib/tcpcheck.py.

Paths (source pod -> destination pod):
  same-node          shop/client -> shop/echo-a      (a pod of the same node: the same-node fast
                                                      path, no HBONE; test_zy checks it)
  cross-node         shop/client -> shop/echo-b      (HBONE across the node link)
  passthrough        shop/client -> legacy/legacy-b  (mesh -> outside the mesh, plain TCP)
  inbound-plaintext  legacy/legacy-b -> shop/echo-a  (outside -> mesh, captured on 15006)
  no-mesh            legacy/legacy-a -> legacy/legacy-b (the baseline: no proxy anywhere)
"""
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "lib"))

import cluster  # noqa: E402
from cluster_case import preflight, wait_until  # noqa: E402

TCPCHECK = os.path.join(os.path.dirname(cluster.PODAPP), "tcpcheck.py")
MiB = 1 << 20
PORTS = {"abort": 9101, "respond": 9102, "close-first": 9103, "sink": 9104, "source": 9105,
         "echo": 9106, "ack": 9107, "shut-first": 9108}
PATHS = [("same-node", "client", "echo-a"), ("cross-node", "client", "echo-b"),
         ("passthrough", "client", "legacy-b"), ("inbound-plaintext", "legacy-b", "echo-a"),
         ("no-mesh", "legacy-a", "legacy-b")]
MESH_PATHS = [p for p in PATHS if p[0] != "no-mesh"]
# TunnelRelay::kTwoWayAnswers: the answers after which a tunnel's app flow leaves the bypass.
TWO_WAY_ANSWERS = 2
# What a stalled reader may let its writer queue: the bound. Without the mesh this machine
# queues about 1.5 MiB (two sockets' buffers); through the proxy the proxy's buffers add to it.
BACKPRESSURE_LIMIT = 16 * MiB
# The cluster bench's pattern (bench/loadgen.cc --mode throughput): parallel streams on blocking
# sockets, each sends its bytes (64 KiB per send()) and waits in a blocking recv() with
# SO_RCVTIMEO for an 8-byte ack. The server reads nothing for UPLOAD_HOLD seconds, so the proxy
# stops reading the app and pins its flow to the stack; the app's reader goes to sleep in recv()
# UPLOAD_RECV_AFTER seconds in (after the pin), while its writer is still blocked on a full send
# buffer that drains once the server reads.
UPLOAD_STREAMS, UPLOAD_BYTES, UPLOAD_HOLD, UPLOAD_RCVTIMEO = 8, 24 * MiB, 1.0, 20
UPLOAD_RECV_AFTER = 0.3
# Client ports the tests bind on purpose (the reconnects, the inbound-plaintext dial's p, the
# shared four-tuple): reserved in every pod's netns, as an app that binds client ports would.
RECONNECT_PORTS = range(41000, 41000 + len(PATHS))
TUPLE_PORT = 43210
PLAINTEXT_DIAL_PORTS = range(47000, 47020)
PLAINTEXT_CLIENT, PLAINTEXT_APP = "legacy-b", "echo-a"  # that test's pods
# (Not the dial ports in the app pod: that test needs its kernel to offer them.)
RESERVED_PORTS = "%d-%d,%d" % (RECONNECT_PORTS[0], RECONNECT_PORTS[-1], TUPLE_PORT)
PLAINTEXT_CLIENT_RESERVED = "%s,%d-%d" % (RESERVED_PORTS, PLAINTEXT_DIAL_PORTS[0],
                                          PLAINTEXT_DIAL_PORTS[-1])


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict):
            return v
    raise AssertionError("no JSON report in: %s" % text[-2000:])


class TcpSemantics(unittest.TestCase):
    bypass = True

    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster.Cluster(bypass=cls.bypass)
        try:
            cls.cluster.up()
            cls.pods = cluster.demo_topology(cls.cluster, serve=False)
            cls.servers = {}
            for name in ("echo-a", "echo-b", "legacy-b"):
                pod = cls.pods[name]
                for mode, port in PORTS.items():
                    hold = {"sink": 2.5, "source": 2.0, "ack": UPLOAD_HOLD}.get(mode, 0.3)
                    cls.servers[(name, mode)] = pod.spawn("tcpcheck-%s" % mode, [
                        cluster.PYTHON, TCPCHECK, "serve", "--port", str(port), "--mode", mode,
                        "--hold", str(hold)])
                for port in PORTS.values():
                    wait_until("%s listening on %d" % (pod, port),
                               lambda: ":%d " % port in pod.sh(["ss", "-Hltn"]), 10)
            # Unreserved, any earlier connection of a pod's netns (its own, or one the proxy
            # dials from it in in-pod mode) may hold one of these ports in TIME_WAIT, and bind()
            # fails with EADDRINUSE, mesh or not (a CI run met that once, on 41002).
            for name, pod in cls.pods.items():
                ports = PLAINTEXT_CLIENT_RESERVED if name == PLAINTEXT_CLIENT else RESERVED_PORTS
                pod.sh(["sysctl", "-qw", "net.ipv4.ip_local_reserved_ports=" + ports],
                       in_cgroup=False)
        except Exception:
            cls.cluster.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def run_in(self, pod, *args, timeout=60, in_cgroup=True):
        argv = [cluster.PYTHON, TCPCHECK, "client"] + [str(a) for a in args]
        text = pod.sh(argv, timeout=timeout, check=False, in_cgroup=in_cgroup)
        return last_json(text)

    def target(self, dst, mode):
        return "%s:%d" % (self.pods[dst].ip, PORTS[mode])

    def server_events(self, dst, mode):
        return [json.loads(ln) for ln in self.servers[(dst, mode)].log().splitlines()
                if ln.startswith("{")]

    def proxy_of(self, pod_name):
        return self.pods[pod_name].node

    def access_lines_with(self, node, *needles, timeout=5):
        def found():
            return [ln for ln in node.proxy.log().splitlines()
                    if " access " in ln and all(n in ln for n in needles)]
        try:
            return wait_until("access line %s" % (needles,), found, timeout)
        except cluster.ClusterError:
            return []

    def access_line_of(self, path, src, dst, local):
        """The last access-log line of src's connection from port `local`, written by the proxy
        that held the client's end (src's node, or dst's for inbound plaintext); fails the test
        when there is none."""
        node = self.pods[src].node if src == "client" else self.pods[dst].node
        lines = self.access_lines_with(node, "src.addr=%s:%d" % (self.pods[src].ip, local))
        self.assertTrue(lines, "%s: no access-log line for the connection" % path)
        return lines[-1]

    # ---- 1. an abort stays an abort ----

    def test_a_server_that_closes_with_the_request_unread_resets_the_client(self):
        for path, src, dst in PATHS:
            with self.subTest(path=path):
                before = len(self.server_events(dst, "abort"))
                r = self.run_in(self.pods[src], "--target", self.target(dst, "abort"),
                                "--mode", "abort", "--bytes", 64 * 1024)
                events = wait_until("the server's close", lambda: self.server_events(
                    dst, "abort")[before:], 5)
                late = r["at"] - events[-1]["at"]
                # (FIONREAD of a socket in the bypass SOCKHASH counts only its sockmap queue, so
                # the figure is 0 there even with the request waiting in the TCP queue.)
                print("  %-18s server closed (FIONREAD %d); the client saw %s after %.1f ms" % (
                    path, events[-1]["unread"], r.get("how"), late * 1000))
                self.assertEqual(r.get("how"), "reset", "%s: the client saw %s, not a reset: %s"
                                 % (path, r.get("how"), r))
                self.assertLess(late, 0.1, "%s: the reset took %.0f ms" % (path, late * 1000))

    def test_a_client_that_closes_with_the_response_unread_resets_the_server(self):
        for path, src, dst in PATHS:
            with self.subTest(path=path):
                before = len(self.server_events(dst, "respond"))
                r = self.run_in(self.pods[src], "--target", self.target(dst, "respond"),
                                "--mode", "respond")
                self.assertEqual(r.get("got"), 1, r)
                events = wait_until("the server to see the client end", lambda: self.server_events(
                    dst, "respond")[before:], 5)
                how, late = events[-1]["how"], events[-1]["at"] - r["closed_at"]
                print("  %-18s server saw %s %.1f ms after the client closed" % (
                    path, how, late * 1000))
                self.assertEqual(how, "reset", "%s: the server saw %s, not a reset" % (path, how))
                self.assertLess(late, 0.1, "%s: the reset took %.0f ms" % (path, late * 1000))
                if path == "no-mesh":
                    continue
                # The proxy that held the client's end logs the connection as failed (reset).
                line = self.access_line_of(path, src, dst, r["local"])
                self.assertIn("error=", line, "%s: logged as a clean close: %s" % (path, line))

    def test_a_server_that_half_closes_first_still_reads_what_the_client_sends(self):
        """The server sends 256 KiB and half-closes at once; only after that EOF does the client
        send 1 MiB and half-close. The client's half outlives the server's FIN on every path: the
        bytes arrive intact both ways, neither end meets a reset, and the proxy logs the
        connection as complete with the apps' byte counts."""
        server_bytes, client_bytes = 256 * 1024, MiB
        for path, src, dst in PATHS:
            with self.subTest(path=path):
                before = len(self.server_events(dst, "shut-first"))
                r = self.run_in(self.pods[src], "--target", self.target(dst, "shut-first"),
                                "--mode", "shut-first", "--bytes", client_bytes,
                                "--server-bytes", server_bytes)
                self.assertEqual((r.get("received"), r.get("received_intact")),
                                 (server_bytes, True), "%s: the server's bytes: %s" % (path, r))
                self.assertEqual(r.get("end"), "eof", "%s: the client's end: %s" % (path, r))
                events = wait_until("the server's report", lambda: self.server_events(
                    dst, "shut-first")[before:], 10)
                got = events[-1]
                print("  %-18s the server read %s bytes after its FIN" % (path, got.get("bytes")))
                self.assertEqual((got.get("bytes"), got.get("sha256")),
                                 (client_bytes, r.get("sent_sha256")),
                                 "%s: what the server read after its FIN: %s" % (path, got))
                if path == "no-mesh":
                    continue
                line = self.access_line_of(path, src, dst, r["local"])
                self.assertIn("connection complete", line, path)
                self.assertIn(" bytes_sent=%d bytes_recv=%d " % (client_bytes, server_bytes),
                              line, path)

    # ---- 2. a reconnect from a recently used port ----

    def test_a_reconnect_from_the_port_just_used_connects_at_once(self):
        for i, (path, src, dst) in enumerate(PATHS):
            with self.subTest(path=path):
                port = RECONNECT_PORTS[i]
                bind = "%s:%d" % (self.pods[src].ip, port)
                held = self.pods[src].sh(["ss", "-Htanoe", "sport", "=", ":%d" % port],
                                         in_cgroup=False).strip()
                self.assertEqual(held, "", "%s: %s is reserved in the pod's netns, yet held:\n%s"
                                 % (path, bind, held))
                r = self.run_in(self.pods[src], "--target", self.target(dst, "close-first"),
                                "--mode", "reconnect", "--bind", bind, "--rounds", 4,
                                "--timeout", 5)
                print("  %-18s connect ms from %s: %s %s" % (path, bind, r.get("connect_ms"),
                                                             r.get("errors") or ""))
                self.assertEqual(r.get("errors"), [], "%s: %s" % (path, r))
                self.assertEqual(len(r["connect_ms"]), 4)
                self.assertLess(max(r["connect_ms"]), 100, "%s: %s" % (path, r))

    def test_an_inbound_plaintext_dial_never_takes_a_live_client_port(self):
        # Inbound plaintext keeps the client's IP: the proxy dials the app from inside its pod's
        # netns as client:p', where it also holds the captured connection's accepted socket
        # (local = app:port, remote = client:p). If p' were p, the dial's SYN would meet that
        # socket, not the app's listener. The app pod's ephemeral range is cut to {p, p + 1}
        # with p even (the kernel's connect() tries even ports first), so a kernel-chosen p' is
        # p; the proxy must take p + 1. Each round must read the server's 100 bytes at once.
        src, dst = self.pods[PLAINTEXT_CLIENT], self.pods[PLAINTEXT_APP]
        rounds = []
        try:
            for i in range(10):
                p = PLAINTEXT_DIAL_PORTS[2 * i]
                dst.sh(["sysctl", "-qw", "net.ipv4.ip_local_port_range=%d %d" % (p, p + 1)])
                r = self.run_in(src, "--target", self.target(PLAINTEXT_APP, "close-first"),
                                "--mode", "reconnect", "--bind", "%s:%d" % (src.ip, p),
                                "--rounds", 1, "--timeout", 3)
                rounds.append(r)
        finally:
            dst.sh(["sysctl", "-qw", "net.ipv4.ip_local_port_range=32768 60999"])
        print("  inbound-plaintext, client port p, app pod range {p, p+1}: ms to EOF %s" % (
            [r.get("total_ms") for r in rounds]))
        for i, r in enumerate(rounds):
            self.assertEqual(r.get("errors"), [], "round %d: %s" % (i, r))
            self.assertEqual(r.get("received"), [100], "round %d: %s" % (i, r))
            self.assertLess(max(r["total_ms"]), 500, "round %d: %s" % (i, r))

    def test_a_churn_through_a_narrow_port_range_never_hangs(self):
        # At least 20,000 short connections through the mesh in all, each closed by the server
        # first (so the proxy's socket next to the client holds TIME_WAIT), from a range of 300
        # ports: every port comes round over 20 times within TIME_WAIT's minute. The same churn without
        # the mesh runs first, as the baseline.
        churn_paths = MESH_PATHS
        per_path = -(-20000 // len(churn_paths))  # at least 20,000 in all
        counters0 = {n.name: (n.datapath_counter("time_wait_syn"),
                              n.datapath_counter("time_wait_reused"),
                              n.datapath_counter("local_routed")) for n in self.cluster.nodes}
        for path, src, dst in [PATHS[-1]] + churn_paths:
            with self.subTest(path=path):
                pod = self.pods[src]
                pod.sh(["sysctl", "-qw", "net.ipv4.ip_local_port_range=45000 45299"])
                try:
                    r = self.run_in(pod, "--target", self.target(dst, "close-first"),
                                    "--mode", "churn", "--conns", per_path, "--parallel", 8,
                                    "--timeout", 5, "--max-seconds", 150, timeout=200)
                finally:
                    pod.sh(["sysctl", "-qw", "net.ipv4.ip_local_port_range=32768 60999"])
                print("  %-18s %s" % (path, r))
                self.assertEqual(r.get("failed"), 0, "%s: %s" % (path, r))
                self.assertEqual(r.get("done"), per_path, "%s: %s" % (path, r))
                self.assertEqual(r.get("slow"), 0, "%s: connects of 100 ms or more: %s" % (
                    path, r))
        routed = 0
        for n in self.cluster.nodes:
            syn = n.datapath_counter("time_wait_syn") - counters0[n.name][0]
            reused = n.datapath_counter("time_wait_reused") - counters0[n.name][1]
            routed += n.datapath_counter("local_routed") - counters0[n.name][2]
            print("  %s: %d SYNs met a TIME_WAIT socket of the proxy, %d given to its listener" % (
                n.name, syn, reused))
        # Every socket of an enrolled client (legacy-* are not enrolled) was routed over lo to its
        # proxy once established, those whose SYN reused a TIME_WAIT tuple too (sk_lookup's note);
        # with the bypass, so was every enrolled server's socket the proxy dialled.
        clients = sum(1 for _, src, _ in churn_paths if not src.startswith("legacy"))
        servers = sum(1 for _, _, dst in churn_paths if not dst.startswith("legacy"))
        expected = per_path * (clients + (servers if self.bypass else 0))
        print("  apps' sockets routed over lo to their proxy: %d (at least %d)" % (routed, expected))
        self.assertGreaterEqual(routed, expected)

    # ---- 3. backpressure ----

    def test_a_stalled_reader_stops_its_writer_within_16_MiB(self):
        for path, src, dst in PATHS:
            with self.subTest(path=path, writer="client"):
                r = self.run_in(self.pods[src], "--target", self.target(dst, "sink"),
                                "--mode", "push", "--hold", 2.0, timeout=60)
                print("  %-18s client writer, stalled server: %.1f MiB written in 2 s" % (
                    path, (r.get("written") or 0) / MiB))
                self.assertTrue(r.get("intact"), "%s: %s" % (path, r))
                self.assertLessEqual(r["written"], BACKPRESSURE_LIMIT, "%s: %s" % (path, r))
            with self.subTest(path=path, writer="server"):
                r = self.run_in(self.pods[src], "--target", self.target(dst, "source"),
                                "--mode", "pull", "--hold", 2.0, timeout=60)
                print("  %-18s server writer, stalled client: %.1f MiB written in 2 s" % (
                    path, (r.get("written") or 0) / MiB))
                self.assertTrue(r.get("intact"), "%s: %s" % (path, r))
                self.assertLessEqual(r["written"], BACKPRESSURE_LIMIT, "%s: %s" % (path, r))

    @staticmethod
    def flows_sent_to_the_stack(node):
        """Bypassed app flows `node`'s proxy pinned to the stack: for a read pause, or, on a
        spliced passthrough, at the start (both leave the app's socket out of sm_bypass)."""
        text = node.metrics()
        return (cluster.metric_value(text, "sockmesh_bypass_flows_pinned_total") +
                cluster.metric_value(text, "sockmesh_bypass_flows_spliced_total"))

    def test_a_blocking_recv_waits_while_its_send_buffer_drains(self):
        """The regression of 9cb633c. A pinned app socket left in sm_bypass kept tcp_bpf's
        recvmsg, which answers a wakeup that brings no data with EAGAIN, even on a blocking
        socket; the ACKs that free a full send buffer are such wakeups (write space, while a
        writer is blocked: SOCK_NOSPACE). That was the cluster bench's 'recv: Resource
        temporarily unavailable'. Each stream here has its reader asleep in recv() while its
        writer is blocked: without the fix 68 of the 72 streams of the three bypassed paths got
        EAGAIN in 3 runs (every run failed), with it none. In the bench's strict order (the last send() returns, then
        recv()) the writer is rarely still marked blocked, so that order caught it in about 1 of
        100 streams only. Every stream must get its ack and no recv() may return EAGAIN, as
        without the mesh; the client's proxy must have pinned flows (on the passthrough path, at the
        start of its splice), or the case proved nothing.
        Not covered (the fix cannot reach it): a reader already asleep in recv() when the pin
        happens stays in tcp_bpf's recvmsg and can still get EAGAIN."""
        if not self.bypass:
            self.skipTest("the bypass is off: the app's recvmsg is TCP's")
        for path, src, dst in PATHS:
            with self.subTest(path=path):
                node = self.pods[src].node
                pinned0 = self.flows_sent_to_the_stack(node)
                r = self.run_in(self.pods[src], "--target", self.target(dst, "ack"),
                                "--mode", "upload", "--parallel", UPLOAD_STREAMS,
                                "--bytes", UPLOAD_BYTES, "--chunk", 65536,
                                "--recv-after", UPLOAD_RECV_AFTER, "--timeout", UPLOAD_RCVTIMEO,
                                "--max-seconds", 40, timeout=60)
                pinned = self.flows_sent_to_the_stack(node) - pinned0
                print("  %-18s %d x %d MiB: %d answered, %d EAGAIN, %d recv() during the send,"
                      " %.1f s, longest recv %.0f ms; flows pinned %d %s" % (
                          path, UPLOAD_STREAMS, UPLOAD_BYTES // MiB, r.get("answered", 0),
                          r.get("eagain", 0), r.get("recv_during_send", 0), r.get("elapsed", 0),
                          r.get("max_recv_ms", 0), pinned, (r.get("failures") or "")[:2]))
                self.assertEqual(r.get("eagain"), 0, "%s: recv() returned EAGAIN: %s" % (path, r))
                self.assertEqual(r.get("answered"), UPLOAD_STREAMS, "%s: %s" % (path, r))
                self.assertEqual(r.get("failures"), [], "%s: %s" % (path, r))
                if src == "client":
                    self.assertGreater(r.get("recv_during_send", 0), 0, "%s: every send ended "
                                       "before its recv(): the case proved nothing: %s" % (path, r))
                    self.assertGreater(pinned, 0, "%s: no flow was pinned to the stack, so the "
                                       "case did not exercise the pin: %s" % (path, r))

    # ---- 4. request and response ----

    def test_request_and_response_in_lockstep_stay_intact_and_leave_the_bypass(self):
        """An RPC client: 1 KiB messages in lockstep, each recv() a blocking call that sleeps
        until the answer comes, then a half-close. On every path, as without the mesh: every
        round back intact, no error (no EAGAIN), the server's EOF after the half-close. Across
        nodes with the bypass, each app's flow leaves it before the data of its second answer
        is written to it (TunnelRelay::kTwoWayAnswers), while the client app is asleep in
        recv(): sockmesh_bypass_flows_two_way_total +1 on each node, and only the first
        messages of each app go through sk_msg (bypass_sends), not one per round. A single
        exchange (a request and its one answer) stays in the bypass. Where the client's flow is
        still in the bypass at the end, its recv() asleep when the FIN comes may answer EAGAIN
        once before the 0 (tcp_bpf's recvmsg; OPERATING 3.6), so that is allowed there and
        nowhere else."""
        rounds = 40
        nodes = self.cluster.nodes

        def counters():
            texts = [n.metrics() for n in nodes]
            return (sum(cluster.metric_value(t, "sockmesh_bypass_flows_two_way_total")
                        for t in texts),
                    sum(cluster.metric_value(t, "sockmesh_datapath_bypass_sends_total")
                        for t in texts))
        for path, src, dst in PATHS + [("cross-node, one round", "client", "echo-b")]:
            n = 1 if path.endswith("one round") else rounds
            with self.subTest(path=path):
                two_way0, sends0 = counters()
                r = self.run_in(self.pods[src], "--target", self.target(dst, "echo"),
                                "--mode", "rounds", "--rounds", n, "--bytes", 1024,
                                "--timeout", 10, timeout=60)
                two_way, sends = [b - a for a, b in zip((two_way0, sends0), counters())]
                print("  %-22s %d of %d rounds intact%s, EAGAIN before the EOF %s; flows out of "
                      "the bypass %d, sk_msg sends %d" % (
                          path, r.get("intact", 0), n, ", " + r["error"] if "error" in r else "",
                          r.get("eof_eagain"), two_way, sends))
                self.assertNotIn("error", r, "%s: %s" % (path, r))
                self.assertEqual(r.get("intact"), n, "%s: %s" % (path, r))
                self.assertEqual(r.get("after_eof"), 0, "%s: no EOF after the half-close: %s"
                                 % (path, r))
                # A known difference (OPERATING 3.6): while the client app's flow is still in
                # the bypass, a recv() asleep when the FIN comes answers EAGAIN once (tcp_bpf's
                # recvmsg), then 0. Nowhere else.
                in_bypass = self.bypass and src == "client" and (
                    path != "cross-node" or n < TWO_WAY_ANSWERS)
                self.assertLessEqual(r.get("eof_eagain"), 1 if in_bypass else 0,
                                     "%s: EAGAIN before the EOF: %s" % (path, r))
                if path == "cross-node" and self.bypass:
                    self.assertEqual(two_way, 2, "%s: each side's flow leaves the bypass once"
                                     % path)
                    # Before leaving, each app sent 2 messages through sk_msg (an echo server
                    # may answer one message in two sends): without the exit, 2 x 40.
                    self.assertLessEqual(sends, 8, "%s: the messages kept going through sk_msg"
                                         % path)
                    self.assertGreaterEqual(sends, 2, "%s: the apps were not in the bypass, so "
                                            "the case proved nothing" % path)
                else:
                    self.assertEqual(two_way, 0, "%s: only a tunnel with two answers leaves the "
                                     "bypass" % path)

    # ---- 5. network namespaces are never paired ----

    def test_connections_with_one_four_tuple_in_two_netns_never_cross(self):
        """B: a socket in echo-a's netns and cgroup, bound (transparent) to the client's address
        and port, talking to a listener of echo-a that runs outside the pod's cgroup (so nothing
        consumes B's pairing note). A: the client pod's netns, but outside its cgroup, from the
        same address and port to the same listener, through the mesh. Same 4-tuple, two netns."""
        client, echo_a = self.pods["client"], self.pods["echo-a"]
        a_node = client.node
        refused0 = a_node.datapath_counter("bypass_refused")
        listener = cluster.Process("tcpcheck-outside", [
            cluster.PYTHON, TCPCHECK, "serve", "--port", "9200", "--mode", "echo"],
            netns=echo_a.netns_path, log_path=os.path.join(self.cluster.work, "outside.log"))
        try:
            wait_until("the outside listener", lambda: ":9200 " in echo_a.sh(["ss", "-Hltn"]), 10)
            tuple_src = "%s:%d" % (client.ip, TUPLE_PORT)
            target = "%s:9200" % echo_a.ip
            b = echo_a.spawn("tuple-b", [cluster.PYTHON, TCPCHECK, "client", "--target", target,
                                         "--mode", "echo", "--bind", tuple_src, "--transparent",
                                         "--bytes", str(4 * MiB), "--seed", "11", "--pace",
                                         "0.02", "--timeout", "20"])
            wait_until("B connected", lambda: str(TUPLE_PORT) in echo_a.sh(["ss", "-Htn"]), 10)
            a = self.run_in(client, "--target", target, "--mode", "echo", "--bind", tuple_src,
                            "--bytes", 4 * MiB, "--seed", 12, "--pace", 0.01, "--timeout", 20,
                            in_cgroup=False)
            wait_until("B done", lambda: not b.alive(), 30)
            b_report = last_json(b.log())
            print("  A (client netns, outside its cgroup): %s" % a)
            print("  B (echo-a netns, same 4-tuple):       %s" % b_report)
            self.assertTrue(a.get("intact"), "A's bytes crossed or were lost: %s" % a)
            self.assertTrue(b_report.get("intact"), "B's bytes crossed or were lost: %s" % b_report)
        finally:
            listener.stop()
        if self.bypass:
            self.assertGreater(a_node.datapath_counter("bypass_refused"), refused0,
                               "no refused pairing was counted")
        self.assert_pairing_maps_empty()

    def assert_pairing_maps_empty(self):
        def empty(node, name):
            return node.bpftool_dump(name) == []
        for node in self.cluster.nodes:
            for name in ("sm_await_peer", "sm_bypass", "sm_bypass_proxy"):
                try:
                    wait_until("%s on %s to empty" % (name, node.name),
                               lambda: empty(node, name), 5)
                except cluster.ClusterError:
                    self.fail("%s on %s still holds entries after every connection closed: %s" % (
                        name, node.name, node.bpftool_dump(name)[:5]))

    def test_zy_the_same_node_path_took_the_fast_path(self):
        # Runs after the probes (unittest sorts by name): "same-node" above is the same-node fast
        # path (--same-node-fast-path is on by default), not HBONE to node-a's own 15008.
        node, echo_a = self.proxy_of("client"), self.pods["echo-a"]
        fast = cluster.metric_value(node.metrics(), "sockmesh_same_node_fast_path_total")
        self.assertGreater(fast, 0, "no connection took the same-node fast path")
        tunnelled = [ln for ln in node.proxy.log().splitlines()
                     if " access " in ln and "dst.hbone_addr=%s:" % echo_a.ip in ln]
        self.assertEqual(tunnelled, [], "same-node connections went through HBONE")

    def test_zz_no_pairing_note_or_bypass_entry_outlives_the_connections(self):
        # Runs last (unittest sorts by name): every probe of this class has ended by then.
        self.assert_pairing_maps_empty()


class TcpSemanticsWithoutBypass(TcpSemantics):
    bypass = False


if __name__ == "__main__":
    preflight()
    unittest.main(verbosity=2)
