#!/usr/bin/python3
"""Sends a message through a SOCKS5 proxy from a chosen source IP and prints the answer.

usage: socks_client.py SOURCE_IP PROXY_IP:PORT DEST_IP:PORT MESSAGE
Exit code 0 on success; otherwise prints the SOCKS5 reply and exits 1."""
import socket
import struct
import sys

REPLIES = {1: "general failure", 2: "not allowed by ruleset (policy)", 3: "network unreachable",
           4: "host unreachable", 5: "connection refused", 7: "command not supported"}


def main():
    src, proxy, dst, message = sys.argv[1:5]
    p_ip, p_port = proxy.rsplit(":", 1)
    d_ip, d_port = dst.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(10)
    s.bind((src, 0))
    s.connect((p_ip, int(p_port)))
    s.sendall(b"\x05\x01\x00")
    if s.recv(2) != b"\x05\x00":
        print("SOCKS5 negotiation failed")
        return 1
    s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(d_ip) + struct.pack(">H", int(d_port)))
    rep = s.recv(10)
    if len(rep) < 2 or rep[1] != 0:
        code = rep[1] if len(rep) >= 2 else -1
        print("refused: SOCKS5 reply %d (%s)" % (code, REPLIES.get(code, "?")))
        return 1
    s.sendall(message.encode() + b"\n")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    print(data.decode(errors="replace").rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
