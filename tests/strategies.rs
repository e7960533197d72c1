//! Every `requeue_strategy` on classic and quorum queues keeps every message in the broker, in
//! order, and backs up the whole depth, message for message (SPEC.md "Requeue strategies").

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::manifest::Manifest;

#[test]
fn every_strategy_keeps_the_queue_whole_and_in_order() {
    let vh = TestVhost::new("strategies");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let msgs = diverse_messages(150, 11, false);
    for kind in ["classic", "quorum"] {
        declare(&ch, &format!("{kind}-q"), kind, FieldTable::new());
        publish(&ch, &format!("{kind}-q"), &msgs);
    }
    let dir = TempDir::new("strategies");
    for strategy in ["cancel", "nack", "reject", "get"] {
        let store = dir.path().join(strategy);
        let id = format!("strategy-{strategy}");
        let cfg = write_config(
            dir.path(),
            &format!("{strategy}.yaml"),
            &backup_yaml(
                &id,
                &vh.name,
                &store,
                &format!("  requeue_strategy: {strategy}\n  include_definitions: false\n"),
            )
            .replace("  include_definitions: true\n", ""),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        assert_eq!(out.status.code(), Some(0), "{strategy}: {:?}", text(&out));
        let m = Manifest::from_json(&std::fs::read(store.join(&id).join("manifest.json")).unwrap())
            .unwrap();
        assert!(m.definitions.is_none());
        for kind in ["classic", "quorum"] {
            let name = format!("{kind}-q");
            let q = m.queues.iter().find(|q| q.name == name).unwrap();
            assert_eq!(
                q.message_count, 150,
                "{strategy} {kind}: messages backed up"
            );
            assert_eq!(
                depth(&conn, &name),
                150,
                "{strategy} {kind}: depth after backup"
            );
            assert_same_as(
                &in_broker_order(&msgs, kind),
                &peek(&conn, &name, 150),
                Headers::of(kind),
                &format!("{strategy} {kind}: source after backup"),
            );
            // What the backup holds is what was published, in order.
            assert_same_as(
                &as_restored(&in_broker_order(&msgs, kind)),
                &backed_up(&store, &id, &name),
                Headers::of(kind),
                &format!("{strategy} {kind}: the backup's records"),
            );
        }
        // The backed-up records hold the messages in order too.
        let url = format!("file://{}", store.display());
        let out = run_cli(&["validate", "--path", &url, "--backup-id", &id, "--deep"]);
        assert_eq!(out.status.code(), Some(0), "{strategy}: {:?}", text(&out));
    }
}
