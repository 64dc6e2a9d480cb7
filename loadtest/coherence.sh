#!/usr/bin/env bash
# Cache-aware routing quality through the gateway: the cached-token ratio the simulator's
# prefix caches (the simulator's default 1M tokens each) report on the multi-turn-affinity
# scenario against 8 workers (WORKERS=n for another count), for cache_aware with one shard
# (one shared tree), with two shards (per-core trees kept coherent by insert digests), and
# round_robin. Run from the repository root after `cargo build --release --workspace`.
# Everything listens on 127.0.0.1 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release
workers=${WORKERS:-8}
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
run() { # policy shards
  local ports=() urls=()
  for _ in $(seq "$workers"); do p=$(free_port); ports+=("$p"); urls+=("http://127.0.0.1:$p"); done
  local gw; gw=$(free_port)
  "$bin/smg-sim" --ports "$(IFS=,; echo "${ports[*]}")" --model sim-model --itl-ms 0.2 >/dev/null 2>&1 &
  local sim=$!
  sleep 0.5
  "$bin/smg" launch --host 127.0.0.1 --port "$gw" --policy "$1" --cores "$2" --worker-urls "${urls[@]}" >/dev/null 2>&1 &
  local smg=$!
  for _ in $(seq 100); do curl -s "127.0.0.1:$gw/readiness" | grep -q "\"healthy_workers\":$workers" && break; sleep 0.1; done
  # Turns of one user come seconds apart in real use; pace them so digests can cross shards.
  printf '%-12s shards=%s  ' "$1" "$2"
  "$bin/smg-load" run --url "http://127.0.0.1:$gw" --scenario multi-turn-affinity --rate 40 \
    --requests 168 2>&1 | grep -i "cached/prompt" || true
  kill "$smg" "$sim" 2>/dev/null; wait "$smg" "$sim" 2>/dev/null || true
}
run cache_aware 1
run cache_aware 2
run round_robin 1
# Two shards' rotations interleave by how the kernel spreads the client connections over the
# SO_REUSEPORT listeners, which changes from run to run; repeat to show the spread.
for _ in $(seq "${RR_RUNS:-3}"); do run round_robin 2; done
