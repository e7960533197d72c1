//! A sharded backup (issue "Clusters and scale-out", item 5): one backup id written by three
//! processes at once, each given its part by `JOB_COMPLETION_INDEX` as a Kubernetes Indexed
//! Job gives it; one killed mid-run and run again. The backup reads `interrupted` until every
//! part is complete, then `completed`; it validates, restores identical to the source, and a
//! reader merges the parts when the last worker could not.

mod common;

use common::hooked_storage::{Access, Hooked};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::storage::Storage;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};

const QUEUES: usize = 9;
const PER_QUEUE: usize = 150;

fn list_status(store: &std::path::Path, id: &str) -> String {
    let out = run_cli(&[
        "list",
        "--path",
        &format!("file://{}", store.display()),
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|b| b["backup_id"] == id)
        .map(|b| b["status"].as_str().unwrap_or("").to_string())
        .unwrap_or_else(|| panic!("{id} not listed: {v}"))
}

#[test]
fn three_workers_write_one_backup_that_restores_identical() {
    let vh = TestVhost::new("shards");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let mut expected = Vec::new();
    for i in 0..QUEUES {
        let name = format!("q{i}");
        declare(&ch, &name, "classic", FieldTable::new());
        let msgs = diverse_messages(PER_QUEUE, 40 + i as u64, false);
        publish(&ch, &name, &msgs);
        expected.push((name, msgs));
    }
    // A deep one, so that the worker owning it is still reading when it is killed.
    declare(&ch, "deep", "classic", FieldTable::new());
    publish_bulk(&ch, "deep", 60_000, 64);
    let deep_part = rmq_backup::repository::shard::part_of(&vh.name, "deep", 3);

    let dir = TempDir::new("shards");
    let store = dir.path().join("store");
    let id = "sharded";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            id,
            &vh.name,
            &store,
            "  requeue_strategy: get\n  shard:\n    count: 3\n",
        ),
    );
    // Three workers at once; the one with the deep queue is killed while it reads.
    let mut workers = Vec::new();
    for index in 0..3u32 {
        let env = [("JOB_COMPLETION_INDEX", index.to_string())];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        workers.push(spawn_cli(&["backup", "--config", &cfg], &env));
    }
    let (mut victim, lines) = workers.remove(deep_part as usize);
    wait_line(&lines, "queue deep: 60000 messages at start");
    victim.kill().unwrap();
    assert_eq!(victim.wait().unwrap().signal(), Some(9));
    for (child, lines) in workers {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", rest_of(&lines).join("\n"));
    }
    assert_eq!(
        list_status(&store, id),
        "interrupted",
        "a part is missing: not complete"
    );

    // The killed index run again finishes its part and merges the parts.
    let index = deep_part.to_string();
    let out = run_cli_env(
        &["backup", "--config", &cfg],
        &[("JOB_COMPLETION_INDEX", index.as_str())],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(store.join(id).join("manifest.json").is_file(), "merged");
    assert_eq!(list_status(&store, id), "completed");
    let m = manifest(&store, id);
    assert_eq!(m.parts, Some(3));
    assert_eq!(m.queues.len(), QUEUES + 1, "each queue once");
    assert_eq!(m.total_messages, (QUEUES * PER_QUEUE + 60_000) as u64);
    assert!(m.definitions.is_some(), "exported once, by part 0");
    // Every part holds the queues that hash to it, and only part 0 the definitions.
    for index in 0..3u32 {
        let part: rmq_backup::repository::manifest::Manifest = serde_json::from_slice(
            &std::fs::read(store.join(id).join(format!("parts/{index}-of-3.json"))).unwrap(),
        )
        .unwrap();
        assert!(part.completed_at.is_some());
        assert_eq!(part.definitions.is_some(), index == 0);
        for q in &part.queues {
            assert_eq!(
                rmq_backup::repository::shard::part_of(&q.vhost, &q.name, 3),
                index
            );
        }
    }
    // Run again, a part complete is nothing to do.
    let out = run_cli_env(
        &["backup", "--config", &cfg],
        &[("JOB_COMPLETION_INDEX", "0")],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("complete already"),
        "{:?}",
        text(&out)
    );

    // A reader merges the parts when no worker could (killed between its part and the merge),
    // in memory: reading writes nothing.
    std::fs::remove_file(store.join(id).join("manifest.json")).unwrap();
    assert_eq!(list_status(&store, id), "completed");
    assert!(
        !store.join(id).join("manifest.json").exists(),
        "list wrote the merged manifest"
    );
    let url = format!("file://{}", store.display());
    let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Restored, every queue identical to its source.
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
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&target);
    for (name, msgs) in &expected {
        assert_same_as(
            &as_restored(msgs),
            &peek(&tconn, name, msgs.len()),
            Headers::of("classic"),
            &format!("restored {name}"),
        );
        assert_eq!(depth(&tconn, name) as usize, msgs.len());
    }
    assert_eq!(
        seqs(&peek(&tconn, "deep", 60_000)),
        (0..60_000).collect::<Vec<i64>>()
    );
}

#[test]
fn a_part_without_an_index_is_a_configuration_error() {
    let vh = TestVhost::new("shard-noindex");
    let dir = TempDir::new("shard-noindex");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "x",
            &vh.name,
            &dir.path().join("store"),
            "  shard:\n    count: 3\n",
        ),
    );
    let out = std::process::Command::new(binary())
        .args(["backup", "--config", &cfg])
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert_eq!(
        text(&out).1.trim_end(),
        "Configuration error: backup.shard.index is not set and neither is JOB_COMPLETION_INDEX: say which part of the 3 this run writes"
    );
    let out = std::process::Command::new(binary())
        .args(["backup", "--config", &cfg])
        .env("JOB_COMPLETION_INDEX", "7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        text(&out)
            .1
            .contains("part 7 is not below backup.shard.count 3"),
        "{:?}",
        text(&out)
    );
}

/// Issue 31, item 10: `list`, `describe`, `validate`, `cat` and `forget --dry-run` of a sharded
/// backup whose parts are complete but whose merged manifest is absent (its last worker killed
/// between its part and the merge) merge the parts in memory, through read-only credentials,
/// and write nothing. Before: `Manifest::read` put `manifest.json` (a failed put was only
/// logged, so the read went on; the wrapper recorded the attempt).
#[test]
fn readers_of_an_unmerged_sharded_backup_write_nothing() {
    let vh = TestVhost::new("shards-ro");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for i in 0..4 {
        let name = format!("q{i}");
        declare(&ch, &name, "classic", FieldTable::new());
        publish_bulk(&ch, &name, 20, 64);
    }
    let dir = TempDir::new("shards-ro");
    let store = dir.path().join("store");
    let id = "sharded-ro";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, "  shard:\n    count: 2\n"),
    );
    for index in ["0", "1"] {
        let out = run_cli_env(
            &["backup", "--config", &cfg],
            &[("JOB_COMPLETION_INDEX", index)],
        );
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    }
    let merged = store.join(id).join("manifest.json");
    std::fs::remove_file(&merged).unwrap();

    // Read-only credentials: every write and delete fails, and is recorded.
    let attempts = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = attempts.clone();
    let storage: Arc<dyn Storage> = Hooked::new(
        rmq_backup::repository::storage::open_filesystem(&store, None).unwrap(),
        move |access, key| {
            let what = match access {
                Access::Read => return Ok(()),
                Access::Write => "put",
                Access::Delete => "delete",
            };
            seen.lock().unwrap().push(format!("{what} {key}"));
            Err(rmq_backup::Error::Storage(format!(
                "Failed to {what} {key}: access denied (read-only)"
            )))
        },
    );
    let listed = rmq_backup::inspect::list(storage.as_ref()).unwrap();
    let b = listed.backups.iter().find(|b| b.backup_id == id).unwrap();
    assert_eq!((b.status, b.total_messages), ("completed", 80));
    rmq_backup::inspect::describe(storage.as_ref(), id, rmq_backup::inspect::Format::Json).unwrap();
    let report = rmq_backup::inspect::validate(storage.as_ref(), id, true).unwrap();
    assert!(report.is_valid(), "{report:?}");
    let mut out = Vec::new();
    let opts = rmq_backup::inspect::cat::CatOptions {
        vhost: None,
        queue: None,
        since: None,
        until: None,
        limit: None,
        format: rmq_backup::inspect::cat::CatFormat::Jsonl,
        delimiter: b"\n".to_vec(),
    };
    rmq_backup::inspect::cat::cat(storage.as_ref(), id, &opts, None, &mut out).unwrap();
    assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 80);
    let forget = rmq_backup::retention::forget(
        &storage,
        &rmq_backup::retention::Options {
            policy: rmq_backup::retention::Policy {
                keep_last: Some(rmq_backup::retention::Count::N(1)),
                ..Default::default()
            },
            dry_run: true,
            prune_interrupted: true,
            prune: true,
            prune_grace: rmq_backup::retention::Within::default(),
        },
    )
    .unwrap();
    assert!(forget.errors.is_empty(), "{:?}", forget.errors);
    assert_eq!(*attempts.lock().unwrap(), Vec::<String>::new());
    assert!(!merged.exists(), "a reader wrote the merged manifest");
}
