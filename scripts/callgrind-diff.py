#!/usr/bin/env python3
"""What the calls between two callgrind profiles of one program cost, function by function.

    scripts/callgrind-diff.py SHORT LONG CALLS [--inclusive] [--top N]

SHORT and LONG are profiles of the same work with fewer and more calls, each a file or a
directory of files (one per thread, summed; callgrind-master.sh and callgrind-router.sh keep
them with KEEP=DIR as DIR/short and DIR/long); CALLS is how many more LONG made. Prints each
function's instructions per extra call, largest first: self cost by default, inclusive cost
with --inclusive.
"""
import argparse
import os
import subprocess


def costs(path, inclusive):
    if os.path.isdir(path):
        table = {}
        for name in sorted(os.listdir(path)):
            for f, n in file_costs(os.path.join(path, name), inclusive).items():
                table[f] = table.get(f, 0) + n
        return table
    return file_costs(path, inclusive)


def file_costs(path, inclusive):
    out = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
         "--threshold=100", "--auto=no", path],
        check=True, capture_output=True, text=True).stdout
    table, started = {}, False
    for line in out.splitlines():
        if line.startswith("Ir") and "file:function" in line:
            started = True
            continue
        if not started or not line.strip() or line.startswith("--"):
            continue
        count, _, rest = line.strip().partition(" ")
        try:
            n = int(count.replace(",", ""))
        except ValueError:
            continue
        # "(12.3%)  file:function [object]": keep file:function.
        name = rest.split(")", 1)[-1].strip()
        name = name.rsplit(" [", 1)[0]
        table[name] = table.get(name, 0) + n
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("short")
    ap.add_argument("long")
    ap.add_argument("calls", type=int)
    ap.add_argument("--inclusive", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    short, long = costs(a.short, a.inclusive), costs(a.long, a.inclusive)
    rows = sorted(((long.get(f, 0) - short.get(f, 0)) / a.calls, f) for f in set(short) | set(long))
    rows.reverse()
    total = sum(per for per, _ in rows) if not a.inclusive else None
    if total is not None:
        print(f"{total:8.1f}  (sum of self costs per call)")
    for per, f in rows[: a.top]:
        if abs(per) >= 0.5:
            print(f"{per:8.1f}  {f[:150]}")


if __name__ == "__main__":
    main()
