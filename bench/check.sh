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
for p in nginx wrk taskset; do
  command -v $p >/dev/null || { echo "bench/check.sh: $p is missing (Debian: nginx, wrk, util-linux)" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "bench/check.sh: needs 2 CPUs" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

go build -o "$dir/sluice" ./cmd/sluice
cat > "$dir/rules.ini" <<'RULES'
[user=*]
creditLimit = 1000000
resetSeconds = 3600
actorField = user
label = per-user

[default]
creditLimit = 5
resetSeconds = 300
actorField = ip
RULES
cat > "$dir/users.lua" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format("GET", nil, { ["X-User"] = tostring(math.random(1, 1000000)) })
end
LUA

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 500); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.02; done; echo "port $1 never opened" >&2; exit 1; }
# cpu_ticks PID: utime + stime in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

check_port=$(free_port)
taskset -c 0 "$dir/sluice" --addr 127.0.0.1:0 --http-addr "" --data "$dir/data" --policy "$dir/rules.ini" \
  --check-addr "127.0.0.1:$check_port" --check-identity-header X-User --check-trusted-proxies 127.0.0.1 \
  --log-level warn 2>"$dir/sluice.log" &
sluice=$!
pids+=("$sluice")
wait_port "$check_port"

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
