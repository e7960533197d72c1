//! A quorum queue deeper than one consumer's 65,535-message window backs up whole and in order,
//! and the broker keeps it whole and in order (DESIGN.md decision 7).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;

const DEPTH: usize = 70_000;

#[test]
fn quorum_queue_of_70000_backs_up_whole_and_in_order() {
    let vh = TestVhost::new("deepquorum");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "deep", "quorum", FieldTable::new());
    publish_bulk(&ch, "deep", DEPTH, 200);
    assert_eq!(depth(&conn, "deep") as usize, DEPTH);

    let dir = TempDir::new("deepquorum");
    let store = dir.path().join("store");
    let id = "deep-quorum";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, "  segment_max_bytes: 4000000\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(depth(&conn, "deep") as usize, DEPTH, "depth after backup");
    let source: Vec<i64> = peek(&conn, "deep", DEPTH)
        .iter()
        .map(|d| header_i64(d, "seq"))
        .collect();
    assert!(
        source.iter().copied().eq(0..DEPTH as i64),
        "source order changed by the backup"
    );

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let rcfg = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n  produce_batch_size: 500\n",
                vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&target);
    assert_eq!(depth(&tconn, "deep") as usize, DEPTH);
    let restored: Vec<i64> = peek(&tconn, "deep", DEPTH)
        .iter()
        .map(|d| header_i64(d, "seq"))
        .collect();
    assert!(
        restored.iter().copied().eq(0..DEPTH as i64),
        "restored order differs"
    );
}

/// A classic queue deeper than one window: the broker requeues a closed channel's deliveries
/// after close-ok, so a backup ends only when the queue shows them all again. A second backup
/// started the moment the first exits sees (and saves) the whole queue.
#[test]
fn back_to_back_backups_of_a_deep_classic_queue_see_it_whole() {
    let vh = TestVhost::new("backtoback");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "deep", "classic", FieldTable::new());
    publish_bulk(&ch, "deep", DEPTH, 64);
    assert_eq!(depth(&conn, "deep") as usize, DEPTH);
    let dir = TempDir::new("backtoback");
    let store = dir.path().join("store");
    for id in ["first", "second"] {
        let cfg = write_config(
            dir.path(),
            &format!("{id}.yaml"),
            &backup_yaml(id, &vh.name, &store, ""),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("{DEPTH} messages")),
            "backup {id} saw the whole queue: {stdout}"
        );
        // The moment the backup has exited, every message is ready again.
        let ready = ch.queue_declare_passive("deep").unwrap().message_count;
        assert_eq!(ready as usize, DEPTH, "ready right after backup {id}");
    }
}

/// `nack` and `get` read a classic queue with `basic.get`; giving 20,000 messages back with
/// nacks would leave most of them unready for minutes (the broker applies them at ~150/s), so
/// classic queues get them back by a channel close: ready the moment the backup exits.
#[test]
fn classic_nack_and_get_backups_leave_the_queue_ready() {
    const N: usize = 20_000;
    let vh = TestVhost::new("classicnack");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", N, 64);
    assert_eq!(depth(&conn, "q") as usize, N);
    let dir = TempDir::new("classicnack");
    let store = dir.path().join("store");
    for strategy in ["nack", "get"] {
        let cfg = write_config(
            dir.path(),
            &format!("{strategy}.yaml"),
            &backup_yaml(
                strategy,
                &vh.name,
                &store,
                &format!("  requeue_strategy: {strategy}\n"),
            ),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        assert!(!stderr.contains("WARN"), "{stderr}");
        let ready = ch.queue_declare_passive("q").unwrap().message_count;
        assert_eq!(ready as usize, N, "ready right after the {strategy} backup");
        let order: Vec<i64> = peek(&conn, "q", N)
            .iter()
            .map(|d| header_i64(d, "seq"))
            .collect();
        assert!(
            order.iter().copied().eq(0..N as i64),
            "order kept by the {strategy} backup"
        );
        // The backup holds every message once, in order, with its body.
        let saved = backed_up(&store, strategy, "q");
        assert!(
            saved.iter().map(|d| header_i64(d, "seq")).eq(0..N as i64),
            "the {strategy} backup's records"
        );
        let mut rng = Rng::new(N as u64);
        for (i, d) in saved.iter().enumerate() {
            let mut body = rng.bytes(64);
            body[..8].copy_from_slice(&(i as u64).to_be_bytes());
            assert!(d.body == body, "{strategy}: body of record {i}");
        }
    }
}
