#!/usr/bin/env bash
# Instructions per metadata operation on the master, counted by callgrind (repeatable on a
# noisy or small machine, where timings are not): the master under valgrind, `bench master`
# loading OBJECTS objects through its PAPER store and then making N calls of one phase from
# one client. The master runs twice (N1 and N2 calls); the difference over N2 − N1 leaves
# the start-up and the load out.
#
#   scripts/callgrind-master.sh [PHASE]      PHASE: exists | ping | describe | batch-exists | put
#   BIN=path/to/rbgctl N1=1000 N2=6000 OBJECTS=10000 scripts/callgrind-master.sh exists
#
# With KEEP=DIR, the thread profiles are kept in DIR/long and DIR/short (see callgrind-lib.sh;
# scripts/callgrind-diff.py DIR/short DIR/long $((N2 - N1)) says where the calls went).
set -euo pipefail
# shellcheck source=scripts/callgrind-lib.sh
source "$(dirname "$0")/callgrind-lib.sh"
BIN=${BIN:-target/release/rbgctl}
PHASE=${1:-exists}
N1=${N1:-1000}
N2=${N2:-6000}
OBJECTS=${OBJECTS:-10000}
# The master's main thread starts it (a cycle-counter calibration that runs for a time) and
# waits: every call is served on other threads.
SKIP_MAIN_THREAD=1
dir=$(mktemp -d)
master=
trap '[ -n "$master" ] && kill "$master" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

rpc_of() { # the RPC address a master wrote to its ready file
    for _ in $(seq 1200); do [ -s "$1" ] && break; sleep 0.1; done
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['addrs']['rpc'])" "$1"
}

count() { # instructions of a master that served the load and N calls of PHASE, into $total
    local n=$1
    RBGCTL_READY_FILE=$dir/master-$n.json valgrind $(callgrind_opts "$dir/callgrind.$n") \
        "$BIN" master --rpc-address 127.0.0.1 \
        --rpc-port 0 --metrics-host 127.0.0.1 --metrics-port 0 >/dev/null 2>&1 &
    master=$!
    "$BIN" bench master --master "$(rpc_of "$dir/master-$n.json")" --objects "$OBJECTS" \
        --clients 1 --phases "$PHASE" --ops-per-phase "$n" --phase-time 600s --rest 0s \
        --json > "$dir/bench-$n.json" 2> "$dir/bench-$n.err" \
        || { echo "bench master failed:" >&2; tail -5 "$dir/bench-$n.err" >&2; exit 1; }
    kill -INT "$master"
    wait "$master" || true
    master=
    total=$(callgrind_total "$dir/callgrind.$n")
}

callgrind_difference
echo "$PHASE, $OBJECTS objects: $per_call master instructions per call ($a at $N1, $b at $N2)"
