use super::interpolate::interpolate;
use super::*;
use crate::broker::QueueType;
use std::path::PathBuf;

const MINIMAL_BACKUP: &str = "\
mode: backup
backup_id: b1
source:
  amqp_url: amqp://guest:guest@localhost:5672/%2f
  management_url: http://localhost:15672
  management_username: guest
  management_password: guest
storage:
  backend: filesystem
  path: /tmp/backups
";

const MINIMAL_RESTORE: &str = "\
mode: restore
backup_id: b1
target:
  amqp_url: amqp://guest:guest@localhost:5672/%2f
  management_url: http://localhost:15672
  management_username: guest
  management_password: guest
storage:
  backend: memory
";

/// Parses and interpolates without validating.
fn parse(yaml: &str) -> Result<Config> {
    let mut c: Config =
        serde_norway::from_str(yaml).map_err(|e| Error::Serialization(e.to_string()))?;
    c.interpolate_env()?;
    Ok(c)
}

fn parsed(yaml: &str) -> Config {
    match parse(yaml) {
        Ok(c) => c,
        Err(e) => panic!("parse failed: {e}"),
    }
}

fn backup() -> Config {
    parsed(MINIMAL_BACKUP)
}

fn restore() -> Config {
    parsed(MINIMAL_RESTORE)
}

/// The message of the `Error::Config` that `validate` returns.
fn invalid(c: &Config) -> String {
    match c.validate() {
        Err(Error::Config(m)) => m,
        other => panic!("expected a Config error, got {other:?}"),
    }
}

/// The message of the `Error::Serialization` that loading `yaml` returns.
fn serde_err(yaml: &str) -> String {
    match Config::from_yaml_str(yaml) {
        Err(Error::Serialization(m)) => m,
        other => panic!("expected a Serialization error, got {other:?}"),
    }
}

fn load_err(yaml: &str) -> String {
    match Config::from_yaml_str(yaml) {
        Err(Error::Config(m)) => m,
        other => panic!("expected a Config error, got {other:?}"),
    }
}

const FULL: &str = "\
mode: backup
backup_id: full-1
source:
  amqp_url: amqps://user:pw@broker:5671/prod
  management_url: https://broker:15671
  management_username: admin
  management_password: s3cretpw
  stream_port: 5551
  tls:
    enabled: true
    ca_cert: /etc/ca.pem
    client_cert: /etc/client.pem
    client_key: /etc/client.key
  queues:
    include: ['orders.*', 'q?']
    exclude: ['*.tmp']
    vhosts: ['/', prod]
    types: [classic, quorum, stream]
    min_messages: 7
target:
  amqp_url: amqp://t:tpw@target:5673/%2f
  management_url: http://target:15673
  management_username: tadmin
  management_password: tsecret
storage:
  backend: filesystem
  path: /data/backups
backup:
  segment_max_bytes: 1048576
  segment_max_interval_ms: 1000
  compression: lz4
  compression_level: 9
  prefetch_count: 0
  requeue_strategy: nack
  max_concurrent_queues: 2
  checkpoint_interval_secs: 10
  sync_interval_secs: 20
  include_definitions: false
  stop_at_current_depth: false
  stream_enabled: true
  stream_offset_references: [app-1, billing]
restore:
  time_window_start: 1000
  time_window_end: 2000
  queue_mapping: {a: b, 'with space': 'x/y'}
  vhost_mapping: {'/': restored}
  exchange_mapping: {ex1: ex2}
  publish_mode: direct-to-queue
  publisher_confirms: false
  max_concurrent_queues: 8
  produce_batch_size: 500
  rate_limit_messages_per_sec: 250
  restore_definitions: false
  definitions_dry_run: true
  definitions_selection:
    vhosts: [prod]
    queues: [orders]
    exchanges: [ex1]
  create_missing_queues: true
  checkpoint_state: /var/lib/restore.db
  checkpoint_interval_secs: 15
  dry_run: true
  stream_offsets: skip
offset_storage:
  backend: memory
  db_path: /var/lib/offsets.db
  s3_key: full-1/state/offsets.db
  sync_interval_secs: 12
metrics:
  enabled: false
  port: 9090
  bind_address: 127.0.0.1
  path: /m
";

#[test]
fn full_example_parses_every_field() {
    let c = parsed(FULL);
    assert_eq!(c.mode, Mode::Backup);
    assert_eq!(c.backup_id, "full-1");
    let s = c.source.as_ref().expect("source");
    assert_eq!(s.amqp_url, "amqps://user:pw@broker:5671/prod");
    assert_eq!(s.management_url, "https://broker:15671");
    assert_eq!(s.management_username, "admin");
    assert_eq!(s.management_password.expose(), "s3cretpw");
    assert_eq!(s.stream_port, Some(5551));
    assert_eq!(
        s.tls,
        Some(TlsConfig {
            enabled: true,
            ca_cert: Some("/etc/ca.pem".into()),
            client_cert: Some("/etc/client.pem".into()),
            client_key: Some("/etc/client.key".into()),
        })
    );
    assert_eq!(
        s.queues,
        Some(QueueSelection {
            include: vec!["orders.*".into(), "q?".into()],
            exclude: vec!["*.tmp".into()],
            vhosts: vec!["/".into(), "prod".into()],
            types: vec![QueueType::Classic, QueueType::Quorum, QueueType::Stream],
            min_messages: 7,
        })
    );
    let t = c.target.as_ref().expect("target");
    assert_eq!(t.amqp_url, "amqp://t:tpw@target:5673/%2f");
    assert_eq!(
        t.management_url.as_ref().map(|u| u.first()),
        Some("http://target:15673")
    );
    assert_eq!(t.management_username.as_deref(), Some("tadmin"));
    assert_eq!(t.management_password, Some(Secret::new("tsecret")));
    assert_eq!(
        c.storage,
        StorageConfig::Filesystem(FilesystemStorage {
            path: "/data/backups".into()
        })
    );
    assert_eq!(
        c.backup,
        BackupOptions {
            segment_max_bytes: 1_048_576,
            segment_max_interval_ms: 1000,
            compression: CompressionKind::Lz4,
            compression_level: 9,
            segment_version: 1,
            prefetch_count: Some(0),
            requeue_strategy: RequeueStrategy::Nack,
            read_queues_with_delivery_limit: false,
            max_concurrent_queues: 2,
            checkpoint_interval_secs: Some(10),
            sync_interval_secs: 20,
            connection_retries: 3,
            connection_retry_backoff_ms: 1000,
            include_definitions: false,
            stop_at_current_depth: false,
            stream_enabled: true,
            shard: None,
            stream_offset_references: vec!["app-1".into(), "billing".into()],
            encryption: None,
            amqp10_queues: Vec::new(),
        }
    );
    let r = &c.restore;
    assert_eq!(r.time_window_start, Some(1000));
    assert_eq!(r.time_window_end, Some(2000));
    assert_eq!(r.queue_mapping.get("a").map(String::as_str), Some("b"));
    assert_eq!(
        r.queue_mapping.get("with space").map(String::as_str),
        Some("x/y")
    );
    assert_eq!(r.queue_mapping.len(), 2);
    assert_eq!(
        r.vhost_mapping.get("/").map(String::as_str),
        Some("restored")
    );
    assert_eq!(
        r.exchange_mapping.get("ex1").map(String::as_str),
        Some("ex2")
    );
    assert_eq!(r.publish_mode, PublishMode::DirectToQueue);
    assert!(!r.publisher_confirms);
    assert_eq!(r.max_concurrent_queues, 8);
    assert_eq!(r.produce_batch_size, 500);
    assert_eq!(r.rate_limit_messages_per_sec, 250);
    assert!(!r.restore_definitions);
    assert!(r.definitions_dry_run);
    assert_eq!(
        r.definitions_selection,
        DefinitionsSelection {
            vhosts: vec!["prod".into()],
            queues: vec!["orders".into()],
            exchanges: vec!["ex1".into()],
        }
    );
    assert!(r.create_missing_queues);
    assert_eq!(
        r.checkpoint_state,
        Some(PathBuf::from("/var/lib/restore.db"))
    );
    assert_eq!(r.checkpoint_interval_secs, 15);
    assert!(r.dry_run);
    assert_eq!(r.stream_offsets, crate::config::StreamOffsets::Skip);
    assert_eq!(
        c.offset_storage,
        Some(OffsetStorageConfig {
            backend: OffsetBackend::Memory,
            db_path: "/var/lib/offsets.db".into(),
            s3_key: Some("full-1/state/offsets.db".into()),
            sync_interval_secs: 12,
        })
    );
    assert_eq!(
        c.metrics,
        Some(MetricsConfig {
            enabled: false,
            port: 9090,
            bind_address: "127.0.0.1".into(),
            path: "/m".into(),
            ..Default::default()
        })
    );
    // amqps and tls.enabled are supported (issue 15).
    assert!(c.validate().is_ok(), "{:?}", c.validate());
}

#[test]
fn minimal_backup_gets_every_default() {
    let c = Config::from_yaml_str(MINIMAL_BACKUP).expect("valid");
    assert_eq!(c.mode, Mode::Backup);
    assert!(c.target.is_none());
    assert!(c.offset_storage.is_none());
    assert!(c.metrics.is_none());
    let s = c.source.as_ref().expect("source");
    assert_eq!(s.stream_port, None);
    assert!(s.tls.is_none());
    assert!(s.queues.is_none());
    let b = &c.backup;
    assert_eq!(b.segment_max_bytes, 134_217_728);
    assert_eq!(b.segment_max_interval_ms, 60_000);
    assert_eq!(b.compression, CompressionKind::Zstd);
    assert_eq!(b.compression_level, 3);
    assert_eq!(b.prefetch_count, None, "unset: the backup does not warn");
    assert_eq!(b.requeue_strategy, RequeueStrategy::Cancel);
    assert_eq!(b.max_concurrent_queues, 4);
    assert_eq!(
        b.checkpoint_interval_secs, None,
        "unset: the backup does not warn"
    );
    assert_eq!(b.sync_interval_secs, 30);
    assert!(b.include_definitions);
    assert!(b.stop_at_current_depth);
    assert!(!b.stream_enabled);
    let r = &c.restore;
    assert_eq!(r.time_window_start, None);
    assert_eq!(r.time_window_end, None);
    assert!(r.queue_mapping.is_empty());
    assert!(r.vhost_mapping.is_empty());
    assert!(r.exchange_mapping.is_empty());
    assert_eq!(r.publish_mode, PublishMode::Exchange);
    assert!(r.publisher_confirms);
    assert_eq!(r.max_concurrent_queues, 4);
    assert_eq!(r.produce_batch_size, 100);
    assert_eq!(r.rate_limit_messages_per_sec, 0);
    assert!(r.restore_definitions);
    assert!(!r.definitions_dry_run);
    assert!(r.definitions_selection.is_empty());
    assert!(!r.create_missing_queues);
    assert_eq!(r.convert_mirrored_queues, None);
    assert_eq!(r.checkpoint_state, None);
    assert_eq!(r.checkpoint_interval_secs, 60);
    assert!(!r.dry_run);
    assert_eq!(r.stream_offsets, crate::config::StreamOffsets::Translate);
}

#[test]
fn section_defaults() {
    let c = parsed(&format!(
        "{MINIMAL_BACKUP}offset_storage: {{}}\nmetrics: {{}}\n"
    ));
    assert_eq!(
        c.offset_storage,
        Some(OffsetStorageConfig {
            backend: OffsetBackend::Sqlite,
            db_path: "./offsets.db".into(),
            s3_key: None,
            sync_interval_secs: 30,
        })
    );
    assert_eq!(
        c.metrics,
        Some(MetricsConfig {
            enabled: true,
            port: 8080,
            bind_address: "0.0.0.0".into(),
            path: "/metrics".into(),
            textfile: None,
            pushgateway_url: None,
            pushgateway_job: "rmq-backup".into(),
            pushgateway_grouping: Default::default(),
        })
    );
    let c = parsed(&MINIMAL_BACKUP.replace(
        "  management_password: guest\n",
        "  management_password: guest\n  tls: {}\n  queues: {}\n",
    ));
    let s = c.source.expect("source");
    assert_eq!(s.tls, Some(TlsConfig::default()));
    assert!(!TlsConfig::default().enabled);
    assert_eq!(s.queues, Some(QueueSelection::default()));
    assert_eq!(QueueSelection::default().min_messages, 0);
    // An empty section (YAML null) takes the defaults.
    let c = parsed(&format!("{MINIMAL_BACKUP}backup:\nrestore:\n"));
    assert_eq!(c.backup, BackupOptions::default());
    assert_eq!(c.restore, RestoreOptions::default());
}

#[test]
fn minimal_restore() {
    let c = Config::from_yaml_str(MINIMAL_RESTORE).expect("valid");
    assert_eq!(c.mode, Mode::Restore);
    assert!(c.source.is_none());
    assert_eq!(c.storage, StorageConfig::Memory);
    assert_eq!(c.storage.backend_name(), "memory");
    let t = c.require_target().expect("target");
    assert_eq!(t.management_username.as_deref(), Some("guest"));
    // Without management access, restore_definitions must be turned off.
    let yaml = "\
mode: restore
backup_id: b1
target:
  amqp_url: amqp://localhost
storage:
  backend: memory
restore:
  restore_definitions: false
";
    let c = Config::from_yaml_str(yaml).expect("valid");
    let t = c.target.expect("target");
    assert_eq!(t.management_url, None);
    assert_eq!(t.management_username, None);
    assert_eq!(t.management_password, None);
}

#[test]
fn missing_sections() {
    let mut c = backup();
    c.source = None;
    assert_eq!(invalid(&c), "Source configuration required for backup");
    assert_eq!(
        c.validate().map_err(|e| e.to_string()),
        Err("Configuration error: Source configuration required for backup".to_string())
    );
    let mut c = restore();
    c.target = None;
    assert_eq!(invalid(&c), "Target configuration required for restore");
    // A restore config does not need a source, nor a backup config a target.
    assert!(restore().validate().is_ok());
    assert!(backup().validate().is_ok());
    // Missing required top-level fields are YAML errors.
    assert!(serde_err("mode: backup\nstorage: {backend: memory}\n").contains("backup_id"));
    assert!(serde_err("backup_id: x\nstorage: {backend: memory}\n").contains("mode"));
    assert!(serde_err("mode: backup\nbackup_id: x\n").contains("storage"));
    assert!(
        serde_err(&MINIMAL_BACKUP.replace("  management_username: guest\n", ""))
            .contains("missing field `management_username`")
    );
}

#[test]
fn backup_id_rules() {
    for (id, want) in [
        ("", "backup_id must not be empty"),
        ("a/b", "must not contain / or \\"),
        ("a\\b", "must not contain / or \\"),
        (".", "backup_id must not be \".\""),
        ("..", "backup_id must not be \"..\""),
        ("a\nb", "control characters"),
        ("a\u{7f}", "control characters"),
    ] {
        let mut c = backup();
        c.backup_id = id.to_string();
        let m = invalid(&c);
        assert!(m.contains(want), "{id:?}: {m}");
    }
    for id in [
        "nightly-2024-01-01",
        "a.b",
        "...",
        "with space",
        "日本",
        "_default",
    ] {
        let mut c = backup();
        c.backup_id = id.to_string();
        assert!(c.validate().is_ok(), "{id:?}");
    }
}

#[test]
fn segment_versions_1_to_3_and_the_version_of_an_amqp10_queue() {
    for v in [0u8, 4] {
        let mut c = backup();
        c.backup.segment_version = v;
        assert_eq!(
            invalid(&c),
            format!("backup.segment_version must be 1, 2 or 3, got {v}")
        );
    }
    for (v, amqp10) in [(1u8, 2u8), (2, 2), (3, 3)] {
        let mut c = backup();
        c.backup.segment_version = v;
        c.backup.amqp10_queues = vec!["orders-*".into()];
        assert!(c.validate().is_ok(), "version {v}");
        assert_eq!(
            c.backup.segment_version_for("orders-1"),
            amqp10,
            "version {v}"
        );
        assert_eq!(c.backup.segment_version_for("other"), v);
    }
}

#[test]
fn backup_option_ranges() {
    let check = |f: &dyn Fn(&mut BackupOptions), want: &str| {
        let mut c = backup();
        f(&mut c.backup);
        assert_eq!(invalid(&c), want);
    };
    check(
        &|b| b.compression_level = 0,
        "backup.compression_level must be between 1 and 22 for zstd, got 0",
    );
    check(
        &|b| b.compression_level = 23,
        "backup.compression_level must be between 1 and 22 for zstd, got 23",
    );
    check(
        &|b| b.compression_level = -1,
        "backup.compression_level must be between 1 and 22 for zstd, got -1",
    );
    check(
        &|b| b.segment_max_bytes = 0,
        "backup.segment_max_bytes must be greater than 0",
    );
    check(
        &|b| b.segment_max_interval_ms = 0,
        "backup.segment_max_interval_ms must be greater than 0",
    );
    check(
        &|b| b.max_concurrent_queues = 0,
        "backup.max_concurrent_queues must be at least 1",
    );
    check(
        &|b| b.stream_offset_references = vec![String::new()],
        "backup.stream_offset_references: \"\" is not a consumer reference (1 to 256 bytes)",
    );
    check(
        &|b| b.stream_offset_references = vec!["r".repeat(257)],
        &format!(
            "backup.stream_offset_references: {:?} is not a consumer reference (1 to 256 bytes)",
            "r".repeat(257)
        ),
    );
    check(
        &|b| b.checkpoint_interval_secs = Some(0),
        "backup.checkpoint_interval_secs must be greater than 0",
    );
    check(
        &|b| b.sync_interval_secs = 0,
        "backup.sync_interval_secs must be greater than 0",
    );
    for level in [1, 22] {
        let mut c = backup();
        c.backup.compression_level = level;
        assert!(c.validate().is_ok(), "level {level}");
    }
    for kind in [CompressionKind::Lz4, CompressionKind::None] {
        let mut c = backup();
        c.backup.compression = kind;
        c.backup.compression_level = 99;
        assert!(c.validate().is_ok(), "level ignored for {kind:?}");
    }
    let mut c = backup();
    c.backup.prefetch_count = Some(0);
    assert!(c.validate().is_ok(), "prefetch 0 = unlimited");
}

#[test]
fn restore_option_ranges() {
    let check = |f: &dyn Fn(&mut RestoreOptions), want: &str| {
        let mut c = restore();
        f(&mut c.restore);
        assert_eq!(invalid(&c), want);
    };
    check(
        &|r| {
            r.time_window_start = Some(2);
            r.time_window_end = Some(1);
        },
        "restore.time_window_start (2) must not be after restore.time_window_end (1)",
    );
    check(
        &|r| r.max_concurrent_queues = 0,
        "restore.max_concurrent_queues must be at least 1",
    );
    check(
        &|r| r.produce_batch_size = 0,
        "restore.produce_batch_size must be at least 1",
    );
    check(
        &|r| r.checkpoint_interval_secs = 0,
        "restore.checkpoint_interval_secs must be greater than 0",
    );
    check(
        &|r| {
            r.queue_mapping.insert("a".into(), String::new());
        },
        "restore.queue_mapping maps \"a\" to an empty name",
    );
    check(
        &|r| {
            r.vhost_mapping.insert("/".into(), String::new());
        },
        "restore.vhost_mapping maps \"/\" to an empty name",
    );
    check(
        &|r| {
            r.queue_mapping.insert("a".into(), "x".repeat(256));
        },
        "restore.queue_mapping maps \"a\" to a name longer than 255 bytes",
    );
    let mut c = restore();
    c.restore.time_window_start = Some(5);
    c.restore.time_window_end = Some(5);
    c.restore.exchange_mapping.insert("e".into(), String::new());
    c.restore.queue_mapping.insert("a".into(), "x".repeat(255));
    assert!(
        c.validate().is_ok(),
        "equal window, default exchange, 255 bytes"
    );
    c.restore.time_window_end = None;
    assert!(c.validate().is_ok(), "open window");
}

#[test]
fn url_rules() {
    let mut c = backup();
    c.source.as_mut().expect("source").amqp_url = "http://guest:pw@h".into();
    let m = invalid(&c);
    assert_eq!(m, "source.amqp_url must start with amqp:// or amqps://");
    let mut c = backup();
    c.source.as_mut().expect("source").amqp_url = "guest:topsecret@h".into();
    assert!(!invalid(&c).contains("topsecret"));
    let mut c = backup();
    c.source.as_mut().expect("source").amqp_url = "amqp://".into();
    assert!(invalid(&c).contains("source.amqp_url"), "scheme alone");
    let mut c = backup();
    c.source.as_mut().expect("source").amqp_url = "AMQPS://h".into();
    assert!(c.validate().is_ok(), "scheme is case-insensitive");
    let mut c = backup();
    c.source.as_mut().expect("source").management_url = "localhost:15672".into();
    assert_eq!(
        invalid(&c),
        "source.management_url must start with http:// or https://"
    );
    let mut c = backup();
    c.source.as_mut().expect("source").stream_port = Some(0);
    assert_eq!(
        invalid(&c),
        "source.stream_port must be between 1 and 65535"
    );
    let mut c = backup();
    c.source.as_mut().expect("source").management_username = " ".into();
    assert_eq!(invalid(&c), "source.management_username must not be empty");
    let mut c = restore();
    c.target.as_mut().expect("target").amqp_url = "amqp:/x".into();
    assert_eq!(
        invalid(&c),
        "target.amqp_url must start with amqp:// or amqps://"
    );
    let mut c = restore();
    c.target.as_mut().expect("target").management_url = Some("ftp://x".into());
    assert_eq!(
        invalid(&c),
        "target.management_url must start with http:// or https://"
    );
}

#[test]
fn convert_mirrored_queues_takes_quorum_and_needs_the_definitions() {
    let c = parsed(&format!(
        "{MINIMAL_RESTORE}restore:\n  convert_mirrored_queues: quorum\n"
    ));
    assert_eq!(
        c.restore.convert_mirrored_queues,
        Some(crate::config::ConvertMirroredQueues::Quorum)
    );
    assert!(c.validate().is_ok());
    let mut off = c.clone();
    off.restore.restore_definitions = false;
    assert_eq!(
        invalid(&off),
        "restore.convert_mirrored_queues needs restore.restore_definitions: true (the mirroring policies and the queues to convert are read from the backup's definitions)"
    );
    for bad in ["stream", "Quorum", "true"] {
        let m = match parse(&format!(
            "{MINIMAL_RESTORE}restore:\n  convert_mirrored_queues: {bad}\n"
        )) {
            Err(Error::Serialization(m)) => m,
            other => panic!("{bad}: {other:?}"),
        };
        assert!(
            m.contains("convert_mirrored_queues") && m.contains("expected `quorum`"),
            "{bad}: {m}"
        );
    }
}

#[test]
fn target_management_rules() {
    let mut c = restore();
    c.target.as_mut().expect("target").management_url = None;
    c.target.as_mut().expect("target").management_username = None;
    c.target.as_mut().expect("target").management_password = None;
    assert_eq!(
        invalid(&c),
        "target.management_url is required when restore.restore_definitions is true"
    );
    c.restore.restore_definitions = false;
    assert!(c.validate().is_ok());
    c.restore.create_missing_queues = true;
    assert_eq!(
        invalid(&c),
        "target.management_url is required when restore.create_missing_queues is true"
    );
    let mut c = restore();
    c.target.as_mut().expect("target").management_username = None;
    assert_eq!(
        invalid(&c),
        "target.management_username is required when target.management_url is set"
    );
    let mut c = restore();
    c.target.as_mut().expect("target").management_password = None;
    assert_eq!(
        invalid(&c),
        "target.management_password is required when target.management_url is set"
    );
    let mut c = restore();
    c.restore.restore_definitions = false;
    c.target.as_mut().expect("target").management_url = None;
    assert_eq!(
            invalid(&c),
            "target.management_url is required when target.management_username or target.management_password is set"
        );
    // Backup mode does not need the target's management access.
    let mut c = backup();
    c.target = Some(TargetConfig {
        amqp_url: "amqp://h".into(),
        management_url: None,
        management_username: None,
        management_password: None,
        management_password_file: None,
        amqp_password_file: None,
        tls: None,
        stream_port: None,
    });
    assert!(c.validate().is_ok());
}

#[test]
fn storage_rules() {
    let mut c = backup();
    c.storage = StorageConfig::Filesystem(FilesystemStorage {
        path: PathBuf::new(),
    });
    assert_eq!(invalid(&c), "storage.path must not be empty");
    let s3 = |f: &dyn Fn(&mut S3Storage)| {
        let mut s = S3Storage {
            bucket: "b".into(),
            region: None,
            endpoint: None,
            access_key: None,
            secret_key: None,
            access_key_file: None,
            secret_key_file: None,
            prefix: None,
            path_style: false,
            allow_http: false,
            object_lock: None,
        };
        f(&mut s);
        let mut c = backup();
        c.storage = StorageConfig::S3(s);
        invalid(&c)
    };
    assert_eq!(
        s3(&|s| s.bucket = String::new()),
        "storage.bucket must not be empty"
    );
    assert_eq!(
        s3(&|s| s.endpoint = Some("http://127.0.0.1:8333".into())),
        "storage.allow_http must be true when storage.endpoint uses http://"
    );
    assert_eq!(
        s3(&|s| s.endpoint = Some("127.0.0.1:8333".into())),
        "storage.endpoint must start with http:// or https://"
    );
    assert_eq!(
        s3(&|s| s.access_key = Some(Secret::new("k"))),
        "storage.access_key and storage.secret_key must be given together"
    );
    assert!(s3(&|s| s.prefix = Some("../up".into())).starts_with("storage.prefix"));
    assert!(s3(&|s| s.prefix = Some("/abs".into())).starts_with("storage.prefix"));
    let mut c = backup();
    c.storage = StorageConfig::S3(S3Storage {
        bucket: "b".into(),
        region: None,
        endpoint: Some("http://127.0.0.1:8333".into()),
        access_key: None,
        secret_key: None,
        access_key_file: None,
        secret_key_file: None,
        prefix: Some("team/a".into()),
        path_style: true,
        allow_http: true,
        object_lock: None,
    });
    assert_eq!(c.validate(), Ok(()), "a valid s3 config");
    let mut c = backup();
    c.storage = StorageConfig::Azure(AzureStorage {
        account_name: "acct".into(),
        container_name: String::new(),
        account_key: None,
        prefix: None,
        endpoint: None,
        use_workload_identity: None,
        client_id: None,
        tenant_id: None,
        client_secret: None,
        sas_token: None,
        account_key_file: None,
        client_secret_file: None,
        sas_token_file: None,
        object_lock: None,
    });
    assert_eq!(invalid(&c), "storage.container_name must not be empty");
    let mut c = backup();
    c.storage = StorageConfig::Gcs(GcsStorage {
        bucket: "".into(),
        service_account_path: None,
        prefix: None,
        object_lock: None,
    });
    assert_eq!(invalid(&c), "storage.bucket must not be empty");
}

#[test]
fn storage_yaml_shapes() {
    let with_storage = |s: &str| {
        MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            &format!("storage:\n{s}"),
        )
    };
    let c = parsed(&with_storage(
            "  backend: s3\n  bucket: bk\n  region: eu-west-1\n  endpoint: http://127.0.0.1:8333\n  access_key: AK\n  secret_key: SK\n  prefix: p\n  path_style: true\n  allow_http: true\n",
        ));
    assert_eq!(
        c.storage,
        StorageConfig::S3(S3Storage {
            bucket: "bk".into(),
            region: Some("eu-west-1".into()),
            endpoint: Some("http://127.0.0.1:8333".into()),
            access_key: Some(Secret::new("AK")),
            secret_key: Some(Secret::new("SK")),
            access_key_file: None,
            secret_key_file: None,
            prefix: Some("p".into()),
            path_style: true,
            allow_http: true,
            object_lock: None,
        })
    );
    let c = parsed(&with_storage("  backend: s3\n  bucket: bk\n"));
    match &c.storage {
        StorageConfig::S3(s) => {
            assert!(!s.path_style && !s.allow_http);
            assert_eq!((s.region.as_ref(), s.access_key.as_ref()), (None, None));
        }
        other => panic!("{other:?}"),
    }
    let c = parsed(&with_storage(
            "  backend: azure\n  account_name: acct\n  container_name: cont\n  account_key: AKEY\n  prefix: p\n  endpoint: https://x.blob\n  use_workload_identity: true\n  client_id: cid\n  tenant_id: tid\n  client_secret: CSEC\n  sas_token: SAS\n",
        ));
    assert_eq!(
        c.storage,
        StorageConfig::Azure(AzureStorage {
            account_name: "acct".into(),
            container_name: "cont".into(),
            account_key: Some(Secret::new("AKEY")),
            prefix: Some("p".into()),
            endpoint: Some("https://x.blob".into()),
            use_workload_identity: Some(true),
            client_id: Some("cid".into()),
            tenant_id: Some("tid".into()),
            client_secret: Some(Secret::new("CSEC")),
            sas_token: Some(Secret::new("SAS")),
            account_key_file: None,
            client_secret_file: None,
            sas_token_file: None,
            object_lock: None,
        })
    );
    let c = parsed(&with_storage(
        "  backend: gcs\n  bucket: g\n  service_account_path: /k.json\n  prefix: p\n",
    ));
    assert_eq!(
        c.storage,
        StorageConfig::Gcs(GcsStorage {
            bucket: "g".into(),
            service_account_path: Some("/k.json".into()),
            prefix: Some("p".into()),
            object_lock: None,
        })
    );
    // The tag may come after the other fields.
    let c = parsed(&with_storage("  path: /x\n  backend: filesystem\n"));
    assert_eq!(c.storage.backend_name(), "filesystem");
    // Numeric-looking secrets stay text, unchanged.
    let c = parsed(&with_storage(
        "  backend: s3\n  bucket: 0123\n  access_key: 007\n  secret_key: 1e3\n",
    ));
    match &c.storage {
        StorageConfig::S3(s) => {
            assert_eq!(s.bucket, "0123");
            assert_eq!(s.access_key.as_ref().map(Secret::expose), Some("007"));
            assert_eq!(s.secret_key.as_ref().map(Secret::expose), Some("1e3"));
        }
        other => panic!("{other:?}"),
    }
    // Errors.
    let m = serde_err(&with_storage(
        "  backend: filesystem\n  path: /x\n  bukket: b\n",
    ));
    assert!(m.starts_with("storage: unknown field `bukket`"), "{m}");
    assert!(m.contains("at line 11 column 3"), "{m}");
    let m = serde_err(&with_storage("  backend: s3\n  bucket: b\n  path: /x\n"));
    assert!(
        m.contains("storage: field `path` does not apply to backend s3"),
        "{m}"
    );
    let m = serde_err(&with_storage("  backend: memory\n  path: /x\n"));
    assert!(
        m.contains("storage: field `path` does not apply to backend memory"),
        "{m}"
    );
    let m = serde_err(&with_storage("  backend: s3\n  region: r\n"));
    assert!(
        m.contains("storage: missing field `bucket` for backend s3"),
        "{m}"
    );
    let m = serde_err(&with_storage("  backend: filesystem\n"));
    assert!(
        m.contains("storage: missing field `path` for backend filesystem"),
        "{m}"
    );
    let m = serde_err(&with_storage("  backend: azure\n  account_name: a\n"));
    assert!(
        m.contains("missing field `container_name` for backend azure"),
        "{m}"
    );
    let m = serde_err(&with_storage("  path: /x\n"));
    assert!(m.contains("storage: missing field `backend`"), "{m}");
    let m = serde_err(&with_storage("  backend: Filesystem\n  path: /x\n"));
    assert!(m.contains("unknown variant `Filesystem`"), "{m}");
    assert!(m.contains("at line 9 column 12"), "{m}");
    let m = serde_err(&with_storage("  backend: ftp\n"));
    assert!(m.contains("unknown variant `ftp`"), "{m}");
    let m = serde_err(&with_storage(
        "  backend: s3\n  bucket: b\n  path_style: maybe\n",
    ));
    assert!(m.contains("storage.path_style"), "{m}");
}

#[test]
fn not_yet_supported() {
    let check = |f: &dyn Fn(&mut Config), base: Config, want: &str| {
        let mut c = base;
        f(&mut c);
        assert_eq!(invalid(&c), want);
        assert_eq!(
            c.check_supported().map_err(|e| e.message().to_string()),
            Err(want.to_string())
        );
    };
    check(
        &|c| c.backup.stop_at_current_depth = false,
        backup(),
        "backup.stop_at_current_depth: false (a continuous backup) follows streams with the stream protocol: set backup.stream_enabled: true",
    );
    // Disabled or irrelevant settings are accepted, and streams are read, once or continuously.
    let mut c = backup();
    c.backup.stream_enabled = true;
    assert!(c.check_supported().is_ok());
    c.backup.stop_at_current_depth = false;
    assert!(c.check_supported().is_ok());
    c.source.as_mut().expect("source").tls = Some(TlsConfig {
        enabled: false,
        ca_cert: Some("/ca.pem".into()),
        client_cert: None,
        client_key: None,
    });
    c.metrics = Some(MetricsConfig {
        enabled: false,
        ..Default::default()
    });
    c.restore.checkpoint_state = Some("/tmp/r.db".into());
    assert!(c.validate().is_ok(), "{:?}", c.validate());
    let mut c = restore();
    c.backup.stream_enabled = true;
    c.backup.stop_at_current_depth = false;
    assert!(
        c.validate().is_ok(),
        "backup options do not matter for restore"
    );
}

#[test]
fn section_value_rules() {
    let mut c = backup();
    c.source.as_mut().expect("source").tls = Some(TlsConfig {
        enabled: false,
        ca_cert: None,
        client_cert: Some("/c.pem".into()),
        client_key: None,
    });
    assert_eq!(
        invalid(&c),
        "source.tls.client_cert and source.tls.client_key must be given together"
    );
    let mut c = restore();
    c.target.as_mut().expect("target").tls = Some(TlsConfig {
        enabled: true,
        ca_cert: None,
        client_cert: None,
        client_key: Some("/k.pem".into()),
    });
    assert_eq!(
        invalid(&c),
        "target.tls.client_cert and target.tls.client_key must be given together"
    );
    let mut c = backup();
    c.metrics = Some(MetricsConfig {
        enabled: false,
        path: "metrics".into(),
        ..Default::default()
    });
    assert_eq!(invalid(&c), "metrics.path must start with /");
    let mut c = backup();
    c.metrics = Some(MetricsConfig {
        enabled: false,
        path: "/health".into(),
        ..Default::default()
    });
    assert!(invalid(&c).starts_with("metrics.path must not be /health"));
    let mut c = backup();
    c.metrics = Some(MetricsConfig {
        enabled: false,
        bind_address: String::new(),
        ..Default::default()
    });
    assert_eq!(invalid(&c), "metrics.bind_address must not be empty");
    for (m, err) in [
        (
            MetricsConfig {
                textfile: Some("/".into()),
                ..Default::default()
            },
            "metrics.textfile must name a file",
        ),
        (
            MetricsConfig {
                pushgateway_url: Some("pgw:9091".into()),
                ..Default::default()
            },
            "metrics.pushgateway_url must start with http:// or https://",
        ),
        (
            MetricsConfig {
                pushgateway_url: Some("http://pgw:9091/?x=1".into()),
                ..Default::default()
            },
            "metrics.pushgateway_url must not have a query or fragment",
        ),
        (
            MetricsConfig {
                pushgateway_job: " ".into(),
                ..Default::default()
            },
            "metrics.pushgateway_job must not be empty",
        ),
        (
            MetricsConfig {
                pushgateway_grouping: [("mode".to_string(), "x".to_string())].into(),
                ..Default::default()
            },
            "metrics.pushgateway_grouping must not set mode: rmq-backup sets it (pushgateway_job, and backup or restore)",
        ),
        (
            MetricsConfig {
                pushgateway_grouping: [("1x".to_string(), "x".to_string())].into(),
                ..Default::default()
            },
            "metrics.pushgateway_grouping label \"1x\" is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)",
        ),
        (
            MetricsConfig {
                pushgateway_grouping: [("instance".to_string(), "".to_string())].into(),
                ..Default::default()
            },
            "metrics.pushgateway_grouping.instance must not be empty",
        ),
    ] {
        let mut c = backup();
        c.metrics = Some(m);
        assert_eq!(invalid(&c), err);
    }
    let mut c = backup();
    c.offset_storage = Some(OffsetStorageConfig {
        sync_interval_secs: 0,
        ..Default::default()
    });
    assert_eq!(
        invalid(&c),
        "offset_storage.sync_interval_secs must be greater than 0"
    );
    let mut c = backup();
    c.offset_storage = Some(OffsetStorageConfig {
        db_path: PathBuf::new(),
        ..Default::default()
    });
    assert_eq!(invalid(&c), "offset_storage.db_path must not be empty");
}

#[test]
fn enum_values_are_lowercase_only() {
    let m = serde_err(&MINIMAL_BACKUP.replace("mode: backup", "mode: Backup"));
    assert!(m.contains("unknown variant `Backup`"), "{m}");
    assert!(m.contains("at line 1 column 7"), "{m}");
    let m = serde_err(&format!("{MINIMAL_BACKUP}backup:\n  compression: ZSTD\n"));
    assert!(
        m.contains("backup.compression: unknown variant `ZSTD`"),
        "{m}"
    );
    assert!(m.contains("at line 12 column 16"), "{m}");
    let m = serde_err(&format!(
        "{MINIMAL_BACKUP}backup:\n  requeue_strategy: Cancel\n"
    ));
    assert!(
        m.contains("unknown variant `Cancel`") && m.contains("line 12"),
        "{m}"
    );
    let m = serde_err(&format!(
        "{MINIMAL_RESTORE}restore:\n  publish_mode: direct_to_queue\n"
    ));
    assert!(
        m.contains("unknown variant `direct_to_queue`") && m.contains("line"),
        "{m}"
    );
    let m = serde_err(&MINIMAL_BACKUP.replace(
        "  management_password: guest\n",
        "  management_password: guest\n  queues:\n    types: [Classic]\n",
    ));
    assert!(
        m.contains("unknown variant `Classic`") && m.contains("line 9 column 13"),
        "{m}"
    );
    for (yaml, want) in [
        (
            format!("{MINIMAL_BACKUP}backup:\n  compression: lz4\n"),
            CompressionKind::Lz4,
        ),
        (
            format!("{MINIMAL_BACKUP}backup:\n  compression: none\n"),
            CompressionKind::None,
        ),
    ] {
        assert_eq!(parsed(&yaml).backup.compression, want);
    }
    for (name, want) in [
        ("cancel", RequeueStrategy::Cancel),
        ("nack", RequeueStrategy::Nack),
        ("reject", RequeueStrategy::Reject),
        ("get", RequeueStrategy::Get),
    ] {
        let yaml = format!("{MINIMAL_BACKUP}backup:\n  requeue_strategy: {name}\n");
        assert_eq!(parsed(&yaml).backup.requeue_strategy, want);
    }
    let yaml = format!("{MINIMAL_RESTORE}restore:\n  publish_mode: exchange\n");
    assert_eq!(parsed(&yaml).restore.publish_mode, PublishMode::Exchange);
}

#[test]
fn yaml_syntax_and_type_errors() {
    let m = serde_err(&MINIMAL_BACKUP.replace("  path: /tmp/backups", "\tpath: /tmp/backups"));
    assert!(m.contains("at line 10 column 1"), "tabs: {m}");
    let m = serde_err(&format!(
        "{MINIMAL_BACKUP}backup:\n  prefetch_count: 70000\n"
    ));
    assert!(
        m.contains("backup.prefetch_count") && m.contains("line 12"),
        "{m}"
    );
    let m = serde_err(&format!(
        "{MINIMAL_BACKUP}backup:\n  segment_max_bytes: -1\n"
    ));
    assert!(
        m.contains("backup.segment_max_bytes") && m.contains("line 12"),
        "{m}"
    );
    let m = serde_err(&format!(
        "{MINIMAL_BACKUP}backup:\n  include_definitions: yes\n"
    ));
    assert!(m.contains("backup.include_definitions"), "{m}");
    let m = serde_err("[1, 2]");
    assert!(m.contains("expected struct Config"), "{m}");
    let m = serde_err("");
    assert!(m.contains("mode"), "empty file: {m}");
    let m = serde_err("mode: backup\nmode: restore\n");
    assert!(m.contains("duplicate"), "{m}");
    let m = serde_err(&format!(
        "{MINIMAL_RESTORE}restore:\n  time_window_start: soon\n"
    ));
    assert!(m.contains("restore.time_window_start"), "{m}");
    // A serialization error displays with its category prefix.
    let e = Config::from_yaml_str("mode: Backup").expect_err("invalid");
    assert!(e.to_string().starts_with("Serialization error: "), "{e}");
}

#[test]
fn unknown_fields_are_rejected() {
    let m = serde_err(&format!("{MINIMAL_BACKUP}extra: 1\n"));
    assert!(
        m.contains("unknown field `extra`") && m.contains("line 11"),
        "{m}"
    );
    let m = serde_err(&format!("{MINIMAL_BACKUP}backup:\n  compresion: lz4\n"));
    assert!(
        m.contains("backup: unknown field `compresion`") && m.contains("line 12"),
        "{m}"
    );
    let m = serde_err(&format!("{MINIMAL_RESTORE}restore:\n  dryrun: true\n"));
    assert!(m.contains("restore: unknown field `dryrun`"), "{m}");
    let m = serde_err(&format!(
        "{MINIMAL_RESTORE}restore:\n  definitions_selection:\n    queue: [a]\n"
    ));
    assert!(m.contains("unknown field `queue`"), "{m}");
    let m = serde_err(&MINIMAL_BACKUP.replace("  management_username", "  management_user"));
    assert!(m.contains("source: unknown field `management_user`"), "{m}");
    let m = serde_err(&MINIMAL_RESTORE.replace("  management_url", "  mgmt_url"));
    assert!(m.contains("target: unknown field `mgmt_url`"), "{m}");
    let m = serde_err(&MINIMAL_BACKUP.replace(
        "  management_password: guest\n",
        "  management_password: guest\n  queues:\n    includes: [a]\n",
    ));
    assert!(m.contains("unknown field `includes`"), "{m}");
    let m = serde_err(&MINIMAL_BACKUP.replace(
        "  management_password: guest\n",
        "  management_password: guest\n  tls:\n    verify: false\n",
    ));
    assert!(m.contains("unknown field `verify`"), "{m}");
    let m = serde_err(&format!("{MINIMAL_BACKUP}metrics:\n  host: x\n"));
    assert!(m.contains("unknown field `host`"), "{m}");
    let m = serde_err(&format!("{MINIMAL_BACKUP}offset_storage:\n  path: x\n"));
    assert!(m.contains("unknown field `path`"), "{m}");
}

#[test]
fn env_interpolation() {
    std::env::set_var("RMQB_CFGTEST_PW1", "from-env-pw");
    std::env::set_var("RMQB_CFGTEST_USER1", "alice");
    std::env::set_var("RMQB_CFGTEST_HOST1", "broker.local");
    let yaml = MINIMAL_BACKUP
            .replace(
                "amqp_url: amqp://guest:guest@localhost:5672/%2f",
                "amqp_url: amqp://${RMQB_CFGTEST_USER1}:${RMQB_CFGTEST_PW1}@${RMQB_CFGTEST_HOST1}:5672/%2f",
            )
            .replace(
                "management_password: guest",
                "management_password: ${RMQB_CFGTEST_PW1}",
            );
    let c = Config::from_yaml_str(&yaml).expect("valid");
    let s = c.source.expect("source");
    assert_eq!(s.amqp_url, "amqp://alice:from-env-pw@broker.local:5672/%2f");
    assert_eq!(s.management_password.expose(), "from-env-pw");
    // Other fields are not interpolated.
    assert_eq!(s.management_username, "guest");

    // Target fields.
    std::env::set_var("RMQB_CFGTEST_PW2", "tpw");
    let yaml = MINIMAL_RESTORE
        .replace("guest:guest@", "guest:${RMQB_CFGTEST_PW2}@")
        .replace(
            "management_password: guest",
            "management_password: ${RMQB_CFGTEST_PW2}",
        );
    let c = Config::from_yaml_str(&yaml).expect("valid");
    let t = c.target.expect("target");
    assert_eq!(t.amqp_url, "amqp://guest:tpw@localhost:5672/%2f");
    assert_eq!(t.management_password, Some(Secret::new("tpw")));

    // Unset variable.
    let yaml = MINIMAL_BACKUP.replace(
        "management_password: guest",
        "management_password: ${RMQB_CFGTEST_UNSET_A}",
    );
    assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_A referenced in source.management_password is not set"
        );
    let yaml = MINIMAL_RESTORE.replace("guest:guest@", "guest:${RMQB_CFGTEST_UNSET_B}@");
    assert_eq!(
        load_err(&yaml),
        "Environment variable RMQB_CFGTEST_UNSET_B referenced in target.amqp_url is not set"
    );
    let yaml = MINIMAL_BACKUP.replace("guest:guest@", "guest:${RMQB_CFGTEST_UNSET_C}@");
    assert_eq!(
        load_err(&yaml),
        "Environment variable RMQB_CFGTEST_UNSET_C referenced in source.amqp_url is not set"
    );
    let yaml = MINIMAL_RESTORE.replace(
        "management_password: guest",
        "management_password: ${RMQB_CFGTEST_UNSET_D}",
    );
    assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_D referenced in target.management_password is not set"
        );
}

#[test]
fn env_interpolation_edge_cases() {
    std::env::set_var("RMQB_CFGTEST_E1", "v1");
    std::env::set_var("RMQB_CFGTEST_EMPTY", "");
    let f = "source.management_password";
    assert_eq!(interpolate("plain", f), Ok("plain".to_string()));
    assert_eq!(interpolate("${RMQB_CFGTEST_E1}", f), Ok("v1".to_string()));
    assert_eq!(
        interpolate("a${RMQB_CFGTEST_E1}b${RMQB_CFGTEST_E1}c", f),
        Ok("av1bv1c".to_string())
    );
    assert_eq!(
        interpolate("x${RMQB_CFGTEST_EMPTY}y", f),
        Ok("xy".to_string())
    );
    assert_eq!(
        interpolate("$${RMQB_CFGTEST_E1}", f),
        Ok("${RMQB_CFGTEST_E1}".to_string())
    );
    assert_eq!(interpolate("pa$$word$", f), Ok("pa$$word$".to_string()));
    assert_eq!(
        interpolate("$HOME", f),
        Ok("$HOME".to_string()),
        "only ${{...}}"
    );
    assert_eq!(
        interpolate("é${RMQB_CFGTEST_E1}日", f),
        Ok("év1日".to_string())
    );
    // Values are not re-expanded.
    std::env::set_var("RMQB_CFGTEST_NESTED", "${RMQB_CFGTEST_E1}");
    assert_eq!(
        interpolate("${RMQB_CFGTEST_NESTED}", f),
        Ok("${RMQB_CFGTEST_E1}".to_string())
    );
    for bad in [
        "${RMQB_CFGTEST_E1",
        "ab${",
        "${}",
        "${A-B}",
        "${1A}",
        "${ A}",
    ] {
        match interpolate(bad, f) {
            Err(Error::Config(m)) => {
                assert!(m.contains(f), "{bad}: {m}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    // The secret around a bad reference is not echoed.
    match interpolate("hunter2${oops", f) {
        Err(e) => assert!(!e.to_string().contains("hunter2"), "{e}"),
        Ok(v) => panic!("{v}"),
    }
}

#[test]
fn env_interpolation_in_storage_secrets() {
    std::env::set_var("RMQB_CFGTEST_AK", "akid");
    std::env::set_var("RMQB_CFGTEST_SK", "skey");
    let yaml = MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: s3\n  bucket: b\n  access_key: ${RMQB_CFGTEST_AK}\n  secret_key: ${RMQB_CFGTEST_SK}\n",
        );
    let c = parsed(&yaml);
    match &c.storage {
        StorageConfig::S3(s) => {
            assert_eq!(s.access_key.as_ref().map(Secret::expose), Some("akid"));
            assert_eq!(s.secret_key.as_ref().map(Secret::expose), Some("skey"));
        }
        other => panic!("{other:?}"),
    }
    let yaml = MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: azure\n  account_name: a\n  container_name: c\n  account_key: ${RMQB_CFGTEST_AK}\n  client_secret: ${RMQB_CFGTEST_SK}\n  sas_token: ${RMQB_CFGTEST_UNSET_SAS}\n",
        );
    assert_eq!(
        load_err(&yaml),
        "Environment variable RMQB_CFGTEST_UNSET_SAS referenced in storage.sas_token is not set"
    );
}

#[test]
fn debug_output_hides_secrets() {
    std::env::set_var("RMQB_CFGTEST_DBG", "EnvSecretValue");
    let yaml = "\
mode: restore
backup_id: dbg
source:
  amqp_url: amqp://u:SrcUrlPw@h/%2f
  management_url: http://admin:MgmtUrlPw@h:15672
  management_username: u
  management_password: SrcMgmtPw
target:
  amqp_url: amqp://u:${RMQB_CFGTEST_DBG}@h/%2f
  management_url: http://h:15672
  management_username: u
  management_password: TgtMgmtPw
storage:
  backend: azure
  account_name: acct
  container_name: cont
  account_key: AzAccountKey
  client_secret: AzClientSecret
  sas_token: AzSasToken
";
    let c = parsed(yaml);
    let dbg = format!("{c:?} {c:#?}");
    for secret in [
        "SrcUrlPw",
        "MgmtUrlPw",
        "SrcMgmtPw",
        "EnvSecretValue",
        "TgtMgmtPw",
        "AzAccountKey",
        "AzClientSecret",
        "AzSasToken",
    ] {
        assert!(!dbg.contains(secret), "{secret} leaked in {dbg}");
    }
    assert!(dbg.contains("amqp://u:****@h/%2f"), "{dbg}");
    assert!(dbg.contains("acct") && dbg.contains("cont"), "{dbg}");
    let s3 = parsed(&MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: s3\n  bucket: b\n  access_key: S3AccessKey\n  secret_key: S3SecretKey\n",
        ));
    let dbg = format!("{s3:?}");
    assert!(
        !dbg.contains("S3AccessKey") && !dbg.contains("S3SecretKey"),
        "{dbg}"
    );
    assert!(!dbg.contains("guest:guest"), "{dbg}");
    assert_eq!(format!("{:?}", Secret::new("x")), "****");
    assert_eq!(redact_url("user:pw@host"), "****");
    // A URL without a scheme is hidden entirely.
    let mut c = backup();
    c.source.as_mut().expect("source").amqp_url = "guest:NoSchemePw@h".into();
    assert!(!format!("{c:?}").contains("NoSchemePw"));
}

#[test]
fn load_reports_unreadable_file() {
    let path = Path::new("/nonexistent/rmq-backup/config.yaml");
    match Config::load(path) {
        Err(Error::Config(m)) => {
            assert!(
                m.starts_with("Cannot read config file /nonexistent/rmq-backup/config.yaml: "),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn load_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("rmqb-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("c.yaml");
    std::fs::write(&path, MINIMAL_BACKUP).expect("write");
    let c = Config::load(&path);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(c.expect("valid").backup_id, "b1");
}

#[test]
fn example_files_load_and_validate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The scratch crate that builds this file lives elsewhere; find the examples.
    let examples = [root.join("examples"), PathBuf::from("/work/main/examples")]
        .into_iter()
        .find(|p| p.join("config.yaml").exists())
        .expect("examples directory");
    let b = Config::load(&examples.join("config.yaml")).expect("config.yaml validates");
    assert_eq!(b.mode, Mode::Backup);
    assert_eq!(b.storage.backend_name(), "filesystem");
    assert!(b.source.as_ref().and_then(|s| s.queues.as_ref()).is_some());
    let r = Config::load(&examples.join("restore.yaml")).expect("restore.yaml validates");
    assert_eq!(r.mode, Mode::Restore);
    assert_eq!(
        r.backup_id, b.backup_id,
        "the restore example restores the backup example"
    );
    assert_eq!(
        r.restore.queue_mapping.get("orders").map(String::as_str),
        Some("orders-restored")
    );
}

#[test]
fn a_backup_id_takes_environment_variables_and_is_checked_after() {
    // Only this test sets these variables.
    unsafe {
        std::env::set_var("RMQB_TEST_ID_DATE", "20261125");
        std::env::set_var("RMQB_TEST_ID_BAD", "a/b");
    }
    let yaml = |id: &str| {
        format!(
            "mode: backup\nbackup_id: \"{id}\"\nsource:\n  amqp_url: amqp://a\n  management_url: http://a\n  management_username: u\n  management_password: p\nstorage:\n  backend: memory\n"
        )
    };
    let c = Config::from_yaml_str(&yaml("nightly-${RMQB_TEST_ID_DATE}"))
        .expect("a backup id with a set variable");
    assert_eq!(c.backup_id, "nightly-20261125");
    let e = Config::from_yaml_str(&yaml("x-${RMQB_TEST_ID_BAD}"))
        .expect_err("a backup id that becomes a path");
    assert!(e.to_string().starts_with("Configuration error:"), "{e}");
    assert!(Config::from_yaml_str(&yaml("${RMQB_TEST_ID_UNSET}")).is_err());
}

#[test]
fn retention_section() {
    use crate::retention::{Count, Within};
    let c = Config::from_yaml_str(&format!(
        "{MINIMAL_BACKUP}retention:\n  keep_last: 3\n  keep_daily: unlimited\n  keep_weekly: -1\n  keep_within: 1y6m\n  prune: true\n"
    ))
    .expect("valid");
    let o = c
        .retention
        .as_ref()
        .expect("section")
        .options()
        .expect("options");
    assert_eq!(o.policy.keep_last, Some(Count::N(3)));
    assert_eq!(o.policy.keep_daily, Some(Count::Unlimited));
    assert_eq!(o.policy.keep_weekly, Some(Count::Unlimited));
    assert_eq!(o.policy.keep_within, Within::parse("1y6m").ok());
    assert!(o.prune && !o.prune_interrupted && !o.dry_run);
    assert_eq!(o.prune_grace.to_string(), "24h");
    assert!(backup().retention.is_none(), "absent: no retention");
    assert!(
        load_err(&format!("{MINIMAL_BACKUP}retention:\n  keep_monthly: 0\n"))
            .starts_with("retention: no keep_last")
    );
    assert!(load_err(&format!("{MINIMAL_BACKUP}retention: {{}}\n"))
        .starts_with("retention: no keep_last"));
    assert!(
        load_err(&format!("{MINIMAL_RESTORE}retention:\n  keep_last: 1\n"))
            .starts_with("retention applies after a backup")
    );
    let e = serde_err(&format!("{MINIMAL_BACKUP}retention:\n  keep_within: 2w\n"));
    assert!(e.contains("is not a duration such as 1y5m7d2h"), "{e}");
    let e = serde_err(&format!("{MINIMAL_BACKUP}retention:\n  keep_dayly: 2\n"));
    assert!(e.contains("unknown field `keep_dayly`"), "{e}");
}

#[test]
fn metrics_export_fields_parse_interpolate_and_hide_the_password() {
    std::env::set_var("RMQ_BACKUP_TEST_PGW_PASSWORD", "s3cret");
    let c = parsed(&format!(
        "{MINIMAL_BACKUP}metrics:\n  enabled: false\n  textfile: /var/lib/node_exporter/rmq-backup.prom\n  pushgateway_url: \"http://pusher:${{RMQ_BACKUP_TEST_PGW_PASSWORD}}@pgw:9091\"\n  pushgateway_job: nightly\n  pushgateway_grouping:\n    instance: prod-eu\n"
    ));
    let m = c.metrics.as_ref().expect("metrics");
    assert!(!m.enabled);
    assert_eq!(
        m.textfile.as_deref(),
        Some(std::path::Path::new(
            "/var/lib/node_exporter/rmq-backup.prom"
        ))
    );
    assert_eq!(
        m.pushgateway_url.as_deref(),
        Some("http://pusher:s3cret@pgw:9091")
    );
    assert_eq!(m.pushgateway_job, "nightly");
    assert_eq!(m.pushgateway_grouping["instance"], "prod-eu");
    let debug = format!("{c:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains("http://pusher:****@pgw:9091"), "{debug}");
}
