#!/usr/bin/python3
"""The proxy DaemonSet's upgrade, with the image: what the chart's updateStrategy (maxSurge 1,
maxUnavailable 0) makes a kubelet do on one node, run from the rendered manifest with podman on
the simulated cluster (scripts/lib/podspec.py, scripts/lib/chart_runtime.py).

Node-a runs proxy pod v1 (the default profile). The client pod holds connections through it
(to echo-b across nodes via the service VIP, and to echo-a on the same node) and keeps opening
new ones (tests/deploy/surge_client.py). The surge pod v2 starts beside v1 from the same
manifest with a new tag (its own pod netns and name, as a second pod of the DaemonSet), takes
the pods from the agent over ZDS and the listener map's slots (SO_REUSEPORT). Once v2 is ready
the kubelet's part: SIGTERM to v1, SIGKILL if it is still there after the manifest's
terminationGracePeriodSeconds. Half of the held connections end (cleanly) halfway through v1's
drain deadline (--drain-timeout-ms from the manifest), the other half carry on.

It asserts: no new connection fails or waits for a SYN retransmission from v2's start until
after v1 is gone; v1 exits by itself within its drain deadline (before the SIGKILL); the held
connections that end within the deadline are all intact, the ones that outlast it are all cut
at it (OPERATING 6.4 says so); after v1 is gone the datapath is in place (pins, sockops on the
node's cgroup, both pods enrolled with their listeners registered) and traffic flows through
v2. Needs root, podman and helm (scripts/setup); exits 77 without them."""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "scripts", "lib"))

import cluster  # noqa: E402
from chart_runtime import ChartRuntime, build_image, run_manifest_tests  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, PYTHON, run, wait_until  # noqa: E402

SURGE_CLIENT = os.path.join(HERE, "surge_client.py")
HOLD_PER_KIND = 2  # held connections per target and group: 2 targets x 2 groups x 2 = 8


def arg(args, name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))


def in_netns(netns_path, argv):
    return run(["nsenter", "--net=" + netns_path] + argv, check=False, timeout=15)


class UpgradeSurge(unittest.TestCase):
    def test_a_surge_pod_takes_over_and_the_old_one_drains(self):
        image, summary = build_image()
        sys.stdout.write(summary + "\n")
        say = lambda m: sys.stdout.write("  %s\n" % m)  # noqa: E731
        repo, _, tag = image.rpartition(":")
        new_tag = tag + "-upgrade"
        run(["podman", "tag", image, "%s:%s" % (repo, new_tag)])
        self.addCleanup(subprocess.run, ["podman", "untag", image, "%s:%s" % (repo, new_tag)],
                        capture_output=True, timeout=60)
        rt = ChartRuntime(image, values={"node.labelsFrom": "config"})
        with cluster.Cluster(runtime=rt, log=say) as c:
            c.config_path = os.path.join(c.work, "config.yaml")
            c.up()
            a = c.nodes[0]
            pods = cluster.demo_topology(c)
            client, echo_a, echo_b = pods["client"], pods["echo-a"], pods["echo-b"]

            # What the manifest says about the upgrade.
            ds = rt.render(a)["sockmesh"]
            self.assertEqual(ds["spec"]["updateStrategy"], {
                "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
            spec = ds["spec"]["template"]["spec"]
            grace = int(spec["terminationGracePeriodSeconds"])
            drain = int(arg(spec["containers"][0]["args"], "--drain-timeout-ms")) / 1000.0
            self.assertLess(drain, grace, "the drain must end before the kubelet's SIGKILL")
            say("manifest: maxSurge 1, maxUnavailable 0; terminationGracePeriodSeconds %d, "
                "--drain-timeout-ms %d" % (grace, drain * 1000))

            # Connections held through v1, and new ones all along.
            v1 = a.proxy
            vip, direct = "%s:80" % ECHO_VIP, "%s:%d" % (echo_a.ip, APP_PORT)
            ctl = os.path.join(c.work, "surge-control")
            os.makedirs(ctl)
            holds = []
            for group in ("short", "long"):
                for target in (vip, direct):
                    holds += ["--hold", "%s=%s" % (group, target)] * HOLD_PER_KIND
            n_held = len(holds) // 2
            holder = client.spawn("surge", [PYTHON, SURGE_CLIENT, "--control", ctl,
                                            "--probe", vip, "--interval", "0.05",
                                            "--max-seconds", "90"] + holds)
            wait_until("%d connections held through v1" % n_held, lambda: len(
                [f for f in os.listdir(ctl) if f.startswith("held-")]) == n_held or
                not holder.alive(), 20)
            self.assertTrue(holder.alive(), holder.log()[-2000:])

            # The surge pod: the same manifest, a new tag.
            t_surge = time.time()
            v2 = rt.start_proxy(a, revision=2, extra={"tag": new_tag})
            self.addCleanup(v2.stop, signal.SIGKILL, 5)
            v2_image = rt.render(a, {"tag": new_tag})["sockmesh"]["spec"]["template"]["spec"][
                "containers"][0]["image"]
            self.assertEqual(v2_image, "%s:%s" % (repo, new_tag))
            wait_until("v2 to be ready (15021 in its own pod netns)", lambda: in_netns(
                v2.netns_path, ["curl", "-s", "--max-time", "2",
                                "http://127.0.0.1:15021/healthz/ready"]) == "ready\n" or
                not v2.alive(), 30)
            self.assertTrue(v2.alive(), v2.log()[-3000:])
            t_ready = time.time()
            self.assertIn("snapshot received: 2 pod(s)", v2.log())
            # New connections now go to v2 (its access log), while v1 still runs.
            wait_until("v2 to carry new connections", lambda: "dst.hbone_addr=%s:15008" %
                       echo_b.ip in v2.log(), 10)
            self.assertTrue(v1.alive())
            time.sleep(1.0)  # an overlap with both running

            # The kubelet: SIGTERM to v1, SIGKILL after terminationGracePeriodSeconds.
            t_term = time.time()
            v1.send(signal.SIGTERM)
            time.sleep(drain / 2)
            open(os.path.join(ctl, "end-short"), "w").close()
            t_end_short = time.time()
            killed = not wait_until_or_not(lambda: not v1.alive(), t_term + grace - time.time())
            t_gone = time.time()
            v1_log = v1.log()
            code = v1.stop(signal.SIGKILL, timeout=5)
            a.proxy, a.proxy_netns_path = v2, v2.netns_path
            time.sleep(1.5)  # new connections after v1 is gone
            open(os.path.join(ctl, "stop"), "w").close()
            wait_until("the surge client to report", lambda: not holder.alive(), 20)
            report = json.loads(holder.log().strip().splitlines()[-1])
            say("v2 ready %.2f s after its start; v1 exited %.2f s after SIGTERM (exit %s%s)" % (
                t_ready - t_surge, t_gone - t_term, code, ", SIGKILLed" if killed else ""))

            self.assertFalse(killed, "v1 was still draining at the grace period's end:\n" +
                             v1_log[-3000:])
            self.assertEqual(code, 0, v1_log[-3000:])
            self.assertLessEqual(t_gone - t_term, drain + 1.5, "v1 drained past its deadline")
            self.assertIn("draining", v1_log)

            # New connections: every one from v2's start until after v1 left worked, at once.
            during = [p for p in report["probes"] if t_surge <= p[0] <= t_gone + 1.0]
            failed = [p for p in during if not p[1]]
            slow = [p for p in during if p[1] and p[2] >= 900]
            say("new connections during the overlap: %d, failed %d, connect() max %.1f ms" % (
                len(during), len(failed), max([p[2] for p in during if p[1]] or [0])))
            self.assertGreaterEqual(len(during), 20, report["probes"][-5:])
            self.assertEqual(failed, [], "new connections failed during the hand-over")
            self.assertEqual(slow, [], "connect() waited for a SYN retransmission")

            # Held connections: the ones that ended within the drain deadline are intact, the
            # ones that outlast it are cut at it.
            short = [h for h in report["held"] if h["group"] == "short"]
            long_ = [h for h in report["held"] if h["group"] == "long"]
            kept = [h for h in short if h["ok"] and t_term < h["ended_at"] < t_term + drain]
            cut = [h for h in long_ if not h["ok"] and
                   t_term + drain - 1.0 <= h["error_at"] <= t_term + grace]
            say("held through v1: %d ended within the drain deadline, %d intact; %d outlasted "
                "it, %d cut at it (%.1f-%.1f s after SIGTERM; %s)" % (
                    len(short), len(kept), len(long_), len(cut),
                    min([h["error_at"] - t_term for h in cut] or [0]),
                    max([h["error_at"] - t_term for h in cut] or [0]),
                    ", ".join(sorted({str(h["error"]) for h in long_}))))
            self.assertEqual(len(kept), len(short), json.dumps(short))
            self.assertEqual(len(cut), len(long_), json.dumps(long_))
            self.assertTrue(all(h["pings"] > 0 for h in report["held"]))
            self.assertTrue(t_end_short < t_term + drain)

            # The datapath after v1 is gone: pins, sockops, both pods enrolled and served by v2.
            status = a.agent.exec("sockmesh-loader", "--pin-root", a.pin_root, "status")
            self.assertIn(client.ip, status)
            self.assertIn(echo_a.ip, status)
            self.assertEqual(status.count("outbound (15001)"), 2, status)
            dump = json.loads(a.agent.exec("bpftool", "-j", "map", "dump", "pinned",
                                           os.path.join(a.pin_root, "sm_workloads")))
            self.assertEqual(len(dump), 2, dump)
            cg = run(["bpftool", "cgroup", "show", a.cgroup], check=False)
            self.assertIn("sock_ops", cg)
            self.assertTrue(os.path.exists(os.path.join(a.pin_root, "sm_listeners")))
            self.assertGreaterEqual(a.agent.log().count("a proxy connected"), 2)

            # Traffic through v2 only.
            for target, server in ((vip, "shop/echo-b"), (direct, "shop/echo-a")):
                r = client.client(target, "--bytes", 1 << 20, "--timeout", 20)
                self.assertTrue(r.get("ok") and r.get("servers") == [server], "%s: %s\nv2:\n%s"
                                % (target, r, v2.log()[-3000:]))
            d = a.config_dump()   # v2's admin port, in its netns
            self.assertTrue(d.get("workloads"))


def wait_until_or_not(condition, timeout):
    deadline = time.monotonic() + max(0.0, timeout)
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def main():
    run_manifest_tests("upgrade-surge")


if __name__ == "__main__":
    main()
