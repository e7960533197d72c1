//! Backup behaviours of SPEC.md with a test of their own: `metrics.path`, a shallow
//! `validate` of a size mismatch and of totals that disagree, rotation by
//! `segment_max_interval_ms`, and `max_concurrent_queues` above 1 with more queues than
//! threads.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::MetricsConfig;
use rmq_backup::metrics::server::MetricsServer;

fn get(url: &str) -> (u16, String) {
    let mut r = ureq::get(url)
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .expect(url);
    (
        r.status().as_u16(),
        r.body_mut().read_to_string().unwrap_or_default(),
    )
}

#[test]
fn metrics_path_moves_the_metrics_endpoint() {
    let server = MetricsServer::start(&MetricsConfig {
        port: 0,
        bind_address: "127.0.0.1".into(),
        path: "/internal/prom".into(),
        ..Default::default()
    })
    .unwrap();
    let base = format!("http://{}", server.local_addr());
    let (code, body) = get(&format!("{base}/internal/prom"));
    assert_eq!(code, 200);
    assert!(
        body.contains("# TYPE broker_backup_messages_read counter"),
        "{body}"
    );
    assert_eq!(
        get(&format!("{base}/metrics")).0,
        404,
        "the default path is free"
    );
    let (code, index) = get(&format!("{base}/"));
    assert_eq!(code, 200);
    assert!(index.contains("href=\"/internal/prom\""), "{index}");
}

#[test]
fn shallow_validate_finds_a_size_mismatch_and_totals_that_disagree() {
    let vh = TestVhost::new("spec-validate");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", 50, 100);
    let dir = TempDir::new("spec-validate");
    let store = dir.path().join("store");
    let url = format!("file://{}", store.display());
    for id in ["size", "totals"] {
        let cfg = write_config(
            dir.path(),
            &format!("{id}.yaml"),
            &backup_yaml(id, &vh.name, &store, ""),
        );
        assert_eq!(
            run_cli(&["backup", "--config", &cfg]).status.code(),
            Some(0)
        );
    }
    let validate = |id: &str| {
        let out = run_cli(&["validate", "--path", &url, "--backup-id", id]);
        let (stdout, stderr) = text(&out);
        (out.status.code(), stdout, stderr)
    };
    assert_eq!(validate("size").0, Some(0));

    // A segment one byte longer than the manifest says.
    let seg = manifest(&store, "size").queues[0].segments[0].clone();
    let mut bytes = std::fs::read(store.join(&seg.key)).unwrap();
    bytes.push(0);
    std::fs::write(store.join(&seg.key), &bytes).unwrap();
    let (code, stdout, stderr) = validate("size");
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Backup size is DAMAGED (shallow check): 1 problem(s) in 1 segments"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "Storage error: size is {} bytes but the manifest says {}",
            seg.size_bytes + 1,
            seg.size_bytes
        )),
        "{stdout}"
    );

    // Manifest totals that do not add up.
    let path = store.join("totals").join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["total_messages"] = serde_json::json!(51);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let (code, stdout, stderr) = validate("totals");
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("Manifest error: totals disagree with the queues: 51 messages,"),
        "{stdout}"
    );
}

#[test]
fn segments_rotate_on_segment_max_interval_ms() {
    const N: usize = 10_000;
    let vh = TestVhost::new("spec-interval");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", N, 64);
    let dir = TempDir::new("spec-interval");
    let store = dir.path().join("store");
    // basic.get: one round trip per message, so the read lasts far longer than 30 ms (a batch
    // of 512 records alone takes longer, even at 10,000 msg/s); the size limit is far away.
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "i",
            &vh.name,
            &store,
            "  requeue_strategy: get\n  segment_max_interval_ms: 30\n",
        ),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let m = manifest(&store, "i");
    let segments = &m.queues[0].segments;
    // The read lasts about a second (~10,000 msg/s): many 30 ms segments, none of them near the size limit
    // (128 MiB), so each was closed by its age. (Records reach the segment in batches, so a
    // segment's records may span a little more than 30 ms.)
    assert!(segments.len() >= 3, "{} segment(s)", segments.len());
    assert!(segments.iter().all(|s| s.uncompressed_bytes < 1 << 20));
    assert_eq!(
        segments.iter().map(|s| s.record_count).sum::<u64>(),
        N as u64
    );
    assert_eq!(
        seqs(&backed_up(&store, "i", "q")),
        (0..N as i64).collect::<Vec<_>>()
    );
}

#[test]
fn more_queues_than_threads_are_all_backed_up_whole() {
    let vh = TestVhost::new("spec-concurrency");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let queues: Vec<(String, usize)> = (0..5).map(|i| (format!("q{i}"), 500 + 300 * i)).collect();
    for (q, n) in &queues {
        declare(
            &ch,
            q,
            if q == "q3" { "quorum" } else { "classic" },
            FieldTable::new(),
        );
        publish_bulk(&ch, q, *n, 128);
    }
    let dir = TempDir::new("spec-concurrency");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "c",
            &vh.name,
            &store,
            "  max_concurrent_queues: 2\n  segment_max_bytes: 100000\n",
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let total: usize = queues.iter().map(|(_, n)| n).sum();
    assert!(
        stdout.starts_with(&format!("Backup c completed: 5 queues, {total} messages,")),
        "{stdout}"
    );
    let m = manifest(&store, "c");
    for (q, n) in &queues {
        let entry = m.queues.iter().find(|e| &e.name == q).unwrap();
        assert_eq!(entry.message_count as usize, *n, "{q}");
        assert_eq!(
            seqs(&backed_up(&store, "c", q)),
            (0..*n as i64).collect::<Vec<_>>(),
            "{q}: every message once, in order"
        );
        assert_eq!(depth(&conn, q) as usize, *n, "{q}: source whole");
    }
}
