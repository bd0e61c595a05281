#!/usr/bin/env bash
# Instructions per request of the router, counted by callgrind (repeatable on a noisy or small
# machine, where timings are not): a FAKE worker, the router under valgrind with one runtime
# thread, and keep-alive requests one at a time. The router runs twice (N1 and N2 requests);
# the difference over N2 − N1 leaves start-up out.
#
#   scripts/callgrind-router.sh [CASE] [POLICY]      CASE: gen | gen-stream | chat | chat-stream
#   BIN=path/to/rbgctl N1=200 N2=1200 PROMPT_CHARS=512 scripts/callgrind-router.sh gen cache_aware
#   WORKER=sim scripts/callgrind-router.sh gen precise_prefix   (a SIMULATED engine publishing
#   its KV events, which precise_prefix follows, in place of the FAKE worker)
#
# With TENANTS=1, the router admits by tenant (issue 66): a tenants file of one tenant with a
# request rate far above the load and a concurrency cap, --max-concurrent-requests 64, and
# every request carrying the tenant's key: the count beside one without TENANTS is admission's
# cost. TENANTS=tokens also gives the tenant a token rate (the prompt's text is then read).
#
# With KEEP=DIR, the thread profiles are kept in DIR/long and DIR/short (see callgrind-lib.sh;
# scripts/callgrind-diff.py DIR/short DIR/long $((N2 - N1)) says where the calls went).
#
# BIN must be a testkit build (`cargo build --release --features testkit`) for the FAKE worker.
set -euo pipefail
# shellcheck source=scripts/callgrind-lib.sh
source "$(dirname "$0")/callgrind-lib.sh"
BIN=${BIN:-target/release/rbgctl}
CASE=${1:-gen}
POLICY=${2:-round_robin}
N1=${N1:-200}
N2=${N2:-1200}
export PROMPT_CHARS=${PROMPT_CHARS:-512}
dir=$(mktemp -d)
worker=
trap '[ -n "$worker" ] && kill "$worker" 2>/dev/null; rm -rf "$dir"' EXIT

port_of() { # the HTTP port a role wrote to its ready file
    for _ in $(seq 600); do [ -s "$1" ] && break; sleep 0.1; done
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['addrs']['http'].rsplit(':',1)[1])" "$1"
}

drive() { # N keep-alive requests of CASE at PORT
    python3 - "$1" "$2" "$CASE" <<'PY'
import http.client, json, os, sys
port, n, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
chars = int(os.environ["PROMPT_CHARS"])
prompt = ("The quick brown fox jumps over the lazy dog. " * (chars // 40 + 1))[:chars]
stream = case.endswith("-stream")
if case.startswith("gen"):
    path = "/generate"
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "stream": stream}
else:
    path = "/v1/chat/completions"
    body = {"model": "fake-model", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8, "temperature": 0, "stream": stream}
data = json.dumps(body).encode()
headers = {"content-type": "application/json"}
if os.environ.get("TENANTS", "0") != "0":
    headers["authorization"] = "Bearer callgrind-tenant-key"
c = http.client.HTTPConnection("127.0.0.1", port)
for _ in range(n):
    c.request("POST", path, body=data, headers=headers)
    r = c.getresponse()
    b = r.read()
    assert r.status == 200, (r.status, b[:200])
PY
}

case ${WORKER:-fake} in
fake) RBGCTL_READY_FILE=$dir/worker.json "$BIN" bench fake-worker --port 0 >/dev/null 2>&1 & ;;
# A SIMULATED engine that publishes its caches' KV events (for precise_prefix), answering at once.
sim) RBGCTL_READY_FILE=$dir/worker.json "$BIN" sim-engine --port 0 --prefill-us-per-token 0 \
        --decode-ms-per-token 0 --kv-events-config \
        '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,"replay_endpoint":"tcp://127.0.0.1:0","topic":"kv"}' \
        >/dev/null 2>&1 & ;;
*) echo "WORKER: fake or sim" >&2; exit 2 ;;
esac
worker=$!
worker_port=$(port_of "$dir/worker.json")
export TENANTS=${TENANTS:-0}
tenant_args=()
if [ "$TENANTS" != 0 ]; then
    key=$(printf %s callgrind-tenant-key | sha256sum | cut -d' ' -f1)
    printf '[[tenant]]\nname = "t"\nkeys = ["sha256:%s"]\nrequests_per_second = 1e9\nmax_concurrent = 100000\n' \
        "$key" > "$dir/tenants.toml"
    if [ "$TENANTS" = tokens ]; then echo 'tokens_per_second = 1e12' >> "$dir/tenants.toml"; fi
    tenant_args=(--tenants-file "$dir/tenants.toml" --max-concurrent-requests 64)
fi

count() { # instructions of a router that served N requests, into $total
    local n=$1
    RBGCTL_READY_FILE=$dir/router-$n.json valgrind $(callgrind_opts "$dir/callgrind.$n") \
        "$BIN" router --host 127.0.0.1 --port 0 \
        --prometheus-port 0 --worker-urls "http://127.0.0.1:$worker_port" --policy "$POLICY" \
        --runtime-threads 1 --disable-health-check "${tenant_args[@]}" >/dev/null 2>&1 &
    local router=$!
    drive "$(port_of "$dir/router-$n.json")" "$n"
    kill -INT "$router"
    wait "$router" || true
    total=$(callgrind_total "$dir/callgrind.$n")
}

callgrind_difference
echo "$CASE $POLICY ${PROMPT_CHARS} chars$([ "$TENANTS" != 0 ] && echo ", tenants ($TENANTS)"): $per_call instructions per request ($a at $N1, $b at $N2)"
