#!/usr/bin/env bash
# The loopback demo (scripts/demo --loopback; no root needed): two sockmesh-proxy nodes on loopback, an application
# behind node B, a client behind node A, traffic through an HBONE tunnel (mTLS HTTP/2 CONNECT on
# port 15008), and the evidence: access log, metrics, config dump, and a policy denial.
#
#   scripts/demo --loopback          set up, build, run the demo, clean up
#   scripts/demo --loopback --keep   leave the two proxies running and print how to poke at them
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
keep=false
[ "${1:-}" = "--keep" ] && keep=true

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "setup and build"
"$root/scripts/setup"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build" -j "$(nproc)" --target sockmesh-proxy
proxy="$root/build/userspace/sockmesh-proxy"

work=$(mktemp -d /tmp/sockmesh-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
if ! $keep; then trap cleanup EXIT INT TERM; fi

# The embedded default config (sockmesh-proxy with no --config) describes this topology:
#   client  127.0.10.1  node-a  ns default  sa client
#   echo-1  127.0.20.1  node-b  ns default  sa echo   (HBONE)
#   service echo.default.svc.cluster.local  VIP 127.0.30.1:80 -> 8080
A_ADMIN=127.0.0.1 B_ADMIN=127.0.0.2
"$proxy" --print-default-config >"$work/mesh.yaml"
step "start node-a and node-b with the embedded default config (copied to $work/mesh.yaml)"
"$proxy" --node node-a --config "$work/mesh.yaml" --state-dir "$work/ca" --socks5 127.0.0.1:15080 \
  --socks5-clients 127.0.10.1=Kubernetes//v1/Pod/default/client \
  --admin $A_ADMIN:15000 --metrics $A_ADMIN:15020 --readiness $A_ADMIN:15021 >"$work/node-a.log" 2>&1 &
pids+=($!)
"$proxy" --node node-b --config "$work/mesh.yaml" --state-dir "$work/ca" \
  --admin $B_ADMIN:15000 --metrics $B_ADMIN:15020 --readiness $B_ADMIN:15021 >"$work/node-b.log" 2>&1 &
pids+=($!)
/usr/bin/python3 - "$work" <<'PY' &
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.20.1", 8080)); s.listen(64)
def serve(c, addr):
    data = b""
    while not data.endswith(b"\n"):
        d = c.recv(4096)
        if not d: break
        data += d
    c.sendall(b"echo-1 saw client %s:%d say: %s" % (addr[0].encode(), addr[1], data))
    c.close()
for _ in range(1000):
    c, addr = s.accept()
    threading.Thread(target=serve, args=(c, addr), daemon=True).start()
PY
pids+=($!)
for n in $A_ADMIN $B_ADMIN; do
  for _ in $(seq 1 100); do
    curl -fs "http://$n:15021/healthz/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fs "http://$n:15021/healthz/ready" >/dev/null || { echo "node on $n did not become ready"; cat "$work"/node-*.log; exit 1; }
done
echo "both nodes ready; node-b listens for HBONE on 127.0.20.1:15008"
grep -h "listening" "$work"/node-*.log | sed 's/^[^ ]* /  /'

client() { /usr/bin/python3 "$root/scripts/lib/socks_client.py" 127.0.10.1 127.0.0.1:15080 "$@"; }

step "client (127.0.10.1) -> service VIP 127.0.30.1:80 through node-a's SOCKS5"
client 127.0.30.1:80 "hello over HBONE"
echo "  (the app saw the client's own IP: source address preserved across the tunnel)"

step "client -> the workload IP 127.0.20.1:8080 directly (pooled: same HBONE connection)"
client 127.0.20.1:8080 "second hello"

step "access log (one line per connection, each side)"
sleep 0.3
grep -h "connection complete" "$work"/node-a.log | sed 's/^[^ ]* /  node-a /' | head -2
grep -h "connection complete" "$work"/node-b.log | sed 's/^[^ ]* /  node-b /' | head -2

step "metrics on node-b (:15020/metrics), Istio's names and labels"
curl -fs "http://$B_ADMIN:15020/metrics" | grep -E '^istio_tcp_(connections_opened|received_bytes)_total' \
  | sed -E 's/source_canonical[^,]*,//g; s/destination_canonical[^,]*,//g' | cut -c1-220 | sed 's/^/  /'

step "config dump on node-a (:15000/config_dump): workloads, certificates with expiry"
curl -fs "http://$A_ADMIN:15000/config_dump" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
for w in d["workloads"]:
    print("  workload %-8s %-12s %s local=%s" % (w["name"], ",".join(w["workloadIps"]), w["identity"], w["local"]))
for c in d["certificates"]:
    leaf = (c.get("certChain") or [{}])[0]
    print("  certificate %s %s expires %s (renews %s)" % (c["identity"], c["state"], leaf.get("expirationTime"), c.get("renewAt")))'

step "add a Deny policy to the config file; the running nodes reload it"
{ grep -v '^policies:' "$work/mesh.yaml"; cat <<YAML
policies:
- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: ["cluster.local/ns/default/sa/client"]
YAML
} >"$work/mesh.yaml.new"
mv "$work/mesh.yaml.new" "$work/mesh.yaml"
for _ in $(seq 1 100); do
  curl -fs "http://$B_ADMIN:15000/config_dump" | grep -q deny-client && break
  sleep 0.1
done
grep -h "config loaded" "$work/node-b.log" | tail -1 | sed 's/^[^ ]* /  node-b /'
if client 127.0.30.1:80 "this should be refused"; then
  echo "!! the connection was not refused: the policy did not take effect" >&2
  exit 1
fi
sleep 0.3
grep -h "refused CONNECT" "$work/node-b.log" | tail -1 | sed 's/^[^ ]* /  node-b /'
curl -fs "http://$B_ADMIN:15020/metrics" | grep -E '^istio_tcp_connections_closed_total.*response_flags="DENY"' \
  | grep -oE 'source_principal="[^"]*"|response_flags="[^"]*"|} [0-9]+' | tr '\n' ' ' | sed 's/^/  /'; echo

if $keep; then
  step "left running (--keep)"
  cat <<TXT
  logs:        $work/node-a.log  $work/node-b.log
  send:        /usr/bin/python3 scripts/lib/socks_client.py 127.0.10.1 127.0.0.1:15080 127.0.30.1:80 hi
  config dump: curl -s http://$A_ADMIN:15000/config_dump
  metrics:     curl -s http://$B_ADMIN:15020/metrics
  log levels:  curl -s -XPOST 'http://$A_ADMIN:15000/logging?level=debug'
  stop:        kill ${pids[*]}
TXT
else
  step "done; cleaning up"
fi
