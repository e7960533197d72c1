//! Append-only credentials (docs/protecting-backups.md "Protecting backups from deletion"): a backup whose storage
//! refuses every delete completes, leaves the objects it would have tidied away in place (one
//! warning), and restores identical. The storage here is the memory backend behind a wrapper
//! that refuses deletes as S3 answers a policy denying `s3:DeleteObject`.

mod common;

use common::hooked_storage::{Access, Hooked};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::error::Error;
use rmq_backup::{backup, inspect, repository::storage, restore};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[test]
fn a_backup_without_delete_rights_completes_and_restores() {
    let vh = TestVhost::new("appendonly");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "ao q", "classic", FieldTable::new());
    let msgs = diverse_messages(60, 33, false);
    publish(&ch, "ao q", &msgs);
    let store_name = format!("append-only-{}", unique_suffix());
    let yaml = format!(
        "mode: backup\nbackup_id: ao-1\nsource:\n  amqp_url: \"{}\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{}\"]\nstorage:\n  backend: memory\nbackup:\n  segment_max_bytes: 20000\n",
        amqp_url(&vh.name),
        management_url(),
        vh.name
    );
    let cfg = Config::from_yaml_str(&yaml).unwrap();
    let inner = storage::open_memory(&store_name, None).unwrap();
    // An earlier attempt left a segment this run's manifest will not list: a run removes
    // such segments at its end, which this storage refuses.
    let stray = format!(
        "{}segment-0099.zst",
        rmq_backup::repository::manifest::queue_prefix("ao-1", &vh.name, "ao q")
    );
    inner
        .put_bytes(&stray, b"left by an earlier attempt")
        .unwrap();
    // Every operation but delete passed through; deletes refused (and counted), as S3 answers
    // a policy denying `s3:DeleteObject`.
    let refused = Arc::new(AtomicU64::new(0));
    let counted = refused.clone();
    let refusing = Hooked::new(inner.clone(), move |access, key| match access {
        Access::Delete => {
            counted.fetch_add(1, Ordering::Relaxed);
            Err(Error::Storage(format!(
                "Failed to delete {key}: 403 AccessDenied"
            )))
        }
        _ => Ok(()),
    });
    let before = storage::append_only::skipped();
    let summary = backup::run(&cfg, refusing.clone()).expect("the backup completes");
    assert_eq!(summary.messages, 60);
    assert!(
        refused.load(Ordering::Relaxed) >= 1,
        "the run tried to tidy up"
    );
    assert!(
        storage::append_only::skipped() > before,
        "and skipped the refused delete"
    );
    assert!(
        inner.head(&stray).unwrap().is_some(),
        "left for forget --prune"
    );
    // The run lock is ended in place, not deleted.
    assert!(inner.head("ao-1/state/lock.json").unwrap().is_some());

    let report = inspect::validate(inner.as_ref(), "ao-1", true).unwrap();
    assert!(report.is_valid(), "{:?}", report.problems);
    assert_eq!(
        inspect::status(
            inner.as_ref(),
            &rmq_backup::repository::manifest::Manifest::read(inner.as_ref(), "ao-1").unwrap()
        )
        .unwrap(),
        "completed"
    );

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let ryaml = format!(
        "mode: restore\nbackup_id: ao-1\ntarget:\n  amqp_url: \"{}\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: memory\nrestore:\n  publish_mode: direct-to-queue\n  definitions_selection:\n    queues: [\"ao q\"]\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
        amqp_url("/"),
        management_url(),
        vh.name
    );
    let rcfg = Config::from_yaml_str(&ryaml).unwrap();
    let s = restore::run(&rcfg, refusing).unwrap();
    assert_eq!((s.published(), s.confirmed(), s.failed()), (60, 60, 0));
    let tconn = connect(&target);
    assert_same(&as_restored(&msgs), &peek(&tconn, "ao q", 60), "restored");
}
