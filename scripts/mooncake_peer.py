#!/usr/bin/env python3
"""The Mooncake store, measured the way `rbgctl bench store` measures rbgctl, for a side-by-side
run (`rbgctl bench store --mooncake-python PYTHON`).

Run with a Python that imports the `mooncake-transfer-engine-non-cuda` wheel (its
`mooncake_master` binary is in the package). Same topology as rbgctl's rows: a master, one
storage process (a 4 GiB segment, no local buffer) and this process as a pure client, all on
loopback over TCP (or Mooncake's RDMA transport: `--protocol rdma --device rxe0`). The client uses the zero-copy calls (`put_from` / `get_into` and their batch
forms, on a registered buffer), Mooncake's fastest, and `batch_is_exist` of 128 keys. Prints
one JSON document: the rows, the master RPCs the client's calls make, and the CPU time
Mooncake's master and storage process spent meanwhile (from /proc).

With `--on-master ADDR` the same client runs against the master at ADDR (rbgctl's, with its
stores) instead of starting Mooncake's: the wheel, unchanged, on both.

    python mooncake_peer.py run --sizes 4096,65536 --phase-time 2 --phase-ops 20000 \
        --phase-bytes 1073741824 --batch 32 --batch-value 262144 [--on-master 127.0.0.1:50051]
"""

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

READY = "mooncake-peer: storage node ready"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline):
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def store(master, segment, buffer, protocol="tcp", device=""):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, protocol, device, master)
    if rc != 0:
        raise SystemExit(f"mooncake setup failed: {rc}")
    return s


def node(args):
    """A pure storage node: contributes its segment until its stdin closes."""
    s = store(args.master, args.segment, 0, args.protocol, args.device)
    print(READY, flush=True)
    sys.stdin.read()
    s.close()


# Master RPCs each client call makes (Mooncake's MasterClient): a put starts and ends, a get
# asks for the replica list, a batch does so once for all its keys.
RPCS = {"put": 2, "get": 1, "batch_put": 2, "batch_get": 1, "batch_exists": 1}


def cpu_seconds(pid):
    """utime + stime of process `pid`, from /proc (None when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def percentile(sorted_us, q):
    if not sorted_us:
        return 0.0
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


CASE = "mooncake tcp"


def row(op, value, items, measured):
    latencies, elapsed, errors, cpu = measured
    lat = sorted(l * 1e6 for l in latencies)
    ops = len(latencies) * items
    kind = op.split(" ")[0]
    row.rpcs += (len(latencies) + errors) * RPCS[kind]
    row.calls += len(latencies) + errors
    return {
        "case": CASE,
        "op": op,
        "value_bytes": value,
        "threads": 1,
        "ops": ops,
        "bytes": ops * value,
        "errors": errors,
        "seconds": elapsed,
        "gb_per_s": ops * value / elapsed / 1e9 if elapsed > 0 else 0.0,
        "ops_per_s": ops / elapsed if elapsed > 0 else 0.0,
        "p50_us": percentile(lat, 0.50),
        "p99_us": percentile(lat, 0.99),
        # The client process's own CPU time (all its threads) per call: what no server can
        # take off a call's latency.
        "client_cpu_us": cpu * 1e6 / max(1, len(latencies) + errors),
    }


def phase(n, time_cap, op):
    """Runs op(i) for i in 0..n until the time cap; answers latencies, elapsed, errors and the
    process's CPU seconds."""
    latencies, errors = [], 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(n):
        if time.perf_counter() - t0 > time_cap:
            break
        start = time.perf_counter()
        if op(i):
            latencies.append(time.perf_counter() - start)
        else:
            errors += 1
    return latencies, time.perf_counter() - t0, errors, time.process_time() - cpu0


def fill(buf, size, seed):
    pattern = bytes((seed * 31 + i) % 251 for i in range(251))
    data = (pattern * (size // len(pattern) + 1))[:size]
    ctypes.memmove(buf, data, size)
    return data


def client(args):
    s = store(args.master, 0, args.buffer, args.protocol, args.device)
    rows = []
    run = f"peer{os.getpid()}"
    for size in args.sizes:
        buf = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(buf)
        s.register_buffer(ptr, size)
        data = fill(buf, size, size)
        n = max(1, min(args.phase_ops, args.phase_bytes // size))
        key = lambda i: f"{run}/{size}/{i}"
        put = phase(n, args.phase_time, lambda i: s.put_from(key(i), ptr, size) == 0)
        rows.append(row("put", size, 1, put))
        written = len(put[0])
        ctypes.memset(buf, 0, size)
        lat, el, err, cpu = phase(written, args.phase_time, lambda i: s.get_into(key(i), ptr, size) == size)
        if lat and ctypes.string_at(ptr, size) != data:
            err += 1
        rows.append(row("get", size, 1, (lat, el, err, cpu)))
        s.batch_remove([key(i) for i in range(written)], True)
        s.unregister_buffer(ptr)

    b, v = args.batch, args.batch_value
    buf = ctypes.create_string_buffer(b * v)
    base = ctypes.addressof(buf)
    s.register_buffer(base, b * v)
    fill(buf, b * v, 7)
    ptrs = [base + j * v for j in range(b)]
    sizes = [v] * b
    calls = max(1, min(args.phase_ops, args.phase_bytes // v) // b)
    keys = lambda i: [f"{run}/batch/{i}/{j}" for j in range(b)]
    ok = lambda rcs: all(rc == 0 for rc in rcs)
    put = phase(calls, args.phase_time, lambda i: ok(s.batch_put_from(keys(i), ptrs, sizes)))
    rows.append(row(f"batch_put {b}x", v, b, put))
    written = len(put[0])
    got = lambda rcs: all(rc == v for rc in rcs)
    rows.append(row(f"batch_get {b}x", v, b,
                    phase(written, args.phase_time, lambda i: got(s.batch_get_into(keys(i), ptrs, sizes)))))
    # Which of 128 keys exist (half of them do), asked at once: one master round trip.
    present = [k for i in range(written) for k in keys(i)][:64]
    asked = present + [f"{run}/absent/{j}" for j in range(128 - len(present))]
    want = [1] * len(present) + [0] * (128 - len(present))
    rows.append(row("batch_exists 128x", 0, 128,
                    phase(args.phase_ops, args.phase_time, lambda i: list(s.batch_is_exist(asked)) == want)))
    for i in range(written):
        s.batch_remove(keys(i), True)
    s.unregister_buffer(base)
    s.close()
    return rows


def report(rows, master_cpu, store_cpu):
    json.dump({"rows": rows, "client_rpcs": row.rpcs, "client_calls": row.calls,
               "master_cpu_seconds": master_cpu, "store_cpu_seconds": store_cpu},
              sys.stdout)
    print()


def run(args):
    global CASE
    row.rpcs = row.calls = 0
    CASE = f"mooncake {args.protocol}"
    if args.on_master:
        CASE = f"mooncake client on rbgctl {args.protocol}"
        args.master = args.on_master
        report(client(args), None, None)
        return
    # The binary the wheel's `mooncake_master` command runs, in its package (also found when
    # the package is on PYTHONPATH rather than installed in this Python's environment).
    try:
        import mooncake
    except ImportError:
        raise SystemExit(f"{sys.executable} cannot import mooncake: install "
                         "mooncake-transfer-engine-non-cuda into its environment")
    master_bin = os.path.join(os.path.dirname(os.path.abspath(mooncake.__file__)),
                              "mooncake_master")
    if not os.access(master_bin, os.X_OK):
        raise SystemExit(f"no executable mooncake_master in {os.path.dirname(master_bin)}")
    env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
    rpc, metrics = free_port(), free_port()
    master = subprocess.Popen(
        [master_bin, f"--rpc_port={rpc}", f"--metrics_port={metrics}",
         "--rpc_address=127.0.0.1", "--enable_http_metadata_server=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    storage = None
    try:
        if not wait_port(rpc, time.monotonic() + 20):
            raise SystemExit("mooncake_master did not listen within 20 s")
        addr = f"127.0.0.1:{rpc}"
        storage = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "node", "--master", addr,
             "--segment", str(args.segment), "--protocol", args.protocol,
             "--device", args.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True)
        line = storage.stdout.readline()
        if READY not in line:
            raise SystemExit("the Mooncake storage node did not start")
        args.master = addr
        before = [cpu_seconds(p.pid) for p in (master, storage)]
        rows = client(args)
        after = [cpu_seconds(p.pid) for p in (master, storage)]
        spent = [a - b if a is not None and b is not None else None
                 for a, b in zip(after, before)]
        report(rows, *spent)
    finally:
        for p in (storage, master):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
    r.add_argument("--phase-time", type=float, default=2.0)
    r.add_argument("--phase-ops", type=int, default=20000)
    r.add_argument("--phase-bytes", type=int, default=1 << 30)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--batch-value", type=int, default=256 << 10)
    r.add_argument("--segment", type=int, default=4 << 30)
    r.add_argument("--buffer", type=int, default=512 << 20)
    r.add_argument("--on-master", default=None,
                   help="run the client against this master (rbgctl's) instead of Mooncake's")
    n = sub.add_parser("node")
    n.add_argument("--master", required=True)
    n.add_argument("--segment", type=int, required=True)
    for q in (r, n):
        q.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"],
                       help="Mooncake's transport for the node and the client")
        q.add_argument("--device", default="", help="RDMA devices (rdma), e.g. rxe0")
    args = p.parse_args()
    if args.mode == "node":
        node(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
