#!/usr/bin/env bash
# Instructions and system calls per Mooncake RPC on the master, counted (repeatable on a noisy
# or small machine, where timings are not): Mooncake's own client (the wheel, unchanged) makes N
# calls of one phase, against rbgctl's master and store or against Mooncake's own master and
# storage process, the master under valgrind's callgrind. Each master runs twice (N1 and N2
# calls); the difference over N2 − N1 leaves start-up, mounting and loading out. A second pair
# of runs under `strace -f` counts the master's system calls the same way (every call it
# traced, one per line; `strace -c`'s table came out short by a third here).
#
#   scripts/callgrind-mooncake-master.sh [PEER] [PHASE]   PEER: rbgctl | mooncake
#                                                         PHASE: get | put | exists
#   PYTHON=target/ci-mooncake/bin/python BIN=target/release/rbgctl N1=300 N2=1300 \
#       scripts/callgrind-mooncake-master.sh mooncake get
#
# A get is one GetReplicaList, a put a PutStart and a PutEnd (and, on rbgctl, the master's
# SEAL_DEFERRED to the store), an exists one ExistKey; values are 4 KiB over Mooncake's TCP
# transport, which the master never touches. Time-driven work (the client's pings every
# second, each master's housekeeping) lands in the difference in proportion to the longer run's
# extra time, a small share at these counts.
set -euo pipefail
# shellcheck source=scripts/callgrind-lib.sh
source "$(dirname "$0")/callgrind-lib.sh"
BIN=${BIN:-target/release/rbgctl}
PYTHON=${PYTHON:-target/ci-mooncake/bin/python}
PEER=${1:-rbgctl}
PHASE=${2:-get}
N1=${N1:-300}
N2=${N2:-1300}
case $PEER in rbgctl | mooncake) ;; *) echo "PEER is rbgctl or mooncake, not $PEER" >&2; exit 2 ;; esac
case $PHASE in get | put | exists) ;; *) echo "PHASE is get, put or exists, not $PHASE" >&2; exit 2 ;; esac
# rbgctl's master calibrates its cycle counter on its main thread for a time at start and
# serves every call on other threads; Mooncake's serves on threads its main thread starts.
[ "$PEER" = rbgctl ] && SKIP_MAIN_THREAD=1
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
# KEEP=DIR keeps the profiles (and strace's traces) in DIR: callgrind's per thread from
# callgrind-lib.sh for rbgctl, cachegrind's here for Mooncake.
keep=${KEEP:-}
[ -n "$keep" ] && mkdir -p "$keep"
[ "$PEER" = mooncake ] && KEEP=

free_port() {
    "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # until something listens on 127.0.0.1:$1 (2 minutes: valgrind starts slowly)
    for _ in $(seq 1200); do
        "$PYTHON" -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),0.5)' "$1" \
            2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listened on port $1 within 2 minutes:" >&2
    grep -m5 -i "valgrind:\|error\|assert\|unhandled" "$dir/master.log" >&2
    exit 1
}

mooncake_master_bin() {
    "$PYTHON" -c 'import mooncake,os; print(os.path.join(os.path.dirname(mooncake.__file__),"mooncake_master"))'
}

# The wheel's client at master $1: loads $3 values (unless PHASE is put), then $2 calls of PHASE.
client() {
    "$PYTHON" - "$1" "$2" "$3" "$PHASE" <<'EOF'
import ctypes, sys
from mooncake.store import MooncakeDistributedStore
master, n, LOAD, phase = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
assert rc == 0, f"setup: {rc}"
size = 4096
buf = ctypes.create_string_buffer(size)
ptr = ctypes.addressof(buf)
s.register_buffer(ptr, size)
if phase == "put":
    for i in range(n):
        assert s.put_from(f"put/{i}", ptr, size) == 0
else:
    for i in range(LOAD):
        assert s.put_from(f"load/{i}", ptr, size) == 0
    for i in range(n):
        if phase == "get":
            assert s.get_into(f"load/{i % LOAD}", ptr, size) == size
        else:
            assert s.is_exist(f"load/{i % LOAD}") == 1
s.unregister_buffer(ptr)
s.close()
EOF
}

# Starts the master (under $1: a wrapper command) and its store; sets master_pid and addr.
start() {
    local wrap=$1 rpc
    wrapped=${wrap%% *}
    rpc=$(free_port)
    addr=127.0.0.1:$rpc
    if [ "$PEER" = rbgctl ]; then
        master_name=rbgctl
        # shellcheck disable=SC2086
        $wrap "$BIN" master --rpc-address 127.0.0.1 --rpc-port "$rpc" \
            --metrics-host 127.0.0.1 --metrics-port 0 >"$dir/master.log" 2>&1 &
        master_pid=$!
        pids+=("$master_pid")
        wait_port "$rpc"
        rm -f "$dir/store.json"
        RBGCTL_READY_FILE=$dir/store.json "$BIN" store --master "$addr" --name s0 --segment-size 64MiB --persistent false \
            --bind-address 127.0.0.1 --port 0 --metrics-port 0 >"$dir/store.log" 2>&1 &
        pids+=("$!")
        # Ready once its segment is mounted.
        for _ in $(seq 1200); do [ -s "$dir/store.json" ] && break; sleep 0.1; done
        [ -s "$dir/store.json" ] || { echo "the store did not start:" >&2; tail -5 "$dir/store.log" >&2; exit 1; }
    else
        master_name=mooncake_master
        # shellcheck disable=SC2086
        MC_TCP_BIND_ADDRESS=127.0.0.1 $wrap "$(mooncake_master_bin)" --rpc_port="$rpc" \
            --rpc_address=127.0.0.1 --metrics_port="$(free_port)" \
            --enable_http_metadata_server=false >"$dir/master.log" 2>&1 &
        master_pid=$!
        pids+=("$master_pid")
        wait_port "$rpc"
        # A storage process contributing a 64 MiB segment, as in `bench store`'s Mooncake rows.
        mkfifo "$dir/node.in"
        MC_TCP_BIND_ADDRESS=127.0.0.1 "$PYTHON" "$(dirname "$0")/mooncake_peer.py" node \
            --master "$addr" --segment $((64 << 20)) <"$dir/node.in" >"$dir/node.out" 2>/dev/null &
        pids+=("$!")
        exec 9>"$dir/node.in"
        for _ in $(seq 1200); do grep -q "storage node ready" "$dir/node.out" && break; sleep 0.1; done
        grep -q "storage node ready" "$dir/node.out" || { echo "the storage node did not start" >&2; exit 1; }
    fi
}

# Stops what start started; the master last, by SIGINT, so that valgrind writes its profile.
stop() {
    [ "$PEER" = mooncake ] && exec 9>&- && rm -f "$dir/node.in"
    for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    # Under strace the master is strace's child.
    if [ "$wrapped" = strace ]; then pkill -INT -x -P "$master_pid" "$master_name"; else kill -INT "$master_pid"; fi
    wait "$master_pid" || true
    pids=()
}

run_client() {
    client "$addr" "$1" "$N2" 2>"$dir/client.err" \
        || { echo "the wheel's client failed:" >&2; tail -5 "$dir/client.err" >&2; exit 1; }
}

count() { # instructions of a master that served the load and N calls of PHASE, into $total
    local opts
    opts=$(callgrind_opts "$dir/callgrind.$1")
    # Callgrind fails an assertion on a signal Mooncake's master takes as it starts:
    # cachegrind counts the same instructions, without a call graph, all threads in one.
    [ "$PEER" = mooncake ] && opts="--tool=cachegrind --cache-sim=no --cachegrind-out-file=$dir/cachegrind.$1"
    start "valgrind $opts"
    run_client "$1"
    stop
    if [ "$PEER" = mooncake ]; then
        total=$(awk '/^summary:/ {print $2}' "$dir/cachegrind.$1")
        [ -n "$keep" ] && cp "$dir/cachegrind.$1" "$keep/"
    else
        total=$(callgrind_total "$dir/callgrind.$1")
    fi
}

syscalls() { # system calls of a master that served the load and N calls, into $total
    start "strace -f -qq -o $dir/strace.$1"
    run_client "$1"
    stop
    # A call another thread interrupted is written twice, begun and resumed: counted once.
    total=$(grep -vc 'resumed>' "$dir/strace.$1")
    [ -n "$keep" ] && cp "$dir/strace.$1" "$keep/" || true
}

callgrind_difference
echo "$PEER $PHASE: $per_call master instructions per call ($a at $N1, $b at $N2)"
syscalls "$N1"
a_sys=$total
syscalls "$N2"
echo "$PEER $PHASE: $(((total - a_sys) / (N2 - N1))) master system calls per call ($a_sys at $N1, $total at $N2)"
