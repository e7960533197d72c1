#!/usr/bin/env bash
# Builds a Debian package of rmq-backup (amd64) with dpkg-deb: the static binary
# (scripts/build-static.sh) as /usr/bin/rmq-backup, an example configuration as the conffile
# /etc/rmq-backup/backup.yaml, systemd units for a nightly backup (rmq-backup.service and
# rmq-backup.timer, not enabled), README.md in /usr/share/doc/rmq-backup. The postinst creates
# the system user rmq-backup and /var/backups/rmq-backup. Prints the .deb's path last.
#
# Usage: scripts/build-deb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/build-static.sh)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
stage=target/deb/rmq-backup_${version}_amd64
rm -rf "$stage"
install -D -m 0755 "$bin" "$stage/usr/bin/rmq-backup"
install -D -m 0640 packaging/backup.yaml "$stage/etc/rmq-backup/backup.yaml"
install -D -m 0644 packaging/systemd/rmq-backup.service "$stage/lib/systemd/system/rmq-backup.service"
install -D -m 0644 packaging/systemd/rmq-backup.timer "$stage/lib/systemd/system/rmq-backup.timer"
install -D -m 0644 README.md "$stage/usr/share/doc/rmq-backup/README.md"
install -D -m 0644 LICENSE "$stage/usr/share/doc/rmq-backup/copyright"
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: rmq-backup
Version: $version
Architecture: amd64
Maintainer: rmq-backup maintainers <rmq-backup@example.com>
Section: admin
Priority: optional
Installed-Size: $(du -sk "$stage" | cut -f1)
Description: back up RabbitMQ queues, streams and topology, byte for byte
 rmq-backup reads the queues and streams of a RabbitMQ broker without removing
 anything, writes them to a filesystem or object storage (S3, Azure Blob, GCS)
 and restores them. One static binary; a systemd timer runs a nightly backup.
CONTROL
echo "/etc/rmq-backup/backup.yaml" > "$stage/DEBIAN/conffiles"
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  if ! getent passwd rmq-backup >/dev/null; then
    adduser --system --group --home /var/lib/rmq-backup --no-create-home rmq-backup >/dev/null 2>&1 ||
      useradd --system --user-group --home-dir /var/lib/rmq-backup --shell /usr/sbin/nologin rmq-backup
  fi
  install -d -o rmq-backup -g rmq-backup -m 0750 /var/backups/rmq-backup
  chgrp rmq-backup /etc/rmq-backup/backup.yaml
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
POSTINST
cat > "$stage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
POSTRM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/postrm"
dpkg-deb --build --root-owner-group "$stage" >&2
echo "$stage.deb"
