#!/usr/bin/env bash
# The cost of checkpointing: Nexmark q5, q7 and q8 at parallelism 1, checkpointed every second
# and not, on the same events, same binary, same run:
#   bench/checkpoint_overhead.sh [EVENTS [ROUNDS [BACKEND]]]
# Each round runs every query both ways, alternating which goes first; the table reports the
# best run of each side (on a shared machine a neighbour only ever slows a run down) with the
# range of all, the drop from the best uncheckpointed to the best checkpointed run, and the
# checkpoints' figures of the best checkpointed run. Prints a markdown table for
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

EVENTS="${1:-40000000}"
ROUNDS="${2:-3}"
BACKEND="${3:-hashmap}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/weir-target}"
cargo build --release --workspace --bin weir >&2
WEIR="$CARGO_TARGET_DIR/release/weir"
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT

run() { # query, side, round
  local extra=()
  if [ "$2" = on ]; then extra=(--checkpoint-interval-ms 1000); fi
  "$WEIR" bench nexmark --query "$1" --events "$EVENTS" --parallelism 1 \
    --state-backend "$BACKEND" "${extra[@]}" --json 2> /dev/null > "$RUNS/$1-$2-$3.json"
}

for round in $(seq "$ROUNDS"); do
  for query in q5 q7 q8; do
    if [ $((round % 2)) = 1 ]; then
      run "$query" off "$round"; run "$query" on "$round"
    else
      run "$query" on "$round"; run "$query" off "$round"
    fi
  done
done

python3 - "$RUNS" "$EVENTS" "$BACKEND" <<'PY'
import glob, json, sys
runs, events, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"Backend `{backend}`, {events:,} events, parallelism 1, checkpoint interval 1 s.\n")
print("| query | off: events/s, best (range) | on: events/s, best (range) | drop, best vs best | checkpoints | duration ms p50 / max | last checkpoint bytes: full / written | sync pause ms p50 / p99 / max | checksums |")
print("|---|---|---|---|---|---|---|---|---|")
for query in ["q5", "q7", "q8"]:
    side = {s: [json.load(open(f)) for f in sorted(glob.glob(f"{runs}/{query}-{s}-*.json"))] for s in ["off", "on"]}
    rate = {s: [r["events_per_second"] / 1e6 for r in side[s]] for s in side}
    best_on = max(side["on"], key=lambda r: r["events_per_second"])
    drop = 1 - max(rate["on"]) / max(rate["off"])
    duration = best_on.get("checkpoint_duration_ms") or {}
    pause = best_on.get("sync_pause_ms") or {}
    sums = {r["checksum"] for r in side["off"] + side["on"]}
    def fmt(x):
        return "-" if x is None else f"{x:.1f}"
    print(f"| {query} | {max(rate['off']):.2f} M ({min(rate['off']):.2f}–{max(rate['off']):.2f}) "
          f"| {max(rate['on']):.2f} M ({min(rate['on']):.2f}–{max(rate['on']):.2f}) | {drop * 100:.1f} % "
          f"| {best_on.get('checkpoints_completed', 0)} | {fmt(duration.get('p50'))} / {fmt(duration.get('max'))} "
          f"| {best_on['checkpoint_bytes']['last_full']:,} / "
          f"{best_on['checkpoint_bytes']['last_incremental']:,} "
          f"| {fmt(pause.get('p50'))} / {fmt(pause.get('p99'))} / {fmt(pause.get('max'))} "
          f"| {'match' if len(sums) == 1 else 'DIFFER'} |")
PY
