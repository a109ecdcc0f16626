"""Test harness for sockmesh integration tests: real sockmesh-proxy processes on loopback.

Each test process gets its own block of loopback addresses (127.A.B.0/24, A and B from the
process id), so tests can run in parallel and never reuse each other's leftovers. Workload IPs,
HBONE listeners and admin ports all live on those addresses.
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BUILD_DIR = os.environ.get("SOCKMESH_BUILD_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
PROXY_BIN = os.path.join(BUILD_DIR, "userspace", "sockmesh-proxy")

_block_counter = [0]


def address_block():
    """A fresh 127.A.B prefix for this process (distinct per call)."""
    _block_counter[0] += 1
    pid = os.getpid()
    a = 100 + (pid % 150)
    b = ((pid // 150) * 16 + _block_counter[0]) % 250 + 1
    return "127.%d.%d" % (a, b)


class TempDir:
    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="sockmesh-test-")

    def file(self, name, text):
        p = os.path.join(self.path, name)
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, p)
        return p

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


def wait_until(predicate, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last: %r)" % (timeout, what, last))


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def http_post(url, timeout=2.0):
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


class ProxyNode:
    """One sockmesh-proxy process, as node `name`, with admin ports on `admin_ip`. The admin
    listener binds loopback only; `admin` names its address when admin_ip is not loopback."""

    def __init__(self, name, config_path, state_dir, admin_ip, log_dir, socks5=None, extra=(),
                 admin=None):
        self.name = name
        self.admin_ip = admin_ip
        self.admin = admin or "%s:15000" % admin_ip
        self.log_path = os.path.join(log_dir, "%s.log" % name)
        # config_path None: no local config (e.g. the mesh state comes from xDS, see `extra`).
        config = ["--config", config_path] if config_path else []
        self.args = [PROXY_BIN, "--node", name] + config + [
                     "--state-dir", state_dir,
                     "--admin", self.admin,
                     "--metrics", "%s:15020" % admin_ip,
                     "--readiness", "%s:15021" % admin_ip,
                     "--config-poll-ms", "100",
                     "--log-level", "debug"]
        if socks5:
            self.args += ["--socks5", socks5]
        self.args += list(extra)
        self.env = {}  # environment variables added to this process's (ztunnel's names)
        self.proc = None

    def start(self, wait=True):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **self.env))
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=15.0):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited with %s:\n%s" % (
                    self.name, self.proc.returncode, self.logs()[-3000:]))
            # The log line first: a stray process listening on 0.0.0.0:15021 must not pass
            # for this node.
            if "sockmesh-proxy ready" not in self.logs():
                return False
            return http_get("http://%s:15021/healthz/ready" % self.admin_ip)[0] == 200
        wait_until(ready, timeout, what="%s ready" % self.name)

    def logs(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def metrics(self):
        return http_get("http://%s:15020/metrics" % self.admin_ip)[1]

    def metric_sum(self, name, **labels):
        """Sum of a metric's samples whose labels include all of `labels`."""
        total = 0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all('%s="%s"' % (k, v) in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def config_dump(self):
        return json.loads(http_get("http://%s/config_dump" % self.admin)[1])

    def terminate(self, timeout=15.0):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if getattr(self, "log", None) and not self.log.closed:
            self.log.close()


# ---------------------------------------------------------------------------------------------
# Applications

class TcpServer:
    """A TCP server on ip:port: accepts on a thread of its own until close() and serves each
    connection on another by calling self._serve(conn, addr, record), which subclasses define;
    `record` is what self._track(addr) returned on the accepting thread (so that it is listed
    the moment the connection is accepted)."""

    def __init__(self, ip, port, backlog=512):
        self.sock = socket.socket(family_of(ip), socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(backlog)
        self.sock.settimeout(0.2)
        self.peers = []
        self.serving = []
        self.stopped = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        deadline = time.time() + 600  # bounded even if a test forgets close()
        while not self.stopped and time.time() < deadline:
            try:
                c, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(None)
            self.peers.append(addr)
            record = self._track(addr)
            t = threading.Thread(target=self._serve, args=(c, addr, record), daemon=True)
            self.serving.append(t)
            t.start()

    def _track(self, addr):
        return None

    def close(self):
        self.stopped = True
        self.sock.close()
        for t in [self.thread] + self.serving:
            t.join(2)


class EchoServer(TcpServer):
    """Modes: 'echo' returns bytes; 'whoami' sends the client's address then echoes; 'hash'
    reads to EOF and answers the SHA-256 of what it read."""

    def __init__(self, ip, port, mode="echo"):
        self.mode = mode
        super().__init__(ip, port)

    def _serve(self, c, addr, _record):
        try:
            if self.mode == "whoami":
                c.sendall(("%s:%d\n" % addr).encode())
            if self.mode == "hash":
                h = hashlib.sha256()
                while True:
                    d = c.recv(1 << 20)
                    if not d:
                        break
                    h.update(d)
                c.sendall(h.hexdigest().encode())
                c.shutdown(socket.SHUT_WR)
            else:
                while True:
                    d = c.recv(1 << 20)
                    if not d:
                        break
                    c.sendall(d)
                c.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            c.close()


SOCKS_REPLIES = {0: "succeeded", 1: "general failure", 2: "not allowed by ruleset",
                 4: "host unreachable", 5: "connection refused", 7: "command not supported"}


def family_of(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def socket_inodes(remote_ip, remote_port):
    """The inodes of this host's IPv4 TCP sockets connected to remote_ip:remote_port
    (/proc/net/tcp; the namespace of the calling process)."""
    want = "%08X:%04X" % (socket.htonl(int.from_bytes(socket.inet_aton(remote_ip), "big")),
                          remote_port)
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[2] == want:
                inodes.add(fields[9])
    return inodes


def epoll_events(pid, inodes):
    """{fd: events} of process pid's epoll registrations whose descriptor is one of these
    socket inodes (from /proc/<pid>/fd and the fdinfo of its eventpoll descriptors)."""
    fds, epolls = {}, []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target == "anon_inode:[eventpoll]":
            epolls.append(fd)
        elif target.startswith("socket:[") and target[8:-1] in inodes:
            fds[int(fd)] = target
    found = {}
    for ep in epolls:
        try:
            with open("/proc/%d/fdinfo/%s" % (pid, ep)) as f:
                for line in f:
                    words = line.split()
                    if len(words) >= 4 and words[0] == "tfd:" and int(words[1]) in fds:
                        found[int(words[1])] = int(words[3], 16)
        except OSError:
            continue
    return found


def socks_connect(source_ip, proxy, dst_ip, dst_port, timeout=10.0):
    """Returns (socket, reply code). The socket is closed when the reply is not 0. IPv4 or IPv6
    (SOCKS5 address type 1 or 4), by the addresses given."""
    s = socket.socket(family_of(source_ip), socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source_ip, 0))
    s.connect(proxy)
    s.sendall(b"\x05\x01\x00")
    if recv_exact(s, 2) != b"\x05\x00":
        raise AssertionError("SOCKS5 method negotiation failed")
    if family_of(dst_ip) == socket.AF_INET6:
        target = b"\x04" + socket.inet_pton(socket.AF_INET6, dst_ip)
    else:
        target = b"\x01" + socket.inet_aton(dst_ip)
    s.sendall(b"\x05\x01\x00" + target + struct.pack(">H", dst_port))
    rep = recv_exact(s, 4)
    recv_exact(s, (16 if rep[3] == 4 else 4) + 2)  # the bound address and port
    if rep[1] != 0:
        s.close()
    return s, rep[1]


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise AssertionError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += d
    return buf


def recv_all(s):
    chunks = []
    while True:
        d = s.recv(1 << 20)
        if not d:
            return b"".join(chunks)
        chunks.append(d)


def read_line(s):
    """One line from socket s (byte by byte, so nothing after it is consumed), without the
    newline; what came before EOF if the peer closed first."""
    line = b""
    while not line.endswith(b"\n"):
        d = s.recv(1)
        if not d:
            break
        line += d
    return line.decode().strip()


def transfer_and_check(s, payload):
    """Sends payload (in a thread), reads the echo to EOF; returns True when identical."""
    def send():
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send)
    t.start()
    got = hashlib.sha256()
    n = 0
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        got.update(d)
        n += len(d)
    t.join()
    return n == len(payload) and got.digest() == hashlib.sha256(payload).digest()


# ---------------------------------------------------------------------------------------------
# Mesh topologies

def workload_yaml(uid, name, ns, sa, ip, node, protocol="HBONE", services=None):
    lines = ["- uid: %s" % uid, "  name: %s" % name, "  namespace: %s" % ns,
             "  serviceAccount: %s" % sa, "  workloadIps: [%s]" % ip, "  protocol: %s" % protocol,
             "  node: %s" % node]
    if services:
        lines.append("  services:")
        for svc, ports in services.items():
            lines.append('    "%s":' % svc)
            for a, b in ports.items():
                lines.append("      %d: %d" % (a, b))
    return "\n".join(lines)


def show_logs_if_failed(case, mesh):
    """From a unittest.TestCase's tearDown: write the mesh's logs to stderr when the test failed
    or errored (or SOCKMESH_TEST_LOGS is set), so a failure carries what the proxies said."""
    result = getattr(case._outcome, "result", None)
    failed = result is not None and any(
        t is case for t, _ in list(result.failures) + list(result.errors))
    if failed or os.environ.get("SOCKMESH_TEST_LOGS"):
        sys.stderr.write(mesh.dump_logs())


def close_mesh(closers, mesh):
    """Runs the callables in `closers` newest first (each failure ignored, so the rest still
    run), then stops the mesh, removes its files and closes the nodes' log files. Empties
    `closers`."""
    for close in reversed(closers):
        try:
            close()
        except Exception:  # noqa: BLE001 - keep tearing down
            pass
    closers.clear()
    mesh.stop()
    mesh.cleanup()
    for node in (mesh.a, mesh.b):
        log = getattr(node, "log", None)
        if log is not None:
            log.close()


class TwoNodeMesh:
    """client (node-a) -> A --HBONE--> B -> server (node-b), plus a service VIP for the server.

    Addresses in one 127.x.y block: .10 client, .20 server, .30 VIP, .1/.2 admin of A/B."""

    def __init__(self, policies="", server_sa="server", server_sa_seen_by_a=None, extra_a=(),
                 extra_b=(), extra_workloads="", env_a=None):
        self.block = address_block()
        b = self.block
        self.client_ip, self.server_ip, self.vip = b + ".10", b + ".20", b + ".30"
        self.tmp = TempDir()
        self.state_dir = os.path.join(self.tmp.path, "ca")
        self.policies = policies
        self.server_sa = server_sa
        self.server_sa_seen_by_a = server_sa_seen_by_a or server_sa
        self.extra_workloads = extra_workloads
        self.config_a = self.tmp.file("a.yaml", self.config(self.server_sa_seen_by_a))
        self.config_b = self.tmp.file("b.yaml", self.config(self.server_sa))
        self.socks = (b + ".1", 15080)
        # SOCKS5 speaks for the client workload only, and only from the client's address.
        self.a = ProxyNode("node-a", self.config_a, self.state_dir, b + ".1", self.tmp.path,
                           socks5="%s:15080" % (b + ".1"),
                           extra=["--socks5-clients", "%s=c1" % self.client_ip] + list(extra_a))
        self.a.env = dict(env_a or {})
        self.b = ProxyNode("node-b", self.config_b, self.state_dir, b + ".2", self.tmp.path,
                           extra=extra_b)

    def config(self, server_sa, policies=None):
        svc_key = "default/server.default.svc.cluster.local"
        text = "workloads:\n"
        text += workload_yaml("c1", "client", "default", "client", self.client_ip, "node-a") + "\n"
        text += workload_yaml("s1", "server", "default", server_sa, self.server_ip, "node-b",
                              services={svc_key: {80: 8080}}) + "\n"
        text += self.extra_workloads
        text += ("services:\n- name: server\n  namespace: default\n"
                 "  hostname: server.default.svc.cluster.local\n"
                 "  vips: [\"/%s\"]\n  ports: {80: 8080}\n" % self.vip)
        p = self.policies if policies is None else policies
        if p:
            text += "policies:\n" + p
        return text

    def set_policies(self, policies):
        self.policies = policies
        self.tmp.file("a.yaml", self.config(self.server_sa_seen_by_a))
        self.tmp.file("b.yaml", self.config(self.server_sa))

    def start(self):
        self.a.start(wait=False)
        self.b.start(wait=False)
        self.a.wait_ready()
        self.b.wait_ready()
        return self

    def connect(self, dst_ip=None, dst_port=8080, source_ip=None):
        return socks_connect(source_ip or self.client_ip, self.socks, dst_ip or self.server_ip,
                             dst_port)

    def stop(self):
        self.a.terminate()
        self.b.terminate()

    def dump_logs(self):
        return "---- node-a ----\n%s\n---- node-b ----\n%s" % (self.a.logs()[-6000:],
                                                              self.b.logs()[-6000:])

    def cleanup(self):
        self.a.kill()
        self.b.kill()
        self.tmp.cleanup()


def openssl(*args, cwd=None):
    subprocess.run(["openssl", *args], check=True, cwd=cwd, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def make_ca(directory, name):
    """A separate CA (key + cert) made with the openssl CLI; returns (cert, key) paths."""
    key = os.path.join(directory, name + "-key.pem")
    cert = os.path.join(directory, name + "-cert.pem")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/O=" + name,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def issue_leaf(directory, name, ca_cert, ca_key, spiffe_id, days=1, not_before_offset=None):
    """A workload certificate for spiffe_id signed by the given CA; returns (cert, key)."""
    key = os.path.join(directory, name + "-key.pem")
    csr = os.path.join(directory, name + ".csr")
    cert = os.path.join(directory, name + "-cert.pem")
    ext = os.path.join(directory, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=URI:%s\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\n"
                % spiffe_id)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", "/O=test")
    args = ["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-extfile", ext]
    if days < 0:
        # An expired certificate: valid for a day that ended yesterday.
        args += ["-not_before", "20200101000000Z", "-not_after", "20200102000000Z"]
    else:
        args += ["-days", str(days)]
    openssl(*args)
    return cert, key
