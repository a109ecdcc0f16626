#!/usr/bin/python3
"""A small upstream DNS server for the cluster tests, with dnspython (an implementation
independent of the proxy's): UDP and TCP on one port, one log line per query
("udp|tcp NAME TYPE from IP"). Its zone:
  outside.example.   A 192.0.2.7, AAAA 2001:db8::7
  big.example.       40 A records: over UDP without EDNS the answer is cut to the header and
                     question with TC set, over TCP it is whole
  slow.example.      never answered (the proxy's upstream timeout)
  anything else      NXDOMAIN (so a name the proxy should have answered itself, asked here, fails)
"""
import argparse
import socket
import socketserver
import sys
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

TTL = 30


def answer(wire, transport, peer):
    try:
        q = dns.message.from_wire(wire)
    except Exception as e:  # a malformed query: logged, not answered
        print("%s malformed from %s: %s" % (transport, peer, e), flush=True)
        return None
    # (An RRset of a question holds no records, so it is falsy: test the list, not the RRset.)
    question = q.question[0] if len(q.question) > 0 else None
    name = question.name.to_text().lower() if question is not None else ""
    rdtype = question.rdtype if question is not None else dns.rdatatype.A
    print("%s %s %s from %s" % (transport, name, dns.rdatatype.to_text(rdtype), peer), flush=True)
    if name == "slow.example.":
        return None
    r = dns.message.make_response(q)
    if name == "outside.example.":
        if rdtype == dns.rdatatype.A:
            r.answer.append(dns.rrset.from_text(name, TTL, "IN", "A", "192.0.2.7"))
        elif rdtype == dns.rdatatype.AAAA:
            r.answer.append(dns.rrset.from_text(name, TTL, "IN", "AAAA", "2001:db8::7"))
    elif name == "big.example." and rdtype == dns.rdatatype.A:
        if transport == "udp" and q.edns < 0:
            r.flags |= dns.flags.TC
        else:
            r.answer.append(dns.rrset.from_text_list(
                name, TTL, "IN", "A", ["198.51.100.%d" % i for i in range(1, 41)]))
    else:
        r.set_rcode(dns.rcode.NXDOMAIN)
    return r.to_wire()


class Udp(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        out = answer(data, "udp", self.client_address[0])
        if out is not None:
            sock.sendto(out, self.client_address)


class Tcp(socketserver.StreamRequestHandler):
    def handle(self):
        self.connection.settimeout(10)
        try:
            while True:
                head = self.rfile.read(2)
                if len(head) < 2:
                    return
                wire = self.rfile.read(int.from_bytes(head, "big"))
                out = answer(wire, "tcp", self.client_address[0])
                if out is None:
                    return
                self.wfile.write(len(out).to_bytes(2, "big") + out)
        except OSError:
            return


class UdpServer(socketserver.ThreadingUDPServer):
    allow_reuse_address = True
    daemon_threads = True


class TcpServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=53)
    a = p.parse_args()
    udp = UdpServer(("0.0.0.0", a.port), Udp)
    tcp = TcpServer(("0.0.0.0", a.port), Tcp)
    threading.Thread(target=udp.serve_forever, daemon=True).start()
    print("fake dns listening on %d (udp, tcp)" % a.port, flush=True)
    try:
        tcp.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    sys.exit(main())
