#!/usr/bin/env bash
# Starts the RabbitMQ 4.x brokers of the suite beside the host's 3.10.8:
# Debian's own packages in chroots, each node on its own ports:
#
#   node                      version  AMQP  stream  management  distribution  chroot suite
#   rabbit43@localhost        4.3.6    5692  5572    15692       25692         forky
#   rabbit43nm@localhost      4.3.6    5694  5574    15694       25694         forky (a copy)
#   rabbit40@localhost        4.0.5    5690  5570    15690       25690         trixie
#
# rabbit43 is the suite's main broker (scripts/test.sh points the tests at it); rabbit40 and the
# host's 3.10.8 run the cross-version set. rabbit43nm is 4.3.6 locked down as an operator may:
# the deprecated features transient_nonexcl_queues and global_qos denied
# (deprecated_features.permit.* = false: a restore of a 3.x backup's transient queues, and the
# tool's own connections, are tested against it), and the management API's
# message statistics switched off (management_agent.disable_metrics_collector = true), for the
# tests of brokers without them. guest may connect from anywhere (loopback_users = none); all
# listen on 127.0.0.1 only.
#
# When the test CA of scripts/setup-rabbitmq-tls.sh exists ($RMQ_BACKUP_TLS_DIR, default
# /tmp/rmq-backup-tls), rabbit43 and rabbit40 also listen with TLS (its server certificate,
# client certificates verified when given, not required): rabbit43 amqps 5693, stream 5573,
# https 15693; rabbit40 amqps 5691, stream 5571, https 15691.
#
# The chroots live in $RMQ_BACKUP_BROKERS_DIR (default /opt/rmq-backup-brokers): made once
# (debootstrap + apt-get, ~3 minutes each), then reused; a node already answering is left
# alone. Run as root (debootstrap, chroot, mounts). Needs network access to Debian's archive
# the first time only.
#
# Usage: scripts/setup-rabbitmq-4x.sh [start|stop|prepare]   (default start)
#   prepare: only makes the chroots (network and disk: debootstrap, apt-get in the chroots),
#   starts nothing; scripts/test.sh runs it beside the build, before the TLS test CA that
#   `start` configures exists.
set -euo pipefail

export PATH="/usr/sbin:/sbin:/usr/bin:/bin:${PATH:-}"
BASE="${RMQ_BACKUP_BROKERS_DIR:-/opt/rmq-backup-brokers}"
TIMEOUT="${RMQ_SETUP_TIMEOUT:-180}"
ARCHIVE="${RMQ_BACKUP_DEBIAN_ARCHIVE:-http://deb.debian.org/debian}"
GUEST_AUTH="Z3Vlc3Q6Z3Vlc3Q="

log() { echo "setup-rabbitmq-4x: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

port_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null; }

# HTTP status of GET /api/overview on port $1 with guest/guest ("000" when nothing answers).
overview_status() {
    local line
    line="$(timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET /api/overview HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Basic %s\r\nConnection: close\r\n\r\n" "$2" >&3
        head -n 1 <&3
    ' _ "$1" "$GUEST_AUTH" 2>/dev/null || true)"
    line="$(printf '%s' "$line" | awk '{print $2}')"
    echo "${line:-000}"
}

ready() { # ready AMQP STREAM MGMT [MORE_PORTS...]
    port_open "$1" && port_open "$2" && [[ "$(overview_status "$3")" == "200" ]] || return 1
    local p
    for p in "${@:4}"; do port_open "$p" || return 1; done
}

TLS_DIR="${RMQ_BACKUP_TLS_DIR:-/tmp/rmq-backup-tls}"

# The TLS listeners' configuration for a node in chroot DIR (files copied in), or nothing
# when there is no test CA: tls_conf DIR AMQPS STREAM HTTPS
tls_conf() {
    local dir=$1 amqps=$2 stream=$3 https=$4
    [[ -f "$TLS_DIR/ca.pem" && -f "$TLS_DIR/server.pem" && -f "$TLS_DIR/server.key" ]] || return 0
    mkdir -p "$dir/etc/rabbitmq/tls"
    cp "$TLS_DIR/ca.pem" "$TLS_DIR/server.pem" "$TLS_DIR/server.key" "$dir/etc/rabbitmq/tls/"
    chroot "$dir" chown -R rabbitmq:rabbitmq /etc/rabbitmq/tls
    chmod 600 "$dir/etc/rabbitmq/tls/server.key"
    cat <<CONF
listeners.ssl.default = 127.0.0.1:$amqps
ssl_options.cacertfile = /etc/rabbitmq/tls/ca.pem
ssl_options.certfile = /etc/rabbitmq/tls/server.pem
ssl_options.keyfile = /etc/rabbitmq/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
stream.listeners.ssl.default = 127.0.0.1:$stream
management.ssl.ip = 127.0.0.1
management.ssl.port = $https
management.ssl.cacertfile = /etc/rabbitmq/tls/ca.pem
management.ssl.certfile = /etc/rabbitmq/tls/server.pem
management.ssl.keyfile = /etc/rabbitmq/tls/server.key
CONF
}

# The TLS ports of tls_conf when it configures them: tls_ports PORTS...
tls_ports() {
    [[ -f "$TLS_DIR/ca.pem" ]] && echo "$@"
    return 0
}

mounted() { grep -qs " $1 " /proc/mounts; }

mount_all() {
    local dir=$1 m
    for m in proc sys dev dev/pts; do
        mkdir -p "$dir/$m"
        mounted "$dir/$m" || mount --bind "/$m" "$dir/$m"
    done
}

umount_all() {
    local dir=$1 m
    for m in dev/pts dev sys proc; do
        if mounted "$dir/$m"; then umount -l "$dir/$m" || true; fi
    done
}

# make_chroot SUITE DIR [SCRIPT]: a minimal Debian SUITE with rabbitmq-server installed.
make_chroot() {
    local suite=$1 dir=$2 script=${3:-}
    [[ -f "$dir/.rmq-backup-ready" ]] && return
    [[ "$(id -u)" == "0" ]] || die "making the $suite chroot needs root (debootstrap, chroot, mount)"
    command -v debootstrap >/dev/null || {
        log "installing debootstrap (apt-get)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >&2 ||
            { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >&2; }
    }
    umount_all "$dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    log "debootstrap $suite into $dir (about a minute)"
    # shellcheck disable=SC2086
    debootstrap --variant=minbase --include=ca-certificates "$suite" "$dir" "$ARCHIVE" $script >"$dir.debootstrap.log" 2>&1 ||
        { tail -n 30 "$dir.debootstrap.log" >&2; die "debootstrap $suite failed (log: $dir.debootstrap.log)"; }
    cp /etc/hosts "$dir/etc/hosts"
    printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
    chmod 755 "$dir/usr/sbin/policy-rc.d"
    mount_all "$dir"
    local apt_opts=(-o Acquire::Check-Valid-Until=false)
    log "installing rabbitmq-server in the $suite chroot (1-2 minutes)"
    chroot "$dir" apt-get "${apt_opts[@]}" update >"$dir.apt.log" 2>&1 ||
        { tail -n 30 "$dir.apt.log" >&2; die "apt-get update in the $suite chroot failed"; }
    chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends rabbitmq-server >>"$dir.apt.log" 2>&1 ||
        { tail -n 30 "$dir.apt.log" >&2; die "installing rabbitmq-server in the $suite chroot failed"; }
    chroot "$dir" apt-get clean
    chroot "$dir" rabbitmq-plugins enable --offline rabbitmq_management rabbitmq_stream >/dev/null
    touch "$dir/.rmq-backup-ready"
}

# configure DIR NODENAME AMQP STREAM MGMT DIST [EXTRA_CONF]
configure() {
    local dir=$1 node=$2 amqp=$3 stream=$4 mgmt=$5 dist=$6 extra=${7:-}
    cp /etc/hosts "$dir/etc/hosts"
    # The open-file limit raised to the hard limit: RabbitMQ 4.x keeps a file open per classic
    # queue holding messages, and at the usual 1,024 a node fails the ~970th queue's declare
    # (INTERNAL_ERROR, emfile: scripts/bench.sh many). Set by the server script itself
    # (RABBITMQ_MAX_OPEN_FILES), after its `su rabbitmq`, whose PAM session (pam_limits) had put
    # back a soft limit of 1,024 that a `ulimit -n` before it had raised.
    # At most 65,536: an Erlang VM sizes tables by its limit, and with a container's huge
    # default (1,073,741,816) RabbitMQ is known to start slowly and take much memory.
    local nofile
    nofile=$(ulimit -Hn)
    if [[ $nofile == unlimited ]] || ((nofile > 65536)); then
        nofile=65536
    fi
    cat >"$dir/etc/rabbitmq/rabbitmq-env.conf" <<ENV
NODENAME=$node
DIST_PORT=$dist
RABBITMQ_MAX_OPEN_FILES=$nofile
ENV
    cat >"$dir/etc/rabbitmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$amqp
management.tcp.ip = 127.0.0.1
management.tcp.port = $mgmt
stream.listeners.tcp.1 = 127.0.0.1:$stream
stream.advertised_host = 127.0.0.1
stream.advertised_port = $stream
loopback_users = none
$extra
CONF
}

# start DIR NODENAME AMQP STREAM MGMT DIST EXTRA_CONF [MORE_PORTS...]: a node already running
# with this configuration is left alone; one running with another is restarted.
start() {
    local dir=$1 node=$2 amqp=$3 stream=$4 mgmt=$5 dist=$6 extra=${7:-}
    local conf=("$dir/etc/rabbitmq/rabbitmq.conf" "$dir/etc/rabbitmq/rabbitmq-env.conf")
    local before
    before="$(cat "${conf[@]}" 2>/dev/null || true)"
    configure "$dir" "$node" "$amqp" "$stream" "$mgmt" "$dist" "$extra"
    if ready "$amqp" "$stream" "$mgmt" "${@:8}"; then
        if [[ "$before" == "$(cat "${conf[@]}")" ]]; then
            log "$node already running"
            return
        fi
        log "$node runs with an older configuration: restarting it"
    fi
    mount_all "$dir"
    chroot "$dir" rabbitmqctl -q stop >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 60))
    while port_open "$amqp" && ((SECONDS < deadline)); do sleep 1; done
    log "starting $node"
    chroot "$dir" bash -c 'export HOME=/var/lib/rabbitmq; nohup rabbitmq-server >/var/log/rabbitmq/console.log 2>&1 &'
}

wait_ready() { # wait_ready DIR NODENAME AMQP STREAM MGMT [MORE_PORTS...]
    local dir=$1 node=$2 amqp=$3 stream=$4 mgmt=$5
    local deadline=$((SECONDS + TIMEOUT))
    until ready "$amqp" "$stream" "$mgmt" "${@:6}"; do
        ((SECONDS < deadline)) || {
            tail -n 20 "$dir/var/log/rabbitmq/console.log" >&2 || true
            die "$node did not open AMQP $amqp, stream $stream and management $mgmt within $TIMEOUT s (log: $dir/var/log/rabbitmq/)"
        }
        sleep 1
    done
}

stop() {
    local dir=$1 node=$2
    [[ -d "$dir" ]] || return 0
    chroot "$dir" rabbitmqctl -q stop >/dev/null 2>&1 && log "stopped $node" || true
    umount_all "$dir"
}

R40="$BASE/rabbitmq-4.0"
R43="$BASE/rabbitmq-4.3"
R43NM="$BASE/rabbitmq-4.3-no-metrics"
mkdir -p "$BASE"

case "${1:-start}" in
stop)
    stop "$R40" rabbit40@localhost
    stop "$R43" rabbit43@localhost
    stop "$R43NM" rabbit43nm@localhost
    exit 0
    ;;
start | prepare) ;;
*) die "usage: $0 [start|stop|prepare]" ;;
esac

# The chroot of the node without metrics: a copy of the 4.3 one, without its node's data.
copy_no_metrics() {
    [[ ! -f "$R43NM/.rmq-backup-ready" ]] && [[ -f "$R43/.rmq-backup-ready" ]] || return 0
    log "copying the 4.3 chroot for the node without metrics"
    umount_all "$R43NM"
    rm -rf "$R43NM"
    mkdir -p "$R43NM"
    # The node's own data stays behind: a fresh node, its own cookie and database.
    tar -C "$R43" --exclude=./proc --exclude=./sys --exclude=./dev --exclude=./var/lib/rabbitmq/mnesia \
        --exclude=./var/log/rabbitmq --exclude=./var/lib/rabbitmq/.erlang.cookie -cf - . | tar -C "$R43NM" -xf -
    mkdir -p "$R43NM/var/log/rabbitmq" "$R43NM/var/lib/rabbitmq/mnesia"
    chroot "$R43NM" chown -R rabbitmq:rabbitmq /var/log/rabbitmq /var/lib/rabbitmq
}

if [[ "${1:-start}" == prepare ]]; then
    make_chroot forky "$R43" /usr/share/debootstrap/scripts/sid
    copy_no_metrics
    make_chroot trixie "$R40"
    log "chroots ready in $BASE (no node started)"
    exit 0
fi

# The two suites are made one after the other (both download from the same archive) but the
# second while the first node starts.
make_chroot forky "$R43" /usr/share/debootstrap/scripts/sid
# shellcheck disable=SC2046
start "$R43" rabbit43@localhost 5692 5572 15692 25692 "$(tls_conf "$R43" 5693 5573 15693)" $(tls_ports 5693 5573 15693)
copy_no_metrics
start "$R43NM" rabbit43nm@localhost 5694 5574 15694 25694 "management_agent.disable_metrics_collector = true
deprecated_features.permit.transient_nonexcl_queues = false
deprecated_features.permit.global_qos = false"
make_chroot trixie "$R40"
# shellcheck disable=SC2046
start "$R40" rabbit40@localhost 5690 5570 15690 25690 "$(tls_conf "$R40" 5691 5571 15691)" $(tls_ports 5691 5571 15691)
# shellcheck disable=SC2046
wait_ready "$R43" rabbit43@localhost 5692 5572 15692 $(tls_ports 5693 5573 15693)
wait_ready "$R43NM" rabbit43nm@localhost 5694 5574 15694
# shellcheck disable=SC2046
wait_ready "$R40" rabbit40@localhost 5690 5570 15690 $(tls_ports 5691 5571 15691)
echo "RabbitMQ 4.x ready: 4.3.6 on AMQP 5692 (stream 5572, management 15692), 4.3.6 locked down (no metrics, deprecated features denied) on 5694 (5574, 15694), 4.0.5 on 5690 (5570, 15690); guest/guest" >&2
