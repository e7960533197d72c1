//! A zstd segment is judged once at 8 MiB of payload (`backup/incompressible.rs`,
//! `EARLY_VERDICT_BYTES`): one of random bodies that has not shrunk by then is finished there,
//! so the rest of the queue is stored uncompressed without zstd searching a whole 128 MiB
//! segment first; one of text bodies goes on to its full size. Both restore byte for byte
//! and pass `validate --deep` (the tool's own reader is checked against the published bodies,
//! the oracle).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;

/// 200 bodies of 64 KiB: 12.5 MiB, past the early verdict, under one default segment.
const MESSAGES: usize = 200;

fn bodies(random: bool) -> Vec<Msg> {
    let mut rng = Rng::new(11);
    (0..MESSAGES)
        .map(|i| Msg {
            props: Default::default(),
            body: if random {
                rng.bytes(64 << 10)
            } else {
                format!("{{\"order\":{i},\"status\":\"created\"}} ")
                    .repeat(4096)
                    .into_bytes()[..64 << 10]
                    .to_vec()
            },
        })
        .collect()
}

#[test]
fn a_segment_that_has_not_shrunk_at_8_mib_ends_there_and_the_rest_is_stored_plain() {
    for random in [true, false] {
        let what = if random { "random" } else { "text" };
        let vh = TestVhost::new(&format!("early-{what}"));
        let conn = vh.connect();
        let ch = conn.open_channel().unwrap();
        declare(&ch, "q", "classic", FieldTable::new());
        let msgs = bodies(random);
        publish(&ch, "q", &msgs);
        let dir = TempDir::new(&format!("early-{what}"));
        let store = dir.path().join("store");
        let id = format!("early-{what}");
        let cfg = write_config(
            dir.path(),
            "b.yaml",
            &backup_yaml(&id, &vh.name, &store, "  segment_version: 2\n"),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "backup {what}: {:?}",
            text(&out)
        );
        let m = manifest(&store, &id);
        let segments = &m.queues[0].segments;
        let keys: Vec<(&str, u64, u64)> = segments
            .iter()
            .map(|s| (s.key.as_str(), s.record_count, s.uncompressed_bytes))
            .collect();
        assert!(segments[0].key.ends_with(".zst"), "{what}: {keys:?}");
        if random {
            // Finished at the first record past 8 MiB of payload, the rest in one plain one.
            assert_eq!(segments.len(), 2, "{what}: {keys:?}");
            let first = segments[0].uncompressed_bytes;
            assert!(
                (8 << 20..(8 << 20) + (65 << 10)).contains(&first),
                "{what}: {keys:?}"
            );
            assert!(!segments[1].key.ends_with(".zst"), "{what}: {keys:?}");
        } else {
            assert_eq!(segments.len(), 1, "{what}: {keys:?}");
        }
        assert_eq!(
            segments.iter().map(|s| s.record_count).sum::<u64>(),
            MESSAGES as u64,
            "{what}"
        );
        let url = format!("file://{}", store.display());
        let out = run_cli(&["validate", "--path", &url, "--backup-id", &id, "--deep"]);
        assert_eq!(out.status.code(), Some(0), "{what}: {:?}", text(&out));
        let target = vh.sibling(&id);
        let rcfg = write_config(
            dir.path(),
            "r.yaml",
            &restore_yaml(
                &id,
                &store,
                &format!(
                    "  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
                    v = vh.name
                ),
            ),
        );
        let out = run_cli(&["restore", "--config", &rcfg]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "restore {what}: {:?}",
            text(&out)
        );
        let tconn = connect(&target);
        assert_same(&as_restored(&msgs), &peek(&tconn, "q", msgs.len()), what);
        drop(tconn);
        let _ = management().delete_vhost(&target);
        assert_eq!(
            depth(&conn, "q"),
            MESSAGES as u32,
            "{what}: the source kept every message"
        );
    }
}
