#!/usr/bin/python3
"""A stand-in for the one Kubernetes API call a stopping node agent makes with
--uninstall-when-removed: GET /apis/apps/v1/namespaces/<ns>/daemonsets/<name>. It answers from the
agent tests' recorded answers (tests/loader/agent/testdata/kube): the DaemonSet while the file
given as STATE_FILE says "present", a 404 Status once it says "gone". Every request is appended to
LOG_FILE with its Authorization header. Usage: fake_owner_api.py PORT STATE_FILE LOG_FILE TOKEN
[CERT KEY] (it listens on 127.0.0.1 in the network namespace it is started in; over TLS with the
given PEM files, as an API server does, otherwise plain HTTP)."""
import http.server
import os
import ssl
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = os.path.join(HERE, "..", "loader", "agent", "testdata", "kube")
PATH = "/apis/apps/v1/namespaces/istio-system/daemonsets/sockmesh-node"


def recorded(name):
    with open(os.path.join(RECORDED, name), "rb") as f:
        return f.read()


def main():
    port, state_file, log_file, token = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            auth = self.headers.get("Authorization", "")
            with open(log_file, "a") as f:
                f.write("%s %s\n" % (self.path, auth))
            if auth != "Bearer " + token:
                status, body = 401, b'{"kind":"Status","code":401,"reason":"Unauthorized"}'
            elif self.path != PATH:
                status, body = 404, b'{"kind":"Status","code":404,"reason":"NotFound"}'
            else:
                with open(state_file) as f:
                    state = f.read().strip()
                status, body = ((200, recorded("daemonset-node.json")) if state == "present"
                                else (404, recorded("daemonset-node-not-found.json")))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    if len(sys.argv) > 6:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(sys.argv[5], sys.argv[6])
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
