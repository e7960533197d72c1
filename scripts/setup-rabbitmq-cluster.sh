#!/usr/bin/env bash
# Starts the test cluster of the suite: three RabbitMQ nodes clustered together beside the
# main broker and the TLS nodes (scripts/setup-rabbitmq-tls.sh), each with its own ports:
#
#   node     AMQP            stream          management (http)   Erlang distribution
#   rmqc1    127.0.0.1:5701  127.0.0.1:5711  127.0.0.1:15701     25701
#   rmqc2    127.0.0.1:5702  127.0.0.1:5712  127.0.0.1:15702     25702
#   rmqc3    127.0.0.1:5703  127.0.0.1:5713  127.0.0.1:15703     25703
#
# Tests that need a cluster (quorum queues with leaders spread over nodes, node-local reads)
# or a broker they may stop, restart or put under an alarm use these nodes, never the main
# broker (other tests run beside them). A test that stops a node starts it again.
#
# Files in $RMQ_BACKUP_CLUSTER_DIR (default /tmp/rmq-backup-cluster): nodes/<node>/ with each
# node's config, data and logs. Idempotent: nodes already running and clustered are left
# alone. Run as root; needs rabbitmq-server (see scripts/setup-rabbitmq.sh).
set -euo pipefail

export PATH="/usr/sbin:/sbin:/usr/bin:/bin:${PATH:-}"
DIR="${RMQ_BACKUP_CLUSTER_DIR:-/tmp/rmq-backup-cluster}"
TIMEOUT="${RMQ_SETUP_TIMEOUT:-180}"
HOST="$(hostname -s)"

log() { echo "setup-rabbitmq-cluster: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

command -v rabbitmq-server >/dev/null || die "rabbitmq-server is not installed (run scripts/setup-rabbitmq.sh first)"
mkdir -p "$DIR"

port_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null; }
all_open() {
    local p
    for p; do port_open "$p" || return 1; done
}
ctl() { rabbitmqctl -n "$1@$HOST" "${@:2}"; }

# rabbitmq_event_exchange lets tests see every consumer created (consumer.created events name
# the channel, hence the node), where sampling list_consumers could miss a short read.
PLUGINS='[rabbitmq_management,rabbitmq_stream,rabbitmq_event_exchange]'

# start_node NAME N: AMQP 570N, stream 571N, management 1570N, distribution 2570N.
start_node() {
    local name="$1" n="$2"
    local nd="$DIR/nodes/$name"
    if all_open "570$n" "571$n" "1570$n"; then
        return
    fi
    if [[ -f "$nd/$name.pid" ]]; then
        ctl "$name" stop "$nd/$name.pid" >/dev/null 2>&1 || true
    fi
    mkdir -p "$nd"
    cat >"$nd/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:570$n
stream.listeners.tcp.1 = 127.0.0.1:571$n
stream.advertised_host = 127.0.0.1
stream.advertised_port = 571$n
management.tcp.ip = 127.0.0.1
management.tcp.port = 1570$n
loopback_users = none
cluster_name = rmq-backup-test
CONF
    echo "$PLUGINS." >"$nd/enabled_plugins"
    chown -R rabbitmq:rabbitmq "$nd" 2>/dev/null || true
    log "starting $name (AMQP 570$n, stream 571$n, management 1570$n)"
    RABBITMQ_NODENAME="$name@$HOST" RABBITMQ_NODE_PORT="570$n" RABBITMQ_DIST_PORT="2570$n" \
        RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd/log" \
        RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$nd/enabled_plugins" \
        RABBITMQ_PLUGINS_EXPAND_DIR="$nd/plugins-expand" RABBITMQ_PID_FILE="$nd/$name.pid" \
        rabbitmq-server -detached >/dev/null 2>&1 || die "rabbitmq-server -detached failed for $name"
}

wait_node() {
    local name="$1" n="$2" deadline=$((SECONDS + TIMEOUT))
    until all_open "570$n" "571$n" "1570$n"; do
        ((SECONDS < deadline)) || die "$name did not open its ports within $TIMEOUT s (see $DIR/nodes/$name/log)"
        sleep 1
    done
}

# True when rmqc1 sees all three nodes running.
clustered() {
    local s
    s="$(ctl rmqc1 cluster_status --formatter json 2>/dev/null || true)"
    [[ "$s" == *"rmqc1@$HOST"* && "$s" == *"rmqc2@$HOST"* && "$s" == *"rmqc3@$HOST"* ]] &&
        [[ "$(grep -o '"running_nodes":\[[^]]*\]' <<<"$s" | grep -o 'rmqc' | wc -l)" == 3 ]]
}

for n in 1 2 3; do start_node "rmqc$n" "$n"; done
for n in 1 2 3; do wait_node "rmqc$n" "$n"; done
if ! clustered; then
    for n in 2 3; do
        if ! ctl rmqc1 cluster_status --formatter json 2>/dev/null | grep -q "rmqc$n@$HOST"; then
            log "joining rmqc$n to rmqc1"
            ctl "rmqc$n" stop_app >/dev/null 2>&1
            ctl "rmqc$n" reset >/dev/null 2>&1
            ctl "rmqc$n" join_cluster "rmqc1@$HOST" >/dev/null 2>&1
            ctl "rmqc$n" start_app >/dev/null 2>&1
        fi
    done
    deadline=$((SECONDS + TIMEOUT))
    until clustered; do
        ((SECONDS < deadline)) || die "the three nodes did not form a cluster within $TIMEOUT s"
        sleep 1
    done
    for n in 1 2 3; do wait_node "rmqc$n" "$n"; done
fi
# Nodes started by an earlier version of this script: enable the plugins they lack, online.
for n in 1 2 3; do
    nd="$DIR/nodes/rmqc$n"
    if ! grep -q rabbitmq_event_exchange "$nd/enabled_plugins" 2>/dev/null; then
        log "enabling rabbitmq_event_exchange on rmqc$n"
        echo "$PLUGINS." >"$nd/enabled_plugins"
        RABBITMQ_ENABLED_PLUGINS_FILE="$nd/enabled_plugins" \
            rabbitmq-plugins -n "rmqc$n@$HOST" enable --online rabbitmq_event_exchange >/dev/null ||
            die "could not enable rabbitmq_event_exchange on rmqc$n"
    fi
done
echo "test cluster ready: rmqc1..3@$HOST on AMQP 5701-5703, stream 5711-5713, management 15701-15703" >&2
