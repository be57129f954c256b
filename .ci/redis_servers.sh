#!/usr/bin/env bash
# Start / stop the Redis servers the Redis-tier tests use, on loopback ports of their own:
#   * a standalone server with an ACL user and password (and `default` disabled), and
#   * a 3-node Redis Cluster (no replicas).
# Usage:  bash .ci/redis_servers.sh start   # prints the environment to `eval`
#         bash .ci/redis_servers.sh stop
#         eval "$(bash .ci/redis_servers.sh env)"
# Installs Debian's redis-server when it is missing (needs root and apt, as on CI).
# Ports: KVOFFLOAD_REDIS_PORT (default 16390) and KVOFFLOAD_REDIS_CLUSTER_PORT (17390..17392).
set -euo pipefail

PORT="${KVOFFLOAD_REDIS_PORT:-16390}"
CPORT="${KVOFFLOAD_REDIS_CLUSTER_PORT:-17390}"
USER_NAME="kvoffload"
PASSWORD="${KVOFFLOAD_REDIS_PASSWORD:-kvoffload-test-secret}"
DIR="${KVOFFLOAD_REDIS_DIR:-/tmp/kvoffload-redis}"

env_lines() {
  echo "export KVOFFLOAD_REDIS_URL=redis://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/0"
  echo "export KVOFFLOAD_REDIS_CLUSTER_URL=redis://127.0.0.1:$CPORT"
  echo "export KVOFFLOAD_REDIS_CLUSTER_PORTS=$CPORT,$((CPORT + 1)),$((CPORT + 2))"
  echo "export KVOFFLOAD_REDIS_DIR=$DIR"
}

ensure_installed() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return
  fi
  echo "== installing Debian's redis-server" >&2
  if ! command -v apt-get >/dev/null; then
    echo "redis-server is missing and apt-get is not available: install Redis 6.2+ by hand" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || true
  apt-get install -y -qq redis-server >&2
}

wait_ping() {  # port [auth args...]
  local port=$1
  shift
  for _ in $(seq 1 100); do
    if redis-cli -p "$port" "$@" ping 2>/dev/null | grep -q PONG; then
      return 0
    fi
    sleep 0.1
  done
  echo "redis on port $port did not answer" >&2
  return 1
}

start_server() {  # port dir extra-args...
  local port=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --save "" --appendonly no \
    --maxmemory 512mb --maxmemory-policy allkeys-lru --proto-max-bulk-len 1gb "$@"
}

start() {
  ensure_installed
  stop >/dev/null 2>&1 || true
  start_server "$PORT" "$DIR/standalone" \
    --user default off --user "$USER_NAME" on ">$PASSWORD" "~*" "&*" "+@all"
  wait_ping "$PORT" --user "$USER_NAME" --pass "$PASSWORD" --no-auth-warning
  local nodes=()
  for i in 0 1 2; do
    local p=$((CPORT + i))
    start_server "$p" "$DIR/cluster-$p" --cluster-enabled yes \
      --cluster-config-file "$DIR/cluster-$p/nodes.conf" --cluster-node-timeout 2000
    nodes+=("127.0.0.1:$p")
  done
  for i in 0 1 2; do wait_ping $((CPORT + i)); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/cluster-create.log" 2>&1
  for _ in $(seq 1 100); do
    if redis-cli -p "$CPORT" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
      env_lines
      return 0
    fi
    sleep 0.1
  done
  echo "the cluster did not reach cluster_state:ok (see $DIR/cluster-create.log)" >&2
  exit 1
}

stop() {
  for pidfile in "$DIR"/*/redis.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 0.3
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
