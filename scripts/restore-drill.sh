#!/usr/bin/env bash
# A restore drill (docs/restore-drill.md) against a running RabbitMQ, in vhosts of its own:
# seeds a vhost (a topic exchange and a binding, a policy, a classic, a quorum and a stream
# queue with messages, a stream consumer offset), backs it up with its definitions, deletes the
# vhost (the disaster), restores from the backup into an empty broker's place (definitions
# first, then messages, then stream offsets), and checks the result: the definitions, every
# queue's depth, every message (body, properties, headers, by a second backup's records), the
# consumer offset. Prints `DRILL PASS` and exits 0, or `DRILL FAIL: <what>` and exits 1.
#
# Needs curl and python3 (the stream offset is stored and read with scripts/drill/stream_offset.py,
# standard library only). The broker user needs the administrator tag (definitions).
#
# Environment (all optional):
#   RMQ_BACKUP_BIN         the rmq-backup binary (default: rmq-backup on PATH, else target/release
#                          or target/debug of this checkout)
#   RMQ_DRILL_HOST         broker host (127.0.0.1)
#   RMQ_DRILL_AMQP_PORT    5672; RMQ_DRILL_MANAGEMENT_PORT 15672; RMQ_DRILL_STREAM_PORT 5552
#   RMQ_DRILL_USER, RMQ_DRILL_PASSWORD    guest / guest
#   RMQ_DRILL_VHOST        the drill's vhost (default rmq-backup-drill-<pid>); deleted at the end
#   RMQ_DRILL_KEEP=1       keep the vhost and the work directory for a look afterwards
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HOST="${RMQ_DRILL_HOST:-127.0.0.1}"
AMQP_PORT="${RMQ_DRILL_AMQP_PORT:-5672}"
MGMT_PORT="${RMQ_DRILL_MANAGEMENT_PORT:-15672}"
STREAM_PORT="${RMQ_DRILL_STREAM_PORT:-5552}"
USER_NAME="${RMQ_DRILL_USER:-guest}"
PASSWORD="${RMQ_DRILL_PASSWORD:-guest}"
VHOST="${RMQ_DRILL_VHOST:-rmq-backup-drill-$$}"
MGMT="http://$HOST:$MGMT_PORT"
BIN="${RMQ_BACKUP_BIN:-}"
if [ -z "$BIN" ]; then
    BIN="$(command -v rmq-backup || true)"
    for b in "$ROOT/target/release/rmq-backup" "$ROOT/target/debug/rmq-backup"; do
        [ -n "$BIN" ] || { [ -x "$b" ] && BIN="$b"; }
    done
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rmq-backup-drill.XXXXXX")"
ID="drill-$(date -u +%Y%m%dT%H%M%S)-$$"
OFFSETS="python3 $HERE/drill/stream_offset.py"

say() { echo "drill: $*"; }
fail() {
    echo "DRILL FAIL: $*"
    exit 1
}
cleanup() {
    if [ "${RMQ_DRILL_KEEP:-0}" = 1 ]; then
        say "kept vhost $VHOST and $WORK"
    else
        curl -s -u "$USER_NAME:$PASSWORD" -X DELETE "$MGMT/api/vhosts/$(enc "$VHOST")" >/dev/null || true
        rm -rf "$WORK"
    fi
}
enc() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }
# api METHOD PATH [JSON]: the management API; fails the drill on an HTTP error.
api() {
    local code
    code="$(curl -s -o "$WORK/api.out" -w '%{http_code}' -u "$USER_NAME:$PASSWORD" \
        -H 'content-type: application/json' -X "$1" "$MGMT/api$2" ${3:+--data "$3"})" ||
        fail "management API $1 $2: no answer from $MGMT"
    case "$code" in 2??) ;; *) fail "management API $1 $2: HTTP $code $(head -c 300 "$WORK/api.out")" ;; esac
}
publish() { # exchange routing-key payload headers-json
    api POST "/exchanges/$V/$1/publish" \
        "{\"properties\":{\"delivery_mode\":2,\"content_type\":\"text/plain\",\"headers\":$4},\"routing_key\":\"$2\",\"payload\":\"$3\",\"payload_encoding\":\"string\"}"
    grep -q '"routed":true' "$WORK/api.out" || fail "a message to $1/$2 was not routed"
}
# depth QUEUE: the queue's message count from the management API ("" while unknown).
depth() {
    api GET "/queues/$V/$1"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("messages",""))' "$WORK/api.out"
}
# wait_depth QUEUE N: until the queue holds N messages (60 s).
wait_depth() {
    local d=""
    for _ in $(seq 1 120); do
        d="$(depth "$1")"
        [ "$d" = "$2" ] && return 0
        sleep 0.5
    done
    fail "queue $1 holds ${d:-an unknown number of} messages, not $2"
}
config() { # mode backup_id extra
    cat <<YAML
mode: $1
backup_id: "$2"
$([ "$1" = backup ] && echo source: || echo target:)
  amqp_url: "amqp://$USER_NAME@$HOST:$AMQP_PORT/$V"
  amqp_password_file: "$WORK/password"
  management_url: "$MGMT"
  management_username: "$USER_NAME"
  management_password_file: "$WORK/password"
  stream_port: $STREAM_PORT
$3
storage:
  backend: filesystem
  path: "$WORK/store"
YAML
}
trap cleanup EXIT
[ -x "$BIN" ] || fail "no rmq-backup binary (set RMQ_BACKUP_BIN, or cargo build --release)"
command -v curl >/dev/null || fail "curl is needed"
command -v python3 >/dev/null || fail "python3 is needed"
V="$(enc "$VHOST")"
printf '%s\n' "$PASSWORD" >"$WORK/password"
chmod 600 "$WORK/password"
say "$("$BIN" --version), broker $MGMT, vhost $VHOST, work $WORK"

say "1. a vhost to lose: exchange, binding, policy, classic, quorum and stream queues, messages, an offset"
api PUT "/vhosts/$V"
api PUT "/permissions/$V/$(enc "$USER_NAME")" '{"configure":".*","write":".*","read":".*"}'
api PUT "/exchanges/$V/orders-x" '{"type":"topic","durable":true}'
api PUT "/queues/$V/orders" '{"durable":true,"arguments":{"x-queue-type":"classic"}}'
api PUT "/queues/$V/payments" '{"durable":true,"arguments":{"x-queue-type":"quorum"}}'
api PUT "/queues/$V/events" '{"durable":true,"arguments":{"x-queue-type":"stream"}}'
api POST "/bindings/$V/e/orders-x/q/orders" '{"routing_key":"order.#"}'
api PUT "/policies/$V/drill-orders" '{"pattern":"^orders$","definition":{"max-length":100000},"apply-to":"queues"}'
for i in $(seq 1 20); do publish orders-x order.created "order $i" "{\"n\":$i,\"tenant\":\"acme\"}"; done
for i in $(seq 1 10); do publish amq.default payments "payment $i" "{\"n\":$i}"; done
for i in $(seq 1 30); do publish amq.default events "event $i" "{\"n\":$i}"; done
wait_depth orders 20
wait_depth payments 10
wait_depth events 30
$OFFSETS store "$HOST" "$STREAM_PORT" "$USER_NAME" "$PASSWORD" "$VHOST" events billing 9 >/dev/null ||
    fail "storing the consumer offset billing on stream events"
api GET "/definitions/$V"
cp "$WORK/api.out" "$WORK/definitions-before.json"

say "2. the nightly backup, checked"
config backup "$ID" "  queues:
    vhosts: [\"$VHOST\"]
backup:
  include_definitions: true
  stream_enabled: true
  stream_offset_references: [billing]" >"$WORK/backup.yaml"
"$BIN" config check --config "$WORK/backup.yaml" >/dev/null || fail "config check of the backup configuration"
"$BIN" backup --config "$WORK/backup.yaml" >"$WORK/backup.out" 2>"$WORK/backup.log" ||
    fail "backup exited $? ($(tail -n 1 "$WORK/backup.log"))"
"$BIN" validate --config "$WORK/backup.yaml" --deep >/dev/null 2>&1 || fail "validate --deep of $ID"

say "3. the disaster: vhost $VHOST deleted (queues, messages, bindings, policy, offsets)"
api DELETE "/vhosts/$V"

say "4. the restore: definitions, then messages, then stream offsets"
config restore "$ID" "restore:
  restore_definitions: true
  definitions_selection:
    vhosts: [\"$VHOST\"]
  stream_offsets: translate" >"$WORK/restore.yaml"
"$BIN" restore --config "$WORK/restore.yaml" --dry-run >"$WORK/restore-plan.out" 2>&1 ||
    fail "restore --dry-run ($(tail -n 1 "$WORK/restore-plan.out"))"
"$BIN" restore --config "$WORK/restore.yaml" >"$WORK/restore.out" 2>"$WORK/restore.log" ||
    fail "restore exited $? ($(tail -n 1 "$WORK/restore.log"))"
grep -q "60 messages published, 60 confirmed, 0 failed" "$WORK/restore.out" ||
    fail "restore summary: $(cat "$WORK/restore.out")"

say "5. the checks"
# 5a. the definitions of the vhost: exchanges, queues (type, arguments), bindings, policies.
api GET "/definitions/$V"
python3 - "$WORK/definitions-before.json" "$WORK/api.out" <<'PY' || fail "definitions differ after the restore"
import json, sys
def shape(path):
    d = json.load(open(path))
    pick = lambda items, keys: sorted(json.dumps({k: i.get(k) for k in keys}, sort_keys=True) for i in items)
    return {
        "exchanges": pick(d.get("exchanges", []), ["name", "type", "durable", "arguments"]),
        "queues": pick(d.get("queues", []), ["name", "durable", "arguments"]),
        "bindings": pick(d.get("bindings", []), ["source", "destination", "destination_type", "routing_key"]),
        "policies": pick(d.get("policies", []), ["name", "pattern", "definition", "apply-to"]),
    }
before, after = shape(sys.argv[1]), shape(sys.argv[2])
for k in before:
    if before[k] != after[k]:
        print(f"drill: {k} before: {before[k]}\ndrill: {k} after:  {after[k]}")
        sys.exit(1)
PY
# 5b. every queue's depth (a stream's count from the management API also counts the chunk
# that stores a consumer offset: its records are checked in 5c instead).
wait_depth orders 20
wait_depth payments 10
# 5c. every message: a second backup of the restored vhost holds the same records.
config backup "$ID-verify" "  queues:
    vhosts: [\"$VHOST\"]
backup:
  include_definitions: false
  stream_enabled: true" >"$WORK/verify.yaml"
"$BIN" backup --config "$WORK/verify.yaml" >/dev/null 2>"$WORK/verify.log" ||
    fail "backup of the restored vhost exited $? ($(tail -n 1 "$WORK/verify.log"))"
for q in orders payments events; do
    for b in "$ID" "$ID-verify"; do
        "$BIN" cat --config "$WORK/backup.yaml" --backup-id "$b" --queue "$q" >"$WORK/$b-$q.jsonl" ||
            fail "cat of $q in $b"
    done
    python3 - "$WORK/$ID-$q.jsonl" "$WORK/$ID-verify-$q.jsonl" "$q" <<'PY' || fail "the messages of $q differ after the restore"
import json, sys
keep = ["exchange", "routing_key", "properties", "headers", "body_encoding", "body"]
def records(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        r["headers"] = [h for h in r["headers"] if h["name"] not in ("x-delivery-count", "x-acquired-count")]
        out.append({k: r.get(k) for k in keep})
    return out
a, b = records(sys.argv[1]), records(sys.argv[2])
if a != b:
    print(f"drill: {sys.argv[3]}: {len(a)} records backed up, {len(b)} after the restore; first difference:")
    for x, y in zip(a, b):
        if x != y:
            print(f"  before {x}\n  after  {y}")
            break
    sys.exit(1)
PY
done
# 5d. the stream consumer offset: where the restore says it put it.
expected="$(sed -n 's/.*consumer reference billing: offset 9 in the backup is offset \([0-9]*\) in stream events.*/\1/p' "$WORK/restore.log" | head -n 1)"
[ -n "$expected" ] || fail "the restore did not restore the consumer offset billing ($(grep -i billing "$WORK/restore.log" | head -n 1))"
got="$($OFFSETS query "$HOST" "$STREAM_PORT" "$USER_NAME" "$PASSWORD" "$VHOST" events billing)" ||
    fail "no offset stored for billing on the restored stream events"
[ "$got" = "$expected" ] || fail "billing's offset is $got on the restored stream, the restore said $expected"

say "definitions, 60 messages in 3 queues and the consumer offset billing ($got) are back"
echo "DRILL PASS"
