#!/usr/bin/python3
"""End to end on two simulated nodes: the DNS proxy (#15). Each proxy runs with --dns-proxy on;
tc captures an enrolled pod's queries to port 53 (any address) into its 15053 sockets. The pods'
resolver is legacy-b (10.244.2.11), where tests/e2e/fake_dns.py (dnspython) serves a small zone
and answers NXDOMAIN for the mesh's names, so an answer with a VIP can only come from the proxy.
Pods resolve with ordinary resolvers: glibc (getent, Python's getaddrinfo) through a resolv.conf of
their own (a private mount namespace), and dig."""
import os
import time

from cluster_case import ECHO_VIP, ClusterCase, main, metric_value, wait_until

UPSTREAM = "10.244.2.11"  # legacy-b, the fourth pod of cluster.demo_topology (node-b, index 11)
HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_DNS = os.path.join(HERE, "fake_dns.py")


class Dns(ClusterCase):
    proxy_extra = ("--dns-proxy", "on", "--dns-upstream", UPSTREAM,
                   "--dns-upstream-timeout", "2s")

    def setUp(self):
        super().setUp()
        legacy_b = self.pods["legacy-b"]
        self.assertEqual(legacy_b.ip, UPSTREAM)
        self.upstream = legacy_b.spawn("dns", ["/usr/bin/python3", FAKE_DNS, "--port", "53"])
        wait_until("the fake upstream DNS server", lambda: "listening" in self.upstream.log(), 10)
        self.resolv = os.path.join(self.cluster.work, "pod-resolv.conf")
        with open(self.resolv, "w") as f:
            f.write("nameserver %s\nsearch shop.svc.cluster.local svc.cluster.local "
                    "cluster.local\noptions ndots:5 timeout:2 attempts:1\n" % UPSTREAM)

    def resolve(self, pod, *argv, check=False):
        """argv in the pod, with the pod's resolv.conf bind-mounted in a mount namespace of its
        own (the host's /etc/resolv.conf is untouched)."""
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return pod.sh(["unshare", "-m", "sh", "-c", script, self.resolv] + list(argv),
                      check=check, timeout=30)

    def dig(self, pod, *args):
        return self.resolve(pod, "dig", "+time=3", "+tries=1", *args)

    def upstream_saw(self, needle):
        return needle in self.upstream.log()

    def test_a_pod_resolves_the_service_with_ordinary_resolvers_and_connects_through_it(self):
        client = self.client
        dns_before = self.a.datapath_counter("captured_dns")
        fqdn = "echo.shop.svc.cluster.local"
        out = self.resolve(client, "getent", "ahostsv4", fqdn)
        self.assertIn(ECHO_VIP, out, "getent %s: %s" % (fqdn, out))
        out = self.resolve(client, "getent", "ahostsv4", "echo")  # the search path
        self.assertIn(ECHO_VIP, out, "getent echo: %s" % out)
        py = self.resolve(client, "/usr/bin/python3", "-c",
                          "import socket; print(sorted({a[4][0] for a in socket.getaddrinfo("
                          "'echo.shop', 80, socket.AF_INET)}))")
        self.assertIn("'%s'" % ECHO_VIP, py, "getaddrinfo echo.shop: %s" % py)
        out = self.dig(client, "+short", fqdn)
        self.assertEqual(out.split(), [ECHO_VIP], "dig: %s" % out)
        # Answered by the proxy: the upstream never saw the service's name (it sees the search
        # path's other tries, e.g. echo.shop.svc.cluster.local.shop.svc.cluster.local, which are
        # not the mesh's and are forwarded, as kube-dns would get them), and tc counted them.
        self.assertFalse(self.upstream_saw(" %s. A from" % fqdn), self.upstream.log())
        self.assertGreater(self.a.datapath_counter("captured_dns"), dns_before)
        requests = metric_value(self.a.metrics(), "istio_dns_requests_total")
        self.assertGreaterEqual(requests, 4)
        # Then the resolved address works through the mesh.
        self.talk(client, "%s:80" % ECHO_VIP, 64 * 1024)

    def test_other_names_are_forwarded_unchanged_and_truncation_falls_back_to_tcp(self):
        client = self.client
        out = self.dig(client, "+short", "outside.example")
        self.assertEqual(out.split(), ["192.0.2.7"], "%s\nupstream:\n%s\nproxy:\n%s" % (
            out, self.upstream.log()[-1500:], self.a.proxy.log()[-3000:]))
        # The proxy forwards from the pod's netns: the upstream sees the pod's address.
        wait_until("the forwarded query at the upstream",
                   lambda: self.upstream_saw("udp outside.example. A from %s" % client.ip), 5)
        out = self.dig(client, "+noedns", "big.example")  # UDP: TC set; dig retries over TCP
        self.assertIn("Truncated, retrying in TCP mode", out)
        self.assertEqual(out.count("IN\tA\t198.51.100."), 40, out)
        self.assertTrue(self.upstream_saw("tcp big.example. A from %s" % client.ip),
                        self.upstream.log())
        out = self.dig(client, "nosuch.example")
        self.assertIn("status: NXDOMAIN", out)
        # A silent upstream: SERVFAIL after --dns-upstream-timeout (2 s), not a hang.
        t0 = time.monotonic()
        out = self.dig(client, "+time=5", "slow.example")
        self.assertIn("status: SERVFAIL", out)
        self.assertLess(time.monotonic() - t0, 4.5)
        self.assertGreaterEqual(metric_value(self.a.metrics(),
                                             "istio_dns_upstream_failures_total"), 1)

    def test_a_pod_labelled_dns_capture_false_queries_its_resolver_directly(self):
        pod = self.cluster.add_pod("node-a", "shop", "no-dns", "default",
                                   labels={"app": "no-dns", "ambient.istio.io/dns-capture": "false"})
        wait_until("the agent to enroll the pod",
                   lambda: pod.ip in self.a.loader("status"), 10)
        status = self.a.loader("status")
        line = [ln for ln in status.splitlines() if pod.ip in ln]
        before = self.a.datapath_counter("captured_dns")
        out = self.dig(pod, "echo.shop.svc.cluster.local")
        # Not captured: the upstream answered, and it does not know the mesh's names.
        self.assertIn("status: NXDOMAIN", out, "%s\n%s" % (out, line))
        self.assertTrue(self.upstream_saw("udp echo.shop.svc.cluster.local. A from %s" % pod.ip))
        self.assertEqual(self.a.datapath_counter("captured_dns"), before)
        # Its TCP is still in the mesh.
        self.talk(pod, "%s:80" % ECHO_VIP, 4096)

    def test_malformed_packets_and_a_burst_of_10000_queries_leave_the_proxy_answering(self):
        client = self.client
        # Garbage, a header alone, a response instead of a query: from the pod, to port 53.
        program = r"""
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.5)
for junk in (b"\x00", b"\xff" * 40, struct.pack(">HHHHHH", 7, 0x8000, 1, 0, 0, 0)):
    s.sendto(junk, (sys.argv[1], 53))
def query(i, name=b"\x04echo\x04shop\x03svc\x07cluster\x05local\x00"):
    return struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0) + name + b"\x00\x01\x00\x01"
t0 = time.monotonic()
s.setblocking(False)
sent = 0
for i in range(10000):
    try:
        s.sendto(query(i), (sys.argv[1], 53))
        sent += 1
    except BlockingIOError:
        time.sleep(0.001)
    if time.monotonic() - t0 > 20:
        break
answers = 0
s.settimeout(0.5)
while True:
    try:
        s.recv(512)
        answers += 1
    except OSError:
        break
print("sent", sent, "answers", answers, "seconds", round(time.monotonic() - t0, 2))
"""
        out = client.sh(["/usr/bin/python3", "-c", program, UPSTREAM], timeout=60)
        self.assertIn("sent", out)
        sent = int(out.split()[1])
        self.assertGreaterEqual(sent, 5000, out)
        self.assertTrue(self.a.proxy.alive(), self.a.proxy.log()[-2000:])
        # Still answering, and what it refused is counted.
        wait_until("the proxy to answer again",
                   lambda: self.dig(client, "+short", "echo").split() == [ECHO_VIP], 10)
        self.assertTrue(self.upstream.alive())

    def test_a_malformed_tcp_query_is_refused_and_the_listener_keeps_serving(self):
        client = self.client
        program = r"""
import socket, struct, sys
s = socket.create_connection((sys.argv[1], 53), timeout=5)
s.sendall(struct.pack(">H", 3) + b"\x01\x02\x03")
try:
    data = s.recv(100)
except OSError as e:
    data = repr(e).encode()
print("got", len(data))
"""
        out = client.sh(["/usr/bin/python3", "-c", program, UPSTREAM], timeout=30)
        self.assertIn("got", out)
        out = self.dig(client, "+tcp", "+short", "echo.shop.svc.cluster.local")
        self.assertEqual(out.split(), [ECHO_VIP], out)


if __name__ == "__main__":
    main()
