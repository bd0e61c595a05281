#!/usr/bin/env python3
"""Mooncake's wheel against itself over RDMA, to keep what crosses the wire as test vectors.

Runs inside the soft-RoCE VM (scripts/rdma-vm.sh), as root, with the wheel importable
(PYTHONPATH at the site-packages of target/ci-mooncake) and MC_GID_INDEX=1. Two Transfer
Engines with ``protocol="rdma"`` on rxe0, in two processes, find each other through an HTTP
metadata server this script serves; it points the target's ``rpc_meta`` at a relay that passes
the handshake frames on and keeps them. The initiator writes a pattern into the target's
registered memory and reads it back (one slice and several). What is kept, as JSON on stdout:
the target's descriptor, its rpc_meta, and every handshake frame each way.

    python3 scripts/mooncake-rdma-capture.py > tests/vectors/mooncake/rdma/capture.json
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOST = os.environ.get("CAPTURE_HOST", "10.0.2.15")
DEVICE = os.environ.get("CAPTURE_DEVICE", "rxe0")
SIZE = 1 << 20


class Metadata:
    """Mooncake's HTTP metadata protocol (GET/PUT/DELETE /metadata?key=K), with rpc_meta of the
    target rewritten to the relay."""

    def __init__(self):
        self.kv: dict = {}
        self.original: dict = {}
        self.relay_port = 0
        self.lock = threading.Lock()


def serve_metadata(meta: Metadata) -> int:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _key(self):
            return parse_qs(urlparse(self.path).query).get("key", [""])[0]

        def do_GET(self):
            with meta.lock:
                body = meta.kv.get(self._key())
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            key = self._key()
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with meta.lock:
                # The first engine's (the target's) handshakes go through the relay.
                if key.startswith("mooncake/rpc_meta/") and meta.relay_port and not meta.original:
                    meta.original[key] = json.loads(body)
                    rewritten = dict(meta.original[key], rpc_port=meta.relay_port)
                    body = json.dumps(rewritten).encode()
                meta.kv[key] = body
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_DELETE(self):
            with meta.lock:
                meta.kv.pop(self._key(), None)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def read_frame(sock: socket.socket):
    head = _exact(sock, 8)
    if head is None:
        return None
    (n,) = struct.unpack("<Q", head)
    body = _exact(sock, n)
    return body[0], body[1:]


def _exact(sock: socket.socket, n: int):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return buf


def relay(listener: socket.socket, target_port, frames: list) -> None:
    """Passes each connection's frames on to the target's handshake port, keeping them."""
    while True:
        client, _ = listener.accept()
        with client, socket.create_connection((HOST, target_port())) as upstream:
            while True:
                got = read_frame(client)
                if got is None:
                    break
                kind, body = got
                frames.append({"from": "initiator", "type": kind, "json": json.loads(body)})
                upstream.sendall(struct.pack("<Q", len(body) + 1) + bytes([kind]) + body)
                back = read_frame(upstream)
                if back is None:
                    break
                frames.append({"from": "target", "type": back[0], "json": json.loads(back[1])})
                client.sendall(struct.pack("<Q", len(back[1]) + 1) + bytes([back[0]]) + back[1])


def engine(metadata_url: str, name: str):
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    rc = te.initialize(name, metadata_url, "rdma", DEVICE)
    if rc != 0:
        raise SystemExit(f"initialize: {rc}")
    buf = (ctypes.c_ubyte * SIZE)()
    addr = ctypes.addressof(buf)
    if te.register_memory(addr, SIZE) != 0:
        raise SystemExit("register_memory failed")
    return te, buf, addr


def target(metadata_url: str, name: str) -> None:
    """The target: registers memory, says where, waits for its stdin to close."""
    te, buf, addr = engine(metadata_url, name)
    print(json.dumps({"rpc_port": te.get_rpc_port(), "addr": addr}), flush=True)
    sys.stdin.read()
    print(json.dumps({"head": bytes(buf[:16]).hex()}), flush=True)


def initiator(metadata_url: str, name: str, peer: str, peer_addr: int) -> None:
    """The initiator: writes a pattern into the target's memory and reads it back, one slice
    (4 KiB) and several (200 KiB)."""
    te, buf, addr = engine(metadata_url, name)
    checks = []
    for size in (4096, 200 << 10):
        pattern = bytes((i * 7 + size) % 251 for i in range(size))
        ctypes.memmove(addr, pattern, size)
        t0 = time.monotonic()
        w = te.transfer_sync_write(peer, addr, peer_addr, size)
        ctypes.memset(addr, 0, size)
        r = te.transfer_sync_read(peer, addr, peer_addr, size)
        checks.append({"size": size, "write": w, "read": r, "equal": bytes(buf[:size]) == pattern,
                       "seconds": round(time.monotonic() - t0, 3)})
    print(json.dumps(checks), flush=True)


def main() -> None:
    # The wheel holds Python's lock while it calls the metadata server: engines run in processes
    # of their own, this one serves the metadata and the relay.
    if len(sys.argv) > 2 and sys.argv[1] == "--target":
        target(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--initiator":
        initiator(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    meta = Metadata()
    url = f"http://127.0.0.1:{serve_metadata(meta)}/metadata"
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(4)
    meta.relay_port = listener.getsockname()[1]
    frames: list = []
    where: dict = {}
    threading.Thread(target=relay, args=(listener, lambda: where["rpc_port"], frames), daemon=True).start()

    name = f"{HOST}:17001"
    proc = subprocess.Popen([sys.executable, __file__, "--target", url, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    where.update(json.loads(proc.stdout.readline()))
    with meta.lock:
        descriptor = json.loads(meta.kv[f"mooncake/ram/{name}"])
    out = subprocess.run([sys.executable, __file__, "--initiator", url, f"{HOST}:17002", name, str(where["addr"])],
                         capture_output=True, text=True, timeout=600)
    sys.stderr.write(out.stderr)
    checks = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"failed": out.returncode}
    proc.stdin.close()
    tail = json.loads(proc.stdout.readline())
    proc.wait(timeout=30)
    json.dump({
        "wheel": "mooncake-transfer-engine-non-cuda==0.3.13.post1",
        "name": name,
        "descriptor": descriptor,
        "rpc_meta": meta.original.get(f"mooncake/rpc_meta/{name}"),
        "metadata_keys": sorted(meta.kv),
        "frames": frames,
        "checks": checks,
        "target_head": tail["head"],
    }, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
