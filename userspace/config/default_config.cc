#include "config/local_config.h"

namespace sockmesh::config {

const char* embedded_default_config() {
  // Every address is in 127.0.0.0/8 so the demo runs on one machine without privileges; the two
  // "nodes" are two proxy processes started with --node node-a / node-b.
  return R"yaml(# sockmesh built-in demo: two nodes on loopback.
namespaces:
- name: default
  labels:
    istio.io/dataplane-mode: ambient

workloads:
- uid: Kubernetes//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadName: client
  canonicalName: client
  canonicalRevision: v1
  node: node-a
  network: ""
  protocol: HBONE
  workloadIps: ["127.0.10.1"]
  labels:
    app: client
- uid: Kubernetes//v1/Pod/default/echo-1
  name: echo-1
  namespace: default
  serviceAccount: echo
  workloadName: echo
  canonicalName: echo
  canonicalRevision: v1
  node: node-b
  network: ""
  protocol: HBONE
  workloadIps: ["127.0.20.1"]
  labels:
    app: echo
  services:
    "default/echo.default.svc.cluster.local":
      80: 8080

services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/127.0.30.1"]
  ports:
    80: 8080
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/echo"]

policies: []
)yaml";
}

}  // namespace sockmesh::config
