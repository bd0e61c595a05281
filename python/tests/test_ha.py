"""Elected masters from Python: master addresses, epoch fencing, and a failover with real etcd,
real masters and a real store."""

import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest
import json
import urllib.request

from harness import binary, free_port, wait_until

from rbgctl import Client, ConfigError
from rbgctl import protocol as p
from rbgctl.connection import Connection, Fence, StaleEpoch
from rbgctl.errors import RemoteError
from rbgctl.leader import EtcdLookup, KubeLookup, parse_master


class Addresses(unittest.TestCase):
    def test_elected_master_addresses_parse_and_bad_ones_say_what_to_fix(self):
        e = parse_master("etcd://h1:2379;http://h2:2380/prod")
        self.assertIsInstance(e, EtcdLookup)
        self.assertEqual(e.endpoints, ["http://h1:2379", "http://h2:2380"])
        self.assertEqual(e.key, "mooncake-store/prod/master_view")
        self.assertIsInstance(parse_master("k8s://pool/rbgctl-master"), KubeLookup)
        self.assertIsNone(parse_master("127.0.0.1:50051"))
        # Every place that takes a master address takes these: the client config, the
        # HiCache extra config (a mapping), and the environment.
        from rbgctl import ClientConfig

        spec = "etcd://127.0.0.1:2379;127.0.0.1:22379/prod"
        self.assertEqual(ClientConfig(master=spec).master, spec)
        self.assertEqual(ClientConfig.from_mapping({"master_server_address": spec}).master, spec)
        self.assertEqual(ClientConfig(master="k8s://pool/masters").master, "k8s://pool/masters")
        for spec, why in [
            ("etcd://", "no etcd endpoint"),
            ("etcd://h1", "not host:port"),
            ("etcd://h1:2379/a b", "cluster id"),
            ("k8s://pool", "not a valid Kubernetes name"),
            ("redis://h:1", "unknown scheme"),
        ]:
            with self.assertRaises(ConfigError) as cm:
                parse_master(spec)
            self.assertIn(why, str(cm.exception), spec)


class _OneReply:
    """A server that answers one request with a given raw reply."""

    def __init__(self, reply: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.reply = reply
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def serve(self):
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(self.reply)


class Fencing(unittest.TestCase):
    def _reply(self, epoch: int, status: int = 0, meta: bytes = b"\x01") -> bytes:
        body = struct.pack("<Q", epoch) + meta
        return p.pack_header(p.Opcode.EXISTS, 1, len(body), 0, status=status, flags=p.FLAG_REPLY | p.FLAG_EPOCH) + body

    def _call(self, reply: bytes, fence: Fence):
        import threading

        srv = _OneReply(reply)
        t = threading.Thread(target=srv.serve)
        t.start()
        try:
            c = Connection(srv.addr, 2, 2, fence=fence)
            try:
                return c.call(p.Opcode.EXISTS, p.key_req("k"), p.parse_bool)
            finally:
                c.close()
        finally:
            t.join(5)
            srv.sock.close()

    def test_an_answer_of_an_older_epoch_is_refused_and_a_newer_one_raises_the_fence(self):
        fence = Fence()
        fence.set(7)
        self.assertTrue(self._call(self._reply(7), fence))
        self.assertTrue(self._call(self._reply(9), fence))
        self.assertEqual(fence.epoch, 9)
        with self.assertRaises(StaleEpoch):
            self._call(self._reply(8), fence)
        # A standby's refusal is no answer to fence: it comes through as NOT_LEADER.
        with self.assertRaises(RemoteError) as cm:
            self._call(self._reply(0, status=p.Status.NOT_LEADER, meta=b"standby"), fence)
        self.assertEqual(cm.exception.status, p.Status.NOT_LEADER)


def etcd_program():
    found = os.environ.get("RBGCTL_ETCD") or shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    return found


class Failover(unittest.TestCase):
    """Two masters elected through a real etcd, a store and a client that follow the leader."""

    def setUp(self):
        etcd = etcd_program()
        if etcd is None:
            if os.environ.get("CI"):
                self.fail("etcd is not installed; .ci/run installs Debian's etcd-server")
            self.skipTest("no etcd program")
        self.dir = tempfile.mkdtemp(prefix="rbgctl-pyha-")
        self.log = open(os.path.join(self.dir, "processes.log"), "ab")
        self.procs = []
        client_port, peer_port = free_port(), free_port()
        self.etcd = subprocess.Popen(
            [etcd, "--data-dir", os.path.join(self.dir, "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
             "--name", "default"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.procs.append(self.etcd)
        endpoints = f"127.0.0.1:{client_port}"

        def healthy():
            with urllib.request.urlopen(f"http://{endpoints}/health", timeout=1) as r:
                return b'"true"' in r.read()

        wait_until("etcd healthy", healthy, timeout=30)
        self.spec = f"etcd://{endpoints}/py-{os.getpid()}"
        self.masters = []
        for _ in range(2):
            metrics = free_port()
            proc = subprocess.Popen(
                [binary(), "master", "--rpc-address", "127.0.0.1", "--rpc-port", str(free_port()),
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics),
                 "--enable-ha", "--etcd-endpoints", endpoints, "--cluster-id", f"py-{os.getpid()}",
                 "--ha-lease-ttl", "2s"],
                stdout=subprocess.DEVNULL, stderr=self.log)
            self.procs.append(proc)
            self.masters.append((proc, metrics))
        wait_until("a leader elected", lambda: self.leader() is not None, timeout=20)
        store = subprocess.Popen(
            [binary(), "store", "--master", self.spec, "--bind-address", "127.0.0.1",
             "--local-hostname", "127.0.0.1", "--port", str(free_port()), "--segment-size", "64MiB",
             "--metrics-host", "127.0.0.1", "--metrics-port", str(free_port()),
             "--heartbeat-interval", "200ms", "--shm-dir", os.path.join(self.dir, "shm")],
            stdout=subprocess.DEVNULL, stderr=self.log)
        self.procs.append(store)

    def tearDown(self):
        for proc in getattr(self, "procs", []):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
        if hasattr(self, "log"):
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def health(self, i):
        proc, port = self.masters[i]
        if proc.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
                return json.load(r)
        except OSError:
            return None

    def leader(self):
        for i in range(len(self.masters)):
            h = self.health(i)
            if h and h.get("role") == "leader":
                return i
        return None

    def test_a_client_given_etcd_follows_the_leader_and_loses_nothing(self):
        def segment_mounted():
            with Client(self.spec) as c:
                return len(c.segments()) == 1

        wait_until("the store mounted at the leader", segment_mounted, timeout=20)
        with Client(self.spec) as c:
            values = {f"py-{i}": os.urandom(1000) for i in range(50)}
            for k, v in values.items():
                c.put(k, v)
            old = self.leader()
            self.masters[old][0].send_signal(signal.SIGKILL)
            self.masters[old][0].wait(timeout=10)
            killed = time.monotonic()
            done = None
            while time.monotonic() - killed < 20:
                try:
                    c.put("after", b"after")
                    done = time.monotonic() - killed
                    break
                except Exception:
                    time.sleep(0.05)
            self.assertIsNotNone(done, "no put succeeded after the leader was killed")
            self.assertNotEqual(self.leader(), old)

            def all_back():
                return all(c.get(k) == v for k, v in values.items())

            wait_until("every object readable at the new leader", all_back, timeout=15)
            self.assertEqual(c.get("after"), b"after")


if __name__ == "__main__":
    unittest.main()
