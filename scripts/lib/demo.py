#!/usr/bin/python3
"""The sockmesh demo on a simulated two-node cluster (run by scripts/demo, as root, once built).

Builds the cluster of scripts/lib/cluster.py (two node namespaces joined by a link; on each, the
node agent `sockmesh-loader run` and `sockmesh-proxy` in in-pod mode; pods made through the real
CNI chain: bridge + host-local, then sockmesh-cni), sends traffic, and prints what happened and
the evidence: the wire, access logs, metrics deltas, the workload map, the bypass counters.
  --keep   leave the cluster up and print how to poke at it (remove it with --down)
  --down   remove clusters left by --keep
  --ipv4-only  no IPv6 (by default the cluster is dual stack and step 5 adds one IPv6 flow; with
               --containers it is IPv4 only)
"""
import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as C  # noqa: E402

BOLD, DIM, GREEN, RED, RESET = "\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[0m"
if not sys.stdout.isatty():
    BOLD = DIM = GREEN = RED = RESET = ""
T0 = time.monotonic()
MiB = 1 << 20


def say(msg=""):
    print("  " + msg, flush=True)


def step(title):
    print("\n%s== [%5.1fs] %s%s" % (BOLD, time.monotonic() - T0, title, RESET), flush=True)


def good(msg):
    say("%s✔ %s%s" % (GREEN, msg, RESET))


class DemoFailed(Exception):
    pass


def check(condition, msg):
    if not condition:
        raise DemoFailed(msg)


def short_access(line):
    """The access-log line without its timestamp and with the fields a reader wants."""
    keep = ("src.addr", "src.identity", "dst.addr", "dst.hbone_addr", "dst.service",
            "dst.identity", "direction", "bytes_sent", "bytes_recv", "duration")
    fields = [f for f in line.split() if f.split("=")[0] in keep]
    return " ".join(fields)


def access(node, *needles):
    lines = []
    for _ in range(50):
        lines = [ln for ln in node.proxy.log().splitlines()
                 if " access " in ln and all(n in ln for n in needles)]
        if lines:
            break
        time.sleep(0.1)
    return lines


def flow(title, src, target, size, expect_server, **extra):
    args = ["--bytes", size]
    for k, v in extra.items():
        args += ["--" + k, v]
    r = src.client(target, *args)
    check(r.get("ok"), "%s failed: %s" % (title, r))
    check(r["servers"] == [expect_server], "%s reached %s" % (title, r["servers"]))
    good("%s: %d bytes echoed intact in %.0f ms; %s saw the client as %s" % (
        title, r["bytes"], r["elapsed"] * 1000, expect_server, ", ".join(r["seen_as"])))
    return r


def wire_capture(node):
    pcap = os.path.join(node.cluster.work, "node-link.pcap")
    p = subprocess.Popen(["nsenter", "--net=" + node.netns_path, "tcpdump", "-i", "eth0", "-U",
                          "-s", "0", "-w", pcap, "tcp"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    C.wait_until("tcpdump", lambda: os.path.exists(pcap), 10)
    time.sleep(0.3)
    return p, pcap


def tshark(pcap, *args):
    return subprocess.run(["tshark", "-r", pcap, "-d", "tcp.port==15008,tls"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          timeout=60).stdout


def demo(keep, containers=False, xds=False, dual_stack=True):
    step("1/8 the cluster: two nodes, each with its node agent and proxy")
    runtime = None
    if containers:
        # The chart's containers instead of the binaries: scripts/image builds the image, the
        # chart is rendered per node and its pod templates run under podman (chart_runtime).
        import chart_runtime
        image, summary = chart_runtime.build_image(prebuilt=False)
        say(summary)
        # With --xds the chart's ambient profile: xDS and certificates from the fake istiod.
        runtime = chart_runtime.ChartRuntime(image, values={"profile": "ambient"} if xds else None)
    c = C.Cluster(keep=keep, log=say, runtime=runtime, xds=xds, dual_stack=dual_stack)
    try:
        if runtime:
            # The ConfigMap sockmesh-config (key config.yaml) is the cluster's config file.
            c.config_path = os.path.join(c.work, "config.yaml")
            if xds:  # istiod's address, as an operator sets it when it is not the default
                runtime.values.update({"xdsAddress": c.istiod_address,
                                       "caAddress": c.istiod_address})
        c.up()
        a, b = c.node("node-a"), c.node("node-b")
        if runtime:
            ps = C.run(["podman", "ps", "--filter", "name=" + c.id, "--format",
                        "{{.Names}}\t{{.Image}}\t{{.Command}}"])
            for ln in sorted(ps.splitlines()):
                name, image_ref, command = (ln.split("\t") + ["", ""])[:3]
                say("container %-40s %s  %s" % (name.replace(c.id + "-", ""), image_ref,
                                                command[:60]))
        for n in c.nodes:
            say("%s: netns %s, cgroup %s, pin root %s" % (n.name, n.netns, n.cgroup, n.pin_root))
        if xds:
            for n in c.nodes:
                x = n.config_dump()["xds"]
                say("%s's proxy: mesh from %s over Delta xDS (synced %s, %d stream(s)), "
                    "certificates from its CA" % (n.name, c.istiod_address, x["synced"],
                                                  x["streams"]))
        say("CNI config of node-a after sockmesh-install-cni: plugins %s" % " -> ".join(
            p["type"] for p in a.conflist()["plugins"]))

        step("2/8 pods through the CNI chain; shop is labelled istio.io/dataplane-mode=ambient")
        pods = C.demo_topology(c)
        if xds:
            for n in c.nodes:
                for cert in n.config_dump()["certificates"]:
                    if cert.get("state") != "Available":
                        continue
                    leaf = cert["certChain"][0]
                    say("%s: certificate for %s from %s, serial %s, expires %s" % (
                        n.name, cert["identity"], n.config_dump()["certificateIssuer"],
                        leaf["serialNumber"][:16], leaf["expirationTime"]))
        client, echo_a, echo_b = pods["client"], pods["echo-a"], pods["echo-b"]
        legacy_a, legacy_b = pods["legacy-a"], pods["legacy-b"]
        for n in c.nodes:
            for ln in n.agent.log().splitlines():
                if " ADD " in ln:
                    say("%s agent: %s" % (n.name, ln.split(" agent ", 1)[-1]))
        say("service echo.shop.svc.cluster.local: VIP %s:80%s -> echo-b:8080" % (
            C.ECHO_VIP, " and [%s]:80" % C.ECHO_VIP6 if dual_stack else ""))

        step("3/8 the workload map on node-a, as bpftool shows it (BTF-typed records)")
        out = C.run(["bpftool", "map", "dump", "pinned", os.path.join(a.pin_root,
                                                                      "sm_workloads")])
        for ln in out.splitlines()[:30]:
            say(DIM + ln + RESET)
        check(client.identity.split("/sa/")[1] in out, "no record for the client's identity")

        before = {n.name: n.metrics() for n in c.nodes}
        step("4/8 pod -> pod on the same node (client -> echo-a: the same-node fast path, no HBONE)")
        flow("client -> %s:8080" % echo_a.ip, client, "%s:8080" % echo_a.ip, MiB, "shop/echo-a")
        for ln in access(a, "direction=inbound", "dst.addr=%s:8080" % echo_a.ip)[:1]:
            say("node-a access: " + short_access(ln))

        step("5/8 pod -> service VIP -> pod on the other node, with the node link captured")
        marker = "SOCKMESH-DEMO-PLAINTEXT-%d" % os.getpid()
        dump, pcap = wire_capture(a)
        try:
            flow("client -> %s:80 (echo VIP)" % C.ECHO_VIP, client, "%s:80" % C.ECHO_VIP, MiB,
                 "shop/echo-b", text=marker)
            if dual_stack:
                flow("IPv6: client -> [%s]:80 (echo's IPv6 VIP)" % C.ECHO_VIP6, client,
                     "[%s]:80" % C.ECHO_VIP6, 256 * 1024, "shop/echo-b", text=marker)
            time.sleep(0.3)
        finally:
            dump.terminate()
            dump.wait(10)
        for ln in access(a, "direction=outbound", "dst.service=echo")[:1]:
            say("node-a access: " + short_access(ln))
        for ln in access(b, "direction=inbound", "dst.addr=%s:8080" % echo_b.ip)[:1]:
            say("node-b access: " + short_access(ln))
        mesh = "ip.src==%s && ip.dst==%s" % (client.ip, echo_b.ip)
        ports = sorted(set(tshark(pcap, "-Y", mesh, "-T", "fields", "-e",
                                  "tcp.dstport").split()))
        alpn = sorted(set(tshark(pcap, "-Y", mesh + " && tls.handshake.type==1", "-T", "fields",
                                 "-e", "tls.handshake.extensions_alpn_str").split()))
        version = tshark(pcap, "-Y", "tls.handshake.type==2", "-T", "fields", "-e",
                         "tls.handshake.extensions.supported_version").split()
        records = tshark(pcap, "-Y", mesh + " && (tls.record.opaque_type==23 || "
                         "tls.record.content_type==23)", "-T", "fields",
                         "-e", "frame.number").split()
        with open(pcap, "rb") as f:
            clear = f.read().count(marker.encode())
        say("on the node link (tcpdump on node-a eth0, decoded by tshark):")
        say("  client -> echo-b packets went to port(s) %s" % ", ".join(ports))
        say("  ClientHello ALPN %s; ServerHello supported_version %s (TLS 1.3 = 0x0304)" % (
            ",".join(alpn), ",".join(sorted(set(version)))))
        say("  %d TLS application-data packets; the payload marker appears %d times in clear"
            % (len(records), clear))
        check(ports == ["15008"] and alpn == ["h2"] and "0x0304" in version and clear == 0,
              "the cross-node hop is not TLS 1.3 + h2 on 15008 without plaintext")
        good("the cross-node hop is mTLS 1.3, ALPN h2, to 15008, and carries no plaintext")
        if dual_stack:
            for ln in access(b, "direction=inbound", "src.addr=[%s]" % client.ip6)[:1]:
                say("node-b access: " + short_access(ln))
            mesh6 = "ipv6.src==%s && ipv6.dst==%s" % (client.ip6, echo_b.ip6)
            ports6 = sorted(set(tshark(pcap, "-Y", mesh6, "-T", "fields", "-e",
                                       "tcp.dstport").split()))
            alpn6 = sorted(set(tshark(pcap, "-Y", mesh6 + " && tls.handshake.type==1", "-T",
                                      "fields", "-e", "tls.handshake.extensions_alpn_str").split()))
            say("  IPv6 client -> echo-b packets went to port(s) %s, ClientHello ALPN %s" % (
                ", ".join(ports6), ",".join(alpn6)))
            check(ports6 == ["15008"] and alpn6 == ["h2"],
                  "the IPv6 flow did not cross as TLS + h2 to 15008")
            good("the IPv6 flow crossed the same way: HBONE between [%s] and [%s]:15008" % (
                client.ip6, echo_b.ip6))

        step("6/8 legacy pods (not in the mesh) -> a mesh pod: plaintext captured on 15006")
        in_before = a.datapath_counter("captured_inbound")
        flow("legacy-b (node-b) -> echo-a:8080", legacy_b, "%s:8080" % echo_a.ip, 256 * 1024,
             "shop/echo-a")
        for ln in access(a, "direction=inbound", "src.addr=%s" % legacy_b.ip)[:1]:
            say("node-a access: " + short_access(ln))
        say("node-a tc captured_inbound: +%d" % (a.datapath_counter("captured_inbound") - in_before))
        say("adding policy deny-legacy in namespace shop: Deny from %s/32" % legacy_b.ip)
        c.set_policies([{"name": "deny-legacy", "namespace": "shop", "scope": "Namespace",
                         "action": "Deny", "rules": [[[{"sourceIps": ["%s/32" % legacy_b.ip]}]]]}])
        r = legacy_b.client("%s:8080" % echo_a.ip, "--bytes", 4096, "--timeout", 5)
        check(not r.get("ok"), "legacy-b was not refused: %s" % r)
        good("legacy-b -> echo-a refused after the policy (%s, in %.0f ms)" % (
            r["errors"][0] if r.get("errors") else "?", r["elapsed"] * 1000))
        for ln in a.proxy.log().splitlines()[-40:]:
            if "deny-legacy" in ln:
                say("node-a log: " + ln.split(" ", 2)[-1][:200])
                break
        flow("legacy-a (node-a) -> echo-a:8080, still allowed", legacy_a, "%s:8080" % echo_a.ip,
             4096, "shop/echo-a")

        step("7/8 mesh pod -> legacy pod: captured, passed through as plain TCP")
        flow("client -> legacy-b %s:8080" % legacy_b.ip, client, "%s:8080" % legacy_b.ip,
             256 * 1024, "legacy/legacy-b")
        for ln in access(a, "direction=outbound", "dst.addr=%s:8080" % legacy_b.ip)[:1]:
            say("node-a access: " + short_access(ln))

        step("8/8 what the nodes counted during the demo (metrics deltas, :15020/metrics)")
        series = [("istio_tcp_connections_opened_total", {"reporter": "source"}),
                  ("istio_tcp_connections_opened_total", {"reporter": "destination"}),
                  ("istio_tcp_sent_bytes_total", {"reporter": "destination"}),
                  ("istio_tcp_connections_closed_total", {"response_flags": "DENY"}),
                  ("sockmesh_datapath_captured_outbound_total", {}),
                  ("sockmesh_datapath_captured_inbound_total", {}),
                  ("sockmesh_datapath_bypass_sends_total", {}),
                  ("sockmesh_datapath_bypass_misses_total", {}),
                  ("sockmesh_datapath_sockops_inserted_total", {})]
        after = {n.name: n.metrics() for n in c.nodes}
        say("%-62s %10s %10s" % ("series", "node-a", "node-b"))
        for name, labels in series:
            tag = name + ("{%s}" % ",".join('%s="%s"' % kv for kv in labels.items())
                          if labels else "")
            deltas = [C.metric_value(after[n], name, **labels) -
                      C.metric_value(before[n], name, **labels) for n in ("node-a", "node-b")]
            say("%-62s %10d %10d" % (tag, deltas[0], deltas[1]))
        check(a.datapath_counter("bypass_sends") > 0, "the sockmap bypass was never taken")
        good("the app <-> proxy hops in the pods went through the sockmap bypass")

        if keep:
            step("left running (--keep)")
            say("cluster %s, files in %s" % (c.id, c.work))
            # In the pod's netns AND its cgroup, as the pod's own processes run: a process in
            # the netns alone is outside the cgroup where sockops runs, so it gets no bypass.
            say("a shell in a pod:     %s" % client.shell_command("bash"))
            say("send from the client: %s" % client.shell_command(
                "/usr/bin/python3 %s client --target %s:80" % (C.PODAPP, C.ECHO_VIP)))
            say("admin of node-a:      nsenter --net=%s curl -s localhost:15000/config_dump"
                % a.netns_path)
            say("metrics of node-b:    nsenter --net=%s curl -s localhost:15020/metrics"
                % b.netns_path)
            say("maps of node-a:       bpftool map dump pinned %s/sm_workloads" % a.pin_root)
            say("datapath of node-a:   %s --pin-root %s status" % (C.binary("sockmesh-loader"),
                                                                  a.pin_root))
            say("logs:                 %s/node-*/proxy-1.log, agent-1.log" % c.work)
            say("remove it:            scripts/demo --down")
        else:
            step("done: removing the cluster")
    except BaseException:
        if not c.closed:
            for n in c.nodes:
                if n.proxy:
                    sys.stderr.write("---- %s proxy log (tail) ----\n%s\n" % (
                        n.name, n.proxy.log()[-2500:]))
        keep = False
        raise
    finally:
        if not keep:
            c.close()
            say("removed: namespaces, cgroups, pin roots, processes, files")


def main(argv):
    p = argparse.ArgumentParser(description="sockmesh demo on a simulated two-node cluster")
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    p.add_argument("--down", action="store_true", help="remove clusters left by --keep")
    p.add_argument("--xds", action="store_true",
                   help="the proxies take the mesh over Delta xDS and their certificates from a "
                        "fake istiod built from proto/ (it follows the topology's config file)")
    p.add_argument("--containers", action="store_true",
                   help="run the image built by scripts/image as the chart's DaemonSets describe")
    p.add_argument("--ipv4-only", action="store_true",
                   help="no IPv6 addresses (the default cluster is dual stack, with one IPv6 flow)")
    args = p.parse_args(argv)
    if args.containers and args.keep:
        print("--containers and --keep do not go together (--down does not remove containers)",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("scripts/demo needs root: it builds network namespaces, loads BPF programs and "
              "makes cgroups (run it with sudo)", file=sys.stderr)
        return 1
    if args.down:
        ids = C.tear_down_kept(log=say)
        say("removed %d cluster(s)" % len(ids) if ids else "no kept cluster found")
        return 0
    # Ctrl-C and SIGTERM both unwind through the cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    dual_stack = not (args.ipv4_only or args.containers)
    if dual_stack and not os.path.isdir("/proc/sys/net/ipv6"):
        say("this kernel has IPv6 off (no /proc/sys/net/ipv6): the cluster is IPv4 only")
        dual_stack = False
    try:
        demo(args.keep, args.containers, args.xds, dual_stack=dual_stack)
    except KeyboardInterrupt:
        print("\ninterrupted; the cluster was removed", file=sys.stderr)
        return 130
    except (DemoFailed, C.ClusterError) as e:
        print("\n%sDEMO FAILED: %s%s" % (RED, e, RESET), file=sys.stderr)
        return 1
    print("\n%sdemo finished in %.0f s%s" % (BOLD, time.monotonic() - T0, RESET))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
