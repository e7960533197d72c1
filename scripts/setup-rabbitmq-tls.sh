#!/usr/bin/env bash
# Makes the TLS brokers of the test suite: a test CA with server and client certificates, and two
# extra RabbitMQ nodes beside the main one:
#
#   node      AMQP over TLS   stream over TLS   management https   client certificate
#   rmqtls    127.0.0.1:5671  127.0.0.1:5551    127.0.0.1:15671     verified when given, not required
#   rmqmtls   127.0.0.1:5681  127.0.0.1:5561    127.0.0.1:15681     required (verify_peer,
#                                                                   fail_if_no_peer_cert = true)
#
# Each node also has a plain AMQP port (rmqtls 5674, rmqmtls 5684) through which the tests
# publish and check messages, so that only the tool's own connections go over TLS. The server
# certificate is valid for the name "localhost" only (not for 127.0.0.1), so a test can check
# that the name is verified.
#
# Files in $RMQ_BACKUP_TLS_DIR (default /tmp/rmq-backup-tls), made with the openssl command:
#   ca.pem, ca.key               the test CA (EC P-256, 10 years)
#   other-ca.pem                 a second CA that signed nothing the brokers use
#   server.pem, server.key       the brokers' certificate (SAN DNS:localhost)
#   client.pem                   client certificate (RSA 2048), keys: client.pkcs8.key
#                                (BEGIN PRIVATE KEY) and client.pkcs1.key (BEGIN RSA PRIVATE KEY)
#   client-ec.pem                client certificate (EC P-256), keys: client-ec.pkcs8.key and
#                                client-ec.sec1.key (BEGIN EC PRIVATE KEY)
#   client-expired.pem           client certificate valid in 2020 only (key client.pkcs8.key)
#   server-expired.pem           server certificate for localhost valid in 2020 only (key
#                                server.key), for a TLS server a test starts itself
#   nodes/<node>/                each node's config, data and logs
#
# Idempotent: existing certificates are kept; a node already answering is left alone. Run as root
# (the nodes run as the rabbitmq user, as the main broker). Needs rabbitmq-server (see
# scripts/setup-rabbitmq.sh) and openssl.
set -euo pipefail

export PATH="/usr/sbin:/sbin:/usr/bin:/bin:${PATH:-}"
DIR="${RMQ_BACKUP_TLS_DIR:-/tmp/rmq-backup-tls}"
TIMEOUT="${RMQ_SETUP_TIMEOUT:-120}"
HOST="$(hostname -s)"

log() { echo "setup-rabbitmq-tls: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

command -v openssl >/dev/null || {
    [[ "$(id -u)" == "0" ]] || die "openssl is not installed"
    log "installing openssl (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y openssl >/dev/null
}
command -v rabbitmq-server >/dev/null || die "rabbitmq-server is not installed (run scripts/setup-rabbitmq.sh first)"

mkdir -p "$DIR"
cd "$DIR"

# --- certificates ---------------------------------------------------------------------------

# sign NAME EXT [STARTDATE ENDDATE]: NAME.csr -> NAME.pem signed by ca.pem.
sign() {
    local name="$1" ext="$2" start="${3:-}" end="${4:-}"
    if [[ -n "$start" ]]; then
        # `openssl ca` is the one openssl 3.0 command that sets arbitrary validity dates.
        rm -rf ca-db && mkdir ca-db && : >ca-db/index.txt && echo 1000 >ca-db/serial
        cat >ca-db/ca.cnf <<CNF
[ca]
default_ca = test
[test]
dir = $DIR/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $DIR/ca.pem
private_key = $DIR/ca.key
default_md = sha256
policy = any
copy_extensions = none
unique_subject = no
[any]
commonName = supplied
[ext]
$(tr ';' '\n' <<<"$ext")
CNF
        openssl ca -batch -notext -config ca-db/ca.cnf -extensions ext -startdate "$start" \
            -enddate "$end" -in "$name.csr" -out "$name.pem" 2>/dev/null
        rm -rf ca-db
    else
        openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
            -sha256 -extfile <(tr ';' '\n' <<<"$ext") -out "$name.pem" 2>/dev/null
    fi
    rm -f "$name.csr"
}

SERVER_EXT="basicConstraints=critical,CA:FALSE;keyUsage=critical,digitalSignature,keyEncipherment;extendedKeyUsage=serverAuth;subjectAltName=DNS:localhost"
CLIENT_EXT="basicConstraints=critical,CA:FALSE;keyUsage=critical,digitalSignature,keyEncipherment;extendedKeyUsage=clientAuth"

if [[ ! -s client-expired.pem ]]; then
    log "making the test CA and certificates in $DIR"
    rm -f ./*.pem ./*.key ./*.srl
    for ca in ca other-ca; do
        openssl ecparam -name prime256v1 -genkey -noout -out "$ca.key"
        openssl req -x509 -new -key "$ca.key" -sha256 -days 3650 -subj "/CN=rmq-backup test $ca" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out "$ca.pem"
    done
    rm -f other-ca.key

    openssl ecparam -name prime256v1 -genkey -noout -out server.sec1.key
    openssl pkcs8 -topk8 -nocrypt -in server.sec1.key -out server.key && rm server.sec1.key
    openssl req -new -key server.key -subj "/CN=localhost" -out server.csr
    sign server "$SERVER_EXT"
    openssl req -new -key server.key -subj "/CN=localhost" -out server-expired.csr
    sign server-expired "$SERVER_EXT" 20200101000000Z 20201231000000Z

    openssl genrsa -out client.pkcs8.key 2048 2>/dev/null
    openssl rsa -in client.pkcs8.key -traditional -out client.pkcs1.key 2>/dev/null
    openssl req -new -key client.pkcs8.key -subj "/CN=rmq-backup-client" -out client.csr
    sign client "$CLIENT_EXT"
    openssl req -new -key client.pkcs8.key -subj "/CN=rmq-backup-client" -out client-expired.csr
    sign client-expired "$CLIENT_EXT" 20200101000000Z 20201231000000Z

    openssl ecparam -name prime256v1 -genkey -noout -out client-ec.sec1.key
    openssl pkcs8 -topk8 -nocrypt -in client-ec.sec1.key -out client-ec.pkcs8.key
    openssl req -new -key client-ec.pkcs8.key -subj "/CN=rmq-backup-client-ec" -out client-ec.csr
    sign client-ec "$CLIENT_EXT"
    rm -f ./*.srl
    grep -q "BEGIN RSA PRIVATE KEY" client.pkcs1.key || die "client.pkcs1.key is not PKCS#1"
    grep -q "BEGIN EC PRIVATE KEY" client-ec.sec1.key || die "client-ec.sec1.key is not SEC1"
fi
if [[ ! -s client-v1.pem ]]; then
    # The common way to sign a client certificate, without an extension file: X.509 v1.
    openssl req -new -key client.pkcs8.key -subj "/CN=rmq-backup-client-v1" -out client-v1.csr
    openssl x509 -req -in client-v1.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -sha256 -out client-v1.pem 2>/dev/null
    rm -f client-v1.csr ./*.srl
fi
chmod 0644 ./*.pem ./*.key

# --- nodes ----------------------------------------------------------------------------------

port_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null; }
all_open() {
    local p
    for p; do port_open "$p" || return 1; done
}

# start_node NAME AMQP STREAM MGMT DIST FAIL_IF_NO_PEER_CERT PLAIN
start_node() {
    local name="$1" amqp="$2" stream="$3" mgmt="$4" dist="$5" require="$6" plain="$7"
    local nd="$DIR/nodes/$name"
    if all_open "$amqp" "$stream" "$mgmt" "$plain"; then
        log "$name already running (amqps 127.0.0.1:$amqp)"
        return
    fi
    if [[ -f "$nd/$name.pid" ]]; then
        # Running with another configuration (or half up): stop it first.
        rabbitmqctl -n "$name@$HOST" stop "$nd/$name.pid" >/dev/null 2>&1 || true
    fi
    mkdir -p "$nd"
    cat >"$nd/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$plain
listeners.ssl.default = 127.0.0.1:$amqp
ssl_options.cacertfile = $DIR/ca.pem
ssl_options.certfile = $DIR/server.pem
ssl_options.keyfile = $DIR/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = $require
stream.listeners.tcp = none
stream.listeners.ssl.default = 127.0.0.1:$stream
management.ssl.ip = 127.0.0.1
management.ssl.port = $mgmt
management.ssl.cacertfile = $DIR/ca.pem
management.ssl.certfile = $DIR/server.pem
management.ssl.keyfile = $DIR/server.key
management.ssl.verify = verify_peer
management.ssl.fail_if_no_peer_cert = $require
loopback_users = none
CONF
    echo '[rabbitmq_management,rabbitmq_stream].' >"$nd/enabled_plugins"
    chown -R rabbitmq:rabbitmq "$nd" 2>/dev/null || true
    log "starting $name (amqps $amqp, stream $stream, https $mgmt)"
    RABBITMQ_NODENAME="$name@$HOST" RABBITMQ_DIST_PORT="$dist" \
        RABBITMQ_MNESIA_BASE="$nd/mnesia" RABBITMQ_LOG_BASE="$nd/log" \
        RABBITMQ_CONFIG_FILE="$nd/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$nd/enabled_plugins" \
        RABBITMQ_PLUGINS_EXPAND_DIR="$nd/plugins-expand" RABBITMQ_PID_FILE="$nd/$name.pid" \
        rabbitmq-server -detached >/dev/null 2>&1 || die "rabbitmq-server -detached failed for $name"
}

wait_node() {
    local name="$1" amqp="$2" stream="$3" mgmt="$4" plain="$5"
    local deadline=$((SECONDS + TIMEOUT))
    until all_open "$amqp" "$stream" "$mgmt" "$plain"; do
        ((SECONDS < deadline)) || die "$name did not open ports $amqp, $stream, $mgmt and $plain within $TIMEOUT s (see $DIR/nodes/$name/log)"
        sleep 1
    done
}

start_node rmqtls 5671 5551 15671 25671 false 5674
start_node rmqmtls 5681 5561 15681 25681 true 5684
wait_node rmqtls 5671 5551 15671 5674
wait_node rmqmtls 5681 5561 15681 5684
echo "TLS brokers ready: amqps://localhost:5671 (client certificate optional), amqps://localhost:5681 (client certificate required); CA $DIR/ca.pem" >&2
