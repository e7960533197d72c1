//! Issue 39, the backup side: messages published by an AMQP 1.0 client that is not ours (Qpid
//! Proton, `tests/amqp10_support/proton_oracle.py`) into a classic and a quorum queue, backed
//! up with `backup.amqp10_queues`, are stored as their publisher sent them: Proton decodes
//! each stored record's body (`proton_decode.py`) to exactly what it decodes of what it sent,
//! every field with its AMQP type (only the delivery annotations, which are for one hop, are
//! not kept), the bare message byte for byte. The queues are whole afterwards, in order, and
//! on RabbitMQ 4.3 the delivery counts Proton reads back are unchanged (30 nightly backups of a
//! quorum queue too). On 4.0 (`RMQ_TEST_BROKER=4.0`) every give-back counts, and the
//! delivery-limit rules decide (checked: each backup raises `x-delivery-count` by one, below
//! the limit). RabbitMQ 3.x has no AMQP 1.0 core: the test returns early there.

mod common;

use common::proton::proton;
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::broker::amqp10::message::{sections, PROPERTIES};
use rmq_backup::repository::record::{BackupRecord, MessageFormat};
use serde_json::Value as Json;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const PY: &str = "/usr/bin/python3";

/// Proton's decoding of each message (hex lines or proton_oracle.py's JSON lines).
fn decode(lines: &[String]) -> Vec<Json> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/amqp10_support/proton_decode.py"
    );
    let mut child = Command::new(PY)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run proton_decode.py");
    // Written from a thread: the output of a large message fills the pipe meanwhile.
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.to_vec();
    let writer = std::thread::spawn(move || {
        for l in input {
            writeln!(stdin, "{l}").unwrap();
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "proton_decode.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The bare message: every byte from the properties section on (none: from the first
/// section after the annotations).
fn bare(b: &[u8]) -> Vec<u8> {
    let s = sections(b).expect("sections");
    let from = s
        .iter()
        .find(|(c, _, _)| *c >= PROPERTIES)
        .map_or(b.len(), |(_, _, r)| r.start);
    b[from..].to_vec()
}

fn records(store: &Path, id: &str, queue: &str) -> Vec<BackupRecord> {
    use rmq_backup::repository::segment::SegmentReader;
    let m = manifest(store, id);
    let q = m.queues.iter().find(|q| q.name == queue).expect("queue");
    let mut out = Vec::new();
    for s in &q.segments {
        let reader = SegmentReader::open(&store.join(&s.key)).expect("segment");
        for r in reader.records() {
            out.push(r.expect("record").into_record().expect("decode"));
        }
    }
    out
}

/// (header delivery-count, x-delivery-count) of each message Proton reads (and releases).
/// Proton's own release counts on a quorum queue (it closes its connection right after
/// settling), so callers compare differences between successive reads.
fn counts(vhost: &str, queue: &str, n: usize) -> Vec<(u64, u64)> {
    let got = proton(&[
        "receive",
        vhost,
        &format!("/queues/{queue}"),
        &n.to_string(),
        "release",
    ]);
    decode(&got)
        .iter()
        .map(|m| {
            let ann = m["annotations"].as_str().unwrap().to_string();
            let x = ann.find("'x-delivery-count'").map_or(0, |i| {
                let v = ann[i..].split([',', '}']).next().unwrap();
                let digits: String = v
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect();
                digits.parse().unwrap()
            });
            (m["delivery_count"].as_str().unwrap().parse().unwrap(), x)
        })
        .collect()
}

/// What reads in between added to each count: `later - earlier`, message by message.
fn added(earlier: &[(u64, u64)], later: &[(u64, u64)]) -> Vec<(u64, u64)> {
    earlier
        .iter()
        .zip(later)
        .map(|(a, b)| (b.0 - a.0, b.1 - a.1))
        .collect()
}

fn backup(dir: &Path, store: &Path, vh: &TestVhost, id: &str) {
    let cfg = write_config(
        dir,
        &format!("{id}.yaml"),
        &backup_yaml(id, &vh.name, store, "  amqp10_queues: [\"c-*\", \"q-*\"]"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_4x() -> bool {
    if broker().version.0 < 4 {
        eprintln!(
            "skipped: RabbitMQ {}.{} has no AMQP 1.0 core (backup.amqp10_queues reads over 0-9-1 there)",
            broker().version.0,
            broker().version.1
        );
        return false;
    }
    true
}

const N: usize = 16;

#[test]
fn proton_messages_are_stored_as_sent_and_the_queues_stay_whole() {
    if !is_4x() {
        return;
    }
    let vh = TestVhost::new("amqp10-backup");
    {
        let conn = vh.connect();
        let ch = conn.open_channel().unwrap();
        declare(&ch, "c-1", "classic", FieldTable::new());
        declare(&ch, "q-1", "quorum", FieldTable::new());
    }
    let dir = TempDir::new("amqp10-backup");
    let store = dir.path().join("store");
    for (queue, seed) in [("c-1", "11"), ("q-1", "12")] {
        let sent = proton(&[
            "publish",
            &vh.name,
            &format!("/queues/{queue}"),
            &N.to_string(),
            seed,
        ]);
        assert_eq!(sent.len(), N);
        let first = counts(&vh.name, queue, N);
        let before = counts(&vh.name, queue, N);
        let id = format!("b-{queue}");
        backup(dir.path(), &store, &vh, &id);
        let recs = records(&store, &id, queue);
        assert_eq!(recs.len(), N, "{queue}: every message stored");
        let stored: Vec<String> = recs.iter().map(|r| hex(&r.body)).collect();
        let (want, got) = (decode(&sent), decode(&stored));
        // Quorum queues deliver messages of priority above 4 first (tests/amqp10_client.rs):
        // each stored message is matched with an equal one sent, each sent one used once.
        let mut used = [false; N];
        for (i, g) in got.iter().enumerate() {
            let r = &recs[i];
            assert_eq!(r.message_format, Some(MessageFormat::Amqp10));
            assert_eq!((r.exchange.as_str(), r.routing_key.as_str()), ("", queue));
            assert_eq!(r.delivery_tag, i as u64 + 1);
            assert!(r.headers.is_empty());
            // Delivery annotations are for one hop: the broker does not keep them.
            let as_kept = |w: &Json| {
                let mut w = w.clone();
                w["instructions"] = Json::String("None".into());
                // RabbitMQ 4.0 delivers every message as durable (measured on 4.0.5: a
                // message sent without a header comes to any AMQP 1.0 consumer with durable
                // true), so its consumers see it so before and after a restore alike.
                if broker().version < (4, 3) {
                    w["durable"] = Json::String("True".into());
                }
                w
            };
            let j = (0..N)
                .find(|&j| !used[j] && as_kept(&want[j]) == *g)
                .unwrap_or_else(|| {
                    panic!("{queue}: stored message {i} is none of those sent: {g}")
                });
            used[j] = true;
            assert_eq!(
                bare(&r.body),
                bare(&unhex(&sent[j])),
                "{queue}: message {i}'s bare message byte for byte"
            );
        }
        let conn = vh.connect();
        assert_eq!(
            depth(&conn, queue) as usize,
            N,
            "{queue} whole after the backup"
        );
        let after = counts(&vh.name, queue, N);
        let (by_proton, by_backup) = (added(&first, &before), added(&before, &after));
        eprintln!(
            "{queue} on {}.{}: one Proton read added {by_proton:?}, the backup and one Proton read {by_backup:?}",
            broker().version.0,
            broker().version.1
        );
        if broker().version >= (4, 3) {
            assert_eq!(
                by_backup, by_proton,
                "{queue}: the backup changed no count on 4.3"
            );
        } else if queue.starts_with('q') {
            // 4.0-4.2: the give-back counts once, in x-delivery-count (the header's stays).
            let once: Vec<_> = by_proton.iter().map(|(h, x)| (*h, x + 1)).collect();
            assert_eq!(by_backup, once, "{queue}: the backup counted once on 4.0");
        }
    }
}

#[test]
fn thirty_nightly_backups_of_a_quorum_queue_change_nothing() {
    if !is_4x() || broker().version < (4, 3) {
        eprintln!("skipped: RabbitMQ 4.3 or later gives back without counting");
        return;
    }
    let vh = TestVhost::new("amqp10-nightly");
    {
        let conn = vh.connect();
        let ch = conn.open_channel().unwrap();
        declare(&ch, "q-n", "quorum", FieldTable::new());
    }
    let sent = proton(&["publish", &vh.name, "/queues/q-n", "3", "5"]);
    let first = counts(&vh.name, "q-n", 3);
    let before = counts(&vh.name, "q-n", 3);
    let raw_before = proton(&["receive", &vh.name, "/queues/q-n", "3", "release"]);
    let dir = TempDir::new("amqp10-nightly");
    let store = dir.path().join("store");
    for night in 0..30 {
        backup(dir.path(), &store, &vh, &format!("night-{night}"));
    }
    let last = records(&store, "night-29", "q-n");
    assert_eq!(last.len(), 3);
    for (r, s) in last.iter().zip(&sent) {
        assert_eq!(bare(&r.body), bare(&unhex(s)));
    }
    let after = counts(&vh.name, "q-n", 3);
    // Two Proton reads since `before` (raw_before's and after's own), nothing else.
    let two: Vec<_> = added(&first, &before)
        .iter()
        .map(|(h, x)| (2 * h, 2 * x))
        .collect();
    assert_eq!(
        added(&before, &after),
        two,
        "delivery counts after 30 backups"
    );
    let raw_after = proton(&["receive", &vh.name, "/queues/q-n", "3", "release"]);
    let bares = |l: &[String]| -> Vec<Vec<u8>> {
        l.iter()
            .map(|j| {
                let v: Json = serde_json::from_str(j).unwrap();
                bare(&unhex(v["raw"].as_str().unwrap()))
            })
            .collect()
    };
    assert_eq!(
        bares(&raw_after),
        bares(&raw_before),
        "messages as they were, in order"
    );
}
