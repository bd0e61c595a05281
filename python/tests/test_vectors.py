"""The golden frames of ``tests/vectors/frames.json`` (generated from the Rust declaration of the
protocol by ``tests/it/protocol_vectors.rs``): this client decodes each frame it would receive and
builds each frame it would send, byte for byte. A protocol change on the Rust side that this
client does not follow fails here."""

import dataclasses
import json
import os
import unittest

from harness import REPO

from rbgctl import protocol as p

VECTORS = os.path.join(REPO, "tests", "vectors", "frames.json")


def as_json(v):
    """A decoded value as the vectors write it (serde's JSON of the Rust structs)."""
    if isinstance(v, p.Failed):
        return {"Err": v.status}
    if dataclasses.is_dataclass(v):
        return {f.name: as_json(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [as_json(x) for x in v]
    if isinstance(v, bytes):
        return v.hex()
    return v


def result_json(v):
    return as_json(v) if isinstance(v, p.Failed) else {"Ok": as_json(v)}


def replicate(f):
    return p.ReplicateConfig(
        f["replica_num"], f["soft_pin"], f["soft_pin_ttl_ms"], f["preferred_segment"], f["reach"]
    )


def stored(f):
    return p.StoredObject(f["key"], f["version"], f["offset"], f["size"], f["checksum"])


def encoded(build):
    e = p.Encoder()
    build(e)
    return e.bytes()


# What the client sends: the meta built from the vector's fields.
REQUESTS = {
    "Empty": lambda f: b"",
    "PingReq": lambda f: p.ping(f["client_id"]),
    "KeyReq": lambda f: p.key_req(f["key"]),
    "ListKeysReq": lambda f: p.list_keys_req(f["pattern"], f["limit"], f["tenant"]),
    "BatchKeysReq": lambda f: p.keys_req(f["keys"]),
    "RemoveReq": lambda f: p.remove_req(f["key"], f["force"]),
    "RemoveAllReq": lambda f: p.remove_all_req(f["force"], f["tenant"]),
    "BatchRemoveReq": lambda f: p.batch_remove_req(f["keys"], f["force"]),
    "ReportCorruptReq": lambda f: p.report_corrupt_req(f["key"], f["version"], f["segment_id"]),
    "BatchPutStartReq": lambda f: p.batch_put_start_req(
        f["client_id"], replicate(f["config"]), [(i["key"], i["size"]) for i in f["items"]]
    ),
    "BatchPutEndReq": lambda f: p.batch_put_end_req(
        f["client_id"], [(i["key"], i["object_id"], i["checksum"], i["unhashed"]) for i in f["items"]]
    ),
    "WriteReq": lambda f: p.write_req(
        f["offset"], f["key"], f["version"], f["checksum"], bytes.fromhex(f["grant"])
    ),
    "ReadReq": lambda f: p.read_req(f["offset"], f["length"]),
    "SealReq": lambda f: p.seal_req(
        [stored(o) for o in f["objects"]], [bytes.fromhex(g) for g in f["grants"]]
    ),
}

# What the client receives: (parser, the decoded value as the vector's fields, encoder).
REPLIES = {
    "Empty": (p.parse_empty, lambda v: None, lambda v: b""),
    "bool": (p.parse_bool, lambda v: v, lambda v: encoded(lambda e: e.bool(v))),
    "PingResp": (p.parse_bool, lambda v: {"need_remount": v}, lambda v: encoded(lambda e: e.bool(v))),
    "RemoveAllResp": (p.parse_u64, lambda v: {"removed": v}, lambda v: encoded(lambda e: e.u64(v))),
    "ListSegmentsResp": (
        p.parse_segments,
        lambda v: {"segments": as_json(v)},
        lambda v: encoded(lambda e: e.list(v, lambda e, s: s.encode(e))),
    ),
    "ObjectDesc": (p.parse_object_desc, as_json, lambda v: encoded(v.encode)),
    "ListKeysResp": (
        p.parse_list_keys,
        lambda v: {"keys": v[0], "truncated": v[1]},
        lambda v: encoded(lambda e: e.list(v[0], lambda e, k: e.str(k)).bool(v[1])),
    ),
    "BatchGetReplicasResp": (
        p.parse_batch_descs,
        lambda v: {"items": [result_json(x) for x in v]},
        lambda v: encoded(lambda e: e.list(v, lambda e, x: e.result(x, lambda e, d: d.encode(e)))),
    ),
    "BatchPutStartResp": (
        p.parse_batch_put_start,
        lambda v: {"items": [result_json(x) for x in v]},
        lambda v: encoded(lambda e: e.list(v, lambda e, x: e.result(x, lambda e, s: s.encode(e)))),
    ),
    "BatchStatusResp": (
        p.parse_statuses,
        lambda v: {"items": v},
        lambda v: encoded(lambda e: e.list(v, p.Encoder.u16)),
    ),
    "BatchExistsResp": (
        p.parse_bools,
        lambda v: {"items": v},
        lambda v: encoded(lambda e: e.list(v, p.Encoder.bool)),
    ),
}

# Messages between master and stores, or forms of a request this client sends in batch form
# only: the Rust suite checks them; a new message must be added to one of these three tables.
NOT_USED_HERE = {
    "MountReq",
    "MountResp",
    "UnmountReq",
    "ReportReq",
    "ReportResp",
    "PutStartReq",
    "PutStartResp",
    "PutEndReq",
    "PutRevokeReq",
    "StoreInfoResp",
    "ForgetReq",
    "ForgetLeaseReq",
    "ForgetReq+tag",
    "ForgetLeaseReq+tag",
    "MoveReq+tag",
    "LeaseReq",
    "LeaseResp",
    "AuthHelloReq",
    "AuthChallengeResp",
    "AuthProofReq",
    "MoveReq",
    "ReadVersionReq",
    "BatchPutCommitReq",
    "BatchPutCommitResp",
    "RdmaConnectReq",
    "SealDeferredResp",
    "HashedReq",
    "HandOverReq",
    "HandOverResp",
    "RdmaConnectResp",
    "CheckVersionResp",
}


def load():
    with open(VECTORS) as f:
        return json.load(f)


class GoldenFrames(unittest.TestCase):
    def test_every_message_is_known_to_this_client(self):
        names = {c["message"] for c in load()} - {"Error"}
        unknown = names - set(REQUESTS) - set(REPLIES) - NOT_USED_HERE
        self.assertEqual(unknown, set(), "messages this client neither handles nor lists as unused")

    def test_headers_decode_and_pack_again(self):
        for c in load():
            with self.subTest(c["name"]):
                frame = bytes.fromhex(c["frame"])
                h = p.unpack_header(frame[: p.HEADER_LEN])
                self.assertEqual(
                    (h.opcode, h.is_reply, h.status, h.request_id, h.data_len),
                    (c["opcode"], c["reply"], c["status"], c["request_id"], c["data_len"]),
                )
                self.assertEqual(h.meta_len, len(frame) - p.HEADER_LEN)
                again = p.pack_header(h.opcode, h.request_id, h.meta_len, h.data_len, h.status, h.flags)
                self.assertEqual(again, frame[: p.HEADER_LEN])

    def test_requests_are_built_byte_for_byte(self):
        n = 0
        for c in load():
            build = REQUESTS.get(c["message"])
            if c["reply"] or build is None:
                continue
            with self.subTest(c["name"]):
                meta = bytes.fromhex(c["frame"])[p.HEADER_LEN :]
                self.assertEqual(build(c["fields"]).hex(), meta.hex())
                n += 1
        self.assertGreaterEqual(n, 15)

    def test_replies_decode_to_their_fields_and_encode_again(self):
        n = 0
        for c in load():
            if not c["reply"] or c["message"] not in REPLIES:
                continue
            parse, fields, encode = REPLIES[c["message"]]
            with self.subTest(c["name"]):
                meta = bytes.fromhex(c["frame"])[p.HEADER_LEN :]
                value = p.decode(meta, parse)
                self.assertEqual(fields(value), c["fields"])
                self.assertEqual(encode(value).hex(), meta.hex())
                n += 1
        self.assertGreaterEqual(n, 12)

    def test_error_answers_carry_their_message(self):
        errors = [c for c in load() if c["message"] == "Error"]
        self.assertGreaterEqual(len(errors), 3)
        for c in errors:
            with self.subTest(c["name"]):
                meta = bytes.fromhex(c["frame"])[p.HEADER_LEN :]
                self.assertNotEqual(c["status"], 0)
                self.assertEqual(p.error_message(meta), c["fields"])
                self.assertTrue(p.status_name(c["status"]).isupper())


if __name__ == "__main__":
    unittest.main()
