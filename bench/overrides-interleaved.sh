#!/usr/bin/env bash
# bench/overrides-interleaved.sh: the CPU per GET /check of a server with
# a million per-actor overrides against one without, in alternating runs
# (the machine's load drifts less between neighbours than between the
# separate runs of bench/overrides.sh), standalone or as a cluster node.
#
# Usage, from the repository root (needs wrk, redis-cli and taskset; 2 CPUs):
#   bench/overrides-interleaved.sh [seconds per run, default 15] [connections, default 50] [overrides, default 1000000] [users, default 10000] [rounds, default 4] [standalone|cluster, default cluster] [with|without, default with]
#
# Both servers run at once under taskset -c 0 with the rule file of
# bench/check.sh; the second gets POLICY OVERRIDE per-user <i> 1000000
# for i = 1..N (the rule's own limit), or with without the same for the
# actors x1..xN, so that no user the checks send has an override (a
# cluster node's filter of its override keys answers them without a
# store read: docs/policy.md, "In a cluster"), then COMPACT and a SIGTERM
# restart, as in bench/overrides.sh. Then each round runs wrk -t1 (CPU 1)
# against the first, then the second, and prints checks/s, p50, p99,
# sluice's CPU per check and the load average. With cluster, each server
# is a cluster of one node (see bench/overrides.sh): run with TMPDIR on a
# tmpfs (TMPDIR=/dev/shm), as a cluster node syncs each override.
set -euo pipefail
secs=${1:-15}
conns=${2:-50}
n=${3:-1000000}
users=${4:-10000}
rounds=${5:-4}
script=bench/overrides-interleaved.sh
. "$(dirname "$0")/lib.sh"
bench_mode "${6:-cluster}"
case ${7:-with} in
with) prefix= ;;
without) prefix=x ;;
*) echo "$script: $7: want with (the users checked have the overrides) or without (others have them)" >&2; exit 1 ;;
esac
bench_setup "$users" wrk redis-cli taskset

start_sluice none
none_pid=$sluice none_check=$check_port
start_sluice overrides
awk -v n="$n" -v p="$prefix" 'BEGIN { for (i = 1; i <= n; i++) { a = p i; printf "*5\r\n$6\r\nPOLICY\r\n$8\r\nOVERRIDE\r\n$8\r\nper-user\r\n$%d\r\n%s\r\n$7\r\n1000000\r\n", length(a), a } }' > "$dir/overrides.resp"
taskset -c 1 redis-cli -p "$resp_port" --pipe < "$dir/overrides.resp" | tail -1 | sed 's/^/load: /'
rm "$dir/overrides.resp"
redis-cli -p "$resp_port" COMPACT | sed 's/^/COMPACT: /'
kill -TERM "$sluice"; wait "$sluice" 2>/dev/null || true
start_sluice overrides "$resp_port"
redis-cli -p "$resp_port" INFO policy | tr -d '\r' | grep -E '^policy_overrides:'

# run NAME PID PORT: one wrk run against /check, then its line.
run() {
  local s0 s1 out reqs p50 p99
  s0=$(cpu_ticks "$2")
  out=$(taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$dir/users.lua" "http://127.0.0.1:$3/check")
  s1=$(cpu_ticks "$2")
  reqs=$(echo "$out" | awk '/requests in/ { print $1 }')
  p50=$(echo "$out" | awk '$1 == "50%" { print $2 }')
  p99=$(echo "$out" | awk '$1 == "99%" { print $2 }')
  awk -v n="$1" -v r="$reqs" -v s=$((s1 - s0)) -v hz="$hz" -v t="$secs" -v a="$p50" -v b="$p99" -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
    printf "%s: %.0f checks/s, p50 %s, p99 %s, sluice CPU %.1f µs per check (load %s)\n", n, r / t, a, b, s * 1e6 / hz / r, l }'
}

for r in $(seq "$rounds"); do
  run "round $r, no overrides" "$none_pid" "$none_check"
  run "round $r, $n overrides" "$sluice" "$check_port"
done
