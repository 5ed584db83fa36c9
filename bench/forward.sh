#!/usr/bin/env bash
# bench/forward.sh: HITs forwarded between the nodes of a cluster (issue
# 29): throughput, each node's CPU per request, and the connections the
# owner received, with redis-benchmark.
#
# Usage, from the repository root (needs redis-benchmark, redis-cli and
# taskset; 2 CPUs):
#   bench/forward.sh [requests per run, default 200000] [rounds, default 3] [an older sluice binary to compare]
#
# Each run starts two fresh nodes, a cluster of two (one copy of each
# slot, --fsync everysec), both under taskset -c 0, with the rule file of
# bench/check.sh (a per-user rule, actorField user); redis-benchmark on
# CPU 1 sends HIT user=N, N random of a million, to node 0 only, so about
# half the counters are the other node's and are forwarded to it. The
# loads are 64 clients unpipelined, 256 unpipelined and 32 pipelining 16.
# With an older binary, each round runs it then this tree's on each load.
# It prints redis-benchmark's rate and p50, each node's CPU µs per
# request (/proc/PID/stat), and node 1's connected_clients and
# total_connections_received from INFO.
set -euo pipefail
n=${1:-200000}
rounds=${2:-3}
before=${3:-}
script=bench/forward.sh
. "$(dirname "$0")/lib.sh"
bench_setup 1 redis-benchmark redis-cli taskset

# run LABEL BINARY CLIENTS PIPELINE: one run on two fresh nodes.
run() {
  local label=$1 bin=$2 c=$3 p=$4 i a0 a1 b0 b1 out info
  local ports=("$(free_port)" "$(free_port)") nodes node=()
  nodes=127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}
  for i in 0 1; do
    rm -rf "$dir/data-$i"
    taskset -c 0 "$bin" --addr "127.0.0.1:${ports[$i]}" --http-addr "" --data "$dir/data-$i" --policy "$dir/rules.ini" \
      --cluster-nodes "$nodes" --cluster-ordinal "$i" --log-level warn 2>"$dir/sluice-$i.log" &
    node+=($!)
    pids+=($!)
  done
  wait_port "${ports[0]}"; wait_port "${ports[1]}"
  a0=$(cpu_ticks "${node[0]}"); a1=$(cpu_ticks "${node[1]}")
  out=$(taskset -c 1 redis-benchmark -p "${ports[0]}" -c "$c" -P "$p" -n "$n" -r 1000000 -q HIT user=__rand_int__ 2>&1 | tr '\r' '\n' | grep -v '^$' | tail -1)
  b0=$(cpu_ticks "${node[0]}"); b1=$(cpu_ticks "${node[1]}")
  info=$(redis-cli -p "${ports[1]}" INFO | grep -E '^(connected_clients|total_connections_received):' | tr -d '\r' | tr '\n' ' ')
  printf '%-7s c=%-3s P=%-2s %s | node 0 %s µs/req, node 1 %s µs/req | node 1 %s\n' "$label" "$c" "$p" "${out#HIT user=__rand_int__: }" \
    "$(echo "scale=2; ($b0-$a0)*1000000/$hz/$n" | bc)" "$(echo "scale=2; ($b1-$a1)*1000000/$hz/$n" | bc)" "$info"
  kill "${node[@]}"
  wait "${node[@]}" 2>/dev/null || true
}

for _ in $(seq "$rounds"); do
  for load in "64 1" "256 1" "32 16"; do
    # shellcheck disable=SC2086 # load is two words on purpose
    if [ -n "$before" ]; then run before "$before" $load; fi
    # shellcheck disable=SC2086
    run after "$dir/sluice" $load
  done
done
