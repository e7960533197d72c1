#!/usr/bin/env bash
# The main job, end to end, on a local RabbitMQ that this script starts if needed:
# seed sample queues, back up to a directory, list and validate the backup, restore it to a
# new vhost, and show that every message came back identical.
#
# Usage: scripts/demo.sh [messages_per_queue]   (default 2000)
# Env:   KEEP=1 keeps the demo vhosts and the backup directory for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-2000}
AMQP=${RMQ_AMQP_BASE:-amqp://guest:guest@127.0.0.1:5672}
MGMT=${RMQ_MANAGEMENT_URL:-http://127.0.0.1:15672}
SRC=rmqb-demo
DST=rmqb-demo-restored
ID="demo-$(date -u +%Y%m%dT%H%M%SZ)"

scripts/setup-rabbitmq.sh
echo "== building rmq-backup (release)"
cargo build --release --quiet --bin rmq-backup --example demo
BIN=target/release/rmq-backup
DEMO=target/release/examples/demo

WORK=$(mktemp -d /tmp/rmq-backup-demo.XXXXXX)
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
    curl -fsS -u guest:guest -X DELETE "$MGMT/api/vhosts/$SRC" >/dev/null 2>&1 || true
    curl -fsS -u guest:guest -X DELETE "$MGMT/api/vhosts/$DST" >/dev/null 2>&1 || true
  else
    echo "kept: backup in $WORK/backups, vhosts $SRC and $DST"
  fi
}
trap cleanup EXIT
curl -fsS -u guest:guest -X DELETE "$MGMT/api/vhosts/$DST" >/dev/null 2>&1 || true

echo "== seeding vhost $SRC"
"$DEMO" seed "$AMQP" "$MGMT" "$SRC" "$N"

cat > "$WORK/backup.yaml" <<YAML
mode: backup
backup_id: "$ID"
source:
  amqp_url: "$AMQP/$SRC"
  management_url: "$MGMT"
  management_username: guest
  management_password: \${RMQ_DEMO_PASSWORD}
  queues:
    vhosts: ["$SRC"]
storage:
  backend: filesystem
  path: "$WORK/backups"
backup:
  compression: zstd
  compression_level: 3
YAML
cat > "$WORK/restore.yaml" <<YAML
mode: restore
backup_id: "$ID"
target:
  amqp_url: "$AMQP/%2f"
  management_url: "$MGMT"
  management_username: guest
  management_password: \${RMQ_DEMO_PASSWORD}
storage:
  backend: filesystem
  path: "$WORK/backups"
restore:
  publish_mode: direct-to-queue
  restore_definitions: true
  definitions_selection:
    vhosts: ["$SRC"]
  vhost_mapping:
    "$SRC": "$DST"
YAML
export RMQ_DEMO_PASSWORD=guest

echo "== backup"
"$BIN" backup --config "$WORK/backup.yaml"
echo "== list"
"$BIN" list --path "file://$WORK/backups"
echo "== validate --deep"
"$BIN" validate --path "file://$WORK/backups" --backup-id "$ID" --deep
echo "== restore into vhost $DST"
"$BIN" restore --config "$WORK/restore.yaml"
echo "== every message, compared (body, properties, headers with their types, order)"
"$DEMO" verify "$AMQP" "$SRC" "$DST"
echo "== demo passed"
