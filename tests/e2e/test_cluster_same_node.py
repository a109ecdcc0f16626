#!/usr/bin/python3
"""The same-node fast path (--same-node-fast-path, on by default): a connection from an enrolled pod
to another pod the same proxy serves is authorized by the proxy itself and dialled straight into
the server pod, without HBONE to its own 15008. Checked against the tunnel it replaces, in one
cluster (node-a's proxy restarted with the flag off): the payload intact, the client's address
kept, the same metric series with both reporters, access-log bytes equal to what the apps sent, and
the path in the access log and in /config_dump (also for a passthrough connection); payloads from 1
byte to 64 MiB; a server that half-closes first and still reads; a Deny policy refuses a new
same-node connection and closes a live one. TCP's semantics on the path (half-close both ways, RST
both ways, backpressure) are in test_cluster_tcp_semantics.py, whose "same-node" path takes the
fast path by default.
Topology: cluster.demo_topology (client and echo-a on node-a)."""
import json
import re
import time

from cluster_case import APP_PORT, ClusterCase, main, metric_value, wait_until  # noqa: F401

MiB = 1 << 20
SERIES = ("istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total",
          "istio_tcp_sent_bytes_total", "istio_tcp_received_bytes_total")


# A server that half-closes first (sends 3 bytes, then FIN) and then reads what the client still
# sends, to EOF: the client's sending half must outlive the server's FIN through the relay.
HALF_CLOSE_SERVER = r"""
import hashlib, json, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d))
s.listen(8)
s.settimeout(60)
for _ in range(4):
    c, peer = s.accept()
    c.settimeout(10)
    c.sendall(b"bye")
    c.shutdown(socket.SHUT_WR)
    n, h = 0, hashlib.sha256()
    while True:
        d = c.recv(65536)
        if not d:
            break
        n += len(d)
        h.update(d)
    print(json.dumps({"got": n, "sha256": h.hexdigest()}), flush=True)
    c.close()
"""
HALF_CLOSE_CLIENT = r"""
import hashlib, json, socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
first = b""
for _ in range(100):
    d = c.recv(65536)
    if not d:
        break
    first += d
data = bytes(range(256)) * (int(sys.argv[3]) // 256)
c.sendall(data)
c.shutdown(socket.SHUT_WR)
rest = c.recv(1)
c.close()
print(json.dumps({"first": first.decode(), "after_eof": len(rest),
                  "sha256": hashlib.sha256(data).hexdigest()}), flush=True)
"""
HALF_CLOSE_PORT = 9200


def deny_policy(name, **match):
    return {"name": name, "namespace": "shop", "scope": "Namespace", "action": "Deny",
            "rules": [[[match]]]}


def label_sets(text, name):
    """The label sets of metric `name`'s samples (values left out)."""
    out = set()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            body = line[len(name) + 1:].rpartition("} ")[0]
            out.add(frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body)))
    return out


def field(line, key):
    m = re.search(r" %s=(\S+)" % re.escape(key), line)
    return m.group(1) if m else None


class SameNode(ClusterCase):

    def echo_a(self):
        return "%s:%d" % (self.pods["echo-a"].ip, APP_PORT)

    def greeting_of(self, peer):
        """What podapp's server wrote before the echo to the connection from `peer`."""
        return len(json.dumps({"server": "shop/echo-a", "peer": peer}) + "\n")

    def one_flow(self, size):
        """client -> echo-a with `size` bytes: the two access lines and node-a's metrics."""
        r = self.talk(self.client, self.echo_a(), size)
        self.assertEqual(r["servers"], ["shop/echo-a"])
        self.assertEqual(r["seen_as"], [self.client.ip], "the server did not see the client's IP")
        echo_log = self.pods["echo-a"].processes[0].log()
        peers = re.findall(r"closed (\S+) after echoing (\d+) bytes", echo_log)
        self.assertTrue(peers, "echo-a logged no closed connection")
        peer, echoed = peers[-1]
        self.assertEqual(int(echoed), size)
        lines = {}
        for direction in ("outbound", "inbound"):
            found = self.access_lines(self.a, "direction=%s" % direction,
                                      "dst.addr=%s" % self.echo_a())
            self.assertTrue(found, "node-a logged no %s line for the flow" % direction)
            lines[direction] = found[-1]
        # The counters are written when the connection closes: wait for both reporters.
        wait_until("both reporters to count the close", lambda: metric_value(
            self.a.metrics(), "istio_tcp_connections_closed_total",
            destination_workload="echo-a") >= 2, 5)
        return lines, self.a.metrics(), self.greeting_of(peer)

    def test_the_fast_path_keeps_the_tunnels_metric_series_and_counts_the_apps_bytes(self):
        size = 3 * MiB + 17
        fast, fast_metrics, greeting = self.one_flow(size)
        for direction, line in fast.items():
            self.assertIn(" path=same-node", line, "%s line: %s" % (direction, line))
            self.assertNotIn("dst.hbone_addr", line, "no tunnel on the fast path: %s" % line)
            self.assertEqual(field(line, "bytes_sent"), str(size), line)
            self.assertEqual(field(line, "bytes_recv"), str(size + greeting), line)
            self.assertEqual(field(line, "src.identity"), self.client.identity, line)
            self.assertEqual(field(line, "dst.identity"), self.pods["echo-a"].identity, line)
            self.assertNotIn("error=", line)
        for reporter in ("source", "destination"):
            # Istio's direction: the request's bytes are "received" by the proxy.
            self.assertEqual(metric_value(fast_metrics, "istio_tcp_received_bytes_total",
                                          reporter=reporter, destination_workload="echo-a"), size)
            self.assertEqual(metric_value(fast_metrics, "istio_tcp_sent_bytes_total",
                                          reporter=reporter, destination_workload="echo-a"),
                             size + greeting)
        self.assertEqual(metric_value(fast_metrics, "sockmesh_same_node_fast_path_total"), 1)

        # The same flow through the tunnel: node-a's proxy again, with the flag off.
        self.cluster.proxy_extra = list(self.cluster.proxy_extra) + [
            "--same-node-fast-path", "false"]
        self.a.start_proxy()
        tunnel, tunnel_metrics, greeting = self.one_flow(size)
        for direction, line in tunnel.items():
            self.assertNotIn(" path=", line, line)
            self.assertIn("dst.hbone_addr=%s:15008" % self.pods["echo-a"].ip, line)
            self.assertEqual(field(line, "bytes_sent"), str(size), line)
        self.assertEqual(metric_value(tunnel_metrics, "sockmesh_same_node_fast_path_total"), 0)
        for name in SERIES:
            with self.subTest(series=name):
                self.assertEqual(label_sets(fast_metrics, name), label_sets(tunnel_metrics, name),
                                 "the fast path's %s series differ from the tunnel's" % name)
                self.assertEqual(len(label_sets(fast_metrics, name)), 2, "one per reporter")

    def test_payloads_from_1_byte_to_64_MiB_arrive_intact_and_are_counted(self):
        sizes = [1, 1000, 65537, 64 * MiB]
        for size in sizes:
            self.talk(self.client, self.echo_a(), size)
            line = self.access_lines(self.a, "direction=inbound", "path=same-node",
                                     "bytes_sent=%d " % size)
            self.assertTrue(line, "no fast-path access line with bytes_sent=%d" % size)
        self.assertEqual(metric_value(self.a.metrics(), "sockmesh_same_node_fast_path_total"),
                         len(sizes))

    def test_the_server_half_closes_first_and_still_reads_what_the_client_sends(self):
        import cluster
        echo_a = self.pods["echo-a"]
        server = echo_a.spawn("half-close", [cluster.PYTHON, "-c",
                                             HALF_CLOSE_SERVER % HALF_CLOSE_PORT])
        wait_until("the half-close server to listen",
                   lambda: ":%d " % HALF_CLOSE_PORT in echo_a.sh(["ss", "-Hltn"]), 10)
        size = 4 * MiB
        out = self.client.sh([cluster.PYTHON, "-c", HALF_CLOSE_CLIENT, echo_a.ip,
                              str(HALF_CLOSE_PORT), str(size)], timeout=60)
        sent = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(sent["first"], "bye", "the server's bytes before its FIN: %s" % sent)
        got = wait_until("the server's report", lambda: [
            json.loads(ln) for ln in server.log().splitlines() if ln.startswith("{")], 10)[-1]
        self.assertEqual(got, {"got": size, "sha256": sent["sha256"]},
                         "what the server read after its own FIN")
        self.assertEqual(sent["after_eof"], 0)
        line = self.access_lines(self.a, "direction=outbound", "path=same-node",
                                 "dst.addr=%s:%d" % (echo_a.ip, HALF_CLOSE_PORT))
        self.assertTrue(line, "the connection did not take the fast path")
        self.assertEqual(field(line[-1], "bytes_sent"), str(size))
        self.assertEqual(field(line[-1], "bytes_recv"), "3")

    def live_paths(self, dst):
        """(direction, path, relay) of node-a's live connections to `dst`, from /config_dump."""
        found = []

        def listed():
            found[:] = sorted((c["direction"], c["path"], c["relay"])
                              for c in self.a.config_dump()["connections"] if c["dst"] == dst)
            return all(relay for _, _, relay in found) and found
        wait_until("node-a's /config_dump to list the connection to %s" % dst, listed, 10)
        return found

    def test_config_dump_names_the_passthrough_path_of_a_live_connection(self):
        legacy = "%s:%d" % (self.pods["legacy-a"].ip, APP_PORT)
        spliced_before = metric_value(self.a.metrics(), "sockmesh_bypass_flows_spliced_total")
        live = self.client.client_process("live-legacy", legacy, "--stream-seconds", 3)
        # The client's socket is in the bypass; the proxy pins its flow to the stack and splices.
        self.assertEqual(self.live_paths(legacy), [("outbound", "passthrough", "splice")])
        self.assertEqual(metric_value(self.a.metrics(), "sockmesh_bypass_flows_spliced_total"),
                         spliced_before + 1)
        self.assertTrue(self.report_of(live, timeout=15)["ok"])
        wait_until("the closed connection to leave /config_dump", lambda: not [
            c for c in self.a.config_dump()["connections"] if c["dst"] == legacy], 10)

    def test_a_deny_policy_refuses_a_same_node_connection_and_closes_a_live_one(self):
        client, echo_a = self.client, self.pods["echo-a"]
        self.talk(client, self.echo_a(), 4096)  # allowed before
        live = client.client_process("live", self.echo_a(), "--stream-seconds", 30)
        wait_until("the live stream to reach echo-a",
                   lambda: echo_a.processes[0].log().count("accepted from %s" % client.ip) >= 2,
                   10)
        # /config_dump names the path of the live connection: both records, same-node, copied
        # (the client's and the app's sockets are in the sockmap bypass, which splice cannot read).
        self.assertEqual(self.live_paths(self.echo_a()), [
            ("inbound", "same-node", "copy"), ("outbound", "same-node", "copy")])
        self.cluster.set_policies([
            deny_policy("deny-client", principals=["cluster.local/ns/shop/sa/client"])])
        applied = time.time()
        report = self.report_of(live, timeout=15)
        self.assertFalse(report["ok"], "the live same-node connection survived the Deny policy")
        self.assertLess(report["first_error_at"] - applied, 5.0,
                        "the live connection was closed late: %s" % report)
        closed = self.access_lines(self.a, "direction=inbound", "path=same-node",
                                   "policy now denies")
        self.assertTrue(closed, "no access line says the re-check closed the connection")
        r = client.client(self.echo_a(), "--bytes", 4096, "--timeout", 5)
        self.assertFalse(r["ok"], "a new same-node connection was not refused: %s" % r)
        self.assertLess(r["elapsed"], 5.0, "refusal took the whole timeout: %s" % r)
        refused = self.access_lines(self.a, "direction=outbound", "path=same-node",
                                    "not authorized")
        self.assertTrue(refused, "no outbound access line for the refusal")
        text = self.a.metrics()
        for reporter in ("source", "destination"):
            self.assertGreaterEqual(metric_value(text, "istio_tcp_connections_closed_total",
                                                 reporter=reporter, response_flags="DENY"), 1,
                                    "reporter %s counted no DENY" % reporter)
        # The refused connection never reached the app: it accepted only the two made before the
        # policy (the allowed one and the live stream).
        self.assertEqual(echo_a.processes[0].log().count("accepted from %s" % client.ip), 2)


if __name__ == "__main__":
    main()
