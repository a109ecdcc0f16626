"""The base of the end-to-end tests on the simulated cluster (scripts/lib/cluster.py): each test
gets a cluster of its own (two node namespaces, each with its sockmesh-loader agent, sockmesh-proxy,
cgroup and bpffs pin root; pods made through the real CNI chain), removed afterwards even when
the test fails. Needs root; without it the tests are skipped loudly (exit 77), which scripts/test
turns into a failure under CI=true."""
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "lib"))

import cluster  # noqa: E402
from cluster import APP_PORT, ECHO_VIP, ECHO_VIP6, ClusterError, metric_value, wait_until  # noqa: E402,F401 (re-exported)

SKIP_EXIT = 77
__all__ = ["APP_PORT", "ECHO_VIP", "ECHO_VIP6", "ClusterCase", "ClusterError", "main", "metric_value",
           "preflight", "wait_until"]


def preflight():
    """Exit 77 with a loud reason when this machine cannot run the cluster."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (network namespaces, BPF and cgroups need it)")
    for name in ("sockmesh-proxy", "sockmesh-loader", "sockmesh-cni", "sockmesh-install-cni"):
        try:
            cluster.binary(name)
        except ClusterError as e:
            problems.append(str(e))
    for plugin in ("bridge", "host-local"):
        if not os.access("/usr/lib/cni/" + plugin, os.X_OK):
            problems.append("/usr/lib/cni/%s missing (containernetworking-plugins)" % plugin)
    if problems:
        sys.stderr.write("\n!!! SKIPPING the end-to-end cluster tests: %s\n\n" % "; ".join(problems))
        sys.exit(SKIP_EXIT)


class ClusterCase(unittest.TestCase):
    """setUp: a cluster with the demo's topology (cluster.demo_topology)."""

    drain_timeout_ms = 3000
    xds = False  # True: the proxies' mesh and certificates come from the fake istiod
    proxy_extra = ()  # more sockmesh-proxy flags
    dual_stack = False  # True: every pod, the node link and the service have IPv6 too

    def setUp(self):
        self.t0 = time.monotonic()
        self.cluster = cluster.Cluster(drain_timeout_ms=self.drain_timeout_ms, xds=self.xds,
                                       proxy_extra=self.proxy_extra,
                                       dual_stack=self.dual_stack)
        self.addCleanup(self.cluster.close)
        self.addCleanup(self.dump_logs_on_failure)
        self.cluster.up()
        self.pods = cluster.demo_topology(self.cluster)
        self.a, self.b = self.cluster.node("node-a"), self.cluster.node("node-b")
        self.client = self.pods["client"]

    def dump_logs_on_failure(self):
        outcome = getattr(self, "_outcome", None)
        failed = False
        if outcome is not None:
            result = getattr(outcome, "result", None)
            if result is not None:
                failed = any(t is self for t, _ in result.failures + result.errors)
        if failed or os.environ.get("SOCKMESH_E2E_SHOW_LOG"):
            for n in self.cluster.nodes:
                for proc in (n.proxy, n.agent):
                    if proc:
                        sys.stderr.write("---- %s %s (%s) ----\n%s\n" % (
                            n.name, proc.name, proc.log_path, proc.log()[-4000:]))

    # ---- helpers ----

    def talk(self, src, target, size=256 * 1024, **kw):
        """src's app sends size bytes to target and must get them back intact."""
        report = src.client(target, "--bytes", size, *self.extra(kw))
        self.assertTrue(report.get("ok"), "%s -> %s: %s" % (src, target, report))
        return report

    @staticmethod
    def extra(kw):
        out = []
        for k, v in kw.items():
            out += ["--" + k.replace("_", "-"), v]
        return out

    def access_lines(self, node, *needles, timeout=5):
        """Access-log lines of node's current proxy containing every needle (waits for one)."""
        def found():
            lines = [ln for ln in node.proxy.log().splitlines()
                     if " access " in ln and all(n in ln for n in needles)]
            return lines
        try:
            return wait_until("an access-log line with %s on %s" % (needles, node.name), found,
                              timeout)
        except ClusterError:
            return []

    def report_of(self, proc, timeout=60):
        """The JSON report a background podapp client prints last."""
        import json
        deadline = time.monotonic() + timeout
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(proc.alive(), "the client %s is still running after %ss (a hang)" % (
            proc.name, timeout))
        log = proc.log()
        for line in reversed(log.strip().splitlines()):
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and "ok" in report:
                return report
        self.fail("client %s printed no report; its output:\n%s" % (proc.name, log[-3000:]))


def main():
    preflight()
    unittest.main(verbosity=2)
