#!/usr/bin/env python3
"""Drives Mooncake's client (the wheel in this Python's environment) through every call a
HiCache backend makes, against the master at --master, so that the master sees the function
ids and type hashes this wheel sends (`rbgctl mooncake-wire`, which embeds this file).

Each call is tried on its own: one that this wheel version lacks is reported, not fatal.
"""

import argparse
import ctypes
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", required=True)
    args = p.parse_args()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", args.master)
    print("setup", rc, flush=True)
    if rc != 0:
        sys.exit(1)
    n = 4096
    src = ctypes.create_string_buffer(os.urandom(n), n)
    dst = ctypes.create_string_buffer(n)
    calls = [
        ("register_buffer", lambda: s.register_buffer(ctypes.addressof(src), n)),
        ("register_buffer", lambda: s.register_buffer(ctypes.addressof(dst), n)),
        ("put", lambda: s.put("wire/a", b"a" * 100)),
        ("put with config", lambda: s.put("wire/c", b"c" * 100, ReplicateConfig())),
        ("get", lambda: len(s.get("wire/a"))),
        ("get_size", lambda: s.get_size("wire/a")),
        ("is_exist", lambda: s.is_exist("wire/a")),
        ("batch_is_exist", lambda: list(s.batch_is_exist(["wire/a", "wire/none"]))),
        ("put_batch", lambda: s.put_batch(["wire/b1", "wire/b2"], [b"1", b"2"])),
        ("get_batch", lambda: [len(v) for v in s.get_batch(["wire/b1", "wire/b2"])]),
        ("put_from", lambda: s.put_from("wire/z", ctypes.addressof(src), n)),
        ("get_into", lambda: s.get_into("wire/z", ctypes.addressof(dst), n)),
        ("batch_put_from", lambda: list(s.batch_put_from(["wire/z1"], [ctypes.addressof(src)], [n]))),
        ("batch_get_into", lambda: list(s.batch_get_into(["wire/z1"], [ctypes.addressof(dst)], [n]))),
        ("upsert", lambda: s.upsert("wire/a", b"A" * 100)),
        ("remove", lambda: s.remove("wire/c", True)),
        ("batch_remove", lambda: s.batch_remove(["wire/b1"], True)),
    ]
    for name, call in calls:
        try:
            print(name, call(), flush=True)
        except Exception as e:  # noqa: BLE001 - a call this wheel lacks is reported
            print(name, "failed:", type(e).__name__, e, flush=True)
    # A process with a segment pings and asks for tasks every second.
    time.sleep(2.5)
    try:
        print("remove_all", s.remove_all(), flush=True)
    except Exception as e:  # noqa: BLE001
        print("remove_all failed:", e, flush=True)
    s.close()


if __name__ == "__main__":
    main()
