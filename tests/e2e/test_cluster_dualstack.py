#!/usr/bin/python3
"""End to end on two simulated dual-stack nodes (#15): Cluster(dual_stack=True) gives every pod an
IPv4 and an IPv6 address through the same CNI chain (host-local with two ranges), the node link
and the pod routes both families, and the echo service a second VIP (fd00:10:96::20). IPv6 flows
through the whole datapath: tc capture in the pod, the proxy's in-pod IPv6 listeners, HBONE with
IPv6 outer addresses, inbound with the client's IPv6 source kept, policy on an IPv6 source, the
sockmap bypass, and the DNS proxy's AAAA answers. Topology: cluster.demo_topology."""
import json
import os
import subprocess
import time

from cluster_case import (APP_PORT, ECHO_VIP, ECHO_VIP6, ClusterCase, main, metric_value,
                          wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "lib")
TCPCHECK, PODAPP = os.path.join(LIB, "tcpcheck.py"), os.path.join(LIB, "podapp.py")
FQDN = "echo.shop.svc.cluster.local"


def v6(ip, port):
    return "[%s]:%d" % (ip, port)


class DualStack(ClusterCase):
    dual_stack = True
    # The DNS proxy answers the mesh's names; nothing here asks it for another one, so the
    # upstream (legacy-b, with no DNS server) is never used.
    proxy_extra = ("--dns-proxy", "on", "--dns-upstream", "10.244.2.11",
                   "--dns-upstream-timeout", "1s")

    def test_ipv6_pod_to_pod_same_node_fast_path_and_across_nodes_over_hbone_and_the_v6_vip(self):
        client = self.client
        echo_a, echo_b = self.pods["echo-a"], self.pods["echo-b"]
        self.assertTrue(client.ip6 and echo_b.ip6)
        out_a = self.a.datapath_counter("captured_outbound")
        bypass = self.a.datapath_counter("bypass_sends")

        # Same node: the same-node fast path (issue #16) over IPv6, authorized and logged as the
        # inbound side would, no tunnel; the app sees the client's IPv6 address.
        r = self.talk(client, v6(echo_a.ip6, APP_PORT), 512 * 1024)
        self.assertEqual(r["servers"], ["shop/echo-a"])
        self.assertEqual(r["seen_as"], [client.ip6])
        line = self.access_lines(self.a, "direction=inbound",
                                 "dst.addr=%s" % v6(echo_a.ip6, APP_PORT))
        self.assertTrue(line, "node-a's proxy logged no inbound line for echo-a's IPv6")
        self.assertIn("path=same-node", line[0])
        self.assertNotIn("dst.hbone_addr", line[0])
        self.assertIn("src.addr=[%s]:" % client.ip6, line[0])
        self.assertIn("src.identity=%s" % client.identity, line[0])

        # Across nodes, direct: HBONE over the node link with IPv6 outer addresses; tcpdump on
        # node-a's eth0 sees only TLS to [echo-b]:15008 between the two pods' IPv6 addresses.
        marker = "sockmesh-v6-marker-%d" % os.getpid()
        pcap = os.path.join(self.cluster.work, "link6.pcap")
        dump = subprocess.Popen(["nsenter", "--net=" + self.a.netns_path, "tcpdump", "-i", "eth0",
                                 "-U", "-s", "0", "-w", pcap, "ip6 and tcp"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until("tcpdump to start", lambda: os.path.exists(pcap), 10)
            time.sleep(0.3)
            r = self.talk(client, v6(echo_b.ip6, APP_PORT), 512 * 1024, text=marker)
            time.sleep(0.3)
        finally:
            dump.terminate()
            dump.wait(10)
        self.assertEqual(r["servers"], ["shop/echo-b"])
        self.assertEqual(r["seen_as"], [client.ip6])
        with open(pcap, "rb") as f:
            self.assertEqual(f.read().count(marker.encode()), 0, "plaintext on the node link")
        fields = subprocess.run(
            ["tshark", "-r", pcap, "-d", "tcp.port==15008,tls", "-Y",
             "ipv6.src==%s && ipv6.dst==%s" % (client.ip6, echo_b.ip6), "-T", "fields",
             "-e", "tcp.dstport", "-e", "tls.handshake.extensions_alpn_str"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60).stdout
        rows = [ln.split("\t") for ln in fields.splitlines() if ln.strip()]
        self.assertTrue(rows, "no IPv6 packet client -> echo-b on the node link")
        self.assertEqual({row[0] for row in rows}, {"15008"})
        self.assertIn("h2", {row[1] for row in rows if len(row) > 1}, "no ClientHello with h2")
        out = self.access_lines(self.a, "direction=outbound",
                                "dst.addr=%s" % v6(echo_b.ip6, APP_PORT))
        self.assertTrue(out, "node-a's proxy logged no outbound line to echo-b's IPv6")
        self.assertIn("dst.hbone_addr=%s" % v6(echo_b.ip6, 15008), out[0])
        inb = self.access_lines(self.b, "direction=inbound",
                                "dst.addr=%s" % v6(echo_b.ip6, APP_PORT))
        self.assertTrue(inb, "node-b's proxy logged no inbound line for echo-b's IPv6")
        self.assertIn("src.identity=%s" % client.identity, inb[0])
        self.assertIn("dst.identity=%s" % echo_b.identity, inb[0])

        # The service's IPv6 VIP: the proxy picks echo-b, the tunnel goes to its IPv6 address.
        r = self.talk(client, v6(ECHO_VIP6, 80), 256 * 1024)
        self.assertEqual(r["servers"], ["shop/echo-b"])
        self.assertEqual(r["seen_as"], [client.ip6])
        svc = self.access_lines(self.a, "direction=outbound", "dst.service=echo.shop.svc",
                                "dst.hbone_addr=%s" % v6(echo_b.ip6, 15008))
        self.assertTrue(svc, "no outbound line for the IPv6 VIP tunnelled to echo-b's IPv6")

        # Mesh -> outside the mesh over IPv6: captured, passed through as plain TCP.
        legacy_b = self.pods["legacy-b"]
        r = self.talk(client, v6(legacy_b.ip6, APP_PORT), 64 * 1024)
        self.assertEqual((r["servers"], r["seen_as"]), (["legacy/legacy-b"], [client.ip6]))
        plain = self.access_lines(self.a, "direction=outbound",
                                  "dst.addr=%s" % v6(legacy_b.ip6, APP_PORT))
        self.assertTrue(plain, "no outbound passthrough line to legacy-b's IPv6")
        self.assertNotIn("dst.hbone_addr", plain[0])

        # tc captured the four IPv6 SYNs; the app <-> proxy hops in the pods (IPv6 sockets on
        # both ends) took the sockmap bypass.
        self.assertEqual(self.a.datapath_counter("captured_outbound") - out_a, 4)
        self.assertGreater(self.a.datapath_counter("bypass_sends"), bypass)
        self.assertGreater(self.b.datapath_counter("bypass_sends"), 0)

        # IPv4 beside it, unchanged.
        r = self.talk(client, "%s:80" % ECHO_VIP, 64 * 1024)
        self.assertEqual(r["seen_as"], [client.ip])
        # The pods' records hold both addresses; the proxy registered listeners for both.
        status = self.a.loader("status")
        self.assertIn(client.ip6, status)
        self.assertIn("registered for %s,%s" % (client.ip, client.ip6), self.a.proxy.log())
        enrolled = {w["ip"] for w in self.a.config_dump()["enrolledWorkloads"]}
        self.assertLessEqual({client.ip6, echo_a.ip6}, enrolled)

    def test_a_deny_policy_on_an_ipv6_source_refuses_it_and_nothing_else(self):
        legacy_a, legacy_b, echo_a = self.pods["legacy-a"], self.pods["legacy-b"], self.pods["echo-a"]
        r = self.talk(legacy_b, v6(echo_a.ip6, APP_PORT), 4096)  # captured plaintext on 15006
        self.assertEqual(r["seen_as"], [legacy_b.ip6], "inbound plaintext keeps the v6 source")
        inb = self.access_lines(self.a, "direction=inbound", "src.addr=[%s]:" % legacy_b.ip6)
        self.assertTrue(inb, "no inbound plaintext line for legacy-b's IPv6")
        self.cluster.set_policies([{
            "name": "deny-legacy-b-v6", "namespace": "shop", "scope": "Namespace",
            "action": "Deny", "rules": [[[{"sourceIps": ["%s/128" % legacy_b.ip6]}]]]}])
        r = legacy_b.client(v6(echo_a.ip6, APP_PORT), "--bytes", 4096, "--timeout", 5)
        self.assertFalse(r["ok"], "the IPv6 Deny did not refuse legacy-b: %s" % r)
        self.assertLess(r["elapsed"], 5.0, "the refusal took the whole timeout: %s" % r)
        # The same pod over IPv4, and another pod over IPv6, are not that source.
        self.talk(legacy_b, "%s:%d" % (echo_a.ip, APP_PORT), 4096)
        self.talk(legacy_a, v6(echo_a.ip6, APP_PORT), 4096)
        denied = metric_value(self.a.metrics(), "istio_tcp_connections_closed_total",
                              response_flags="DENY")
        self.assertGreaterEqual(denied, 1, "node-a counted no DENY")
        # The kubelet's IPv6 probe: SNATed to istio-cni's IPv6 probe address, exempt from capture.
        exempt = self.a.datapath_counter("node_exempt")
        argv = ["/usr/bin/python3", PODAPP, "client", "--target", v6(echo_a.ip6, APP_PORT),
                "--bytes", "1024", "--timeout", "5"]
        probe = json.loads(self.a.kubelet_sh(argv, check=False).strip().splitlines()[-1])
        self.assertTrue(probe["ok"], "the kubelet's IPv6 probe failed: %s" % probe)
        self.assertEqual(probe["seen_as"], ["fd16:9254:7127:1337:ffff:ffff:ffff:ffff"])
        self.assertEqual(self.a.datapath_counter("node_exempt") - exempt, 1)

        # Deleting echo-a takes both families' records, listeners and policy routing with it
        # (looked at between sockmesh-cni's DEL and the bridge's, while the netns still exists).
        self.assertIn("fwmark", echo_a.sh(["ip", "-6", "rule"]), "no IPv6 rule while enrolled")
        self.assertIn("local default dev lo", echo_a.sh(["ip", "-6", "route", "show", "table",
                                                          "all"]))
        seen = {}

        def between(plugin):
            if plugin == "sockmesh-cni":
                seen["status"] = self.a.loader("status")
                seen["rules"] = echo_a.sh(["ip", "-6", "rule"]) + echo_a.sh(["ip", "rule"])
                seen["listening"] = echo_a.sh(["ss", "-Hltn"])
        self.cluster.delete_pod(echo_a, after_plugin=between)
        for ip in echo_a.ips:
            self.assertNotIn(ip + " ", seen["status"], "a record or listener of %s remains" % ip)
        self.assertIn(self.client.ip6, seen["status"], "the other pod must stay enrolled")
        self.assertNotIn("fwmark", seen["rules"], "policy routing stayed: %s" % seen["rules"])
        self.assertNotIn(":1500", seen["listening"], "a proxy listener stayed in the pod")

    def test_the_dns_proxy_answers_aaaa_for_the_service_over_both_families(self):
        client = self.client
        resolv = os.path.join(self.cluster.work, "pod-resolv.conf")
        with open(resolv, "w") as f:  # the pod's resolver: an IPv6 address, captured as any
            f.write("nameserver %s\nsearch shop.svc.cluster.local svc.cluster.local "
                    "cluster.local\noptions ndots:5 timeout:2 attempts:1\n" % self.pods[
                        "legacy-b"].ip6)
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'

        def resolve(*argv):
            return client.sh(["unshare", "-m", "sh", "-c", script, resolv] + list(argv),
                             check=False, timeout=30)
        before = self.a.datapath_counter("captured_dns")
        out = resolve("getent", "ahostsv6", FQDN)
        self.assertIn(ECHO_VIP6, out, "getent ahostsv6 %s: %s" % (FQDN, out))
        out = resolve("getent", "ahostsv6", "echo")  # the search path, over IPv6 to port 53
        self.assertIn(ECHO_VIP6, out, "getent ahostsv6 echo: %s" % out)
        # dig to the IPv4 and the IPv6 resolver address: AAAA and A per family, from the proxy.
        for server in (self.pods["legacy-b"].ip, self.pods["legacy-b"].ip6):
            out = client.sh(["dig", "+time=3", "+tries=1", "+short", "@" + server, "AAAA", FQDN],
                            check=False)
            self.assertEqual(out.split(), [ECHO_VIP6], "dig @%s AAAA: %s" % (server, out))
            out = client.sh(["dig", "+time=3", "+tries=1", "+short", "@" + server, "A", FQDN],
                            check=False)
            self.assertEqual(out.split(), [ECHO_VIP], "dig @%s A: %s" % (server, out))
        self.assertGreaterEqual(self.a.datapath_counter("captured_dns") - before, 6)
        # Then the answer works through the mesh.
        self.talk(client, v6(ECHO_VIP6, 80), 16 * 1024)

    def test_an_ipv6_abort_is_a_reset_through_the_mesh_as_without_it(self):
        """The server closes with the request unread (tcpcheck's abort): the client must see a
        reset, across nodes through HBONE as between two pods outside the mesh."""
        port = 9101
        for name in ("echo-b", "legacy-b"):
            pod = self.pods[name]
            pod.spawn("tcpcheck-abort", ["/usr/bin/python3", TCPCHECK, "serve", "--host", "::",
                                         "--port", str(port), "--mode", "abort", "--hold", "0.3"])
            wait_until("tcpcheck in %s" % pod, lambda: ":%d " % port in pod.sh(["ss", "-Hltn"]),
                       10)
        for src, dst in (("legacy-a", "legacy-b"), ("client", "echo-b")):
            out = self.pods[src].sh(["/usr/bin/python3", TCPCHECK, "client", "--target",
                                     v6(self.pods[dst].ip6, port), "--mode", "abort", "--bytes",
                                     str(64 * 1024)], check=False, timeout=30)
            report = json.loads(out.strip().splitlines()[-1])
            self.assertEqual(report.get("how"), "reset", "%s -> %s over IPv6: %s" % (
                src, dst, report))
        self.assertTrue(self.access_lines(self.b, "direction=inbound",
                                          "dst.addr=%s" % v6(self.pods["echo-b"].ip6, port)))

    def test_large_ipv6_streams_across_nodes_stay_captured_in_big_tcp_packets(self):
        """An app's IPv6 socket routes to its proxy with lo's MTU, so once its flow is on the stack
        TCP sends GSO packets of two 64K segments, which carry a Hop-by-Hop jumbo header before
        TCP (BIG TCP). tc must capture them like any other packet of the flow: before it stepped
        over that header, they went to the wire, their tail segments reached the real peer, and
        most 8 MiB echoes here were reset."""
        client, echo_b = self.client, self.pods["echo-b"]
        unknown = [n.datapath_counter("unknown_flow") for n in (self.a, self.b)]
        unparsed_before = [n.datapath_counter("unparsed") for n in (self.a, self.b)]
        for _ in range(3):
            r = self.talk(client, v6(echo_b.ip6, APP_PORT), 8 << 20)
            self.assertEqual(r["servers"], ["shop/echo-b"])
        # A stray packet may meet a socket that just closed (a retransmitted FIN); the escapes
        # were one or more per 8 MiB, and each drew a reset that failed the echo above.
        escaped = sum(n.datapath_counter("unknown_flow") - u
                      for n, u in zip((self.a, self.b), unknown))
        self.assertLessEqual(escaped, 2)
        # What tc cannot parse (ICMPv6, MLD) passes and is counted: a handful, not a stream's.
        unparsed = [n.datapath_counter("unparsed") - u
                    for n, u in zip((self.a, self.b), unparsed_before)]
        self.assertTrue(all(u < 100 for u in unparsed), unparsed)


if __name__ == "__main__":
    main()
