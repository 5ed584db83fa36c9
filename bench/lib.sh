# bench/lib.sh: what bench/check.sh and bench/overrides.sh share. Sourced
# after `set -euo pipefail`, with script set to the script's name.

# bench_setup USERS TOOL...: checks the tools and 2 CPUs; makes $dir
# (removed on exit, with the processes in pids killed), builds sluice
# there, and writes $dir/rules.ini (a per-user rule, label per-user, actor
# X-User) and $dir/users.lua (GET with X-User: a random one of USERS).
bench_setup() {
  local users=$1 p pkg
  shift
  for p in "$@"; do
    case $p in redis-cli | redis-benchmark) pkg=redis-tools ;; taskset) pkg=util-linux ;; *) pkg=$p ;; esac
    command -v "$p" >/dev/null || { echo "$script: $p is missing (Debian: $pkg)" >&2; exit 1; }
  done
  [ "$(nproc)" -ge 2 ] || { echo "$script: needs 2 CPUs" >&2; exit 1; }
  dir=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
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
  cat > "$dir/users.lua" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", nil, { ["X-User"] = tostring(math.random(1, $users)) })
end
LUA
  hz=$(getconf CLK_TCK)
}

bench_cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 500); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.02; done; echo "port $1 never opened" >&2; exit 1; }
# cpu_ticks PID: utime + stime in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# bench_mode MODE: standalone, or cluster (start_sluice starts a cluster
# of one node).
bench_mode() {
  case $1 in
  standalone) cluster_node= ;;
  cluster) cluster_node=1 ;;
  *) echo "$script: mode $1: want standalone or cluster" >&2; exit 1 ;;
  esac
}

# start_sluice NAME [RESP_PORT]: a server on CPU 0 with the rules of
# bench_setup, the data directory and log of NAME, /check keyed by
# X-User, on RESP_PORT (default a free one: a restarted cluster node
# needs its own); with cluster_node set, a cluster of this one node,
# owning every slot; sets sluice, resp_port and check_port.
start_sluice() {
  resp_port=${2:-$(free_port)}; check_port=$(free_port)
  local cluster=()
  if [ -n "${cluster_node:-}" ]; then cluster=(--cluster-nodes "127.0.0.1:$resp_port" --cluster-ordinal 0); fi
  taskset -c 0 "$dir/sluice" --addr "127.0.0.1:$resp_port" --http-addr "" --data "$dir/data-$1" --policy "$dir/rules.ini" \
    --check-addr "127.0.0.1:$check_port" --check-identity-header X-User --check-trusted-proxies 127.0.0.1 \
    "${cluster[@]}" --log-level warn 2>"$dir/sluice-$1.log" &
  sluice=$!
  pids+=("$sluice")
  wait_port "$resp_port"; wait_port "$check_port"
}
