#!/usr/bin/env bash
# Nexmark q1 on one shard: no figures read, read every second, read every 100 ms; alternating rounds.
set -euo pipefail
W=${WEIR:-/var/tmp/weir-target/release/weir}
OUT=${1:-/var/tmp/q1-scrape.jsonl}
: > "$OUT"
for round in 1 2 3; do
  for scrape in none 1000 100; do
    if [ "$scrape" = none ]; then extra=(); else extra=(--scrape-ms "$scrape"); fi
    line=$("$W" bench nexmark --query q1 --events 100000000 --parallelism 1 "${extra[@]}" --json 2>/dev/null)
    echo "{\"round\":$round,\"scrape\":\"$scrape\",\"report\":$line}" >> "$OUT"
  done
done
