"""The Transfer Engine path to segments Mooncake's processes mounted: descriptors, ranges and
the discovery setting, without sockets (the wheel drives it for real in tests/it/mooncake_clients.rs)."""

import socket
import struct
import threading
import unittest

from rbgctl import ClientConfig
from rbgctl.errors import ProtocolError, RemoteError, TransportError
from rbgctl.mooncake_te import HEADER, STATUS_OK, STATUS_REFUSED, Peer, TeSegment, discovery_of

BASE = 0x7F00_0000_0000


class Descriptors(unittest.TestCase):
    def test_a_peers_descriptor_gives_its_data_port_and_what_it_covers(self):
        d = {"protocol": "tcp", "tcp_data_host": "10.0.0.5", "tcp_data_port": 15002, "tcp_proto_version": 2,
             "buffers": [{"addr": BASE, "length": 1 << 20, "name": "n"}]}
        peer = Peer("10.0.0.5:15001", d)
        self.assertEqual(peer.addr, ("10.0.0.5", 15002))
        self.assertTrue(peer.v2)
        self.assertTrue(peer.covers(BASE + 4096, 4096))
        self.assertFalse(peer.covers(BASE + (1 << 20) - 1, 2))
        self.assertFalse(peer.covers(BASE - 1, 1))
        # An older peer: no data host (the name's stands in), protocol v1.
        old = Peer("[::1]:15001", {"protocol": "tcp", "tcp_data_port": 16001, "buffers": []})
        self.assertEqual(old.addr, ("::1", 16001))
        self.assertFalse(old.v2)
        for bad in ({"protocol": "rdma", "tcp_data_port": 1, "buffers": []},
                    {"protocol": "tcp", "buffers": []},
                    {"protocol": "tcp", "tcp_data_port": 70000, "buffers": []},
                    {"protocol": "tcp", "tcp_data_port": 1}):
            with self.assertRaisesRegex(ProtocolError, "h:1"):
                Peer("h:1", bad)

    def test_the_discovery_setting(self):
        self.assertIsNone(discovery_of(None))
        self.assertIsNone(discovery_of("P2PHANDSHAKE"))
        self.assertEqual(discovery_of("http://m:8080/metadata"), "http://m:8080/metadata")
        with self.assertLogs("rbgctl.mooncake_te", "WARNING"):
            self.assertIsNone(discovery_of("etcd://e:2379"))
        cfg = ClientConfig.from_mapping({"master": "m:1", "metadata_server": "http://m:8080/metadata"})
        self.assertEqual(cfg.metadata_server, "http://m:8080/metadata")
        cfg = ClientConfig.from_mapping({"master": "m:1"}, env={"MOONCAKE_TE_META_DATA_SERVER": "http://x/m"})
        self.assertEqual(cfg.metadata_server, "http://x/m")


class OnePeer:
    """A Transfer Engine data port on loopback: answers each request from a bytearray standing
    for the segment (v2), refusing a range outside it; serves ``connections`` connections in
    turn, each for at most ``per_connection`` requests (then closes it, as a restarted peer
    would have)."""

    def __init__(self, memory: bytearray, connections: int = 1, per_connection: int = 1 << 30):
        self.memory = memory
        self.connections, self.per_connection = connections, per_connection
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        for _ in range(self.connections):
            conn, _ = self.listener.accept()
            with conn:
                self.serve_one(conn)

    def serve_one(self, conn):
        f = conn.makefile("rb")
        for _ in range(self.per_connection):
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:
                return
            size, addr, op = HEADER.unpack(head)
            off = addr - BASE
            if off < 0 or off + size > len(self.memory):
                conn.sendall(struct.pack("<Q", STATUS_REFUSED))
                return
            if op & 0x7F == 1:
                self.memory[off:off + size] = f.read(size)
                conn.sendall(struct.pack("<Q", STATUS_OK))
            else:
                conn.sendall(struct.pack("<Q", STATUS_OK) + bytes(self.memory[off:off + size]))

    def close(self):
        self.listener.close()
        self.thread.join(timeout=5)


class Requests(unittest.TestCase):
    def test_writes_and_reads_go_to_the_segments_addresses_and_a_refusal_is_said(self):
        memory = bytearray(1 << 16)
        peer = OnePeer(memory)
        seg = TeSegment("127.0.0.1:1", BASE, 1 << 16, None, 2.0, 2.0)
        seg._peer = Peer("127.0.0.1:1", {"protocol": "tcp", "tcp_data_port": peer.port, "tcp_proto_version": 2,
                                         "buffers": [{"addr": BASE, "length": 1 << 17}]})
        try:
            seg.write(4096, [memoryview(b"abc"), memoryview(b"def")])
            self.assertEqual(bytes(memory[4096:4102]), b"abcdef")
            out = bytearray(6)
            seg.read(4096, [memoryview(out)])
            self.assertEqual(bytes(out), b"abcdef")
            # Outside the segment the master describes: refused here, nothing sent.
            with self.assertRaisesRegex(RemoteError, "outside segment"):
                seg.read((1 << 16) - 1, [memoryview(bytearray(2))])
            # Inside the descriptor's buffer but outside the peer's memory: the peer refuses.
            seg.length = 1 << 17
            with self.assertRaisesRegex(RemoteError, "refused"):
                seg.read(1 << 16, [memoryview(bytearray(8))])
        finally:
            seg.close()
            peer.close()

    def test_a_kept_connection_the_peer_closed_is_replaced_once(self):
        memory = bytearray(1 << 16)
        peer = OnePeer(memory, connections=2, per_connection=1)
        seg = TeSegment("127.0.0.1:1", BASE, 1 << 16, None, 2.0, 2.0)
        seg._peer = Peer("127.0.0.1:1", {"protocol": "tcp", "tcp_data_port": peer.port, "tcp_proto_version": 2,
                                         "buffers": [{"addr": BASE, "length": 1 << 16}]})
        try:
            seg.write(0, [memoryview(b"kept")])
            out = bytearray(4)
            seg.read(0, [memoryview(out)])  # the kept connection is closed: a new one serves it
            self.assertEqual(bytes(out), b"kept")
        finally:
            seg.close()
            peer.close()

    def test_an_unreachable_peer_is_a_transport_error(self):
        seg = TeSegment("127.0.0.1:1", BASE, 4096, None, 1.0, 1.0)
        with self.assertRaises(TransportError):
            seg.read(0, [memoryview(bytearray(8))])


if __name__ == "__main__":
    unittest.main()
