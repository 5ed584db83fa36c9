#!/usr/bin/env bash
# bench/check.sh: the cost of sluice's forward-auth endpoint /check per
# request, directly and through nginx's auth_request (the recipe of
# docs/proxies.md), with wrk. Compare with HIT over RESP:
#   go run ./bench --spawn --pin --scenario unpipelined --hit-pct 100
#
# Usage, from the repository root (needs nginx, wrk and taskset; 2 CPUs):
#   bench/check.sh [seconds per run, default 10] [connections, default 50]
#
# sluice runs under taskset -c 0 (so GOMAXPROCS is 1); nginx (one worker)
# and wrk share CPU 1. Each request is GET /bench with X-User: a random one
# of 1M users, so every check reads and writes a counter of its own as HIT
# does in the bench's workload. It prints requests/s from wrk and sluice's
# (and nginx's) CPU time per request from /proc/PID/stat.
set -euo pipefail
secs=${1:-10}
conns=${2:-50}
script=bench/check.sh
. "$(dirname "$0")/lib.sh"
bench_setup 1000000 nginx wrk taskset
start_sluice check

# run NAME URL [NGINX_PID]: one wrk run, then the figures.
run() {
  local name=$1 url=$2 npid=${3:-}
  local s0 n0=0 s1 n1=0 out reqs
  s0=$(cpu_ticks "$sluice"); [ -n "$npid" ] && n0=$(cpu_ticks "$npid")
  out=$(taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" -s "$dir/users.lua" "$url")
  s1=$(cpu_ticks "$sluice"); [ -n "$npid" ] && n1=$(cpu_ticks "$npid")
  reqs=$(echo "$out" | awk '/requests in/ { print $1 }')
  echo "$out" | grep -E "Requests/sec|Latency|Non-2xx" | sed "s/^/  $name: /"
  awk -v n="$name" -v r="$reqs" -v s=$((s1 - s0)) -v g=$((n1 - n0)) -v hz="$hz" -v t="$secs" 'BEGIN {
    printf "  %s: %d requests, %.0f/s; sluice CPU %.1f µs per request", n, r, r / t, s * 1e6 / hz / r
    if (g > 0) printf ", nginx CPU %.1f µs per request", g * 1e6 / hz / r
    printf "\n" }'
}

echo "== /check directly (wrk -> sluice), $conns connections, ${secs}s"
run direct "http://127.0.0.1:$check_port/check"

# nginx with the recipe of docs/proxies.md; the application is a second
# server block of the same nginx that answers 204.
ng_port=$(free_port); app_port=$(free_port)
awk '/<!-- tested: nginx -->/ { on = 1; next } on && /^```nginx/ { inblock = 1; next } inblock && /^```/ { exit } inblock { print }' docs/proxies.md |
  sed -e "s/127.0.0.1:9051/127.0.0.1:$check_port/; s/127.0.0.1:8080/127.0.0.1:$app_port/; s/127.0.0.1:8000/127.0.0.1:$ng_port/" > "$dir/server.conf"
cat > "$dir/nginx.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
error_log $dir/error.log crit;
pid $dir/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/cb; proxy_temp_path $dir/px; fastcgi_temp_path $dir/fc; uwsgi_temp_path $dir/uw; scgi_temp_path $dir/sc;
    include $dir/server.conf;
    server { listen 127.0.0.1:$app_port; location / { return 204; } }
}
NGINX
taskset -c 1 nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
nginx=$!
pids+=("$nginx")
wait_port "$ng_port"
echo "== through nginx auth_request (wrk -> nginx -> sluice /check, then the app), $conns connections, ${secs}s"
run nginx "http://127.0.0.1:$ng_port/bench" "$nginx"
