"""The Helm chart (manifests/charts/sockmesh): helm lint, helm template for each profile and for
value overrides, every rendered object validated against the Kubernetes schemas
(kubernetes-models), and assertions on what matters: privileges, mounts and their propagation,
probes and ports, RBAC, env names, and that every flag the chart passes exists in the binary.
Needs helm and kubernetes-models from scripts/setup (in $SOCKMESH_TOOLS, /opt/sockmesh-tools);
exits 77 (skipped) without them."""
import json
import os
import re
import subprocess
import sys
import unittest

import yaml

SOURCE = os.environ.get("SOCKMESH_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUILD = os.environ.get("SOCKMESH_BUILD_DIR", os.path.join(SOURCE, "build"))
TOOLS = os.environ.get("SOCKMESH_TOOLS", "/opt/sockmesh-tools")
HELM = os.path.join(TOOLS, "bin", "helm")
CHART = os.path.join(SOURCE, "manifests", "charts", "sockmesh")
VALIDATE = os.path.join(SOURCE, "scripts", "lib", "chart-tools", "validate.mjs")
BINARIES = {"sockmesh-proxy": "userspace/sockmesh-proxy", "sockmesh-loader": "loader/sockmesh-loader",
            "sockmesh-install-cni": "cni/sockmesh-install-cni"}
DOWNWARD = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
            "NODE_NAME": "spec.nodeName", "INSTANCE_IP": "status.podIP",
            "SERVICE_ACCOUNT": "spec.serviceAccountName"}


def helm(*args, check=True):
    r = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError("helm %s failed: %s" % (" ".join(args), r.stderr))
    return r


def render(*sets):
    args = ["template", "sm", CHART, "-n", "istio-system"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def find(objs, kind, name):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError("no %s/%s in %s" % (kind, name, [(o["kind"], o["metadata"]["name"])
                                                         for o in objs]))


def container(ds, name):
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def mounts(ds, c):
    """mountPath -> (volume, propagation)."""
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: (vols[m["name"]], m.get("mountPropagation", "None"))
            for m in c.get("volumeMounts", [])}


def caps(c):
    sc = c["securityContext"]
    return sc.get("privileged", False), sorted(sc.get("capabilities", {}).get("add", [])), \
        sc.get("capabilities", {}).get("drop", [])


class ChartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.help = {}
        for name, rel in BINARIES.items():
            r = subprocess.run([os.path.join(BUILD, rel), "--help"], capture_output=True,
                               text=True, timeout=10)
            cls.help[name] = r.stdout + r.stderr

    def validate(self, objs):
        r = subprocess.run(["node", VALIDATE], input=json.dumps(objs), capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, SOCKMESH_TOOLS=TOOLS))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("\nok ") + r.stdout.startswith("ok "), len(objs), r.stdout)

    def test_lint_each_profile(self):
        for profile in ("default", "ambient"):
            out = helm("lint", CHART, "--set", "profile=" + profile, "--strict").stdout
            self.assertIn("0 chart(s) failed", out)

    def test_unknown_profile_is_refused(self):
        r = helm("template", "sm", CHART, "--set", "profile=nope", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('profile "nope" does not exist', r.stderr)

    def test_every_object_validates(self):
        for sets in ([], ["profile=ambient"], ["node.privileged=false"],
                     ["hub=registry.example/mesh", "tag=9.9.9", "logLevel=debug"],
                     ["cni.uninstallOnExit=false", "node.captureNodeTraffic=true"],
                     ["excludeNamespaces={kube-system,istio-system}", "env.FOO=bar"]):
            with self.subTest(sets=sets):
                objs = render(*sets)
                self.assertEqual(sorted((o["kind"], o["metadata"]["name"]) for o in objs), [
                    ("ClusterRole", "sockmesh-node"), ("ClusterRoleBinding", "sockmesh-node"),
                    ("ConfigMap", "sockmesh-config"), ("DaemonSet", "sockmesh"),
                    ("DaemonSet", "sockmesh-node"), ("Role", "sockmesh-node"),
                    ("RoleBinding", "sockmesh-node"), ("ServiceAccount", "sockmesh"),
                    ("ServiceAccount", "sockmesh-node")])
                self.validate(objs)

    def test_flags_exist_in_the_binaries(self):
        for sets in ([], ["profile=ambient"], ["node.captureNodeTraffic=true"]):
            objs = render(*sets)
            for ds in (find(objs, "DaemonSet", "sockmesh"), find(objs, "DaemonSet", "sockmesh-node")):
                for c in ds["spec"]["template"]["spec"]["containers"]:
                    program = c["command"][0]
                    self.assertIn(program, self.help, c["name"])
                    for arg in c["args"]:
                        if not arg.startswith("--"):
                            self.assertEqual((program, arg), ("sockmesh-loader", "run"))
                            continue
                        flag = arg.split("=", 1)[0]
                        self.assertRegex(self.help[program], r"(^|\s|\[)%s[\s\]]" % re.escape(flag),
                                         "%s has no %s" % (program, flag))

    def test_proxy_daemonset(self):
        objs = render()
        ds = find(objs, "DaemonSet", "sockmesh")
        spec = ds["spec"]["template"]["spec"]
        c = container(ds, "proxy")
        self.assertEqual(c["command"], ["sockmesh-proxy"])
        self.assertEqual(c["image"], "sockmesh:0.1.0")
        self.assertEqual(caps(c), (False, ["BPF", "NET_ADMIN", "SYS_ADMIN"], ["ALL"]))
        self.assertFalse(spec.get("hostNetwork", False), "the proxy surges: it needs its own netns")
        self.assertEqual(spec["priorityClassName"], "system-node-critical")
        self.assertIn({"operator": "Exists"}, spec["tolerations"])
        self.assertEqual(ds["spec"]["updateStrategy"]["rollingUpdate"],
                         {"maxSurge": 1, "maxUnavailable": 0})
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/healthz/ready", "port": 15021})
        self.assertIn("livenessProbe", c)
        self.assertEqual({p["containerPort"] for p in c["ports"]}, {15008, 15020, 15021})
        grace = spec["terminationGracePeriodSeconds"]
        self.assertIn("--drain-timeout-ms=%d" % ((grace - 5) * 1000), c["args"])
        env = {e["name"]: e for e in c["env"]}
        for name, path in DOWNWARD.items():
            self.assertEqual(env[name]["valueFrom"]["fieldRef"]["fieldPath"], path)
        self.assertNotIn("CA_ADDRESS", env)
        m = mounts(ds, c)
        self.assertEqual(m["/sys/fs/bpf"][1], "HostToContainer")
        self.assertEqual(m["/sys/fs/bpf"][0]["hostPath"]["path"], "/sys/fs/bpf")
        self.assertEqual(m["/var/run/ztunnel"][0]["hostPath"]["path"], "/var/run/ztunnel")
        self.assertIn("--zds-socket=/var/run/ztunnel/ztunnel.sock", c["args"])
        token = m["/var/run/secrets/tokens"][0]["projected"]["sources"][0]["serviceAccountToken"]
        self.assertEqual((token["audience"], token["path"]), ("istio-ca", "istio-token"))
        self.assertEqual(m["/etc/sockmesh"][0]["configMap"]["name"], "sockmesh-config")

    def test_node_daemonset(self):
        ds = find(render(), "DaemonSet", "sockmesh-node")
        spec = ds["spec"]["template"]["spec"]
        self.assertTrue(spec["hostNetwork"])
        self.assertTrue(spec["hostPID"])
        self.assertEqual(spec["priorityClassName"], "system-node-critical")
        agent, cni = container(ds, "agent"), container(ds, "install-cni")
        self.assertEqual(agent["command"], ["sockmesh-loader"])
        self.assertTrue(agent["securityContext"]["privileged"])
        m = mounts(ds, agent)
        self.assertEqual(m["/sys/fs/bpf"][1], "Bidirectional")
        self.assertEqual(m["/host/sys/fs/cgroup"][0]["hostPath"]["path"], "/sys/fs/cgroup")
        self.assertIn("--cgroup=/host/sys/fs/cgroup", agent["args"])
        self.assertEqual(m["/var/run/netns"][1], "HostToContainer")
        self.assertEqual(m["/var/run/sockmesh"][0]["hostPath"]["path"], "/var/run/sockmesh")
        self.assertEqual(caps(cni), (False, [], ["ALL"]))
        self.assertFalse(cni["securityContext"]["allowPrivilegeEscalation"])
        cm = mounts(ds, cni)
        self.assertEqual(cm["/host/opt/cni/bin"][0]["hostPath"]["path"], "/opt/cni/bin")
        self.assertEqual(cm["/host/etc/cni/net.d"][0]["hostPath"]["path"], "/etc/cni/net.d")
        self.assertIn("--agent-socket=/var/run/sockmesh/cni.sock", cni["args"])
        self.assertIn("--uninstall-on-exit", cni["args"])
        self.assertIn("--exclude-namespaces=kube-system", cni["args"])
        env = {e["name"]: e for e in agent["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")

        # Without privileged: exactly the capabilities the agent uses, and no Bidirectional
        # mount (Kubernetes refuses it outside privileged containers).
        ds = find(render("node.privileged=false", "cniBinDir=/home/kubernetes/bin"),
                  "DaemonSet", "sockmesh-node")
        agent = container(ds, "agent")
        self.assertEqual(caps(agent), (False, ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"], ["ALL"]))
        self.assertEqual(mounts(ds, agent)["/sys/fs/bpf"][1], "HostToContainer")
        self.assertEqual(mounts(ds, container(ds, "install-cni"))["/host/opt/cni/bin"][0]
                         ["hostPath"]["path"], "/home/kubernetes/bin")

    def test_rbac_reads_pods_and_namespaces_only(self):
        objs = render()
        roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
        self.assertEqual([(r["kind"], r["metadata"]["name"]) for r in roles],
                         [("ClusterRole", "sockmesh-node"), ("Role", "sockmesh-node")])
        rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
                       for r in roles[0]["rules"])
        self.assertEqual(rules, [(("",), ("namespaces",), ("list", "watch")),
                                 (("",), ("pods",), ("get", "list", "watch"))])
        # The uninstall check: get on its own DaemonSet, in the release's namespace, nothing else.
        self.assertEqual(roles[1]["metadata"]["namespace"], "istio-system")
        self.assertEqual(roles[1]["rules"], [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                                              "resourceNames": ["sockmesh-node"],
                                              "verbs": ["get"]}])
        self.assertEqual(find(objs, "RoleBinding", "sockmesh-node")["subjects"],
                         [{"kind": "ServiceAccount", "name": "sockmesh-node",
                           "namespace": "istio-system"}])
        agent = container(find(objs, "DaemonSet", "sockmesh-node"), "agent")
        self.assertIn("--uninstall-when-removed=istio-system/sockmesh-node", agent["args"])
        off = render("node.uninstallOnExit=false")
        self.assertEqual([o["kind"] for o in off if o["kind"] in ("Role", "RoleBinding")], [])
        self.assertFalse(any(a.startswith("--uninstall-when-removed") for a in container(
            find(off, "DaemonSet", "sockmesh-node"), "agent")["args"]))
        binding = find(objs, "ClusterRoleBinding", "sockmesh-node")
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": "sockmesh-node",
                                                "namespace": "istio-system"}])
        self.assertEqual(find(objs, "DaemonSet", "sockmesh")["spec"]["template"]["spec"]
                         ["serviceAccountName"], "sockmesh")

    def test_profiles_and_precedence(self):
        def proxy_env(*sets):
            c = container(find(render(*sets), "DaemonSet", "sockmesh"), "proxy")
            return {e["name"]: e.get("value") for e in c["env"]}
        env = proxy_env("profile=ambient")
        # One source of mesh state: no local config file when istiod is the control plane.
        ambient_args = container(find(render("profile=ambient"), "DaemonSet", "sockmesh"),
                                 "proxy")["args"]
        self.assertFalse([a for a in ambient_args if a.startswith("--config")], ambient_args)
        self.assertIn("--config=/etc/sockmesh/config.yaml",
                      container(find(render(), "DaemonSet", "sockmesh"), "proxy")["args"])
        self.assertEqual(env["CA_ADDRESS"], "istiod.istio-system.svc:15012")
        self.assertEqual(env["XDS_ADDRESS"], "istiod.istio-system.svc:15012")
        self.assertEqual(proxy_env("profile=ambient", "istioNamespace=mesh")["CA_ADDRESS"],
                         "istiod.mesh.svc:15012")
        # The user's own values win over the profile's.
        self.assertEqual(proxy_env("profile=ambient", "caAddress=ca.example:15012")["CA_ADDRESS"],
                         "ca.example:15012")
        self.assertNotIn("CA_ADDRESS", proxy_env("profile=ambient", "controlPlane=local"))
        # ambient: istiod's root is a required ConfigMap (the proxy cannot start without it), and
        # the unused built-in CA gets no host path; default: the CA's root on the host.
        def volumes(*sets):
            ds = find(render(*sets), "DaemonSet", "sockmesh")
            return {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        amb = volumes("profile=ambient")
        self.assertEqual(amb["istiod-ca-cert"]["configMap"], {"name": "istio-ca-root-cert"})
        self.assertEqual(amb["ca-state"], {"name": "ca-state", "emptyDir": {}})
        self.assertEqual(volumes()["ca-state"]["hostPath"]["path"], "/var/lib/sockmesh")
        self.assertNotIn("istiod-ca-cert", volumes())
        self.assertIn("hostPath", volumes("profile=ambient", "builtinCA.enabled=true")["ca-state"])
        self.assertEqual(proxy_env("env.FOO=bar")["FOO"], "bar")
        objs = render("hub=registry.example/mesh", "tag=9.9.9", "logLevel=debug")
        c = container(find(objs, "DaemonSet", "sockmesh"), "proxy")
        self.assertEqual(c["image"], "registry.example/mesh/sockmesh:9.9.9")
        self.assertIn("--log-level=debug", c["args"])

    def test_show_values_documents_every_value(self):
        text = helm("show", "values", CHART).stdout
        lines = text.splitlines()
        inside = False
        for i, line in enumerate(lines):
            if line.startswith("_internal_defaults_do_not_set:"):
                inside = True
                continue
            m = re.match(r"^  ([A-Za-z][A-Za-z0-9]*):", line)
            if not inside or not m:
                continue
            # A comment in the key's paragraph (lines up to the previous blank one) before it.
            j = i - 1
            documented = False
            while j >= 0 and lines[j].strip():
                documented |= lines[j].lstrip().startswith("#")
                j -= 1
            self.assertTrue(documented, "value %s has no comment" % m.group(1))


if __name__ == "__main__":
    if not os.access(HELM, os.X_OK) or not os.path.isdir(os.path.join(TOOLS, "node", "node_modules")):
        print("skipped: helm or kubernetes-models missing in %s (run scripts/setup)" % TOOLS)
        sys.exit(77)
    unittest.main(verbosity=2)
