//! A continuous backup (`stop_at_current_depth: false`) follows a stream while a publisher
//! writes: killed with SIGKILL and run again it resumes with no gap and no duplicate; SIGTERM
//! ends it with a completed manifest that `validate --deep` accepts.

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Sets the flag when dropped: a failing test still stops its publisher thread.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Kills the child when dropped: a failing test leaves no backup running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn seq_of(d: &rmq_backup::broker::amqp::Delivery) -> i64 {
    header_i64(d, "seq")
}

#[test]
fn a_continuous_backup_killed_and_rerun_holds_every_message_once() {
    let v = TestVhost::new("stream-live");
    let conn = v.connect();
    let ch = conn.open_channel().expect("channel");
    let args: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"stream".to_vec()),
    )];
    ch.queue_declare("live", true, false, false, &args)
        .expect("declare");
    declare(&ch, "plain", "classic", FieldTable::new());
    publish_bulk(&ch, "plain", 10, 10);
    ch.close().expect("close");

    let dir = TempDir::new("stream-live");
    let db = dir.path().join("offsets.db");
    let id = "live1";
    let extra = format!(
        "  stream_enabled: true\n  stop_at_current_depth: false\n  segment_max_interval_ms: 300\noffset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n  s3_key: {id}/state/offsets.db\n",
        db.display()
    );
    let cfg = write_config(
        dir.path(),
        "backup.yaml",
        &backup_yaml(id, &v.name, dir.path(), &extra),
    );

    // A publisher writes numbered messages (header seq = 0, 1, 2, ...) the whole time.
    let stop = AtomicBool::new(false);
    let published = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = v.connect();
            let ch = c.open_channel().expect("channel");
            ch.confirm_select().expect("confirms");
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..50 {
                    let props = rmq_backup::broker::amqp::BasicProperties {
                        headers: Some(vec![("seq".into(), FieldValue::I64(i))]),
                        ..Default::default()
                    };
                    ch.basic_publish("", "live", true, &props, &i.to_be_bytes())
                        .expect("publish");
                    i += 1;
                }
                ch.wait_for_confirms(0, Duration::from_secs(30))
                    .expect("confirms");
                published.store(i as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            ch.close().expect("close");
        });

        let _stop = StopOnDrop(&stop);
        // First run: killed once it has stored segments.
        let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
        let mut child = KillOnDrop(child);
        // Both lines, in whichever order the two threads log them.
        let mut needed = vec![
            "continuously from offset 0 until stopped",
            "a continuous backup follows streams only; this queue is backed up once",
        ];
        while !needed.is_empty() {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no line with {needed:?}"));
            needed.retain(|n| !line.contains(n));
        }
        std::thread::sleep(Duration::from_secs(2));
        child.0.kill().expect("kill");
        assert_eq!(child.0.wait().unwrap().signal(), Some(9));

        // Second run: resumes after the last stored segment.
        let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
        let mut child = KillOnDrop(child);
        let resumed = wait_line(&lines, "reading resumes at offset");
        assert!(!resumed.contains("resumes at offset 0"), "{resumed}");
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        // Let the backup catch up with the last publishes, then end it with SIGTERM.
        std::thread::sleep(Duration::from_secs(2));
        let kill = Command::new("kill")
            .args(["-TERM", &child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let status = child.0.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "SIGTERM ends a continuous backup normally"
        );
        drop(lines);
    });

    let total = published.load(Ordering::Relaxed) as i64;
    let got = backed_up(dir.path(), id, "live");
    let seqs: Vec<i64> = got.iter().map(seq_of).collect();
    assert_eq!(
        seqs,
        (0..total).collect::<Vec<_>>(),
        "every message once, in order"
    );
    // Offsets (SPEC.md "Segment file": a stream record's delivery tag is its offset).
    let tags: Vec<u64> = got.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, (0..total as u64).collect::<Vec<_>>());
    // The queue was backed up once; the manifest is complete and validates deeply.
    assert_eq!(backed_up(dir.path(), id, "plain").len(), 10);
    let out = run_cli(&[
        "validate",
        "--path",
        &dir.url(),
        "--backup-id",
        id,
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}
