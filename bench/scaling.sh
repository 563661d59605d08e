#!/usr/bin/env bash
# The many-core scaling table: every Nexmark query at each parallelism, and the exchange.
#   bench/scaling.sh WEIR OUT.jsonl ["1 2 4 8 16" [EVENTS_PER_SHARD [ROUNDS]]]
#   bench/scaling.sh --table OUT.jsonl      # the markdown table of a finished run
#   QUERIES="q5 q11" bench/scaling.sh ...   # only those queries (QUERIES="": the exchange only)
# WEIR is a release build of the `weir` binary. Each run appends one JSON line to OUT.jsonl
# (the report of `weir bench nexmark|exchange --json` plus "round" and "cores"), so whatever
# finished before a time limit is kept. Events grow with the shards (EVENTS_PER_SHARD each,
# default 8 M), so that every run lasts about as long and start-up weighs the same in every
# column. Shards are pinned to distinct physical cores first (hyperthread siblings last), read
# from /sys; a parallelism above the cores this process may use is skipped and said so.
set -uo pipefail

if [ "${1:-}" = "--table" ]; then
  exec python3 - "$2" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
meta = [r for r in rows if r.get("kind") == "machine"]
runs = collections.defaultdict(list)
for r in rows:
    if r.get("kind") == "machine":
        continue
    key = (r.get("query", "exchange"), r["shards"])
    runs[key].append(r)
if meta:
    print(f"Machine: {meta[0]['description']}")
    print()
pars = sorted({s for (_, s) in runs})
queries = sorted({q for (q, _) in runs if q != "exchange"}, key=lambda q: int(q[1:]))
def rate(r):  # the exchange: records per second per shard, against the bare hand-off
    return r["events_per_second"] if "events_per_second" in r else r["records_per_second_per_shard"]
print("| query | " + " | ".join(f"{p} shard{'s' if p > 1 else ''}, M events/s, best (range)" for p in pars) + " | " + " | ".join(f"{p}/1" for p in pars[1:]) + " |")
print("|---|" + "---|" * (2 * len(pars) - 1))
for q in queries + (["exchange"] if any(k[0] == "exchange" for k in runs) else []):
    best = {}
    cells = []
    for p in pars:
        rs = [rate(r) / 1e6 for r in runs.get((q, p), [])]
        if rs:
            best[p] = max(rs)
            cells.append(f"{max(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})")
        else:
            cells.append("—")
    base = best.get(pars[0]) if q != "exchange" else None  # the exchange's figure is per shard
    ratios = [f"{best[p] / base:.2f}x" if base and p in best else "—" for p in pars[1:]]
    print(f"| {q} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
handoff = {p: [r["baseline_records_per_second"] / 1e6 for r in runs.get(("exchange", p), [])] for p in pars}
if any(handoff.values()):
    cells = [f"{max(h):.2f} ({min(h):.2f}–{max(h):.2f})" if h else "—" for h in handoff.values()]
    print("| bare two-thread hand-off, M records/s | " + " | ".join(cells) + " |" + " |" * (len(pars) - 1))
def extra(label, field, scale, unit):  # further exchange rows, where the reports carry them
    figures = {p: [r[field] * scale(r) for r in runs.get(("exchange", p), []) if field in r] for p in pars}
    if any(figures.values()):
        cells = [f"{max(f):.2f}{unit} ({min(f):.2f}–{max(f):.2f})" if f else "—" for f in figures.values()]
        print(f"| {label} | " + " | ".join(cells) + " |" + " |" * (len(pars) - 1))
extra("the exchange's job chained, no exchange, M records/s per shard", "chained_records_per_second",
      lambda r: 1 / 1e6 / r["shards"], "")
extra("exchange cost: chained / exchanged", "exchange_cost", lambda r: 1, "x")
PY
fi

WEIR="$1"
OUT="$2"
PARALLELISMS="${3:-1 2 4 8 16}"
PER_SHARD="${4:-8000000}"
ROUNDS="${5:-2}"
QUERIES="${QUERIES-q0 q1 q2 q3 q4 q5 q7 q8 q11 q12}"  # QUERIES="" runs the exchange only

# Logical CPUs this process may use, one per physical core first, then their siblings.
CORES=$(python3 - <<'PY'
import os
allowed = sorted(os.sched_getaffinity(0))
def rank(cpu):
    try:
        siblings = open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read()
        first = int(siblings.replace("-", ",").split(",")[0])
    except OSError:
        first = cpu
    return (0 if first == cpu else 1, cpu)
print(",".join(str(c) for c in sorted(allowed, key=rank)))
PY
)
AVAILABLE=$(tr ',' '\n' <<< "$CORES" | wc -l)
python3 - "$CORES" >> "$OUT" <<'PY'
import json, os, platform, sys
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
desc = f"{len(os.sched_getaffinity(0))} logical CPUs ({model}), kernel {platform.release()}; shards pinned in the order {sys.argv[1]}"
print(json.dumps({"kind": "machine", "description": desc}))
PY

run() { # shards, then the command's arguments; appends the report with round and cores
  local shards="$1"; shift
  local cores pin=()
  cores=$(tr ',' '\n' <<< "$CORES" | head -n "$shards" | paste -sd,)
  pin=(-D "taskmanager.cpu.cores=$cores")
  local report
  if report=$(timeout 120 "$WEIR" "$@" "${pin[@]}" --json 2> /tmp/scaling-err); then
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(round=int(sys.argv[2]), shards=int(sys.argv[3]), pinned=sys.argv[4]); print(json.dumps(r))' \
      "$report" "$round" "$shards" "$cores" >> "$OUT"
  else
    echo "failed: $* ($(tail -c 400 /tmp/scaling-err))" >&2
  fi
}

for round in $(seq "$ROUNDS"); do
  for p in $PARALLELISMS; do
    if [ "$p" -gt "$AVAILABLE" ]; then
      echo "skipped: $p shards, only $AVAILABLE cores" >&2
      continue
    fi
    for q in $QUERIES; do
      run "$p" bench nexmark --query "$q" --events $((PER_SHARD * p)) --parallelism "$p"
    done
    if [ "$p" -ge 2 ]; then
      run "$p" bench exchange --records $((PER_SHARD * p)) --shards "$p"
    fi
    echo "round $round, $p shards: done at $(date +%T)" >&2
  done
done
