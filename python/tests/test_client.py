"""The client against a live master and stores (real processes on loopback)."""

import ctypes
import os
import socket
import subprocess
import threading
import time
import unittest

from harness import LivePool, binary, wait_until

from rbgctl import (
    BufferTooSmall,
    Client,
    ClientConfig,
    ObjectNotFound,
    ProtocolError,
    RbgctlError,
    RemoteError,
    ReplicateConfig,
    Status,
    TransportError,
)


def value(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


class Tenants(unittest.TestCase):
    """Issue 66: one pool, a namespace and a quota per tenant (the master's tenants file)."""

    @classmethod
    def setUpClass(cls):
        import tempfile

        cls.dir = tempfile.TemporaryDirectory(prefix="rbgctl-tenants-")
        path = os.path.join(cls.dir.name, "tenants.toml")
        with open(path, "w") as f:
            f.write('[[tenant]]\nname = "a"\nquota = "1MiB"\n[[tenant]]\nname = "b"\n')
        cls.pool = LivePool(stores=1, segment="64MiB", master_args=("--tenants-file", path))
        cfg = lambda t: ClientConfig(master=cls.pool.master, same_host_shm=False, tenant=t)
        cls.clients = {t: Client(cfg(t)) for t in ("default", "a", "b", "z")}

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients.values():
            c.close()
        cls.pool.close()
        cls.dir.cleanup()

    def test_namespaces_quotas_and_clearing(self):
        d, a, b, z = (self.clients[t] for t in ("default", "a", "b", "z"))
        for c, v in ((d, b"default's"), (a, b"a's"), (b, b"b's")):
            c.put("k", v)
        d.put("only-default", b"x")
        for c, v in ((d, b"default's"), (a, b"a's"), (b, b"b's")):
            self.assertEqual(c.get("k"), v)
        self.assertEqual(a.batch_exists(["k", "only-default"]), [True, False])
        self.assertEqual(a.keys(""), (["k"], False))
        self.assertEqual(d.keys(""), (["k", "only-default"], False))
        with self.assertRaisesRegex(RbgctlError, "0x01"):
            a.get("\x01b\x01k")
        a.put("big/0", value(600 << 10, 1))
        with self.assertRaises(RemoteError) as refused:
            a.put("big/1", value(600 << 10, 2))
        self.assertEqual(refused.exception.status, Status.TENANT_QUOTA_EXCEEDED)
        b.put("big/1", value(2 << 20, 3))
        with self.assertRaises(RemoteError) as unknown:
            z.put("k", b"v")
        self.assertEqual(unknown.exception.status, Status.TENANT_NOT_REGISTERED)
        self.assertEqual(a.remove_all(force=True), 2)
        self.assertFalse(a.exists("k"))
        self.assertEqual(b.get("k"), b"b's")
        self.assertEqual(d.get("k"), b"default's")


class RoundTrips(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = LivePool(stores=2, segment="64MiB")
        cls.shm = Client(cls.pool.master)
        cls.tcp = Client(ClientConfig(master=cls.pool.master, same_host_shm=False))

    @classmethod
    def tearDownClass(cls):
        cls.shm.close()
        cls.tcp.close()
        cls.pool.close()

    def test_put_get_exists_remove(self):
        for c, name in ((self.tcp, "tcp"), (self.shm, "shm")):
            key = f"rt/{name}"
            self.assertFalse(c.exists(key))
            c.put(key, b"hello")
            self.assertTrue(c.exists(key))
            self.assertEqual(c.get(key), b"hello")
            self.assertEqual(c.get_size(key), 5)
            c.put(key, bytearray(b"replaced value"))  # a put of an existing key replaces it
            self.assertEqual(c.get(key), b"replaced value")
            c.remove(key, force=True)
            self.assertFalse(c.exists(key))
            with self.assertRaises(ObjectNotFound):
                c.get(key)

    def test_get_into_memoryview_pointer_and_regions(self):
        v = value(100_000, 1)
        self.tcp.put("into/a", v)
        buf = bytearray(200_000)
        self.assertEqual(self.tcp.get_into("into/a", memoryview(buf)), len(v))
        self.assertEqual(bytes(buf[: len(v)]), v)
        self.assertEqual(buf[len(v)], 0, "nothing past the value is written")
        raw = (ctypes.c_ubyte * len(v))()
        self.assertEqual(self.shm.get_into("into/a", (ctypes.addressof(raw), len(v))), len(v))
        self.assertEqual(bytes(raw), v)
        # One value from two regions, read back into two other regions.
        k, vv = bytearray(v[:30_000]), bytearray(v[30_000:])
        self.tcp.put("into/kv", [k, memoryview(vv)])
        a, b = bytearray(50_000), bytearray(50_000)
        self.assertEqual(self.tcp.get_into("into/kv", [a, b]), len(v))
        self.assertEqual(bytes(a + b), v)
        with self.assertRaises(BufferTooSmall):
            self.tcp.get_into("into/a", bytearray(10))

    def test_batches_with_misses_and_small_buffers(self):
        keys = [f"batch/{i}" for i in range(64)]
        vals = [value(1000 + i * 100, i) for i in range(64)]
        for c in (self.tcp, self.shm):
            self.assertEqual(c.batch_put(keys, vals), [None] * 64)
            self.assertEqual(c.batch_exists(keys + ["batch/none"]), [True] * 64 + [False])
            got = c.batch_get(keys + ["batch/none"])
            self.assertEqual(got[:64], vals)
            self.assertIsInstance(got[64], ObjectNotFound)
            bufs = [bytearray(len(v)) for v in vals]
            bufs[3] = bytearray(5)
            out = c.batch_get_into(keys, bufs)
            self.assertIsInstance(out[3], BufferTooSmall)
            self.assertEqual(
                [o for i, o in enumerate(out) if i != 3], [len(v) for i, v in enumerate(vals) if i != 3]
            )
            self.assertEqual(bufs[10], vals[10])
        self.assertEqual(self.tcp.batch_remove(keys[:2] + ["batch/none"], force=True)[:2], [None, None])

    def test_replica_config(self):
        self.tcp.put("rep/two", b"x" * 4096, ReplicateConfig(replica_num=2))
        segments = {r.segment_id for r in self.tcp.describe("rep/two").replicas}
        self.assertEqual(len(segments), 2)
        name = self.pool.stores[1].endpoint
        self.tcp.put("rep/pref", b"y" * 4096, ReplicateConfig(preferred_segment=name))
        [loc] = self.tcp.describe("rep/pref").replicas
        by_id = {s.id: s.info.name for s in self.tcp.segments()}
        self.assertEqual(by_id[loc.segment_id], name)
        with self.assertRaises(RemoteError) as e:
            self.tcp.put("rep/big", bytearray(65 << 20))
        self.assertEqual(e.exception.status, Status.VALUE_TOO_LARGE)

    def test_same_host_path_is_taken_only_when_allowed(self):
        v = value(1 << 20, 7)
        before_shm, before_tcp = self.shm.stats.snapshot(), self.tcp.stats.snapshot()
        self.shm.put("path/x", v)
        self.assertEqual(self.shm.get("path/x"), v)
        self.assertEqual(self.tcp.get("path/x"), v)
        shm, tcp = self.shm.stats.snapshot(), self.tcp.stats.snapshot()
        self.assertEqual(shm["bytes_written_shm"] - before_shm["bytes_written_shm"], len(v))
        self.assertEqual(shm["bytes_read_shm"] - before_shm["bytes_read_shm"], len(v))
        self.assertEqual(shm["bytes_read_tcp"], before_shm["bytes_read_tcp"])
        self.assertEqual(tcp["bytes_read_tcp"] - before_tcp["bytes_read_tcp"], len(v))
        self.assertEqual(tcp["bytes_read_shm"], 0)

    def test_bad_input_is_refused_and_the_client_goes_on(self):
        with self.assertRaisesRegex(ProtocolError, "4096"):
            self.tcp.put("k" * 5000, b"v")
        with self.assertRaises(RemoteError) as e:
            self.tcp.put("empty", b"")
        self.assertEqual(e.exception.status, Status.INVALID_PARAMS)
        with self.assertRaisesRegex(RbgctlError, "read-only|not a buffer"):
            self.tcp.get_into("x", b"immutable")
        self.tcp.put("after-errors", b"ok")
        self.assertEqual(self.tcp.get("after-errors"), b"ok")

    def test_threads_share_one_client(self):
        errors = []

        def work(t):
            try:
                for i in range(20):
                    k, v = f"thr/{t}/{i}", value(3000 + i, t)
                    self.shm.put(k, v)
                    if self.shm.get(k) != v:
                        errors.append(f"{k}: wrong bytes")
            except RbgctlError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])

    def test_values_written_by_the_rust_client_and_back(self):
        subprocess.run(
            [binary(), "kv", "--master", self.pool.master, "put", "interop/rust", "from rust"],
            check=True,
            timeout=30,
            capture_output=True,
        )
        self.assertEqual(self.tcp.get("interop/rust"), b"from rust")
        self.shm.put("interop/py", b"from python")
        out = subprocess.run(
            [binary(), "kv", "--master", self.pool.master, "get", "interop/py"],
            check=True,
            timeout=30,
            capture_output=True,
        )
        self.assertEqual(out.stdout.strip(), b"from python")


class Failures(unittest.TestCase):
    def test_dead_store_replica_then_dead_pool(self):
        pool = LivePool(stores=2, segment="32MiB")
        self.addCleanup(pool.close)
        with Client(ClientConfig(master=pool.master, same_host_shm=False, io_timeout_s=5)) as c:
            v = value(50_000, 3)
            c.put("two", v, ReplicateConfig(replica_num=2))
            c.put("one", v, ReplicateConfig(preferred_segment=pool.stores[0].endpoint))
            self.assertEqual(c.get("two"), v)  # connections to both stores are now pooled
            pool.stores[0].kill9()
            started = time.monotonic()
            self.assertEqual(c.get("two"), v, "the other replica serves the read")
            with self.assertRaises(RbgctlError):
                c.get("one")
            out = c.batch_get(["one", "two"])
            self.assertIsInstance(out[0], RbgctlError)
            self.assertEqual(out[1], v)
            self.assertLess(time.monotonic() - started, 10, "a dead store must not hang reads")
            pool.master_proc.kill()
            pool.master_proc.wait(timeout=10)
            with self.assertRaises(TransportError):
                c.get("two")

    def test_persistent_store_keeps_shared_memory_writes_across_kill9(self):
        with LivePool(stores=1, segment="32MiB", persistent=True) as pool:
            with Client(pool.master) as c:
                v = value(200_000, 9)
                c.put("sealed", v)
                self.assertEqual(
                    c.stats.snapshot()["bytes_written_shm"], len(v), "written through shared memory"
                )
            store = pool.stores[0]
            store.kill9()
            store.start()

            def readable():
                with Client(ClientConfig(master=pool.master, same_host_shm=False)) as c2:
                    return c2.get("sealed") == v

            deadline = time.monotonic() + 30
            ok = False
            while time.monotonic() < deadline and not ok:
                try:
                    ok = readable()
                except RbgctlError:
                    time.sleep(0.2)
            self.assertTrue(ok, "the store recorded the sealed object and serves it after a restart")

    def test_no_master_and_a_peer_that_is_not_rbgctl(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        started = time.monotonic()
        with self.assertRaises(TransportError):
            Client(ClientConfig(master=f"127.0.0.1:{port}", connect_timeout_s=2))
        self.assertLess(time.monotonic() - started, 5)

        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def http_server():
            conn, _ = srv.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" + b"\x00" * 16)

        t = threading.Thread(target=http_server, daemon=True)
        t.start()
        with self.assertRaisesRegex(ProtocolError, "bad magic"):
            Client(ClientConfig(master=f"127.0.0.1:{srv.getsockname()[1]}", io_timeout_s=5))
        t.join(timeout=5)
        srv.close()


if __name__ == "__main__":
    os.environ.setdefault("RBGCTL_LOG", "warn")
    unittest.main()


class Liveness(unittest.TestCase):
    """One ping binds the client's connection to it at the master: an idle client says nothing
    more while that connection stays open, and pings again once it changed."""

    PINGS = 'rbgctl_master_requests_total{op="ping"}'

    def test_a_clear_while_a_prune_holds_the_idle_connections_closes_them(self):
        from rbgctl.connection import Pool

        with LivePool(stores=0) as live:
            pool = Pool(live.master, 5, 5)
            conn = pool.get()
            pool.put(conn)
            before = pool.changes
            peek = conn.peer_open

            def cleared_meanwhile():
                pool.clear()  # another thread's clear, while the prune holds the connection
                return peek()

            conn.peer_open = cleared_meanwhile
            pool.prune_closed()
            self.assertTrue(conn.broken, "the connection the prune held was closed")
            self.assertEqual(pool.changes, before + 1)
            self.assertIsNot(pool.get(), conn)

    def test_an_idle_client_is_kept_by_its_bound_connection_without_heartbeats(self):
        with LivePool(stores=0, master_args=["--client-ttl", "300ms"]) as pool:
            with Client(ClientConfig(master=pool.master, heartbeat_interval_s=0.02)) as c:
                # Count the heartbeat's ticks: each looks at the connections first.
                ticks = []
                prune = c._master.pool.prune_closed
                c._master.pool.prune_closed = lambda: (ticks.append(1), prune())[1]
                self.assertEqual(pool.master_metric("rbgctl_master_bound_clients"), 1.0)
                pings = pool.master_metric(self.PINGS)
                # Far more than the TTL's worth of ticks (each 10 to 30 ms): not one ping, and
                # the client is still known.
                start = time.monotonic()
                wait_until("60 ticks over 0.9 s", lambda: len(ticks) >= 60 and time.monotonic() - start > 0.9)
                self.assertEqual(pool.master_metric(self.PINGS), pings)
                self.assertEqual(pool.master_metric("rbgctl_master_expired_clients_total"), 0.0)
                self.assertEqual(pool.master_metric("rbgctl_master_clients"), 1.0)
                # Its connection goes: the next tick pings, on a new one.
                c._master.pool.clear()
                wait_until("a ping", lambda: pool.master_metric(self.PINGS) > pings, timeout=10)
                wait_until("bound again", lambda: pool.master_metric("rbgctl_master_bound_clients") == 1.0, timeout=10)
                self.assertFalse(c.exists("k"))

