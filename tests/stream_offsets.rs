//! Stream consumer offsets (issue "Day-to-day operations", item 5) on the real broker: a
//! consumer stores its place with the stream protocol, the backup keeps it
//! (`backup.stream_offset_references`), and the restore into a stream whose offsets differ
//! stores, under the same reference, the offset of the same message there
//! (`restore.stream_offsets: translate`), or nothing (`skip`).

mod common;

use common::*;
use rmq_backup::broker::amqp::{AmqpUrl, FieldTable};
use rmq_backup::broker::stream::{StreamConnection, StreamOptions};

fn stream_conn(vhost: &str) -> StreamConnection {
    let url = AmqpUrl::parse(&amqp_url(vhost)).unwrap();
    StreamConnection::open(&StreamOptions::from_amqp_url(&url, stream_port()))
        .expect("stream connection")
}

/// The stored offset of `reference` on `stream` of `vhost`.
fn stored(vhost: &str, stream: &str, reference: &str) -> Option<u64> {
    let conn = stream_conn(vhost);
    let o = conn.query_offset(reference, stream).expect("query offset");
    let _ = conn.close();
    o
}

#[test]
fn a_consumers_offset_finds_the_same_message_in_the_restored_stream() {
    let vh = TestVhost::new("stream-offsets");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "events", "stream", FieldTable::new());
    publish_bulk(&ch, "events", 100, 64);
    // A consumer that has processed up to offset 41, another that has read everything.
    let consumer = stream_conn(&vh.name);
    consumer.store_offset("app-1", "events", 41).unwrap();
    consumer.store_offset("app-2", "events", 99).unwrap();
    assert_eq!(consumer.query_offset("app-1", "events").unwrap(), Some(41));
    let _ = consumer.close();

    let dir = TempDir::new("stream-offsets");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "so",
            &vh.name,
            &store,
            "  stream_enabled: true\n  stream_offset_references: [app-1, app-2, app-never]\n",
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let m = manifest(&store, "so");
    let q = m.queues.iter().find(|q| q.name == "events").unwrap();
    assert_eq!(
        q.consumer_offsets,
        [("app-1".to_string(), 41), ("app-2".to_string(), 99)].into(),
        "references with no stored offset are left out"
    );

    // The target stream already holds 10 messages: the restored ones take offsets 10..=109.
    for (target, mode, expected) in [
        ("target", "translate", [Some(51), Some(109)]),
        ("target2", "skip", [None, None]),
    ] {
        let target = vh.sibling(target);
        management().create_vhost(&target).unwrap();
        management().set_permissions(&target, "guest").unwrap();
        let tconn = connect(&target);
        let tch = tconn.open_channel().unwrap();
        declare(&tch, "events", "stream", FieldTable::new());
        publish_bulk(&tch, "events", 10, 64);
        let r = write_config(
            dir.path(),
            &format!("r-{mode}.yaml"),
            &restore_yaml(
                "so",
                &store,
                &format!(
                    "  publish_mode: direct-to-queue\n  restore_definitions: false\n  stream_offsets: {mode}\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                    vh.name
                ),
            ),
        );
        let out = run_cli(&["restore", "--config", &r]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        assert_eq!(
            [
                stored(&target, "events", "app-1"),
                stored(&target, "events", "app-2")
            ],
            expected,
            "{mode}: {stderr}"
        );
        assert_eq!(stored(&target, "events", "app-never"), None);
        if mode == "translate" {
            assert!(
                stderr.contains("consumer reference app-1: offset 41 in the backup is offset 51 in stream events"),
                "{stderr}"
            );
            // The same message at the translated offset.
            let source = read_stream_091(&conn, "events", 100);
            let restored = read_stream_091(&tconn, "events", 110);
            assert_eq!(restored[51].body, source[41].body);
            assert_eq!(restored[109].body, source[99].body);
            assert_eq!(seqs(&restored[10..]), seqs(&source));
        }
    }
}
