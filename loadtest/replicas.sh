#!/usr/bin/env bash
# Cache-hit ratio with 1, 2, 4 and 8 gateway replicas behind a round-robin client, with and
# without KV-cache events (issue 28's table). One fleet of WORKERS smg-sim HTTP workers
# (default 4) that count prompts in their model's tokens and publish their prefix caches
# over ZMQ (--tokenize-http --kv-events-endpoint); R gateways, each cache_aware on one core,
# either following every worker's events (--kv-events, --tokenizer-path) or guessing from their
# own trees (today's routing); R smg-load processes replaying the Mooncake sample trace, part
# k/R to gateway k (request i goes to gateway i mod R: a round-robin client). The ratio is
# cached over prompt tokens, summed over the workers' /sim/stats. The fleet restarts for each
# row, so every row starts from cold caches.
#
# Run from the repository root after `cargo build --release --workspace`. Everything listens
# on 127.0.0.1 and stops by itself. SPEEDUP (default 1) replays the trace faster.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release
workers=${WORKERS:-4}
speedup=${SPEEDUP:-1}
trace=loadtest/traces/mooncake-sample.jsonl
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# Cached and prompt tokens summed over the workers on these ports.
tokens() {
  python3 -c '
import json, sys, urllib.request
stats = [json.load(urllib.request.urlopen(f"http://127.0.0.1:{p}/sim/stats")) for p in sys.argv[1:]]
print(sum(s["cached_tokens"] for s in stats), sum(s["prompt_tokens"] for s in stats))' "$@"
}

row() { # replicas events(on|off)
  local replicas=$1 events=$2 ports=() urls=() flags=()
  for _ in $(seq "$workers"); do p=$(free_port); ports+=("$p"); urls+=("http://127.0.0.1:$p"); done
  : >"$tmp/sim.log"
  "$bin/smg-sim" --ports "$(IFS=,; echo "${ports[*]}")" --model sim-model --itl-ms 0.2 --tokenize-http \
    --tokenizer-dir "$tmp/tokenizer" --kv-events-endpoint tcp://127.0.0.1:0 >"$tmp/sim.log" 2>&1 &
  local sim=$!
  for _ in $(seq 100); do [ "$(grep -c '^listening' "$tmp/sim.log" || true)" -eq "$workers" ] && break; sleep 0.1; done
  if [ "$events" = on ]; then
    for i in $(seq 0 $((workers - 1))); do
      flags+=(--kv-events "${urls[$i]}=$(grep "127.0.0.1:${ports[$i]} " "$tmp/sim.log" | sed 's/.*kv_events=//')")
    done
    flags+=(--tokenizer-path "$tmp/tokenizer")
  fi
  local gws=() pids=()
  for k in $(seq 0 $((replicas - 1))); do
    local gw; gw=$(free_port); gws+=("$gw")
    : >"$tmp/smg$k.log"
    "$bin/smg" launch --host 127.0.0.1 --port "$gw" --policy cache_aware --cores 1 --prometheus-port 0 --log-level debug \
      --worker-urls "${urls[@]}" "${flags[@]}" >"$tmp/smg$k.log" 2>&1 &
    pids+=($!)
  done
  for gw in "${gws[@]}"; do
    for _ in $(seq 100); do curl -s "127.0.0.1:$gw/readiness" | grep -q "\"healthy_workers\":$workers" && break; sleep 0.1; done
  done
  if [ "$events" = on ]; then
    # Every gateway follows every publisher, and each worker's events carry a block size once
    # it has stored one: a prompt of its own to each, straight to the worker.
    for k in $(seq 0 $((replicas - 1))); do
      for _ in $(seq 100); do
        [ "$(grep -c 'subscribed' "$tmp/smg$k.log" || true)" -ge "$workers" ] && break; sleep 0.1
      done
    done
    for u in "${urls[@]}"; do
      curl -s "$u/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"sim-model\",\"prompt\":\"warm $u $(printf 'the river %.0s' $(seq 40))\",\"max_tokens\":1}" >/dev/null
    done
  fi
  local before; before=$(tokens "${ports[@]}")
  local loads=()
  for k in $(seq 0 $((replicas - 1))); do
    "$bin/smg-load" run --url "http://127.0.0.1:${gws[$k]}" --scenario chat-1k --model sim-model --trace "$trace" \
      --trace-part "$k/$replicas" --speedup "$speedup" >"$tmp/load$k.log" 2>&1 &
    loads+=($!)
  done
  wait "${loads[@]}"
  local after; after=$(tokens "${ports[@]}")
  python3 -c "
c0, p0 = map(int, '$before'.split()); c1, p1 = map(int, '$after'.split())
print(f'replicas=$replicas events=$events  cached/prompt={(c1 - c0) / max(p1 - p0, 1):.4f} ({c1 - c0} of {p1 - p0})')"
  kill "${pids[@]}" "$sim" 2>/dev/null; wait "${pids[@]}" "$sim" 2>/dev/null || true
}

for r in ${REPLICAS:-1 2 4 8}; do
  row "$r" on
  row "$r" off
done
