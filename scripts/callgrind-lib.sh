# Sourced by scripts/callgrind-*.sh: the difference of two runs under callgrind, so that
# start-up and loading are left out of a per-call figure.
#
# The sourcing script defines `count N` (runs its program under callgrind for N calls, writing
# the profile to "$dir/callgrind.N" and its total instructions to $total, via callgrind_total),
# and sets N1, N2 and dir.

# The instructions a callgrind profile counted in all.
callgrind_total() {
    callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

# Runs `count N1` and `count N2`; sets a and b (their totals) and per_call. With KEEP=DIR, the
# longer run's profile is kept as DIR/callgrind.out and the shorter one's as DIR/callgrind.short
# (scripts/callgrind-diff.py tells what the calls between them cost, function by function).
callgrind_difference() {
    count "$N1"
    a=$total
    count "$N2"
    b=$total
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP" && cp "$dir/callgrind.$N2" "$KEEP/callgrind.out" &&
            cp "$dir/callgrind.$N1" "$KEEP/callgrind.short"
    fi
    per_call=$(((b - a) / (N2 - N1)))
}
