#!/usr/bin/env bash
# bench/overrides.sh: memory and GET /check latency with and without a
# million per-actor overrides (issue 30, must show 2), with wrk.
#
# Usage, from the repository root (needs wrk, redis-cli and taskset; 2 CPUs):
#   bench/overrides.sh [seconds per run, default 10] [connections, default 50] [overrides, default 1000000] [users, default 1000000] [standalone|cluster, default standalone]
#
# Two fresh servers, each under taskset -c 0 (so GOMAXPROCS is 1), with
# the rule file of bench/check.sh (a per-user rule, actorField user):
# the first without overrides; the second after POLICY OVERRIDE per-user
# <user> 1000000 for users 1..N (redis-cli --pipe, on CPU 1), the rule's
# own limit, so that both answer alike and only the overrides differ.
# wrk -t1 runs on CPU 1; every request carries X-User: one of the users
# at random. With 1M users nearly every check creates a counter (the
# override is read then); with fewer, most checks find a live counter
# (which carries it). On the second server every user has an override. The second server is run
# right after the load, then again after COMPACT and a SIGTERM restart
# (the steady state). For each run it prints wrk's rate and latency
# percentiles, sluice's CPU per request, and its memory (VmRSS, VmHWM
# from /proc, used_memory from INFO) before and after.
#
# With cluster, each server is a cluster of one node (--cluster-nodes
# itself), which owns every slot: its overrides are the node's own
# values, read at every hit of a label that has overrides, not only when
# a counter is created (docs/policy.md, "In a cluster"). A cluster node
# syncs each override as it is set: run with TMPDIR on a tmpfs
# (TMPDIR=/dev/shm) unless the disk syncs fast.
set -euo pipefail
secs=${1:-10}
conns=${2:-50}
n=${3:-1000000}
users=${4:-1000000}
script=bench/overrides.sh
. "$(dirname "$0")/lib.sh"
bench_mode "${5:-standalone}"
bench_setup "$users" wrk redis-cli taskset

# mem NAME WHEN: the server's memory now.
mem() {
  local rss hwm used
  rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$sluice/status")
  hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$sluice/status")
  used=$(redis-cli -p "$resp_port" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  awk -v n="$1" -v w="$2" -v r="$rss" -v h="$hwm" -v u="$used" 'BEGIN {
    printf "  %s, %s: VmRSS %.1f MiB, VmHWM %.1f MiB, used_memory %.1f MiB\n", n, w, r / 1024, h / 1024, u / 1048576 }'
}

# run NAME: one wrk run against /check, then the figures.
run() {
  local s0 s1 out reqs
  s0=$(cpu_ticks "$sluice")
  out=$(taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$dir/users.lua" "http://127.0.0.1:$check_port/check")
  s1=$(cpu_ticks "$sluice")
  reqs=$(echo "$out" | awk '/requests in/ { print $1 }')
  echo "$out" | grep -E "Requests/sec|Latency|50%|90%|99%|Non-2xx" | sed "s/^/  $1: /"
  awk -v n="$1" -v r="$reqs" -v s=$((s1 - s0)) -v hz="$hz" -v t="$secs" 'BEGIN {
    printf "  %s: %d requests, %.0f/s; sluice CPU %.1f µs per request\n", n, r, r / t, s * 1e6 / hz / r }'
}

echo "== without overrides: /check, $conns connections, ${secs}s, $users users"
start_sluice none
mem none start
run none
mem none end
kill "$sluice"; wait "$sluice" 2>/dev/null || true

echo "== with $n overrides: POLICY OVERRIDE per-user 1..$n 1000000, then /check"
start_sluice overrides
mem overrides start
awk -v n="$n" 'BEGIN { for (i = 1; i <= n; i++) { a = i ""; printf "*5\r\n$6\r\nPOLICY\r\n$8\r\nOVERRIDE\r\n$8\r\nper-user\r\n$%d\r\n%s\r\n$7\r\n1000000\r\n", length(a), a } }' > "$dir/overrides.resp"
t0=$(date +%s.%N)
taskset -c 1 redis-cli -p "$resp_port" --pipe < "$dir/overrides.resp" | tail -1 | sed 's/^/  load: /'
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN { printf "  load: %d overrides in %.1f s, %.0f/s\n", n, b - a, n / (b - a) }'
redis-cli -p "$resp_port" INFO policy | tr -d '\r' | grep -E '^policy_overrides:' | sed 's/^/  /'
mem overrides loaded
run overrides-loaded
mem overrides-loaded end
# The steady state: every override written to tables (COMPACT), then a
# SIGTERM restart, so that the run does not share CPU 0 with the flushes
# and compactions of the load, and the overrides are read from the store.
redis-cli -p "$resp_port" COMPACT | sed 's/^/  COMPACT: /'
kill -TERM "$sluice"; wait "$sluice" 2>/dev/null || true
start_sluice overrides "$resp_port"
redis-cli -p "$resp_port" INFO policy | tr -d '\r' | grep -E '^policy_overrides:' | sed 's/^/  after the restart: /'
mem overrides restarted
run overrides
mem overrides end
