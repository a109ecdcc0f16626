"""Turns a rendered DaemonSet's pod template into podman invocations for one node: what a kubelet
would run there, on a machine without one (tests/deploy/test_manifest_runs.py runs the chart's
image on the simulated cluster this way). Only what the chart uses is supported; anything else
raises PodSpecError rather than being dropped silently.

    hostNetwork / the pod's own netns  --network ns:<path> (the caller names each)
    hostPID                            --pid host
    (the kubelet's pod cgroup)         --cgroup-parent, when the caller gives one
    securityContext                    --privileged, --cap-drop/--cap-add, --read-only, --user,
                                       --security-opt no-new-privileges
    command / args                     --entrypoint, args with $(VAR) expanded from the env
    env (value, fieldRef)              -e NAME=value; fieldRefs from the PodContext
    hostPath                           -v path:mountPath[:ro][,rshared|rslave]; DirectoryOrCreate,
                                       FileOrCreate
                                       makes the directory
    configMap                          -v <dir the caller gives>:mountPath:ro (a live directory,
                                       as the kubelet keeps a ConfigMap volume up to date)
    projected serviceAccountToken      a token file the caller gives (nobody checks it here)
    emptyDir                           a directory under the caller's work dir
    (the API server, when the caller   -e KUBERNETES_SERVICE_HOST/PORT, and its service account
     gives one)                        directory (token, ca.crt) at
                                       /var/run/secrets/kubernetes.io/serviceaccount, read-only,
                                       unless automountServiceAccountToken is false
"""
import os
import re


class PodSpecError(Exception):
    pass


PODMAN_BASE = ["podman", "run", "--runtime", "runc", "--ulimit", "nofile=20000:20000",
               "--ulimit", "nproc=4096:4096"]
PROPAGATION = {"Bidirectional": "rshared", "HostToContainer": "rslave", "None": None}
FIELDS = {"metadata.name": "pod_name", "metadata.namespace": "namespace",
          "spec.nodeName": "node_name", "status.podIP": "pod_ip",
          "spec.serviceAccountName": "service_account"}


class PodContext:
    """What the kubelet and the API server would fill in for one pod on one node."""

    def __init__(self, node_name, pod_name, namespace, pod_ip, netns, work_dir,
                 config_maps=None, token_file=None, cgroup_parent=None, api_server=None):
        self.node_name, self.pod_name, self.namespace = node_name, pod_name, namespace
        self.pod_ip, self.netns, self.work_dir = pod_ip, netns, work_dir
        self.config_maps = config_maps or {}
        self.token_file = token_file
        # The cgroup the pod's containers go below, as the kubelet's pod cgroup (e.g.
        # /kubepods/...): relative to the cgroup root, or None for podman's default.
        self.cgroup_parent = cgroup_parent
        self.service_account = ""
        # (host, port, service account dir): what every container of a pod learns of the API
        # server, as the kubelet gives it; None: no API server.
        self.api_server = api_server


SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _expand(text, env):
    # Kubernetes' $(VAR) expansion in command and args; $$ escapes, unknown names stay.
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _env(container, ctx):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in FIELDS:
                raise PodSpecError("env %s: fieldRef %s is not supported" % (e["name"], path))
            env[e["name"]] = str(getattr(ctx, FIELDS[path]))
        else:
            raise PodSpecError("env %s: only value and fieldRef are supported" % e["name"])
    return env


def _volume_source(vol, ctx, container_name):
    """The host directory or file a volume is, made if the pod spec says so."""
    if "hostPath" in vol:
        hp = vol["hostPath"]
        kind = hp.get("type", "")
        if kind == "DirectoryOrCreate":
            os.makedirs(hp["path"], exist_ok=True)
        elif kind == "FileOrCreate" and not os.path.exists(hp["path"]):
            os.makedirs(os.path.dirname(hp["path"]), exist_ok=True)
            open(hp["path"], "a").close()
        elif kind == "Directory" and not os.path.isdir(hp["path"]):
            raise PodSpecError("hostPath %s (type Directory) does not exist" % hp["path"])
        return hp["path"]
    if "configMap" in vol:
        name = vol["configMap"]["name"]
        if name not in ctx.config_maps:
            if vol["configMap"].get("optional"):
                return None
            raise PodSpecError("configMap %s: no directory given for it" % name)
        return ctx.config_maps[name]
    if "emptyDir" in vol:
        path = os.path.join(ctx.work_dir, "emptydir", container_name, vol["name"])
        os.makedirs(path, exist_ok=True)
        return path
    if "projected" in vol:
        sources = vol["projected"]["sources"]
        if [list(s) for s in sources] != [["serviceAccountToken"]]:
            raise PodSpecError("projected volume %s: only one serviceAccountToken" % vol["name"])
        path = os.path.join(ctx.work_dir, "projected", vol["name"])
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, sources[0]["serviceAccountToken"]["path"]), "w") as f:
            if ctx.token_file:
                with open(ctx.token_file) as t:
                    f.write(t.read())
            else:
                f.write("not-a-real-token\n")
        return path
    raise PodSpecError("volume %s: kind %s is not supported" % (vol["name"], sorted(vol)))


def podman_runs(daemonset, ctx, image=None, name_prefix="sm"):
    """[(container name, podman argv)] for the DaemonSet's containers on ctx's node, in order."""
    spec = daemonset["spec"]["template"]["spec"]
    ctx.service_account = spec.get("serviceAccountName", "default")
    for key in ("initContainers", "hostIPC"):
        if spec.get(key):
            raise PodSpecError("%s is not supported" % key)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    runs = []
    for c in spec["containers"]:
        argv = list(PODMAN_BASE) + ["-d", "--name", "%s-%s" % (name_prefix, c["name"]),
                                    "--network", "ns:" + ctx.netns,
                                    "--hostname", ctx.pod_name]
        if ctx.cgroup_parent:
            argv += ["--cgroup-parent", ctx.cgroup_parent]
        if spec.get("hostPID"):
            argv += ["--pid", "host"]
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            argv.append("--privileged")
        else:
            for cap in sc.get("capabilities", {}).get("drop", []):
                argv += ["--cap-drop", cap]
            for cap in sc.get("capabilities", {}).get("add", []):
                argv += ["--cap-add", cap]
            if sc.get("allowPrivilegeEscalation") is False:
                argv += ["--security-opt", "no-new-privileges"]
        if sc.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        if "runAsUser" in sc:
            argv += ["--user", "%d:%d" % (sc["runAsUser"], sc.get("runAsGroup", 0))]
        env = _env(c, ctx)
        automount = ctx.api_server is not None and spec.get("automountServiceAccountToken", True)
        if ctx.api_server is not None:
            env.setdefault("KUBERNETES_SERVICE_HOST", ctx.api_server[0])
            env.setdefault("KUBERNETES_SERVICE_PORT", str(ctx.api_server[1]))
        for k, v in env.items():
            argv += ["-e", "%s=%s" % (k, v)]
        for m in c.get("volumeMounts", []):
            vol = volumes.get(m["name"])
            if vol is None:
                raise PodSpecError("mount %s names no volume" % m["name"])
            src = _volume_source(vol, ctx, c["name"])
            if src is None:
                continue
            opts = []
            if m.get("readOnly"):
                opts.append("ro")
            prop = m.get("mountPropagation", "None")
            if prop not in PROPAGATION:
                raise PodSpecError("mountPropagation %s" % prop)
            if PROPAGATION[prop]:
                opts.append(PROPAGATION[prop])
            argv += ["-v", "%s:%s%s" % (src, m["mountPath"], ":" + ",".join(opts) if opts else "")]
        if automount:
            argv += ["-v", "%s:%s:ro" % (ctx.api_server[2], SERVICE_ACCOUNT_MOUNT)]
        command = c.get("command")
        if not command or len(command) != 1:
            raise PodSpecError("container %s: command must be one program" % c["name"])
        argv += ["--entrypoint", command[0], image or c["image"]]
        argv += [_expand(a, env) for a in c.get("args", [])]
        runs.append((c["name"], argv))
    return runs
