"""The pure parts, without a server: frames, field encoding, checksums, buffers, settings."""

import ctypes
import json
import os
import random
import tempfile
import unittest
from types import SimpleNamespace

from rbgctl import checksum
from rbgctl import protocol as p
from rbgctl.buffers import regions, total
from rbgctl.config import ClientConfig
from rbgctl.errors import ConfigError, ProtocolError, RbgctlError
from rbgctl.engine import leading_true
from rbgctl.hicache import key_suffix


class Frames(unittest.TestCase):
    def test_header_layout_is_the_specified_one(self):
        h = p.pack_header(p.Opcode.EXISTS, 7, 3, 0)
        want = (
            b"RBGT\x01\x14\x00\x00"
            + (7).to_bytes(8, "little")
            + b"\x00\x00\x00\x00"
            + (3).to_bytes(4, "little")
            + (0).to_bytes(8, "little")
        )
        self.assertEqual(h, want)
        self.assertEqual(len(h), 32)

    def test_reply_header_round_trip(self):
        raw = p.HEADER.pack(b"RBGT", 1, 0x41, 1, 99, 10, 0, 5, 1 << 33)
        h = p.unpack_header(raw)
        self.assertEqual(
            (h.opcode, h.request_id, h.status, h.meta_len, h.data_len), (0x41, 99, 10, 5, 1 << 33)
        )
        self.assertTrue(h.is_reply)

    def test_bad_headers_are_refused(self):
        with self.assertRaisesRegex(ProtocolError, "bad magic"):
            p.unpack_header(p.HEADER.pack(b"HTTP", 1, 1, 1, 1, 0, 0, 0, 0))
        with self.assertRaisesRegex(ProtocolError, "version 2"):
            p.unpack_header(p.HEADER.pack(b"RBGT", 2, 1, 1, 1, 0, 0, 0, 0))
        with self.assertRaisesRegex(ProtocolError, "limit"):
            p.unpack_header(p.HEADER.pack(b"RBGT", 1, 1, 1, 1, 0, 0, p.MAX_META + 1, 0))
        with self.assertRaisesRegex(ProtocolError, "32 bytes"):
            p.unpack_header(b"RBGT")


class Fields(unittest.TestCase):
    def test_strings_lists_and_exact_consumption(self):
        meta = p.keys_req(["a", "é"])
        self.assertEqual(meta, b"\x02\x00\x00\x00" + b"\x01\x00a" + b"\x02\x00\xc3\xa9")
        self.assertEqual(p.decode(meta, lambda d: d.list(p.Decoder.str)), ["a", "é"])
        with self.assertRaisesRegex(ProtocolError, "trailing"):
            p.decode(meta + b"\x00", lambda d: d.list(p.Decoder.str))
        with self.assertRaisesRegex(ProtocolError, "wanted"):
            p.decode(meta[:-1], lambda d: d.list(p.Decoder.str))

    def test_limits_and_bad_values(self):
        with self.assertRaisesRegex(ProtocolError, "4096"):
            p.key_req("k" * 4097)
        p.key_req("k" * 4096)
        with self.assertRaisesRegex(ProtocolError, "neither 0 nor 1"):
            p.decode(b"\x02", p.parse_bool)
        with self.assertRaisesRegex(ProtocolError, "UTF-8"):
            p.decode(b"\x02\x00\xff\xfe", lambda d: d.str())
        with self.assertRaisesRegex(ProtocolError, "item limit"):
            p.decode((p.MAX_LIST + 1).to_bytes(4, "little"), p.parse_bools)
        with self.assertRaisesRegex(ProtocolError, "0..255"):
            p.batch_put_start_req(1, p.ReplicateConfig(replica_num=300), [("k", 1)])

    def test_object_desc_and_batch_results(self):
        desc = (
            (4096).to_bytes(8, "little")
            + (0xDEADBEEF).to_bytes(4, "little")
            + (5000).to_bytes(8, "little")
            + (42).to_bytes(8, "little")
            + (2).to_bytes(4, "little")
            + (1).to_bytes(8, "little")
            + (0).to_bytes(8, "little")
            + (2).to_bytes(8, "little")
            + (8192).to_bytes(8, "little")
            + b"\x00"  # hashed
        )
        d = p.decode(desc, p.parse_object_desc)
        self.assertEqual((d.size, d.checksum, d.lease_ttl_ms, d.version), (4096, 0xDEADBEEF, 5000, 42))
        self.assertEqual(d.replicas, (p.ReplicaLoc(1, 0), p.ReplicaLoc(2, 8192)))
        batch = (2).to_bytes(4, "little") + b"\x00\x00" + desc + (10).to_bytes(2, "little")
        items = p.decode(batch, p.parse_batch_descs)
        self.assertEqual(items[0], d)
        self.assertEqual(items[1], p.Failed(p.Status.OBJECT_NOT_FOUND))

    def test_put_start_request_bytes(self):
        cfg = p.ReplicateConfig(replica_num=2, soft_pin=True, soft_pin_ttl_ms=9, preferred_segment="s")
        meta = p.batch_put_start_req(5, cfg, [("k", 3)])
        want = (
            (5).to_bytes(8, "little")
            + b"\x02\x01"
            + (9).to_bytes(8, "little")
            + b"\x01\x00s"
            + b"\x02"  # reach: rbgctl's data paths and Mooncake's Transfer Engine
            + (1).to_bytes(4, "little")
            + b"\x01\x00k"
            + (3).to_bytes(8, "little")
        )
        self.assertEqual(meta, want)


class Checksums(unittest.TestCase):
    def test_known_vectors(self):
        for impl in (checksum.crc32c, checksum.crc32c_python):
            self.assertEqual(impl(b"123456789"), 0xE3069283)
            self.assertEqual(impl(bytes(32)), 0x8A9136AA)
            self.assertEqual(impl(b"\xff" * 32), 0x62A8AB43)
            self.assertEqual(impl(b""), 0)

    def test_implementations_agree_and_chain(self):
        data = random.Random(1).randbytes(10000)
        self.assertEqual(checksum.crc32c(data), checksum.crc32c_python(data))
        parts = [memoryview(data)[:3], memoryview(data)[3:4000], memoryview(data)[4000:]]
        self.assertEqual(checksum.crc32c_of(parts), checksum.crc32c(data))


class Buffers(unittest.TestCase):
    def test_pointer_pairs_lists_and_tensors(self):
        arr = (ctypes.c_ubyte * 8)(*range(8))
        ptr = ctypes.addressof(arr)
        [v] = regions((ptr, 8), writable=True)
        v[0] = 200
        self.assertEqual(arr[0], 200)
        views = regions([(ptr, 4), bytearray(b"xy")], writable=True)
        self.assertEqual(total(views), 6)

        class TensorLike:  # what the client needs of a torch.Tensor
            def data_ptr(self):
                return ptr

            def numel(self):
                return 2

            def element_size(self):
                return 4

            def is_contiguous(self):
                return True

        [t] = regions(TensorLike(), writable=True)
        self.assertEqual(t.nbytes, 8)
        self.assertEqual(t[1], 1)

    def test_refusals(self):
        with self.assertRaisesRegex(RbgctlError, "read-only"):
            regions(b"abc", writable=True)
        with self.assertRaisesRegex(RbgctlError, "not a buffer"):
            regions(object(), writable=False)
        with self.assertRaisesRegex(RbgctlError, "null pointer"):
            regions((0, 8), writable=True)
        strided = memoryview(bytearray(8))[::2]
        with self.assertRaisesRegex(RbgctlError, "contiguous"):
            regions(strided, writable=False)


class Settings(unittest.TestCase):
    def test_mapping_and_refusals(self):
        c = ClientConfig.from_mapping({"master": "127.0.0.1:5", "replica_num": 2, "same_host_shm": "false"})
        self.assertEqual((c.master, c.replicate.replica_num, c.same_host_shm), ("127.0.0.1:5", 2, False))
        with self.assertRaisesRegex(ConfigError, "unknown key.*mastr"):
            ClientConfig.from_mapping({"mastr": "127.0.0.1:5"})
        with self.assertRaisesRegex(ConfigError, "port 70000"):
            ClientConfig.from_mapping({"master": "127.0.0.1:70000"})
        with self.assertRaisesRegex(ConfigError, "no master address"):
            ClientConfig.from_mapping({}, env={})
        with self.assertRaisesRegex(ConfigError, "true or false"):
            ClientConfig.from_mapping({"master": "h:1", "soft_pin": "maybe"})
        with self.assertRaisesRegex(ConfigError, "below 1"):
            ClientConfig.from_mapping({"master": "h:1", "replica_num": 0})

    def test_tenant_from_mooncakes_tenant_id_ours_or_the_environment(self):
        self.assertEqual(ClientConfig.from_mapping({"master": "h:1"}, env={}).tenant, "default")
        self.assertEqual(ClientConfig.from_mapping({"master": "h:1", "tenant_id": "a"}).tenant, "a")
        self.assertEqual(ClientConfig.from_mapping({"master": "h:1", "tenant": "b-2"}).tenant, "b-2")
        env = {"MOONCAKE_TENANT_ID": "team.c"}
        self.assertEqual(ClientConfig.from_mapping({"master": "h:1"}, env=env).tenant, "team.c")
        with self.assertRaisesRegex(ConfigError, "not a tenant name"):
            ClientConfig.from_mapping({"master": "h:1", "tenant_id": "a b"})
        with self.assertRaisesRegex(ConfigError, "not a tenant name"):
            ClientConfig(master="h:1", tenant="x" * 65)

    def test_environment_precedence(self):
        self.assertEqual(ClientConfig.from_env({"MOONCAKE_MASTER": "m:1"}).master, "m:1")
        self.assertEqual(
            ClientConfig.from_env({"MOONCAKE_MASTER": "m:1", "RBGCTL_MASTER": "r:2"}).master, "r:2"
        )
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "mooncake.json")
            with open(path, "w") as f:  # a Mooncake store config file, unchanged
                json.dump(
                    {
                        "local_hostname": "10.0.0.2",
                        "metadata_server": "P2PHANDSHAKE",
                        "master_server_address": "10.0.0.1:50051",
                        "protocol": "tcp",
                        "global_segment_size": 0,
                    },
                    f,
                )
            env = {"MOONCAKE_CONFIG_PATH": path, "MOONCAKE_MASTER": "m:1"}
            self.assertEqual(ClientConfig.from_env(env).master, "10.0.0.1:50051")
            with open(path, "w") as f:
                f.write("{not json")
            with self.assertRaisesRegex(ConfigError, "not valid JSON"):
                ClientConfig.from_env(env)
            toml = os.path.join(d, "client.toml")
            with open(toml, "w") as f:
                f.write('master = "127.0.0.1:9"\nreplica_num = 3\n')
            try:
                c = ClientConfig.from_file(toml)
            except ConfigError as e:  # Python < 3.11 without tomli says so
                self.assertIn("TOML", str(e))
            else:
                self.assertEqual((c.master, c.replicate.replica_num), ("127.0.0.1:9", 3))
        with self.assertRaisesRegex(ConfigError, "RBGCTL_MASTER or MOONCAKE_MASTER"):
            ClientConfig.from_env({})

    def test_rdma_is_taken_and_served_over_tcp(self):
        with self.assertLogs("rbgctl.config", "WARNING") as logs:
            c = ClientConfig.from_env({"MOONCAKE_MASTER": "m:1", "MOONCAKE_PROTOCOL": "RDMA"})
        self.assertEqual(c.master, "m:1")
        self.assertIn("reaches stores over TCP", logs.output[0])
        with self.assertRaisesRegex(ConfigError, "cfg: protocol: expected tcp or rdma"):
            ClientConfig.from_mapping({"master": "m:1", "protocol": "udp"}, source="cfg")
        self.assertEqual(
            ClientConfig.from_env({"MOONCAKE_MASTER": "m:1", "MOONCAKE_PROTOCOL": "tcp"}).master, "m:1"
        )


class Keys(unittest.TestCase):
    def cfg(self, **kw):
        base = dict(
            tp_rank=1,
            tp_size=4,
            pp_rank=0,
            pp_size=1,
            attn_cp_rank=0,
            attn_cp_size=1,
            is_mla_model=False,
            model_name="meta-llama/Llama-3.1-8B",
        )
        base.update(kw)
        return SimpleNamespace(**base)

    def test_suffix_per_rank_and_shared_for_mla(self):
        self.assertEqual(key_suffix(self.cfg()), "_meta-llama-Llama-3.1-8B_1_4")
        self.assertEqual(key_suffix(self.cfg(is_mla_model=True)), "_meta-llama-Llama-3.1-8B")
        self.assertEqual(key_suffix(self.cfg(pp_size=2, pp_rank=1)), "_meta-llama-Llama-3.1-8B_1_4_2_1")
        self.assertEqual(
            key_suffix(self.cfg(attn_cp_size=2, attn_cp_rank=1, is_mla_model=True)),
            "_meta-llama-Llama-3.1-8B_cp1_2",
        )
        self.assertEqual(key_suffix(self.cfg(model_name=None)), "_1_4")

    def test_leading_true(self):
        self.assertEqual(leading_true([True, True, False, True]), 2)
        self.assertEqual(leading_true([]), 0)
        self.assertEqual(leading_true([True] * 3), 3)


if __name__ == "__main__":
    unittest.main()
