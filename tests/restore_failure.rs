//! A restore that fails part way (issue "Defects found by test and review", also found by
//! test): its summary says what a rerun will really do with each queue, from the checkpoint
//! database, and the rerun does it.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;

#[test]
fn a_failed_restore_says_what_the_rerun_does_with_each_queue() {
    let vh = TestVhost::new("restore-fail");
    let conn = vh.connect();
    const SMALL: usize = 500;
    const BIG: usize = 30_000;
    for (name, n) in [("a-small", SMALL), ("b-big", BIG)] {
        let ch = conn.open_channel().unwrap();
        declare(&ch, name, "classic", FieldTable::new());
        publish_bulk(&ch, name, n, 100);
        let _ = ch.close();
    }
    let dir = TempDir::new("restore-fail");
    let store = dir.path().join("store");
    let id = "r";
    let cfg = write_config(dir.path(), "b.yaml", &backup_yaml(id, &vh.name, &store, ""));
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let state = dir.path().join("restore.db");
    let restore = |extra: &str| {
        restore_yaml(
            id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  max_concurrent_queues: 1\n  checkpoint_state: \"{}\"\n  checkpoint_interval_secs: 1\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{extra}",
                state.display(),
                v = vh.name
            ),
        )
    };
    // 2,000 msg/s: b-big takes 15 s, time enough for the management API to list its
    // connection and the test to close it.
    let r1 = write_config(
        dir.path(),
        "r1.yaml",
        &restore("  rate_limit_messages_per_sec: 2000\n"),
    );
    let (child, lines) = spawn_cli(&["restore", "--config", &r1], &[]);
    wait_line(&lines, "queue a-small in vhost");
    // Closed once b-big has published (and the broker stored) 2 s of its messages: the
    // checkpoint (every second) then holds some of them.
    let target_conn = connect(&target);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // NOT_FOUND (not declared yet) closes the channel: a new one each time.
        let ch = target_conn.open_channel().unwrap();
        if ch
            .queue_declare_passive("b-big")
            .is_ok_and(|ok| ok.message_count > 4_000)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "b-big never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    close_connection(
        &format!("rmq-backup restore {target}/b-big"),
        "restore test",
    );
    let out = child.wait_with_output().expect("restore");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the closed connection fails the run"
    );
    let log: Vec<String> = rest_of(&lines);
    let log = log.join("\n");
    let small = log
        .lines()
        .find(|l| {
            l.contains(&format!(
                "queue a-small in vhost {target}: restored completely"
            ))
        })
        .unwrap_or_else(|| panic!("nothing said of a-small:\n{log}"));
    assert!(
        small.ends_with("a rerun with the same restore.checkpoint_state skips it"),
        "{small}"
    );
    assert!(
        !log.contains(&format!("queue a-small in vhost {target}: 500 message(s) were published before the restore failed")),
        "{log}"
    );
    let big = log
        .lines()
        .find(|l| {
            l.contains(&format!("queue b-big in vhost {target}: "))
                && l.contains("before the restore failed")
        })
        .unwrap_or_else(|| panic!("nothing said of b-big:\n{log}"));
    assert!(
        big.contains("the checkpoint holds the first ")
            && big.contains("so a rerun with the same restore.checkpoint_state resumes after them"),
        "{big}"
    );

    // The rerun does what was said.
    let r2 = write_config(dir.path(), "r2.yaml", &restore(""));
    let out = run_cli(&["restore", "--config", &r2]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("queue a-small in vhost ")
            && stderr.contains("restored completely by an earlier run"),
        "{stderr}"
    );
    let tconn = connect(&target);
    assert_eq!(
        depth(&tconn, "a-small") as usize,
        SMALL,
        "a-small not published again"
    );
    assert!(depth(&tconn, "b-big") as usize >= BIG, "b-big whole");
}
