# Sourced by scripts/callgrind-*.sh: the difference of two runs under callgrind, so that
# start-up and loading are left out of a per-call figure.
#
# The sourcing script defines `count N` (runs its program under callgrind for N calls, with
# `valgrind $(callgrind_opts "$dir/callgrind.N")`, and sets $total with
# `callgrind_total "$dir/callgrind.N"`), and sets N1, N2 and dir. Each thread's profile is a
# file of its own (callgrind.N-01 is the main thread). With SKIP_MAIN_THREAD=1 the main thread
# is left out of the totals: a server whose main thread only starts it and waits, and whose
# start-up does work for a time rather than a count (the master calibrates its cycle counter
# against the system clock), so that the difference holds the calls alone.

# valgrind's options for a profile at PREFIX.
callgrind_opts() {
    echo "--tool=callgrind --separate-threads=yes --callgrind-out-file=$1"
}

# The thread profiles at PREFIX that count.
callgrind_files() {
    local f
    for f in "$1"-*; do
        if [ "${SKIP_MAIN_THREAD:-0}" = 1 ] && [ "${f##*-}" = 01 ]; then
            continue
        fi
        echo "$f"
    done
}

# The instructions the profiles at PREFIX counted in all.
callgrind_total() {
    local f sum=0 n
    for f in $(callgrind_files "$1"); do
        n=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
        sum=$((sum + ${n:-0}))
    done
    echo "$sum"
}

# Runs `count N1` and `count N2`; sets a and b (their totals) and per_call. With KEEP=DIR, the
# thread profiles that count are kept: the longer run's in DIR/long, the shorter one's in
# DIR/short (scripts/callgrind-diff.py DIR/short DIR/long N2-N1 tells what the calls between
# them cost, function by function; callgrind_annotate reads one thread's file).
callgrind_difference() {
    count "$N1"
    a=$total
    count "$N2"
    b=$total
    if [ -n "${KEEP:-}" ]; then
        rm -rf "$KEEP/long" "$KEEP/short"
        mkdir -p "$KEEP/long" "$KEEP/short"
        # shellcheck disable=SC2046
        cp $(callgrind_files "$dir/callgrind.$N2") "$KEEP/long/"
        # shellcheck disable=SC2046
        cp $(callgrind_files "$dir/callgrind.$N1") "$KEEP/short/"
    fi
    per_call=$(((b - a) / (N2 - N1)))
}
