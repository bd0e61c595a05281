#!/usr/bin/env bash
# The routing policies side by side on the whole service (`rbgctl up`: 4 SIMULATED engines with
# small device caches, the pool as L3): `bench multiturn` at one request rate per policy, and a
# table of mean and p90 TTFT and the cache hit rate.
#
#   scripts/bench-routing.sh [POLICIES]        default: round_robin,cache_aware,precise_prefix
#   BIN=target/release/rbgctl CLIENTS=32 ROUNDS=6 RATE=16 scripts/bench-routing.sh
#   DEVICE_TOKENS=4096 L3=false scripts/bench-routing.sh    # each engine's L1, and no pool as L3
#   KILL_ROUTER_AFTER=20 scripts/bench-routing.sh precise_prefix
#       kill -9 the router 20 s into the run (`up` starts it again on its port): does the
#       restarted router route as well at once? (Each policy's line is followed by the hit
#       rate of each round.)
set -euo pipefail
BIN=${BIN:-target/release/rbgctl}
POLICIES=${1:-round_robin,cache_aware,precise_prefix}
CLIENTS=${CLIENTS:-32}
ROUNDS=${ROUNDS:-6}
RATE=${RATE:-16}
PORT=${PORT:-31000}
dir=$(mktemp -d)
up=
trap '[ -n "$up" ] && kill "$up" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
printf '%-16s %10s %10s %10s %9s\n' policy "mean ttft" "p90 ttft" "hit rate" requests
for policy in ${POLICIES//,/ }; do
    cat > "$dir/up.toml" <<TOML
[pool]
stores = 2
segment_size = "256MiB"
master_port = 0
metadata_port = 0
metrics_port = 0
[engines]
count = 4
base_port = 0
page_size = 16
device_cache_tokens = ${DEVICE_TOKENS:-8192}
l3 = ${L3:-true}
host_cache_tokens = 0
[router]
port = $PORT
policy = "$policy"
TOML
    "$BIN" up --config "$dir/up.toml" > "$dir/up-$policy.log" 2>&1 &
    up=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$PORT/readiness" >/dev/null 2>&1 && break
        sleep 0.1
    done
    killer=
    if [ -n "${KILL_ROUTER_AFTER:-}" ]; then
        (
            sleep "$KILL_ROUTER_AFTER"
            pkill -9 -P "$up" -f ' router' && echo "router killed at ${KILL_ROUTER_AFTER}s" >&2
        ) &
        killer=$!
    fi
    "$BIN" bench multiturn --host 127.0.0.1 --port "$PORT" --num-clients "$CLIENTS" \
        --num-rounds "$ROUNDS" --request-length 512 --sub-question-input-length 64 \
        --output-length 16 --disable-auto-run --request-rate "$RATE" --seed 1 --json \
        > "$dir/$policy.json" 2> "$dir/$policy.err" || { echo "bench multiturn failed:" >&2; tail -5 "$dir/$policy.err" >&2; }
    [ -n "$killer" ] && wait "$killer" || true
    python3 - "$dir/$policy.json" "$policy" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).read().splitlines()[0])
s = line["summary"]
print(f"{sys.argv[2]:<16} {s['average_ttft']*1000:8.1f}ms {s['p90_ttft']*1000:8.1f}ms "
      f"{s['cache_hit_rate']*100:9.1f}% {s['total_requests']:9d}")
rounds = sorted(line["round"].items(), key=lambda kv: int(kv[0].split("_")[1]))
print("  hit rate by round: " + "  ".join(
    f"{k.split('_')[1]}:{v['cache_hit_rate']*100:.1f}%" for k, v in rounds))
PY
    kill "$up"; wait "$up" 2>/dev/null || true; up=
done
