//! Messages published by AMQP 1.0 clients come back whole (issue 39): Apache Qpid Proton
//! (`tests/amqp10_support/proton_restore.py`, Debian's python3-qpid-proton, not our code)
//! publishes messages covering every AMQP 1.0 section and simple type, the tool backs them up
//! over AMQP 1.0 (`backup.amqp10_queues`) and restores them over AMQP 1.0
//! (`src/broker/publisher/amqp10.rs`), and proton reads them back: every section, with the
//! AMQP type of every value, is what it sent, and what the original queue delivered.
//!
//! The tests named `hand_written_*` (and the kill, mixed-kind, time-window and 3.x tests) use
//! records written by hand from proton's encoding in segment format version 2: the stepping
//! stone before the backup's AMQP 1.0 read, kept for what a backup cannot produce (a queue
//! mixing both kinds, a broker older than 4.0) and for the wall-time comparison.
//!
//! Against the broker under test (`RMQ_TEST_BROKER`: 4.3 by default, 4.0); nothing to do on
//! 3.x (no AMQP 1.0 core).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::checkpoint::{Checkpoints, RestoreKey};
use serde_json::Value as Json;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

/// The backup configuration's lines that read `queues` over AMQP 1.0.
fn amqp10_backup(queues: &[&str]) -> String {
    let list: Vec<String> = queues.iter().map(|q| format!("\"{q}\"")).collect();
    format!(
        "  segment_version: 2\n  amqp10_queues: [{}]\n",
        list.join(", ")
    )
}

/// Runs `proton_restore.py`; its stdout lines.
fn proton(args: &[&str]) -> Vec<String> {
    proton::run_script("proton_restore.py", args)
}

/// One message as proton describes it: its typed sections and its bare message.
#[derive(Debug, Clone, PartialEq)]
struct Described {
    sections: Vec<(u64, Json)>,
    bare: String,
}

fn parse(line: &str) -> Described {
    let v: Json = serde_json::from_str(line).expect("proton JSON");
    let sections = v["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .map(|s| (s[0].as_u64().expect("descriptor"), s[1].clone()))
        .collect();
    Described {
        sections,
        bare: v["bare"].as_str().expect("bare").to_string(),
    }
}

fn publish_set(vhost: &str, address: &str) -> Vec<Described> {
    proton(&["publish", vhost, address])
        .iter()
        .map(|l| parse(l))
        .collect()
}

fn read(vhost: &str, queue: &str, n: usize) -> Vec<Described> {
    let address = format!("/queues/{queue}");
    proton(&["read", vhost, &address, &n.to_string()])
        .iter()
        .map(|l| parse(l))
        .collect()
}

const HEADER: u64 = 0x70;
const MESSAGE_ANNOTATIONS: u64 = 0x72;
const PROPERTIES: u64 = 0x73;

/// A delivery without the broker's delivery state: the header's `first-acquirer` and
/// `delivery-count` (its fields 3 and 4) left out.
fn without_delivery_state(d: &Described) -> Described {
    let mut d = d.clone();
    for (code, v) in &mut d.sections {
        if *code == HEADER {
            if let Some(fields) = v[1].as_array_mut() {
                fields.truncate(3);
            }
        }
    }
    d
}

/// A delivery of a source queue after its backup without the counts of the backup's read:
/// the broker's `x-acquired-count` and `x-delivery-count` message annotations (a quorum
/// queue's, on 4.3 the acquisition the read made and gave back; the restored copies start
/// without them, which [`assert_as_sent`] checks).
fn without_read_counts(ds: Vec<Described>) -> Vec<Described> {
    ds.into_iter()
        .map(|mut d| {
            for (code, v) in &mut d.sections {
                if *code == MESSAGE_ANNOTATIONS {
                    if let Some(pairs) = v[1].as_array_mut() {
                        pairs.retain(|p| {
                            let key = p[0][1].as_str().unwrap_or_default();
                            key != "x-acquired-count" && key != "x-delivery-count"
                        });
                    }
                }
            }
            d
        })
        .collect()
}

fn section(d: &Described, code: u64) -> Option<&Json> {
    d.sections.iter().find(|(c, _)| *c == code).map(|(_, v)| v)
}

fn pairs(map: &Json) -> Vec<(Json, Json)> {
    map[1]
        .as_array()
        .expect("map pairs")
        .iter()
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

/// Each message `sent` was delivered as `got` (matched by the bare message): the bare
/// message's sections identical, with their types; the header's fields the publisher set
/// identical; every message annotation the publisher set there with its type, and besides
/// them only the broker's `x-exchange` and `x-routing-key`.
fn assert_as_sent(sent: &[Described], got: &[Described], what: &str) {
    assert_eq!(got.len(), sent.len(), "{what}: count");
    for (i, s) in sent.iter().enumerate() {
        let matching: Vec<&Described> = got.iter().filter(|g| g.bare == s.bare).collect();
        assert_eq!(
            matching.len(),
            1,
            "{what}: message {i} sent, its bare message delivered {} times",
            matching.len()
        );
        let g = matching[0];
        let bare = |d: &Described| -> Vec<(u64, Json)> {
            d.sections
                .iter()
                .filter(|(c, _)| *c >= PROPERTIES)
                .cloned()
                .collect()
        };
        assert_eq!(
            bare(g),
            bare(s),
            "{what}: message {i}: bare message sections"
        );
        if let Some(h) = section(s, HEADER) {
            let sent_fields = h[1].as_array().expect("header list");
            let got_fields = section(g, HEADER).expect("a header")[1]
                .as_array()
                .expect("header list")
                .clone();
            assert_eq!(
                &got_fields[..sent_fields.len()],
                &sent_fields[..],
                "{what}: message {i}: header"
            );
        }
        let got_ann = section(g, MESSAGE_ANNOTATIONS)
            .map(pairs)
            .unwrap_or_default();
        let sent_ann = section(s, MESSAGE_ANNOTATIONS)
            .map(pairs)
            .unwrap_or_default();
        for a in &sent_ann {
            assert!(
                got_ann.contains(a),
                "{what}: message {i}: annotation {a:?} not in {got_ann:?}"
            );
        }
        for a in &got_ann {
            let key = a.0[1].as_str().unwrap_or_default();
            assert!(
                sent_ann.contains(a) || key == "x-exchange" || key == "x-routing-key",
                "{what}: message {i}: annotation {a:?} added"
            );
        }
    }
}

fn assert_same_deliveries(a: &[Described], b: &[Described], what: &str) {
    let a: Vec<Described> = a.iter().map(without_delivery_state).collect();
    let b: Vec<Described> = b.iter().map(without_delivery_state).collect();
    assert_eq!(a.len(), b.len(), "{what}: count");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "{what}: delivery {i}");
    }
}

fn restore_cfg(
    dir: &TempDir,
    name: &str,
    id: &str,
    store: &std::path::Path,
    restore: &str,
) -> String {
    write_config(dir.path(), name, &restore_yaml(id, store, restore))
}

fn create_vhost(name: &str) {
    let m = management();
    let _ = m.delete_vhost(name);
    m.create_vhost(name).expect("create vhost");
    m.set_permissions(name, "guest").expect("permissions");
}

#[test]
fn amqp10_messages_come_back_whole_into_another_vhost_and_the_same_one() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-whole");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let queues = ["a10-classic", "a10-quorum"];
    declare(&ch, queues[0], "classic", FieldTable::new());
    declare(&ch, queues[1], "quorum", FieldTable::new());
    let sent: Vec<Vec<Described>> = queues
        .iter()
        .map(|q| publish_set(&vh.name, &format!("/queues/{q}")))
        .collect();
    let n = sent[0].len();

    let dir = TempDir::new("a10-whole");
    let store = dir.path().join("store");
    let id = "a10";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, &amqp10_backup(&queues)),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Into another vhost (vhost mapping), the queues created by the restore.
    let mapped = vh.sibling("mapped");
    create_vhost(&mapped);
    let cfg = restore_cfg(
        &dir,
        "r1.yaml",
        id,
        &store,
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{mapped}\"\n",
            vh.name
        ),
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let into_mapped: Vec<Vec<Described>> = queues.iter().map(|q| read(&mapped, q, n)).collect();

    // What the original queues deliver (taking their messages), then into them again.
    let original: Vec<Vec<Described>> = queues
        .iter()
        .map(|q| without_read_counts(read(&vh.name, q, n)))
        .collect();
    for q in queues {
        ch.queue_purge(q).unwrap();
    }
    let cfg = restore_cfg(
        &dir,
        "r2.yaml",
        id,
        &store,
        "  publish_mode: direct-to-queue\n  restore_definitions: false\n",
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let into_same: Vec<Vec<Described>> = queues.iter().map(|q| read(&vh.name, q, n)).collect();

    for (i, q) in queues.iter().enumerate() {
        assert_as_sent(&sent[i], &original[i], &format!("{q}: the original queue"));
        assert_as_sent(
            &sent[i],
            &into_mapped[i],
            &format!("{q}: restored into {mapped}"),
        );
        assert_as_sent(
            &sent[i],
            &into_same[i],
            &format!("{q}: restored into the same vhost"),
        );
        assert_same_deliveries(&original[i], &into_mapped[i], &format!("{q}: mapped vhost"));
        assert_same_deliveries(&original[i], &into_same[i], &format!("{q}: same vhost"));
    }
    assert_eq!(depth(&conn, queues[0]) + depth(&conn, queues[1]), 0);
}

/// `queue`'s depth once it holds still (the broker may still be taking in what a killed
/// client sent): the same count three times, 500 ms apart, within 60 s.
fn settled_depth(conn: &rmq_backup::broker::amqp::Connection, queue: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u32::MAX, 0);
    loop {
        let d = depth(conn, queue);
        last = if d == last.0 { (d, last.1 + 1) } else { (d, 0) };
        if last.1 == 2 {
            return u64::from(d);
        }
        assert!(Instant::now() < deadline, "queue {queue} never held still");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `queue`'s depth now (0 while it does not exist).
fn quick_depth(conn: &rmq_backup::broker::amqp::Connection, queue: &str) -> u64 {
    let ch = conn.open_channel().expect("channel");
    let n = ch
        .queue_declare_passive(queue)
        .map_or(0, |ok| u64::from(ok.message_count));
    let _ = ch.close();
    n
}

/// The application property `i` of each delivery, in order.
fn seq_of(ds: &[Described]) -> Vec<i64> {
    ds.iter()
        .map(|d| {
            let props = section(d, 0x74).expect("application properties");
            let (_, v) = pairs(props)
                .into_iter()
                .find(|(k, _)| k[1] == "i")
                .expect("property i");
            v[1].as_str().and_then(|s| s.parse().ok()).expect("i")
        })
        .collect()
}

/// Records per queue of the kill tests, and their window (`produce_batch_size` 20 × 10).
const KILL_N: u64 = 8000;
const BATCH: u64 = 20;
const WINDOW: u64 = BATCH * 10;

#[test]
fn a_killed_amqp10_restore_rerun_delivers_every_message_in_order_with_at_most_a_window_again() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-kill");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let q = "a10-kill";
    declare(&ch, q, "quorum", FieldTable::new());
    proton(&[
        "bulk",
        &vh.name,
        &format!("/queues/{q}"),
        &KILL_N.to_string(),
        "1024",
    ]);
    let dir = TempDir::new("a10-kill");
    let store = dir.path().join("store");
    let id = "a10k";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, &amqp10_backup(&[q])),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    kill_twice_and_rerun(&vh, q, &dir, &store, id);
}

/// Stepping stone of the test above: the records written by hand from proton's encoding.
#[test]
fn a_killed_restore_of_hand_written_amqp10_records_publishes_again_at_most_a_window() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-hkill");
    let q = "a10-hkill";
    let dir = TempDir::new("a10-hkill");
    let store = dir.path().join("store");
    let messages = proton(&["encode", &vh.name, "-", &KILL_N.to_string(), "1024"])
        .iter()
        .map(|h| (String::new(), q.to_string(), unhex(h)))
        .collect();
    hand_backup(&store, "hk", &vh.name, &[(q, "quorum", messages)]);
    kill_twice_and_rerun(&vh, q, &dir, &store, "hk");
}

/// Restores `q` of backup `id` (KILL_N records) into the vhost `target` of `vh`, killed twice
/// with SIGKILL and run again to the end with its checkpoint: each killed run leaves at most
/// a window to publish again, and proton reads every message, in order, the ones published
/// past each checkpoint twice.
fn kill_twice_and_rerun(vh: &TestVhost, q: &str, dir: &TempDir, store: &std::path::Path, id: &str) {
    let target = vh.sibling("target");
    create_vhost(&target);
    let tconn = connect(&target);
    let state = dir.path().join("restore.db");
    let restore = |name: &str, extra: &str| {
        restore_cfg(
            dir,
            name,
            id,
            store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  produce_batch_size: {BATCH}\n  checkpoint_state: \"{}\"\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{extra}",
                state.display(),
                v = vh.name
            ),
        )
    };
    let key = RestoreKey {
        backup_id: id.into(),
        source_vhost: vh.name.clone(),
        source_queue: q.into(),
        target_vhost: target.clone(),
        target_queue: q.into(),
    };
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let (mut held, mut recorded) = (0u64, 0u64);
    // Killed once the target holds `more` messages more than before: under a rate limit
    // (confirms keep up), then at full speed (the window fills and waits).
    for (n, (more, extra)) in [(1000, "  rate_limit_messages_per_sec: 1000\n"), (1500, "")]
        .iter()
        .enumerate()
    {
        let cfg = restore(&format!("r{n}.yaml"), extra);
        let (mut child, lines) = spawn_cli(&["restore", "--config", &cfg], &[]);
        wait_line(&lines, ": restoring");
        let deadline = Instant::now() + Duration::from_secs(60);
        while quick_depth(&tconn, q) < held + more {
            assert!(
                Instant::now() < deadline,
                "run {n}: the restore did not get on"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(9), "run {n} killed");
        let now_held = settled_depth(&tconn, q);
        let published = now_held - held;
        let cp = Checkpoints::open_file(&state).unwrap();
        let (now_recorded, _) = cp.restore_queue(&key).unwrap().unwrap_or((0, false));
        let reached = recorded + published;
        println!("run {n}: {published} published (records {recorded}..{reached}), checkpoint at {now_recorded}: {} to publish again", reached - now_recorded);
        assert!(
            now_recorded <= reached,
            "the checkpoint is past what reached the broker"
        );
        assert!(
            reached - now_recorded <= WINDOW,
            "{} records to publish again, more than the window of {WINDOW}",
            reached - now_recorded
        );
        runs.push((recorded, reached));
        held = now_held;
        recorded = now_recorded;
    }
    let out = run_cli(&["restore", "--config", &restore("last.yaml", "")]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    runs.push((recorded, KILL_N));
    let expected: Vec<i64> = runs
        .iter()
        .flat_map(|&(from, to)| from as i64..to as i64)
        .collect();
    let total = settled_depth(&tconn, q) as usize;
    let got = seq_of(&read(&target, q, total));
    println!(
        "runs {runs:?}: {} delivered, {} twice",
        got.len(),
        got.len() as u64 - KILL_N
    );
    assert_eq!(got.len(), expected.len(), "{runs:?}");
    assert!(got == expected, "out of order or missing: runs {runs:?}");
}

const EX: &str = "a10-ex";
const BOUND: &str = "a10-bound";
const RK: &str = "route.key";

/// Declares in `vhost` the direct exchange `EX` and the quorum queue `BOUND`, bound with `RK`
/// when `with_binding`.
fn exchange_and_queue(vhost: &str, with_binding: bool) {
    let c = connect(vhost);
    let ch = c.open_channel().unwrap();
    ch.exchange_declare(EX, "direct", true, false, &FieldTable::new())
        .unwrap();
    declare(&ch, BOUND, "quorum", FieldTable::new());
    if with_binding {
        ch.queue_bind(BOUND, EX, RK, &FieldTable::new()).unwrap();
    }
}

#[test]
fn amqp10_records_restore_through_an_exchange_and_unroutable_ones_fail() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-exchange");
    exchange_and_queue(&vh.name, true);
    let sent = publish_set(&vh.name, &format!("/exchanges/{EX}/{RK}"));
    let dir = TempDir::new("a10-exchange");
    let store = dir.path().join("store");
    let id = "a10x";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, &amqp10_backup(&[BOUND])),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let restored = restore_through_the_exchange(&vh, &dir, &store, id, &sent);
    let original = without_read_counts(read(&vh.name, BOUND, sent.len()));
    assert_as_sent(&sent, &original, "the original queue");
    assert_same_deliveries(&original, &restored, "restored through the exchange");
}

/// Stepping stone of the test above: the records written by hand from proton's encoding.
#[test]
fn hand_written_amqp10_records_restore_through_an_exchange_and_unroutable_ones_fail() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-hexchange");
    let (sent, raw) = proton_encoded(&vh.name);
    let dir = TempDir::new("a10-hexchange");
    let store = dir.path().join("store");
    let messages = raw
        .into_iter()
        .map(|m| (EX.to_string(), RK.to_string(), m))
        .collect();
    hand_backup(&store, "hx", &vh.name, &[(BOUND, "quorum", messages)]);
    restore_through_the_exchange(&vh, &dir, &store, "hx", &sent);
}

/// Restores backup `id` (queue `BOUND` of `vh`, the messages `sent` through `EX` with `RK`) in
/// `publish_mode: exchange` into the vhost `mapped`, where the exchange routes them to the
/// queue, and checks what proton reads there (returned); then into the vhost `target`, where
/// nothing is bound: the broker releases every message and the restore fails as for
/// unroutable AMQP 0-9-1 messages, naming the address.
fn restore_through_the_exchange(
    vh: &TestVhost,
    dir: &TempDir,
    store: &std::path::Path,
    id: &str,
    sent: &[Described],
) -> Vec<Described> {
    let n = sent.len();
    let mapped = vh.sibling("mapped");
    create_vhost(&mapped);
    exchange_and_queue(&mapped, true);
    let exchange_mode = |name: &str, target: &str| {
        restore_cfg(
            dir,
            name,
            id,
            store,
            &format!(
                "  publish_mode: exchange\n  restore_definitions: false\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                vh.name
            ),
        )
    };
    let out = run_cli(&["restore", "--config", &exchange_mode("r1.yaml", &mapped)]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let restored = read(&mapped, BOUND, n);
    assert_as_sent(sent, &restored, "restored through the exchange");
    for d in &restored {
        let ann = pairs(section(d, MESSAGE_ANNOTATIONS).expect("annotations"));
        assert!(
            ann.iter().any(|(k, v)| k[1] == "x-exchange" && v[1] == EX),
            "{ann:?}"
        );
    }

    let unbound = vh.sibling("target");
    create_vhost(&unbound);
    exchange_and_queue(&unbound, false);
    let out = run_cli(&["restore", "--config", &exchange_mode("r2.yaml", &unbound)]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "AMQP error: {n} message(s) were not accepted by the target broker"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "message released by the target (no queue took it) at /exchanges/{EX}/route.key"
        )),
        "{stderr}"
    );
    assert_eq!(depth(&connect(&unbound), BOUND), 0);
    restored
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The publisher behind the restore (`rmq_backup::broker::publisher::amqp10`) sends proton's
/// own encoding of each message; proton reads back what it sent (through a queue address and
/// an exchange address), and the broker's `released` for an unroutable message comes back as
/// a refusal naming the address.
#[test]
fn the_amqp10_publisher_sends_what_proton_encoded_and_reports_refusals() {
    use rmq_backup::broker::amqp10::ConnectOptions;
    use rmq_backup::broker::publisher::amqp10::Amqp10Publisher;
    use rmq_backup::broker::publisher::{Payload, Publisher, Target};
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-publisher");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let (ex, q) = ("a10-pub-ex", "a10-pub");
    declare(&ch, q, "classic", FieldTable::new());
    ch.exchange_declare(ex, "direct", true, false, &FieldTable::new())
        .unwrap();
    ch.queue_bind(q, ex, "k", &FieldTable::new()).unwrap();
    // Proton's encoding of the set, taken from a queue of its own.
    let scratch = "a10-scratch";
    declare(&ch, scratch, "classic", FieldTable::new());
    let lines = proton(&["publish", &vh.name, &format!("/queues/{scratch}")]);
    let sent: Vec<Described> = lines.iter().map(|l| parse(l)).collect();
    let raw: Vec<Vec<u8>> = lines
        .iter()
        .map(|l| {
            let v: Json = serde_json::from_str(l).unwrap();
            unhex(v["raw"].as_str().unwrap())
        })
        .collect();
    let url = rmq_backup::broker::amqp::AmqpUrl::parse(&amqp_url(&vh.name)).unwrap();
    let mut p = Amqp10Publisher::open(&ConnectOptions::new(url)).unwrap();
    for (i, m) in raw.iter().enumerate() {
        let target = if i % 2 == 0 {
            Target {
                exchange: "",
                routing_key: q,
            }
        } else {
            Target {
                exchange: ex,
                routing_key: "k",
            }
        };
        p.publish(target, Payload::Amqp10(m)).unwrap();
    }
    p.publish(
        Target {
            exchange: ex,
            routing_key: "nowhere",
        },
        Payload::Amqp10(&raw[0]),
    )
    .unwrap();
    let settled = p.settle(0, Duration::from_secs(60)).unwrap();
    assert_eq!(settled.unsettled, 0);
    assert_eq!(settled.nacked, 0);
    assert_eq!(
        settled.refused,
        vec![format!(
            "message released by the target (no queue took it) at /exchanges/{ex}/nowhere"
        )]
    );
    assert_eq!(p.outstanding(), 0);
    p.close().unwrap();
    let got = read(&vh.name, q, raw.len());
    let bare = |d: &[Described]| d.iter().map(|x| x.bare.clone()).collect::<Vec<_>>();
    assert_eq!(bare(&got), bare(&sent), "in order, byte for byte");
    assert_as_sent(&sent, &got, "published by the tool's AMQP 1.0 publisher");
}

/// Proton's encoding of its message set (what it sends), published to a scratch queue of
/// `vhost` that is deleted after.
fn proton_encoded(vhost: &str) -> (Vec<Described>, Vec<Vec<u8>>) {
    let scratch = "a10-scratch";
    let conn = connect(vhost);
    let ch = conn.open_channel().unwrap();
    declare(&ch, scratch, "classic", FieldTable::new());
    let lines = proton(&["publish", vhost, &format!("/queues/{scratch}")]);
    ch.queue_delete(scratch).unwrap();
    let raw = lines
        .iter()
        .map(|l| {
            let v: Json = serde_json::from_str(l).unwrap();
            unhex(v["raw"].as_str().unwrap())
        })
        .collect();
    (lines.iter().map(|l| parse(l)).collect(), raw)
}

/// A queue of [`hand_backup`]: name, type, and its messages; a message that is not an AMQP 1.0
/// message (whose first section is not a described type: 0x00 0x53) is written as the body of
/// an AMQP 0-9-1 record without properties (exchange, routing key, AMQP 1.0
/// message).
type HandQueue<'a> = (&'a str, &'a str, Vec<(String, String, Vec<u8>)>);

/// A backup written by hand as docs/segment-format.md describes version 2: one uncompressed
/// segment per queue whose records hold `messages` (exchange, routing key, AMQP 1.0 message)
/// with `message_format: amqp-1.0`. The stepping stone before the backup's own AMQP 1.0
/// read; the bench of the restore uses it too.
fn hand_backup(store: &std::path::Path, id: &str, vhost: &str, queues: &[HandQueue]) {
    use sha2::Digest;
    let at = 1_700_000_000_000i64;
    let mut entries = Vec::new();
    let mut total = 0usize;
    for (name, kind, messages) in queues {
        let mut payload = Vec::new();
        for (i, (exchange, routing_key, body)) in messages.iter().enumerate() {
            let meta = serde_json::json!({
                "properties": {"content_type": null, "content_encoding": null,
                    "delivery_mode": null, "priority": null, "correlation_id": null,
                    "reply_to": null, "expiration": null, "message_id": null, "timestamp": null,
                    "type_field": null, "user_id": null, "app_id": null, "cluster_id": null},
                "headers": [], "exchange": exchange, "routing_key": routing_key,
                "delivery_tag": i + 1, "redelivered": false, "backed_up_at": at + i as i64,
                "source_queue": name, "source_vhost": vhost, "message_format": "amqp-1.0"
            });
            let mut meta = meta;
            if !body.starts_with(&[0x00, 0x53]) {
                meta.as_object_mut().unwrap().remove("message_format");
            }
            let meta = meta.to_string();
            payload.extend_from_slice(&(meta.len() as u32).to_le_bytes());
            payload.extend_from_slice(meta.as_bytes());
            payload.extend_from_slice(&(body.len() as u32).to_le_bytes());
            payload.extend_from_slice(body);
        }
        let mut file = b"RBAK".to_vec();
        file.extend_from_slice(&[2, 0, 0, 0]);
        file.extend_from_slice(&(messages.len() as u64).to_le_bytes());
        let last = at + messages.len().saturating_sub(1) as i64;
        file.extend_from_slice(&at.to_le_bytes());
        file.extend_from_slice(&last.to_le_bytes());
        file.extend_from_slice(&payload);
        let crc = crc32fast::hash(&file);
        file.extend_from_slice(&crc.to_le_bytes());
        file.extend_from_slice(b"KABR");
        let key = format!("{id}/queues/{vhost}/{name}/segment-0001");
        std::fs::create_dir_all(store.join(&key).parent().unwrap()).unwrap();
        std::fs::write(store.join(&key), &file).unwrap();
        total += file.len();
        entries.push(serde_json::json!({
            "vhost": vhost, "name": name, "queue_type": kind,
            "segments": [{
                "key": key, "sequence": 1, "record_count": messages.len(),
                "size_bytes": file.len(), "uncompressed_bytes": payload.len(),
                "first_timestamp": at, "last_timestamp": last,
                "checksum": rmq_backup::repository::segment::hex_lower(&sha2::Sha256::digest(&file)),
                "segment_version": 2
            }],
            "message_count": messages.len(),
            "first_message_timestamp": at, "last_message_timestamp": last
        }));
    }
    let n: usize = queues.iter().map(|q| q.2.len()).sum();
    let manifest = serde_json::json!({
        "backup_id": id, "created_at": at, "completed_at": at + 1, "source_cluster": null,
        "broker_version": null, "backup_tool_version": "by hand", "definitions": null,
        "queues": entries, "total_messages": n, "total_bytes": total,
        "total_segments": queues.len()
    });
    std::fs::create_dir_all(store.join(id)).unwrap();
    std::fs::write(
        store.join(id).join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

/// Stepping stone (records written by hand from proton's bytes): restored into a classic and
/// a quorum queue, proton reads back every section as it sent it.
#[test]
fn hand_written_amqp10_records_restore_as_proton_sent_them() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-hand");
    let (sent, raw) = proton_encoded(&vh.name);
    let queues = [("h-classic", "classic"), ("h-quorum", "quorum")];
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for (q, kind) in queues {
        declare(&ch, q, kind, FieldTable::new());
    }
    let dir = TempDir::new("a10-hand");
    let store = dir.path().join("store");
    let with = |q: &str| -> Vec<(String, String, Vec<u8>)> {
        raw.iter()
            .map(|m| (String::new(), q.to_string(), m.clone()))
            .collect()
    };
    hand_backup(
        &store,
        "hand",
        &vh.name,
        &[
            (queues[0].0, queues[0].1, with(queues[0].0)),
            (queues[1].0, queues[1].1, with(queues[1].0)),
        ],
    );
    let cfg = restore_cfg(
        &dir,
        "r.yaml",
        "hand",
        &store,
        "  publish_mode: exchange\n  restore_definitions: false\n",
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let same: Vec<Vec<Described>> = queues
        .iter()
        .map(|(q, _)| read(&vh.name, q, sent.len()))
        .collect();
    // Into another vhost (vhost mapping), the queues created by the restore.
    let mapped = vh.sibling("mapped");
    create_vhost(&mapped);
    let cfg = restore_cfg(
        &dir,
        "r2.yaml",
        "hand",
        &store,
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{mapped}\"\n",
            vh.name
        ),
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    for (i, (q, _)) in queues.iter().enumerate() {
        let other = read(&mapped, q, sent.len());
        assert_as_sent(&sent, &same[i], q);
        assert_as_sent(&sent, &other, &format!("{q} in {mapped}"));
        assert_same_deliveries(&same[i], &other, q);
    }
}

/// On a broker older than 4.0 (`RMQ_TEST_BROKER=3.10`), records of AMQP 1.0 messages are
/// refused before anything of their queue is published, naming the queue and the version.
#[test]
fn amqp10_records_into_a_broker_older_than_4_0_fail_before_publishing() {
    if broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-old");
    let q = "a10-old";
    declare(
        &vh.connect().open_channel().unwrap(),
        q,
        "classic",
        FieldTable::new(),
    );
    let dir = TempDir::new("a10-old");
    let store = dir.path().join("store");
    let messages = proton(&["encode", &vh.name, "-", "5", "16"])
        .iter()
        .map(|h| (String::new(), q.to_string(), unhex(h)))
        .collect();
    hand_backup(&store, "old", &vh.name, &[(q, "classic", messages)]);
    let cfg = restore_cfg(
        &dir,
        "r.yaml",
        "old",
        &store,
        "  publish_mode: direct-to-queue\n  restore_definitions: false\n",
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let version = {
        let v = version_of(&vh.connect());
        format!("RabbitMQ {}.{}.", v.0, v.1)
    };
    assert!(
        stderr.contains(&format!(
            "AMQP error: queue {q} in vhost {}: its records are AMQP 1.0 messages",
            vh.name
        )) && stderr.contains(&version)
            && stderr.contains("nothing of this queue was published"),
        "{stderr}"
    );
    assert_eq!(depth(&vh.connect(), q), 0);
}

/// The restore of 10,000 records of 1 KiB messages: AMQP 1.0 records (proton's encoding, over
/// AMQP 1.0) against AMQP 0-9-1 records of 1 KiB bodies (over AMQP 0-9-1), each written by
/// hand uncompressed, into a classic queue; wall time of `rmq-backup restore`, three runs
/// each, alternated. `cargo test --test amqp10_restore restore_wall_time -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn restore_wall_time_amqp10_against_amqp091() {
    const N: usize = 10_000;
    let vh = TestVhost::new("a10-bench");
    let dir = TempDir::new("a10-bench");
    let store = dir.path().join("store");
    let m10: Vec<(String, String, Vec<u8>)> =
        proton(&["encode", &vh.name, "-", &N.to_string(), "1024"])
            .iter()
            .map(|h| (String::new(), "b10".to_string(), unhex(h)))
            .collect();
    let m091: Vec<(String, String, Vec<u8>)> = (0..N)
        .map(|i| {
            (
                String::new(),
                "b091".to_string(),
                vec![(i % 251) as u8; 1024],
            )
        })
        .collect();
    hand_backup(&store, "b10", &vh.name, &[("b10", "classic", m10)]);
    hand_backup(&store, "b091", &vh.name, &[("b091", "classic", m091)]);
    let conn = vh.connect();
    for round in 0..3 {
        for (id, q) in [("b10", "b10"), ("b091", "b091")] {
            let ch = conn.open_channel().unwrap();
            let _ = ch.queue_delete(q);
            declare(&ch, q, "classic", FieldTable::new());
            let cfg = restore_cfg(
                &dir,
                &format!("{id}.yaml"),
                id,
                &store,
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n",
            );
            let started = Instant::now();
            let out = run_cli(&["restore", "--config", &cfg]);
            let took = started.elapsed();
            assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
            assert_eq!(depth(&conn, q) as usize, N);
            println!(
                "round {round}: {id}: {N} records restored in {:.2} s",
                took.as_secs_f64()
            );
        }
    }
}

/// A queue whose records mix both kinds (runs of AMQP 0-9-1 and AMQP 1.0 records, written by
/// hand) is restored in record order, in both publish modes' default-exchange case, with a
/// window smaller than a run: proton reads every message in order, AMQP 1.0 ones with their
/// sections, AMQP 0-9-1 ones as their bodies.
#[test]
fn a_queue_mixing_both_kinds_of_records_keeps_their_order() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-mixed");
    let q = "a10-mixed";
    declare(
        &vh.connect().open_channel().unwrap(),
        q,
        "quorum",
        FieldTable::new(),
    );
    let dir = TempDir::new("a10-mixed");
    let store = dir.path().join("store");
    let encoded = proton(&["encode", &vh.name, "-", "600", "64"]);
    // Runs of 1, 7, 50, 120 and 300 records, alternating kinds.
    let mut messages = Vec::new();
    let mut i = 0usize;
    for (n, run) in [1usize, 7, 50, 120, 300, 1, 121].iter().enumerate() {
        for _ in 0..*run {
            let body = if n % 2 == 0 {
                unhex(&encoded[i])
            } else {
                format!("091 record {i}").into_bytes()
            };
            messages.push((String::new(), q.to_string(), body));
            i += 1;
        }
    }
    let total = messages.len();
    hand_backup(&store, "mixed", &vh.name, &[(q, "quorum", messages)]);
    let cfg = restore_cfg(
        &dir,
        "r.yaml",
        "mixed",
        &store,
        "  publish_mode: exchange\n  restore_definitions: false\n  produce_batch_size: 3\n",
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let got = read(&vh.name, q, total);
    let order: Vec<i64> = got
        .iter()
        .map(|d| match section(d, 0x74) {
            Some(props) => pairs(props)
                .into_iter()
                .find(|(k, _)| k[1] == "i")
                .and_then(|(_, v)| v[1].as_str().and_then(|s| s.parse().ok()))
                .expect("i"),
            None => {
                let data = section(d, 0x75).expect("a data section");
                let text = String::from_utf8(unhex(data[1].as_str().unwrap())).unwrap();
                text.strip_prefix("091 record ").unwrap().parse().unwrap()
            }
        })
        .collect();
    assert_eq!(order, (0..total as i64).collect::<Vec<_>>());
}

/// The time window and the dry run treat AMQP 1.0 records as AMQP 0-9-1 ones: a dry run
/// publishes nothing; a window of records 2 to 4 (their `backed_up_at`) restores those three,
/// and the summary counts them and the five left out.
#[test]
fn amqp10_records_follow_the_time_window_and_the_dry_run() {
    if !broker().is_4x() {
        return;
    }
    let vh = TestVhost::new("a10-window");
    let q = "a10-window";
    let conn = vh.connect();
    declare(
        &conn.open_channel().unwrap(),
        q,
        "classic",
        FieldTable::new(),
    );
    let (sent, raw) = proton_encoded(&vh.name);
    let dir = TempDir::new("a10-window");
    let store = dir.path().join("store");
    let messages = raw
        .into_iter()
        .map(|m| (String::new(), q.to_string(), m))
        .collect();
    hand_backup(&store, "win", &vh.name, &[(q, "classic", messages)]);
    let base = "  publish_mode: direct-to-queue\n  restore_definitions: false\n";
    let out = run_cli(&[
        "restore",
        "--config",
        &restore_cfg(
            &dir,
            "dry.yaml",
            "win",
            &store,
            &format!("{base}  dry_run: true\n"),
        ),
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(depth(&conn, q), 0);
    let window = "  time_window_start: 1700000000002\n  time_window_end: 1700000000004\n";
    let out = run_cli(&[
        "restore",
        "--config",
        &restore_cfg(&dir, "w.yaml", "win", &store, &format!("{base}{window}")),
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    println!("{stdout}\n{stderr}");
    assert!(
        stderr.contains("3 published, 3 confirmed, 0 failed, 5 outside the time window"),
        "{stderr}"
    );
    let got = read(&vh.name, q, 3);
    assert_as_sent(&sent[2..5], &got, "records 2 to 4");
}
