//! How a backup ends when not everything goes to plan, against the real broker: selected queues
//! it must leave alone (exit 4, each named with its reason, counted in a metric), the
//! `error_type` of every failure in `broker_backup_errors`, and the warnings for the unused
//! `backup.prefetch_count` and `backup.checkpoint_interval_secs`.

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};
use rmq_backup::config::Config;
use rmq_backup::metrics;

/// The value of one series of `broker_backup_errors` in this process (0 when absent).
fn errors(queue: &str, vhost: &str, error_type: &str) -> u64 {
    let text = metrics::global().render();
    let series = format!(
        "broker_backup_errors{{queue=\"{queue}\",vhost=\"{vhost}\",error_type=\"{error_type}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

fn config(yaml: &str) -> Config {
    Config::from_yaml_str(yaml).expect("config")
}

#[test]
fn selected_queues_left_alone_exit_4_and_are_named() {
    let vh = TestVhost::new("skipped");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(
        &ch,
        "limited",
        "quorum",
        vec![("x-delivery-limit".into(), FieldValue::I64(2))],
    );
    declare(&ch, "free", "quorum", FieldTable::new());
    declare(&ch, "events", "stream", FieldTable::new());
    // Exclusive to the test's own connection, which stays open during the backup.
    ch.queue_declare("mine-only", false, true, false, &FieldTable::new())
        .unwrap();
    let msgs = diverse_messages(10, 4, false);
    for q in ["limited", "free", "mine-only"] {
        publish(&ch, q, &msgs);
    }
    let dir = TempDir::new("skipped");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("sk", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    let v = &vh.name;
    // Where a backup's give-back counts (before RabbitMQ 4.3), the delivery-limited quorum
    // queue is left alone; on 4.3 it is read (tests/delivery_limit.rs).
    let limited_skipped = !broker().uncounted_nack();
    let mut expected = Vec::new();
    if limited_skipped {
        expected.push(format!("  skipped queue limited in vhost {v} (quorum): it is a quorum queue with a delivery limit of 2, "));
    }
    expected.push(format!(
        "  skipped queue mine-only in vhost {v} (classic): it is exclusive to another connection"
    ));
    let (read, skipped) = if limited_skipped { (2, 2) } else { (3, 1) };
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + expected.len(), "{stdout}");
    assert!(
        lines[0].starts_with(&format!(
            "Backup sk completed: {read} queues, {} messages, ",
            (read - 1) * 10
        )) && lines[0].ends_with(&format!(
            "; {skipped} selected queue(s) skipped, not backed up (exit code 4)"
        )),
        "{stdout}"
    );
    for (line, want) in lines[1..].iter().zip(&expected) {
        assert!(line.starts_with(want.as_str()), "{line:?} vs {want:?}");
        // The log says the same, as a warning.
        let logged = format!(
            "WARN  skipped {}",
            want.trim_start().trim_start_matches("skipped ")
        );
        assert!(stderr.contains(&logged), "{logged:?} in {stderr}");
    }
    let m = manifest(&store, "sk");
    assert!(m.completed_at.is_some(), "the queues read are complete");
    // The (empty) stream is read, through AMQP 0-9-1 without stream_enabled.
    let read_names: &[&str] = if limited_skipped {
        &["events", "free"]
    } else {
        &["events", "free", "limited"]
    };
    assert_eq!(
        m.queues.iter().map(|q| q.name.as_str()).collect::<Vec<_>>(),
        read_names
    );
    // Never delivered by the backup: no delivery count, still all there.
    let got = peek(&conn, "limited", 10);
    assert!(
        !limited_skipped || got.iter().all(|d| !d.redelivered),
        "skipped queue touched"
    );
    assert_eq!(depth(&conn, "mine-only"), 10);

    // The same run in-process: each skipped queue counted once in the metric.
    let storage =
        rmq_backup::repository::storage::open_filesystem(&dir.path().join("store2"), None).unwrap();
    let cfg = config(&backup_yaml("sk2", v, &dir.path().join("unused"), ""));
    let s = rmq_backup::backup::run(&cfg, storage).expect("backup");
    assert_eq!(s.skipped.len(), skipped);
    let text = metrics::global().render();
    let counted: &[(&str, &str)] = if limited_skipped {
        &[("limited", "quorum"), ("mine-only", "classic")]
    } else {
        &[("mine-only", "classic")]
    };
    for (q, kind) in counted {
        let series = format!(
            "broker_backup_queues_skipped{{queue=\"{q}\",vhost=\"{v}\",queue_type=\"{kind}\"}} 1"
        );
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    drop(ch);
}

#[test]
fn every_failure_is_counted_with_its_error_type() {
    let vh = TestVhost::new("errtypes");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &diverse_messages(5, 2, false));
    let dir = TempDir::new("errtypes");
    let store = dir.path().join("store");
    let v = vh.name.as_str();
    let fs = || rmq_backup::repository::storage::open_filesystem(&store, None).unwrap();
    let base = backup_yaml("e1", v, &store, "");

    // Management API refuses the password: authentication, a failure of the whole job.
    let before = errors("", "", "authentication");
    let e = rmq_backup::backup::run(
        &config(&base.replace("management_password: guest", "management_password: wrong")),
        fs(),
    )
    .expect_err("401");
    assert_eq!(
        e.to_string(),
        "Management API error: HTTP 401 for GET /api/overview"
    );
    assert_eq!(errors("", "", "authentication"), before + 1);

    // The AMQP password is wrong (management is fine): the queue's failure, authentication.
    let amqp = amqp_url(v);
    let bad_amqp = amqp.replace("guest:guest@", "guest:wrong@");
    let before = errors("q", v, "authentication");
    let e = rmq_backup::backup::run(
        &config(&base.replace(&amqp, &bad_amqp).replace("e1", "e2")),
        fs(),
    )
    .expect_err("AMQP login");
    assert_eq!(
        e.to_string(),
        "Authentication error: AMQP authentication failed for user guest"
    );
    assert_eq!(errors("q", v, "authentication"), before + 1);

    // Nothing listens on the AMQP port: connection.
    let before = errors("q", v, "connection");
    let port1 = amqp.replace(&format!("127.0.0.1:{}", broker().amqp_port), "127.0.0.1:1");
    let e = rmq_backup::backup::run(
        &config(&base.replace(&amqp, &port1).replace("e1", "e3")),
        fs(),
    )
    .expect_err("refused");
    assert!(
        e.to_string()
            .starts_with("Connection error: Failed to connect to amqp://guest:****@127.0.0.1:1/"),
        "{e}"
    );
    assert_eq!(errors("q", v, "connection"), before + 1);

    // The queue's segments cannot be written: storage, with the queue's labels.
    std::fs::create_dir_all(store.join("e4")).unwrap();
    std::fs::write(store.join("e4").join("queues"), b"in the way").unwrap();
    let before = errors("q", v, "storage");
    let e = rmq_backup::backup::run(&config(&base.replace("e1", "e4")), fs()).expect_err("storage");
    assert!(
        e.to_string()
            .starts_with("Storage error: Failed to write e4/queues/"),
        "{e}"
    );
    assert_eq!(errors("q", v, "storage"), before + 1);

    // A completed backup id again: a configuration error, not a serialization one.
    rmq_backup::backup::run(&config(&base.replace("e1", "e5")), fs()).expect("backup e5");
    let before = errors("", "", "configuration");
    let serialization = errors("", "", "serialization");
    let e =
        rmq_backup::backup::run(&config(&base.replace("e1", "e5")), fs()).expect_err("complete");
    assert!(
        e.to_string()
            .starts_with("Configuration error: backup e5 already exists and is complete"),
        "{e}"
    );
    assert_eq!(errors("", "", "configuration"), before + 1);
    assert_eq!(errors("", "", "serialization"), serialization);
    // The source is untouched by all of it.
    assert_eq!(depth(&conn, "q"), 5);
}

/// Options a one-shot backup does not use are said to be unused (issue "Defects found by
/// test and review", item 9): `prefetch_count` and `checkpoint_interval_secs`.
#[test]
fn options_set_in_the_file_that_a_backup_does_not_use_are_reported() {
    let vh = TestVhost::new("prefetch");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &diverse_messages(30, 3, false));
    let dir = TempDir::new("prefetch");
    let store = dir.path().join("store");
    let prefetch = "backup.prefetch_count is 10 but is not used: a one-shot backup must hold a queue's whole depth unacknowledged";
    let interval = "backup.checkpoint_interval_secs is set but has no effect: a backup records its progress at every stored segment";
    for (id, extra, warned) in [
        ("p1", "  prefetch_count: 10\n", [true, false]),
        ("p2", "  checkpoint_interval_secs: 5\n", [false, true]),
        ("p3", "", [false, false]),
    ] {
        let cfg = write_config(
            dir.path(),
            &format!("{id}.yaml"),
            &backup_yaml(id, &vh.name, &store, extra),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        assert_eq!(
            [stderr.contains(prefetch), stderr.contains(interval)],
            warned,
            "{id}: {stderr}"
        );
        // All 30 read whatever the options said.
        assert_eq!(manifest(&store, id).total_messages, 30);
    }
    assert_eq!(depth(&conn, "q"), 30);
}

/// SPEC.md "Filesystem denied": a storage directory the user may not write to. Run as the
/// unprivileged user `nobody` (root would write anyway), or as is when the tests do not run as
/// root.
#[test]
fn a_storage_directory_without_write_permission_is_filesystem_denied() {
    use std::os::unix::fs::PermissionsExt;
    let vh = TestVhost::new("fs-denied");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &diverse_messages(4, 2, false));
    let dir = TempDir::new("fs-denied");
    let spool = dir.path().join("spool");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&spool).unwrap();
    std::fs::create_dir_all(&store).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The store: readable by everyone, writable by its owner only.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("den", &vh.name, &store, ""),
    );
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bin = binary();
    let bin = bin.as_str();
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let mut cmd = if is_root {
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin,
        ]);
        c
    } else {
        std::process::Command::new(bin)
    };
    let out = cmd
        .args(["backup", "--config", &cfg])
        .env("RMQ_BACKUP_SPOOL_DIR", &spool)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some("Storage error: Failed to write den/state/lock.json: Permission denied"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&store).unwrap().count(),
        0,
        "nothing written"
    );
    assert_eq!(depth(&conn, "q"), 4, "the source untouched");
}
