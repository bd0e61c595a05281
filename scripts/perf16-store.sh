#!/usr/bin/env bash
# Issue 41's figures on the quiet 16-core machine that some sessions are lent (the `device`
# tool; ../shared/device/ says how): `bench store` with every row the issue names, judged against
# the limits measured in the same run, and redis-server beside the small values.
#
#   here:  scripts/perf16-store.sh prepare    # release build, stripped, and redis-server with
#                                             # the libraries it needs, under target/device/
#   there: bash target/device/perf16-store.sh run    # (carry ["target/device"]); figures in $OUT
set -euo pipefail
case "${1:-}" in
prepare)
    cargo build --release --features testkit
    rm -rf target/device && mkdir -p target/device/redis/lib
    strip -o target/device/rbgctl target/release/rbgctl
    cp "$0" target/device/perf16-store.sh
    # Debian's redis-server is redis-check-rdb under another name; it picks its role from argv[0].
    real=$(readlink -f "$(command -v redis-server)")
    cp "$real" target/device/redis/redis-check-rdb
    ldd "$real" | awk '/=> \// {print $3}' | grep -v -E '/lib(c|m|pthread|dl|rt)\.so' |
        xargs -r -I{} cp -L {} target/device/redis/lib/
    cat > target/device/redis/redis-server <<'EOF'
#!/usr/bin/env bash
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib" exec -a redis-server "$here/redis-check-rdb" "$@"
EOF
    chmod +x target/device/redis/redis-server
    target/device/redis/redis-server --version
    du -sh target/device
    ;;
run)
    here=$(dirname "$(readlink -f "$0")")
    out=${OUT:-/tmp/out}
    mkdir -p "$out"
    echo "host: $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB, kernel $(uname -r)"
    "$here/rbgctl" --version
    set +e
    timeout 300 "$here/rbgctl" bench store --json --breakdown \
        --sizes 4KiB,64KiB,1MiB,4MiB --threads 1,4,8 --phase-time 1500ms \
        --segment-size 12GiB --persistent false \
        --redis-server "$here/redis/redis-server" \
        --report "$out/store.html" >"$out/store.json" 2>"$out/store.err"
    echo "rc=$?"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
