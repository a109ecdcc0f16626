#!/usr/bin/python3
"""End to end on two simulated nodes, when things stop: the proxy drained by SIGTERM and
restarted, the proxy killed mid-transfer, the node agent restarted and upgraded under load (one
upgrade resizes a pinned map), and a node whose proxy is down. Topology: cluster.demo_topology;
the proxies' drain deadline is 3 s. OwnerDies: the process that made a cluster is terminated or
killed."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from cluster_case import APP_PORT, ECHO_VIP, ClusterCase, cluster, main, wait_until


class Failures(ClusterCase):

    def stream(self, src, name, target, seconds, timeout=10):
        return src.client_process(name, target, "--stream-seconds", seconds, "--timeout", timeout)

    def wait_streaming(self, server_pod, client_pod, count=1):
        """Until server_pod's app has accepted count connections from client_pod."""
        wait_until("%d stream(s) from %s to reach %s" % (count, client_pod, server_pod),
                   lambda: server_pod.processes[0].log().count(
                       "accepted from %s:" % client_pod.ip) >= count, 10)

    def assert_fresh_traffic_flows(self):
        self.talk(self.client, "%s:80" % ECHO_VIP, 256 * 1024)
        self.talk(self.client, "%s:%d" % (self.pods["echo-a"].ip, APP_PORT), 256 * 1024)
        self.talk(self.pods["legacy-b"], "%s:%d" % (self.pods["echo-a"].ip, APP_PORT), 64 * 1024)

    def test_sigterm_drains_live_streams_within_the_deadline_and_a_restart_serves_again(self):
        deadline = self.drain_timeout_ms / 1000.0
        short = self.stream(self.client, "short", "%s:80" % ECHO_VIP, 2.0)
        long = self.stream(self.client, "long", "%s:%d" % (self.pods["echo-a"].ip, APP_PORT),
                           30.0)
        self.wait_streaming(self.pods["echo-b"], self.client)
        self.wait_streaming(self.pods["echo-a"], self.client)
        term = time.time()
        self.a.proxy.send(signal.SIGTERM)
        code = self.a.proxy.popen.wait(deadline + 5)
        stopped = time.time()
        self.assertEqual(code, 0, "the proxy did not exit cleanly after draining")
        self.assertLessEqual(stopped - term, deadline + 1.5, "drain overran its deadline")
        # The stream that ends within the deadline finished with every byte echoed.
        r = self.report_of(short, 15)
        self.assertTrue(r["ok"], "a stream inside the drain deadline broke: %s" % r)
        self.assertGreater(r["bytes"], 0)
        # The one that would outlast it was cut at the deadline, and its app heard of it.
        r = self.report_of(long, 20)
        self.assertFalse(r["ok"])
        self.assertLess(r["first_error_at"] - term, deadline + 2.0, "cut late: %s" % r)
        self.assertGreater(r["first_error_at"] - term, deadline - 1.0, "cut early: %s" % r)
        log = self.a.proxy.log()
        self.assertIn("draining", log)
        # A new proxy gets the pods again from the node agent (ZDS snapshot) and serves.
        self.a.start_proxy()
        self.assertIn("snapshot received: 2 pod(s)", self.a.proxy.log())
        self.assert_fresh_traffic_flows()

    def test_sigkill_mid_transfer_resets_the_apps_and_traffic_flows_once_it_is_back(self):
        live = self.stream(self.client, "live", "%s:80" % ECHO_VIP, 30.0, timeout=15)
        echo_b = self.pods["echo-b"]
        self.wait_streaming(echo_b, self.client)
        time.sleep(0.5)
        killed = time.time()
        self.a.proxy.send(signal.SIGKILL)
        r = self.report_of(live, 20)
        self.assertFalse(r["ok"])
        self.assertLess(r["first_error_at"] - killed, 3.0, "the app waited for its timeout: %s"
                        % r)
        self.assertRegex(r["errors"][0], r"^(reset|eof|broken-pipe)",
                         "not a reset: %s" % r["errors"])
        # The server app on the other node hears of it too (node-b closes the stream).
        wait_until("echo-b to see its connection end", lambda: "closed %s:" % self.client.ip in
                   echo_b.processes[0].log() or "ended" in echo_b.processes[0].log(), 10)
        self.a.start_proxy()
        self.assert_fresh_traffic_flows()

    def test_restarting_the_node_agents_under_load_breaks_no_connection(self):
        streams = [
            self.stream(self.client, "s1", "%s:80" % ECHO_VIP, 5.0),
            self.stream(self.client, "s2", "%s:%d" % (self.pods["echo-a"].ip, APP_PORT), 5.0),
            self.stream(self.pods["legacy-b"], "s3", "%s:%d" % (self.pods["echo-a"].ip,
                                                                APP_PORT), 5.0),
        ]
        self.wait_streaming(self.pods["echo-a"], self.client)
        self.wait_streaming(self.pods["echo-a"], self.pods["legacy-b"])
        for node in (self.a, self.b):
            self.assertEqual(node.agent.stop(signal.SIGTERM), 0)
            node.start_agent()
            self.assertIn("adopted enrolled pod", node.agent.log(),
                          "the new agent did not adopt %s's pods" % node.name)
        for s in streams:
            r = self.report_of(s, 20)
            self.assertTrue(r["ok"], "%s broke across the agent restart: %s" % (s.name, r))
        captured = self.a.datapath_counter("captured_outbound")
        self.assert_fresh_traffic_flows()
        self.assertEqual(self.a.datapath_counter("captured_outbound") - captured, 2,
                         "tc capture kept working across the restart")

    def tc_program_ids(self, pod):
        out = pod.sh(["tc", "filter", "show", "dev", "eth0", "ingress"])
        return set(re.findall(r"(?:\bid |:\[)(\d+)", out))  # "id N" or "name:[N]" by tc version

    def pinned_program_id(self, node, name):
        m = re.search(r"program %s: id (\d+)" % name, node.loader("status"))
        self.assertIsNotNone(m, "status shows no %s" % name)
        return m.group(1)

    def stream_through_node_a_and_stop_its_agent(self):
        """Two 4 s streams through node-a's pods (a tunnel from the client to the service on
        node-b; plaintext from legacy-b into echo-a), running when node-a's agent stops."""
        streams = [self.stream(self.client, "s1", "%s:80" % ECHO_VIP, 4.0),
                   self.stream(self.pods["legacy-b"], "s2", "%s:%d" % (self.pods["echo-a"].ip,
                                                                       APP_PORT), 4.0)]
        self.wait_streaming(self.pods["echo-b"], self.client)
        self.wait_streaming(self.pods["echo-a"], self.pods["legacy-b"])
        self.assertEqual(self.a.agent.stop(signal.SIGTERM), 0)
        return streams

    def assert_intact_across_the_upgrade(self, streams):
        for s in streams:
            r = self.report_of(s, 20)
            self.assertTrue(r["ok"], "%s broke across the upgrade: %s" % (s.name, r))

    def test_upgrading_the_node_agent_moves_running_pods_to_the_new_tc_programs(self):
        # An "upgrade" whose tc programs differ: the agent restarted with --fail-open (a knob
        # compiled into the programs), while connections stream through node-a's pods.
        old = self.pinned_program_id(self.a, "sm_tc_ingress")
        self.assertEqual(self.tc_program_ids(self.client), {old})
        streams = self.stream_through_node_a_and_stop_its_agent()
        self.a.start_agent(extra=["--fail-open"])
        new = self.pinned_program_id(self.a, "sm_tc_ingress")
        self.assertNotEqual(new, old, "the upgrade did not change the tc program")
        for name in ("client", "echo-a"):
            self.assertEqual(self.tc_program_ids(self.pods[name]), {new},
                             "%s still runs the old tc program" % name)
        self.assert_intact_across_the_upgrade(streams)
        self.assert_fresh_traffic_flows()

    def test_an_upgrade_that_resizes_a_map_keeps_the_streams_and_the_bypass(self):
        # An older build's sm_stack_flows (another max_entries, the rest alike): the new agent's
        # install replaces it, copies its entries and re-pins the programs that use it, while
        # connections stream through node-a; the proxy moves to the new map by itself.
        pin = os.path.join(self.a.pin_root, "sm_stack_flows")
        streams = self.stream_through_node_a_and_stop_its_agent()
        os.unlink(pin)
        cluster.run(["bpftool", "map", "create", pin, "type", "lru_hash", "key", "48", "value",
                     "4", "entries", "1024", "name", "sm_stack_flows"])
        # One flow pinned to the stack in the old map (a made-up 48-byte key): it must be in the
        # new one.
        key = ["%02x" % (i + 1) for i in range(48)]
        cluster.run(["bpftool", "map", "update", "pinned", pin, "key", "hex"] + key +
                    ["value", "hex", "01", "00", "00", "00"])
        self.a.start_agent()
        log = self.a.agent.log()
        self.assertIn("replaced map sm_stack_flows", log)
        self.assertIn("1 entries copied", log)
        self.assertIn("pinned program sm_sk_msg", log)
        shown = json.loads(cluster.run(["bpftool", "-j", "map", "show", "pinned", pin]))
        self.assertEqual(shown["max_entries"], 65536)
        kept = [e for e in self.a.bpftool_dump("sm_stack_flows")
                if e["formatted"]["key"]["netns"] == 0x0807060504030201]
        self.assertEqual(len(kept), 1, "the old map's entry is in the new map")
        self.assertFalse(os.path.exists(pin + "_replaced"))
        self.assert_intact_across_the_upgrade(streams)
        sends = self.a.datapath_counter("bypass_sends")
        self.assert_fresh_traffic_flows()
        self.assertGreater(self.a.datapath_counter("bypass_sends"), sends,
                           "new connections go through the bypass after the upgrade")

        def proxy_moved():  # it looks again on a new connection, at most every 250 ms
            self.talk(self.client, "%s:80" % ECHO_VIP, 4096)
            return ("bypass maps under %s were recreated by the loader" % self.a.pin_root
                    in self.a.proxy.log())
        wait_until("node-a's proxy to open the new bypass maps", proxy_moved, 10)

    def owner_api(self, node, state):
        """fake_owner_api.py in node's netns, and the agent arguments that point at it. Returns
        (args, state_file, request_log)."""
        d = os.path.join(node.dir, "owner-api")
        os.makedirs(d, exist_ok=True)
        state_file, request_log = os.path.join(d, "state"), os.path.join(d, "requests")
        with open(state_file, "w") as f:
            f.write(state)
        kubeconfig = os.path.join(d, "kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: t\n"
                    "clusters: [{name: t, cluster: {server: 'http://127.0.0.1:18443'}}]\n"
                    "users: [{name: t, user: {token: owner-token}}]\n"
                    "contexts: [{name: t, context: {cluster: t, user: t}}]\n")
        cluster.run(["nsenter", "--net=" + node.netns_path, "ip", "link", "set", "lo", "up"])
        api = cluster.Process("owner-api", [os.path.join(os.path.dirname(__file__),
                                                         "fake_owner_api.py"),
                                            "18443", state_file, request_log, "owner-token"],
                              netns=node.netns_path, log_path=os.path.join(d, "log"))
        self.addCleanup(api.stop, signal.SIGKILL)
        wait_until("the fake API in %s" % node.name, lambda: api.alive() and cluster.run(
            ["nsenter", "--net=" + node.netns_path, "curl", "-s", "-o", "/dev/null", "-w",
             "%{http_code}", "http://127.0.0.1:18443/"], check=False).strip() == "401", 10)
        args = ["--kubeconfig", kubeconfig, "--uninstall-when-removed",
                "istio-system/sockmesh-node"]
        return args, state_file, request_log

    def test_a_stopping_agent_removes_the_datapath_only_when_its_daemonset_is_gone(self):
        # The agent asks the API for its DaemonSet at SIGTERM: still there (an upgrade, a
        # restart) keeps every pod enrolled; gone (helm uninstall) unenrolls them and removes
        # the programs and pins. Labels still come from the local config (--labels-from config).
        a = self.a
        args, state_file, request_log = self.owner_api(a, "present")
        a.start_agent(extra=args)
        tc_ids = self.tc_program_ids(self.client)
        self.assertEqual(len(tc_ids), 1, tc_ids)
        self.assertEqual(a.agent.stop(signal.SIGTERM), 0, a.agent.log()[-2000:])
        self.assertIn("DaemonSet istio-system/sockmesh-node is still there", a.agent.log())
        self.assertEqual(self.tc_program_ids(self.client), tc_ids, "capture changed on a restart")
        self.assertTrue(os.listdir(a.pin_root), "pins gone on a restart")
        self.talk(self.client, "%s:80" % ECHO_VIP, 64 * 1024)  # still in the mesh, over HBONE

        a.start_agent(extra=args)
        with open(state_file, "w") as f:
            f.write("gone")
        self.assertEqual(a.agent.stop(signal.SIGTERM), 0, a.agent.log()[-3000:])
        log = a.agent.log()
        self.assertIn("this is an uninstall; removing the datapath", log)
        self.assertIn("datapath removed from %s" % a.pin_root, log)
        self.assertEqual(self.tc_program_ids(self.client), set(), "the client pod is still captured")
        self.assertEqual(self.tc_program_ids(self.pods["echo-a"]), set())
        left = os.listdir(a.pin_root) if os.path.isdir(a.pin_root) else []
        self.assertEqual(left, [], "pins left under %s" % a.pin_root)
        progs = cluster.run(["bpftool", "prog", "show"])
        for pid in tc_ids:
            self.assertNotRegex(progs, r"(?m)^%s:" % pid, "tc program %s still loaded" % pid)
        with open(request_log) as f:
            requests = [r for r in f.read().splitlines() if r != "/ "]  # the test's own probes
        self.assertEqual(requests, ["/apis/apps/v1/namespaces/istio-system/daemonsets/"
                                    "sockmesh-node Bearer owner-token"] * 2, requests)
        # Node B is untouched, and a pod of node A now talks without the mesh.
        self.assertEqual(len(self.tc_program_ids(self.pods["echo-b"])), 1)
        self.talk(self.client, "%s:%d" % (self.pods["legacy-b"].ip, APP_PORT), 64 * 1024)

    def test_a_probe_cgroup_that_cannot_be_resolved_is_retried_by_the_sweep_not_per_pod(self):
        # iptables-restore refuses a rule whose cgroup does not exist. The agent says so once and
        # tries again from its sweep (every 10 s), not after each enroll and unenroll: a node
        # whose kubelet runs elsewhere would otherwise run two failing execs per pod change.
        a = self.a
        wrappers = os.path.join(a.dir, "iptables-wrappers")
        calls = os.path.join(a.dir, "iptables-restore-calls")
        os.makedirs(wrappers, exist_ok=True)
        for tool in ("iptables-restore", "ip6tables-restore"):
            real = shutil.which(tool)
            self.assertTrue(real, "%s is not installed" % tool)
            with open(os.path.join(wrappers, tool), "w") as f:
                f.write("#!/bin/sh\necho %s >> %s\nexec %s \"$@\"\n" % (tool, calls, real))
            os.chmod(os.path.join(wrappers, tool), 0o755)
        env = dict(os.environ, PATH=wrappers + ":" + os.environ.get("PATH", ""))
        a.start_agent(extra=["--probe-cgroup", "sockmesh-no-such/kubelet.service"], env=env)

        def count():
            try:
                with open(calls) as f:
                    return len(f.read().split())
            except FileNotFoundError:
                return 0
        wait_until("the agent's first attempt at the probe rules", lambda: count() > 0, 10)
        self.assertIn("kubelet probes are not exempt from capture", a.agent.log())
        before, t0 = count(), time.monotonic()
        pods = [self.cluster.add_pod(a, "shop", "churn-%d" % i) for i in range(3)]
        for pod in pods:
            self.cluster.delete_pod(pod)
        after, elapsed = count(), time.monotonic() - t0
        # Six pod changes; at most the sweeps that fell in the window may have tried again
        # (one attempt runs each tool at most once).
        sweeps = int(elapsed // 10) + 1
        self.assertLessEqual(after - before, 2 * sweeps,
                             "%d iptables-restore runs in %.1f s for 6 pod changes" % (
                                 after - before, elapsed))
        self.assertEqual(a.agent.log().count("kubelet probes are not exempt from capture"), 1,
                         "the same failure was logged again")
        self.assert_fresh_traffic_flows()

    def second_agent(self, node, tag, zds_socket, extra=()):
        """Another `sockmesh-loader run` on node's run dir, as a second DaemonSet pod would be;
        its exit code and log once it has ended (it must end by itself)."""
        argv = list(node.agent.argv)
        argv[argv.index("--zds-socket") + 1] = zds_socket
        p = cluster.Process("agent-" + tag, argv + list(extra), netns=node.netns_path,
                            log_path=os.path.join(node.dir, "agent-%s.log" % tag))
        try:
            return p.popen.wait(10), p.log()
        except subprocess.TimeoutExpired:
            p.stop(signal.SIGKILL)
            self.fail("the second agent (%s) kept running:\n%s" % (tag, p.log()[-2000:]))

    def test_a_second_node_agent_stops_before_it_changes_anything(self):
        # Same ZDS socket: the first agent's proxy keeps its session.
        tc_program = self.pinned_program_id(self.a, "sm_tc_ingress")
        code, log = self.second_agent(self.a, "same-zds", self.a.zds_socket)
        self.assertEqual(code, 1, log)
        self.assertIn("another process serves ZDS on %s" % self.a.zds_socket, log)
        # Its own ZDS socket, the node's run dir: stopped by the CNI socket, before installing
        # (with --fail-open, an install would have replaced the pinned tc program).
        other_zds = os.path.join(self.a.dir, "second-zds.sock")
        code, log = self.second_agent(self.a, "same-run-dir", other_zds, ["--fail-open"])
        self.assertEqual(code, 1, log)
        self.assertIn("another process serves CNI events on %s" %
                      os.path.join(self.a.run_dir, "cni.sock"), log)
        self.assertFalse(os.path.exists(other_zds), "the second agent left its ZDS socket behind")
        self.assertEqual(self.pinned_program_id(self.a, "sm_tc_ingress"), tc_program,
                         "the second agent reinstalled the datapath")
        self.assertTrue(self.a.agent.alive())
        # The first agent still has its sockets, and traffic flows.
        self.assertTrue(os.path.exists(os.path.join(self.a.run_dir, "cni.sock")))
        self.assert_fresh_traffic_flows()

    def test_a_reinstall_that_recreates_the_maps_is_followed_by_the_running_proxy(self):
        # An upgrade that changes the maps' layout: the agent stopped, everything uninstalled
        # (maps, programs, links; records gone), the agent started again. The proxy keeps
        # running throughout and must move to the new maps.
        self.talk(self.client, "%s:80" % ECHO_VIP, 4096)
        self.assertEqual(self.a.agent.stop(signal.SIGTERM), 0)
        self.a.loader("uninstall", "--force")
        self.a.start_agent()
        wait_until("node-a's agent to enroll its pods again",
                   lambda: self.a.agent.log().count("enrolled running pod") >= 2, 15)
        wait_until("node-a's proxy to re-register its pods' listeners",
                   lambda: self.a.loader("status").count("outbound (15001)") >= 2, 15)
        self.assertIn("was recreated by the loader", self.a.proxy.log())
        self.assert_fresh_traffic_flows()
        # The certificate of the pod's identity still comes from the (new) workload map.
        self.assertTrue(self.access_lines(self.a, "direction=outbound",
                                          "src.identity=%s" % self.client.identity))

    def test_a_node_whose_proxy_is_down_gives_the_other_nodes_pods_a_fast_clear_failure(self):
        self.talk(self.client, "%s:80" % ECHO_VIP, 4096)
        self.b.proxy.stop(signal.SIGKILL)
        for target in ("%s:80" % ECHO_VIP, "%s:%d" % (self.pods["echo-b"].ip, APP_PORT)):
            r = self.client.client(target, "--bytes", 4096, "--timeout", 10)
            self.assertFalse(r["ok"], "reached %s with node-b's proxy down: %s" % (target, r))
            self.assertLess(r["elapsed"], 3.0, "the failure was slow: %s" % r)
            self.assertRegex(r["errors"][0], r"^(connect: )?(reset|eof|refused)", r)
        # node-a says what happened and to whom.
        lines = [ln for ln in self.a.proxy.log().splitlines()
                 if self.pods["echo-b"].ip in ln and ("refused" in ln or "failed" in ln)]
        self.assertTrue(lines, "node-a's proxy logged nothing about the failed dial")
        self.assertIn("15008", lines[-1])
        # The node's other traffic is untouched, and all is well once node-b is back.
        self.talk(self.client, "%s:%d" % (self.pods["echo-a"].ip, APP_PORT), 4096)
        self.b.start_proxy()
        self.assert_fresh_traffic_flows()


class OwnerDies(unittest.TestCase):
    """The process that made a cluster dies: by SIGTERM it removes the cluster itself; by SIGKILL
    the next cluster's sweep removes what it left."""

    OWNER = r"""
import sys
sys.path.insert(0, %r)
import cluster
c = cluster.Cluster()
c.up()
c.label_namespace("shop", True)
c.write_config(wait=True)
c.add_pod("node-a", "shop", "app", "default", labels={"app": "app"})
print(c.id, flush=True)
sys.stdin.read()  # until the test kills it
"""

    def start_owner(self):
        owner = subprocess.Popen(
            [cluster.PYTHON, "-c", self.OWNER % os.path.dirname(cluster.__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: owner.poll() is None and owner.kill())
        self.addCleanup(lambda: [f.close() for f in (owner.stdin, owner.stdout, owner.stderr)])
        cid = owner.stdout.readline().strip()  # the cluster's id, once it is up
        self.assertTrue(cid.startswith(cluster.PREFIX + "-%d-" % owner.pid),
                        "the owner printed %r; stderr: %s" % (cid, owner.stderr.read()[-3000:]
                                                              if not cid else ""))
        return owner, cid

    @staticmethod
    def leftovers(cid):
        found = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout.split() if n.startswith(cid)]
        for where in (cluster.cgroup2_mount(), cluster.bpffs_root(), tempfile.gettempdir()):
            if os.path.isdir(where):
                found += [os.path.join(where, n) for n in os.listdir(where)
                          if n.startswith(cid + "-") or n == cid]
        return found

    def test_sigterm_to_the_owner_removes_its_cluster(self):
        owner, cid = self.start_owner()
        self.assertNotEqual(self.leftovers(cid), [], "the cluster should be up")
        owner.send_signal(signal.SIGTERM)
        self.assertEqual(owner.wait(30), -signal.SIGTERM, "it still dies of the signal")
        self.assertEqual(self.leftovers(cid), [])

    def test_a_killed_owners_cluster_is_swept_by_the_next_one(self):
        owner, cid = self.start_owner()
        owner.kill()
        owner.wait(30)
        self.assertNotEqual(self.leftovers(cid), [], "SIGKILL leaves it behind")
        cluster.sweep_leftovers()
        self.assertEqual(self.leftovers(cid), [])


if __name__ == "__main__":
    main()
