//! TLS and mutual TLS against real brokers (issue 15): the two TLS nodes that
//! `scripts/setup-rabbitmq-tls.sh` starts with its test CA:
//! - rmqtls: amqps 5671, stream over TLS 5551, management https 15671, client certificate
//!   optional; plain AMQP 5674;
//! - rmqmtls: amqps 5681, stream 5561, https 15681, client certificate required; plain 5684.
//!
//! Messages are published and checked over the plain port; only the tool's own connections
//! (AMQP, stream, management) go over TLS. The certificates are valid for `localhost` only.

mod common;
mod tls_support;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::TlsConfig;
use tls_support::*;

/// The `tls:` block of a `source` or `target` section.
fn yaml_tls(cfg: &TlsConfig) -> String {
    let mut s = format!("  tls:\n    enabled: {}\n", cfg.enabled);
    for (k, v) in [
        ("ca_cert", &cfg.ca_cert),
        ("client_cert", &cfg.client_cert),
        ("client_key", &cfg.client_key),
    ] {
        if let Some(p) = v {
            s += &format!("    {k}: \"{}\"\n", p.display());
        }
    }
    s
}

/// Backs up a classic queue (diverse messages, every header type) and a stream (read with the
/// stream protocol over TLS) from `node` with `source_tls`, restores them into a sibling vhost
/// over TLS with `target_tls`, and compares message by message over the plain port.
fn round_trip(
    node: &Node,
    tag: &str,
    amqp_scheme: &str,
    source_tls: TlsConfig,
    target_tls: TlsConfig,
) {
    let vh = TlsVhost::new(node, tag);
    let conn = node.plain(&vh.name);
    let ch = conn.open_channel().expect("channel");
    declare(&ch, "orders", "classic", FieldTable::new());
    declare(&ch, "events", "stream", FieldTable::new());
    let msgs = diverse_messages(150, 15, true);
    publish(&ch, "orders", &msgs);
    let events: Vec<Msg> = (0..40)
        .map(|i| Msg {
            props: Default::default(),
            body: format!("event {i}").into_bytes(),
        })
        .collect();
    publish(&ch, "events", &events);
    wait_ready(&ch, "orders", msgs.len() as u32);

    let dir = TempDir::new(&format!("tls-{tag}"));
    let id = format!("tls-{tag}-{}", unique_suffix());
    let vhost_enc = vh.name.clone();
    // Unset, the stream port is 5551 for a TLS source or target: say it only when it differs.
    let stream_port = if node.stream == 5551 {
        String::new()
    } else {
        format!("  stream_port: {}\n", node.stream)
    };
    let backup = format!(
        r#"mode: backup
backup_id: "{id}"
source:
  amqp_url: "{amqp_scheme}://guest:guest@localhost:{port}/{vhost_enc}"
  management_url: "https://localhost:{https}"
  management_username: guest
  management_password: guest
{stream_port}{tls}  queues:
    vhosts: ["{vhost}"]
storage:
  backend: filesystem
  path: "{store}"
backup:
  include_definitions: true
  stream_enabled: true
"#,
        port = node.amqps,
        https = node.https,
        tls = yaml_tls(&source_tls),
        stream_port = stream_port,
        vhost = vh.name,
        store = dir.path().join("store").display(),
    );
    let cfg = write_config(dir.path(), "backup.yaml", &backup);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "backup over TLS: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("Backup {id} completed")),
        "{stdout}"
    );
    let m = manifest(&dir.path().join("store"), &id);
    assert_eq!(m.total_messages, (msgs.len() + events.len()) as u64);

    let restore = format!(
        r#"mode: restore
backup_id: "{id}"
target:
  amqp_url: "amqps://guest:guest@localhost:{port}/"
  management_url: "https://localhost:{https}"
  management_username: guest
  management_password: guest
{stream_port}{tls}storage:
  backend: filesystem
  path: "{store}"
restore:
  publish_mode: direct-to-queue
  restore_definitions: true
  definitions_selection:
    vhosts: ["{vhost}"]
  vhost_mapping:
    "{vhost}": "{target}"
"#,
        port = node.amqps,
        https = node.https,
        tls = yaml_tls(&target_tls),
        vhost = vh.name,
        target = vh.target(),
        store = dir.path().join("store").display(),
    );
    let cfg = write_config(dir.path(), "restore.yaml", &restore);
    let out = run_cli(&["restore", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "restore over TLS: {stdout}\n{stderr}"
    );

    let tconn = node.plain(&vh.target());
    assert_same(
        &as_restored(&msgs),
        &peek(&tconn, "orders", msgs.len()),
        "orders restored over TLS",
    );
    assert_eq!(depth(&tconn, "orders") as usize, msgs.len());
    let restored: Vec<Vec<u8>> = read_stream_091(&tconn, "events", events.len())
        .into_iter()
        .map(|d| d.body)
        .collect();
    let want: Vec<Vec<u8>> = events.iter().map(|m| m.body.clone()).collect();
    assert_eq!(restored, want, "stream restored over TLS");
    // The source kept everything.
    assert_eq!(depth(&conn, "orders") as usize, msgs.len());
}

#[test]
fn backup_and_restore_over_tls_with_a_ca_file() {
    // ca_cert only; the URLs say amqps:// and https://, and the stream port defaults to 5551.
    let tls = TlsConfig {
        enabled: false,
        ..settings("ca.pem", None)
    };
    round_trip(&tls_node(), "ca", "amqps", tls.clone(), tls);
}

#[test]
fn backup_and_restore_over_mutual_tls_with_each_key_form() {
    // source: tls.enabled turns amqp:// into TLS; an RSA key in PKCS#1. target: EC key in SEC1.
    round_trip(
        &MTLS_NODE,
        "mtls",
        "amqp",
        settings("ca.pem", Some(("client.pem", "client.pkcs1.key"))),
        settings("ca.pem", Some(("client-ec.pem", "client-ec.sec1.key"))),
    );
}

/// Without `ca_cert` the system store is used, and `SSL_CERT_FILE` adds to it (issue 15).
#[test]
fn without_ca_cert_the_system_store_and_ssl_cert_file_are_used() {
    let node = &tls_node();
    let vh = TlsVhost::new(node, "sysstore");
    let conn = node.plain(&vh.name);
    let ch = conn.open_channel().expect("channel");
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(20, 31, false);
    publish(&ch, "q", &msgs);
    wait_ready(&ch, "q", msgs.len() as u32);
    let dir = TempDir::new("tls-sysstore");
    let yaml = |id: &str| {
        format!(
            "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: \"amqps://guest:guest@localhost:{}/\"\n  management_url: \"https://localhost:{}\"\n  management_username: guest\n  management_password: guest\n  tls:\n    enabled: true\n  queues:\n    vhosts: [\"{}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\n",
            node.amqps,
            node.https,
            vh.name,
            dir.path().join("store").display()
        )
    };
    // The system store does not hold the test CA: refused, and the message says where it looked.
    let cfg = write_config(dir.path(), "a.yaml", &yaml("sys-a"));
    let out = run_cli(&["backup", "--config", &cfg]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not signed by a CA in the system CA store"),
        "{stderr}"
    );
    // SSL_CERT_FILE names the CA: the backup reads every message.
    let cfg = write_config(dir.path(), "b.yaml", &yaml("sys-b"));
    let ca = file("ca.pem");
    let out = run_cli_env(
        &["backup", "--config", &cfg],
        &[("SSL_CERT_FILE", ca.to_str().unwrap())],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let got = backed_up(&dir.path().join("store"), "sys-b", "q");
    assert_same(&as_restored(&msgs), &got, "backed up with SSL_CERT_FILE");
}
