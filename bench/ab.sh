#!/usr/bin/env bash
# Same-run A/B of two `weir` binaries (say the commit before a change and the change), with
# checkpointing off: Nexmark throughput per query at parallelism 1, alternating which binary
# goes first each round, and instructions per event (cachegrind, `apt-get install valgrind`),
# which do not move with the neighbours of a shared machine:
#   bench/ab.sh OLD_WEIR NEW_WEIR [EVENTS [ROUNDS [BACKEND [QUERIES]]]]
# Build each binary with `cargo build --release --workspace --bin weir` and copy it out of the
# target directory before building the other. Prints a markdown table for bench/RESULTS.md:
# the best run of each side (a neighbour only ever slows a run down), the range, the new/old
# ratio of the bests, and of the instruction counts (1 M events less 1 000, per event).
set -euo pipefail

OLD="$1"
NEW="$2"
EVENTS="${3:-10000000}"
ROUNDS="${4:-3}"
BACKEND="${5:-hashmap}"
QUERIES="${6:-q5 q7 q8}"
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT

run() { # binary, side, query, round
  "$1" bench nexmark --query "$3" --events "$EVENTS" --parallelism 1 --state-backend "$BACKEND" \
    --json 2> /dev/null > "$RUNS/$3-$2-$4.json"
}

count() {
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$@" 2>&1 > /dev/null \
    | sed -n 's/.*I *refs: *//p' | tr -d ,
}

per_event() { # binary, query
  local many few
  many=$(count "$1" bench nexmark --query "$2" --events 1000000 --state-backend "$BACKEND" --json)
  few=$(count "$1" bench nexmark --query "$2" --events 1000 --state-backend "$BACKEND" --json)
  python3 -c "print(($many - $few) / (1000000 - 1000))"
}

for round in $(seq "$ROUNDS"); do
  for query in $QUERIES; do
    if [ $((round % 2)) = 1 ]; then
      run "$OLD" old "$query" "$round"; run "$NEW" new "$query" "$round"
    else
      run "$NEW" new "$query" "$round"; run "$OLD" old "$query" "$round"
    fi
  done
done
for query in $QUERIES; do
  if command -v valgrind > /dev/null; then
    echo "$(per_event "$OLD" "$query") $(per_event "$NEW" "$query")" > "$RUNS/$query.instructions"
  fi
done

python3 - "$RUNS" "$EVENTS" "$BACKEND" "$QUERIES" <<'PY'
import glob, json, os, sys
runs, events, backend, queries = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
print(f"Backend `{backend}`, {events:,} events, parallelism 1, checkpointing off.\n")
print("| query | old: events/s, best (range) | new: events/s, best (range) | new / old | instructions/event old / new | new / old | checksums |")
print("|---|---|---|---|---|---|---|")
for query in queries:
    side = {s: [json.load(open(f)) for f in sorted(glob.glob(f"{runs}/{query}-{s}-*.json"))] for s in ["old", "new"]}
    rate = {s: [r["events_per_second"] / 1e6 for r in side[s]] for s in side}
    sums = {r["checksum"] for r in side["old"] + side["new"]}
    path = f"{runs}/{query}.instructions"
    if os.path.exists(path):
        old_i, new_i = map(float, open(path).read().split())
        instructions = f"{old_i:.0f} / {new_i:.0f} | {new_i / old_i:.3f}"
    else:
        instructions = "- | -"
    print(f"| {query} | {max(rate['old']):.2f} M ({min(rate['old']):.2f}–{max(rate['old']):.2f}) "
          f"| {max(rate['new']):.2f} M ({min(rate['new']):.2f}–{max(rate['new']):.2f}) "
          f"| {max(rate['new']) / max(rate['old']):.3f} | {instructions} "
          f"| {'equal' if len(sums) == 1 else 'DIFFER: ' + ', '.join(sorted(sums))} |")
PY
