//! A sharded backup (issue "Clusters and scale-out", item 5): one backup id written by three
//! processes at once, each given its part by `JOB_COMPLETION_INDEX` as a Kubernetes Indexed
//! Job gives it; one killed mid-run and run again. The backup reads `interrupted` until every
//! part is complete, then `completed`; it validates, restores identical to the source, and a
//! reader merges the parts when the last worker could not.

mod common;

use common::*;
use rmq_backup::amqp::FieldTable;
use std::os::unix::process::ExitStatusExt;

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
    let deep_part = rmq_backup::shard::part_of(&vh.name, "deep", 3);

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
        let part: rmq_backup::manifest::Manifest = serde_json::from_slice(
            &std::fs::read(store.join(id).join(format!("parts/{index}-of-3.json"))).unwrap(),
        )
        .unwrap();
        assert!(part.completed_at.is_some());
        assert_eq!(part.definitions.is_some(), index == 0);
        for q in &part.queues {
            assert_eq!(rmq_backup::shard::part_of(&q.vhost, &q.name, 3), index);
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

    // A reader merges the parts when no worker could (killed between its part and the merge).
    std::fs::remove_file(store.join(id).join("manifest.json")).unwrap();
    assert_eq!(list_status(&store, id), "completed");
    assert!(
        store.join(id).join("manifest.json").is_file(),
        "merged by list"
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
