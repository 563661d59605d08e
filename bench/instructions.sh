#!/usr/bin/env bash
# Instructions per event of every Nexmark query on 1 shard and of its hand-written baseline,
# counted by valgrind's cachegrind (`apt-get install valgrind`):
#   bench/instructions.sh [EVENTS]
# A count does not move with the neighbours of a shared machine, as throughput does, so it shows
# what a change does to the work per event; it says nothing about cache misses or waiting. Under
# valgrind a run is ~50x slower, so what is timed in wall-clock (the 1 ms buffer timeout, the
# 200 ms watermark interval) happens ~50x less often per event than in a real run.
set -euo pipefail
cd "$(dirname "$0")/.."

EVENTS="${1:-1000000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/weir-target}"
cargo build --release --workspace --bin weir >&2
WEIR="$CARGO_TARGET_DIR/release/weir"

count() {
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$@" 2>&1 > /dev/null \
    | sed -n 's/.*I *refs: *//p' | tr -d ,
}

echo "Commit \`$(git rev-parse --short HEAD)\`, $EVENTS events (\`bench/instructions.sh $EVENTS\`)."
echo
echo "| query | weir instructions/event | baseline instructions/event | weir / baseline |"
echo "|---|---|---|---|"
# Instructions per event of `weir bench nexmark --query Q ARGS...`: the count of EVENTS events
# less that of 1 000, which is the process's fixed cost (start-up, the generator's tables;
# ~42 M instructions either way).
per_event() {
  local q=$1 many few
  shift
  many=$(count "$WEIR" bench nexmark --query "$q" --events "$EVENTS" "$@" --json)
  few=$(count "$WEIR" bench nexmark --query "$q" --events 1000 "$@" --json)
  python3 -c "print(($many - $few) / ($EVENTS - 1000))"
}

for q in q0 q1 q2 q3 q4 q5 q7 q8 q11 q12; do
  engine=$(per_event "$q" --parallelism 1)
  baseline=$(per_event "$q" --baseline)
  python3 -c "e, b = $engine, $baseline; print(f'| $q | {e:.0f} | {b:.0f} | {e / b:.2f}x |')"
done
