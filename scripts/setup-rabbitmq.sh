#!/usr/bin/env bash
# Makes a local RabbitMQ ready for rmq-backup and its tests.
#
# On a fresh Debian machine (run as root): installs rabbitmq-server when missing, enables the
# rabbitmq_management and rabbitmq_stream plugins, starts the node when it is not running, and
# waits until the management API answers 200 on /api/overview with guest/guest and the stream
# port accepts connections. Idempotent: when the broker is already ready it only checks and
# returns in well under a second.
#
# Environment (all optional):
#   RMQ_SETUP_TIMEOUT  seconds to wait for the node and the APIs (default 120)
#   RMQ_HOST           address the broker listens on (default 127.0.0.1)
#   RMQ_MGMT_PORT      management API port (default 15672)
#   RMQ_STREAM_PORT    stream protocol port (default 5552)
#   RMQ_AMQP_PORT      AMQP port, only printed (default 5672)
set -euo pipefail

export PATH="/usr/sbin:/sbin:/usr/bin:/bin:${PATH:-}"

TIMEOUT="${RMQ_SETUP_TIMEOUT:-120}"
HOST="${RMQ_HOST:-127.0.0.1}"
MGMT_PORT="${RMQ_MGMT_PORT:-15672}"
STREAM_PORT="${RMQ_STREAM_PORT:-5552}"
AMQP_PORT="${RMQ_AMQP_PORT:-5672}"
PLUGINS=(rabbitmq_management rabbitmq_stream)
# base64 of "guest:guest" for the Authorization header.
GUEST_AUTH="Z3Vlc3Q6Z3Vlc3Q="

log() { echo "setup-rabbitmq: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# HTTP status of GET /api/overview with guest/guest, or "000" when nothing answers. Plain bash
# (/dev/tcp), so curl is not needed on a minimal machine.
overview_status() {
    local line
    line="$(timeout 5 bash -c '
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "GET /api/overview HTTP/1.0\r\nHost: %s:%s\r\nAuthorization: Basic %s\r\nConnection: close\r\n\r\n" "$1" "$2" "$3" >&3
        head -n 1 <&3
    ' _ "$HOST" "$MGMT_PORT" "$GUEST_AUTH" 2>/dev/null || true)"
    # "HTTP/1.1 200 OK"
    local status
    status="$(printf '%s' "$line" | awk '{print $2}')"
    echo "${status:-000}"
}

# Broker version from /api/overview, or "unknown".
broker_version() {
    timeout 5 bash -c '
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "GET /api/overview?columns=rabbitmq_version HTTP/1.0\r\nHost: %s:%s\r\nAuthorization: Basic %s\r\nConnection: close\r\n\r\n" "$1" "$2" "$3" >&3
        cat <&3
    ' _ "$HOST" "$MGMT_PORT" "$GUEST_AUTH" 2>/dev/null |
        sed -n 's/.*"rabbitmq_version":"\([^"]*\)".*/\1/p' | head -n 1 || true
}

# True when something accepts TCP connections on $HOST:$1.
port_open() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$HOST" "$1" 2>/dev/null
}

ready() {
    [[ "$(overview_status)" == "200" ]] && port_open "$STREAM_PORT"
}

# A node is running when its AMQP port is open, or when it answers a ping. The CLI starts an
# Erlang VM of its own: on a fresh machine busy compiling, a ping took more than 15 s, the
# node (started at boot, without plugins) was taken for stopped, its plugins were enabled
# offline and never started.
node_running() {
    port_open "$AMQP_PORT" || timeout 60 rabbitmq-diagnostics -q ping >/dev/null 2>&1
}

print_ready() {
    local version
    version="$(broker_version)"
    echo "RabbitMQ ${version:-unknown} ready: AMQP ${HOST}:${AMQP_PORT}, management http://${HOST}:${MGMT_PORT} (guest/guest), stream ${HOST}:${STREAM_PORT}"
}

# 1. Install when missing.
if ! command -v rabbitmq-server >/dev/null 2>&1; then
    [[ "$(id -u)" == "0" ]] || die "rabbitmq-server is not installed; run this script as root to install it"
    log "installing rabbitmq-server (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y rabbitmq-server
fi

# Fast path: already running with both plugins active (management answers, stream port open).
if ready; then
    print_ready
    exit 0
fi

# 2. Plugins (online on a running node, offline before start), 3. start the node.
if node_running; then
    log "node running; enabling plugins ${PLUGINS[*]}"
    timeout 120 rabbitmqctl await_startup --timeout 110 >/dev/null 2>&1 || true
    rabbitmq-plugins enable "${PLUGINS[@]}" >/dev/null
else
    log "node not running; enabling plugins ${PLUGINS[*]} offline"
    rabbitmq-plugins enable --offline "${PLUGINS[@]}" >/dev/null
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        log "starting rabbitmq-server (systemd)"
        systemctl start rabbitmq-server || log "systemctl start failed; trying rabbitmq-server -detached"
    fi
    if ! node_running; then
        log "starting rabbitmq-server -detached"
        rabbitmq-server -detached
    fi
fi

deadline=$((SECONDS + TIMEOUT))

# The node must be registered before await_startup can talk to it: retry within the deadline.
until timeout 30 rabbitmqctl await_startup --timeout 25 >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
        die "the RabbitMQ node did not start within ${TIMEOUT} s (see /var/log/rabbitmq/)"
    fi
    sleep 2
done

# 4. Wait for the management API (200 with guest/guest) and the stream port.
until [[ "$(overview_status)" == "200" ]]; do
    if ((SECONDS >= deadline)); then
        die "management API at http://${HOST}:${MGMT_PORT}/api/overview did not answer 200 with guest/guest within ${TIMEOUT} s (last status: $(overview_status))"
    fi
    sleep 1
done
until port_open "$STREAM_PORT"; do
    if ((SECONDS >= deadline)); then
        die "stream port ${HOST}:${STREAM_PORT} not open within ${TIMEOUT} s (is rabbitmq_stream enabled?)"
    fi
    sleep 1
done

print_ready
