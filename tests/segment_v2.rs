//! RBAK segment format versions 2 and 3 (docs/segment-format.md; `backup.segment_version`):
//! segments assembled by hand from the written description are read by `cat`, `describe` and
//! `validate --deep`; a backup in version 2 restores byte for byte (zstd, lz4, none, and
//! encrypted) on the test broker, one in version 3 the broker's own bytes.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use sha2::Digest;

/// One record's metadata as docs/segment-format.md writes it: every BackupRecord field but
/// the body, compact JSON in SPEC.md's order.
fn meta_json(tag: u64, at: i64, content_type: &str) -> String {
    format!(
        concat!(
            r#"{{"properties":{{"content_type":"{ct}","content_encoding":null,"delivery_mode":2,"#,
            r#""priority":null,"correlation_id":null,"reply_to":null,"expiration":null,"#,
            r#""message_id":"m-{tag}","timestamp":null,"type_field":null,"user_id":null,"#,
            r#""app_id":null,"cluster_id":null}},"headers":[["n",{{"Long":{tag}}}]],"#,
            r#""exchange":"","routing_key":"hand","delivery_tag":{tag},"redelivered":false,"#,
            r#""backed_up_at":{at},"source_queue":"hand","source_vhost":"/"}}"#
        ),
        ct = content_type,
        tag = tag,
        at = at
    )
}

/// Stores `payload` (the records of `times.len()` messages) as the one segment of queue `hand`
/// in backup `id`, in segment format `version`, uncompressed, with a manifest that lists it:
/// the segment's key, its bytes and the manifest.
fn store_by_hand(
    store: &std::path::Path,
    id: &str,
    version: u8,
    payload: &[u8],
    times: &[i64],
) -> (String, Vec<u8>, serde_json::Value) {
    let n = times.len();
    // Header: "RBAK", the version, compression 0 (none), 2 reserved bytes, record count u64,
    // first and last backed_up_at i64; then the payload; footer: CRC32 of all before, "KABR".
    let mut file = b"RBAK".to_vec();
    file.extend_from_slice(&[version, 0, 0, 0]);
    file.extend_from_slice(&(n as u64).to_le_bytes());
    file.extend_from_slice(&times[0].to_le_bytes());
    file.extend_from_slice(&times[n - 1].to_le_bytes());
    file.extend_from_slice(payload);
    let crc = crc32fast::hash(&file);
    file.extend_from_slice(&crc.to_le_bytes());
    file.extend_from_slice(b"KABR");
    let key = format!("{id}/queues/_default/hand/segment-0001");
    std::fs::create_dir_all(store.join(&key).parent().unwrap()).unwrap();
    std::fs::write(store.join(&key), &file).unwrap();
    let manifest = serde_json::json!({
        "backup_id": id,
        "created_at": times[0],
        "completed_at": times[n - 1] + 1,
        "source_cluster": null,
        "broker_version": null,
        "backup_tool_version": "by hand",
        "definitions": null,
        "queues": [{
            "vhost": "/",
            "name": "hand",
            "queue_type": "classic",
            "segments": [{
                "key": key,
                "sequence": 1,
                "record_count": n,
                "size_bytes": file.len(),
                "uncompressed_bytes": payload.len(),
                "first_timestamp": times[0],
                "last_timestamp": times[n - 1],
                "checksum": rmq_backup::repository::segment::hex_lower(&sha2::Sha256::digest(&file)),
                "segment_version": version
            }],
            "message_count": n,
            "first_message_timestamp": times[0],
            "last_message_timestamp": times[n - 1]
        }],
        "total_messages": n,
        "total_bytes": file.len(),
        "total_segments": 1
    });
    std::fs::write(
        store.join(id).join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    (key, file, manifest)
}

#[test]
fn a_version_2_segment_written_by_hand_reads_with_the_tool() {
    let dir = TempDir::new("v2-hand");
    let store = dir.path().join("store");
    let id = "hand-v2";
    let bodies: [&[u8]; 3] = [b"hello", &[0, 255, 10, 13], b""];
    let times = [1_700_000_000_000i64, 1_700_000_000_500, 1_700_000_001_000];
    // Payload: per record, u32 LE length + metadata JSON, u32 LE length + body bytes.
    let mut payload = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let m = meta_json(i as u64 + 1, times[i], "text/plain");
        payload.extend_from_slice(&(m.len() as u32).to_le_bytes());
        payload.extend_from_slice(m.as_bytes());
        payload.extend_from_slice(&(body.len() as u32).to_le_bytes());
        payload.extend_from_slice(body);
    }
    let (key, file, manifest) = store_by_hand(&store, id, 2, &payload, &times);
    let url = format!("file://{}", store.display());

    let out = run_cli(&[
        "cat",
        "--path",
        &url,
        "--backup-id",
        id,
        "--format",
        "body",
        "--delimiter",
        "|",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(out.stdout, b"hello|\x00\xff\x0a\x0d||".to_vec());

    let out = run_cli(&["cat", "--path", &url, "--backup-id", id]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let line = lines[0].to_string();
    for needle in ["\"m-1\"", "text/plain", "\"hand\"", "1700000000000"] {
        assert!(line.contains(needle), "{needle} in {line}");
    }

    let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = run_cli(&["describe", "--path", &url, "--backup-id", id]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("Segment format:      version 2"),
        "{stdout}"
    );

    // A header version the tool does not know is refused by it, naming the version.
    let mut bad = file.clone();
    bad[4] = 4;
    let n = bad.len();
    let crc = crc32fast::hash(&bad[..n - 8]);
    bad[n - 8..n - 4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(store.join(&key), &bad).unwrap();
    let mut m = manifest.clone();
    m["queues"][0]["segments"][0]["checksum"] =
        rmq_backup::repository::segment::hex_lower(&sha2::Sha256::digest(&bad)).into();
    std::fs::write(
        store.join(id).join("manifest.json"),
        serde_json::to_vec_pretty(&m).unwrap(),
    )
    .unwrap();
    let out = run_cli(&["cat", "--path", &url, "--backup-id", id]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Serialization error: Unsupported segment version: 4"),
        "{stderr}"
    );
}

/// A version 3 segment assembled from docs/segment-format.md ("Version 3"): a record with
/// binary metadata (its properties as AMQP 0-9-1 encodes them, built here byte by byte) beside
/// one with version 2's JSON metadata; `cat` shows each property and header with its type.
#[test]
fn a_version_3_segment_written_by_hand_reads_with_the_tool() {
    let dir = TempDir::new("v3-hand");
    let store = dir.path().join("store");
    let id = "hand-v3";
    let times = [1_700_000_000_000i64, 1_700_000_000_500];
    // Binary metadata: tag 0x00, flags (bit 0 redelivered), delivery_tag u64 LE, backed_up_at
    // i64 LE, then exchange, routing_key, source_queue, source_vhost as u16 LE length + bytes.
    let mut meta = vec![0x00, 0x01];
    meta.extend_from_slice(&7u64.to_le_bytes());
    meta.extend_from_slice(&times[0].to_le_bytes());
    for s in ["amq.direct", "hand", "hand", "/"] {
        meta.extend_from_slice(&(s.len() as u16).to_le_bytes());
        meta.extend_from_slice(s.as_bytes());
    }
    // Then the AMQP 0-9-1 properties: flags (content-type bit 15, headers bit 13,
    // delivery-mode bit 12, message-id bit 7), content-type "text/plain" as a short string,
    // the header table (u32 BE length; key `n` type `I` -5; key `s` type `S` 2 bytes; key `v`
    // type `V`), delivery-mode 2, message-id "m-7".
    meta.extend_from_slice(&[0xb0, 0x80]);
    meta.push(10);
    meta.extend_from_slice(b"text/plain");
    let mut table = vec![1, b'n', b'I'];
    table.extend_from_slice(&(-5i32).to_be_bytes());
    table.extend_from_slice(&[1, b's', b'S', 0, 0, 0, 2, 0xc3, 0xa9, 1, b'v', b'V']);
    meta.extend_from_slice(&(table.len() as u32).to_be_bytes());
    meta.extend_from_slice(&table);
    meta.push(2);
    meta.push(3);
    meta.extend_from_slice(b"m-7");
    let json = meta_json(8, times[1], "application/json");
    let mut payload = Vec::new();
    for (m, body) in [(&meta[..], &b"bin"[..]), (json.as_bytes(), &b"json"[..])] {
        payload.extend_from_slice(&(m.len() as u32).to_le_bytes());
        payload.extend_from_slice(m);
        payload.extend_from_slice(&(body.len() as u32).to_le_bytes());
        payload.extend_from_slice(body);
    }
    store_by_hand(&store, id, 3, &payload, &times);
    let url = format!("file://{}", store.display());
    let out = run_cli(&["cat", "--path", &url, "--backup-id", id]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let first = lines[0].to_string();
    for needle in [
        "\"text/plain\"",
        "\"m-7\"",
        "\"amq.direct\"",
        "1700000000000",
        "\"redelivered\":true",
        "\"delivery_tag\":7",
        "{\"name\":\"n\",\"type\":\"LongInt\",\"value\":-5}",
        "{\"name\":\"s\",\"type\":\"LongString\",\"value\":\"é\"}",
        "{\"name\":\"v\",\"type\":\"Void\",\"value\":null}",
    ] {
        assert!(first.contains(needle), "{needle} in {first}");
    }
    assert!(lines[1].to_string().contains("\"m-8\""), "{}", lines[1]);
    let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = run_cli(&["describe", "--path", &url, "--backup-id", id]);
    assert!(
        text(&out).0.contains("Segment format:      version 3"),
        "{:?}",
        text(&out)
    );
}

/// Backs up the queues of `vh` with `extra` backup options and restores them into a new
/// vhost; returns the restored vhost and the store.
fn round_trip(vh: &TestVhost, dir: &TempDir, id: &str, extra: &str, restore_extra: &str) -> String {
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        &format!("b-{id}.yaml"),
        &backup_yaml(id, &vh.name, &store, extra),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "backup {id}: {:?}", text(&out));
    let target = vh.sibling(id);
    let rcfg = write_config(
        dir.path(),
        &format!("r-{id}.yaml"),
        &restore_yaml(
            id,
            &store,
            &format!(
                "  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{restore_extra}",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "restore {id}: {:?}", text(&out));
    target
}

#[test]
fn a_version_2_backup_restores_byte_for_byte() {
    let vh = TestVhost::new("v2-rt");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "diverse", "classic", FieldTable::new());
    let msgs = diverse_messages(150, 32, true);
    publish(&ch, "diverse", &msgs);
    let dir = TempDir::new("v2-rt");
    let store = dir.path().join("store");
    let (secret, public) = rmq_backup::repository::encryption::generate();
    let identity = identity_file(dir.path(), &secret);
    let cases = [
        ("v2-zstd", "", ".zst", ""),
        ("v2-lz4", "  compression: lz4\n", ".lz4", ""),
        ("v2-none", "  compression: none\n", "", ""),
        (
            "v2-age",
            &*format!("  encryption:\n    recipients: [\"{public}\"]\n"),
            ".zst.age",
            &*format!(
                "  encryption:\n    identity_file: \"{}\"\n",
                identity.display()
            ),
        ),
    ];
    for (id, extra, ext, restore_extra) in cases {
        let extra = format!("  segment_version: 2\n  segment_max_bytes: 500000\n{extra}");
        let target = round_trip(&vh, &dir, id, &extra, restore_extra);
        let m = manifest(&store, id);
        let segments = &m.queues[0].segments;
        assert!(segments.len() > 1, "{id}: rotates");
        for s in segments {
            // After a segment that did not shrink (the 1 MiB random body), some are stored
            // uncompressed (`segment-NNNN`, `segment-NNNN.age`).
            let plain = s
                .key
                .trim_end_matches(".age")
                .rsplit('-')
                .next()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
            assert!(s.key.ends_with(ext) || plain, "{id}: {}", s.key);
            assert_eq!(
                s.segment_version,
                Some(2),
                "{id}: the manifest says version 2"
            );
            if !ext.ends_with(".age") {
                let b = std::fs::read(store.join(&s.key)).unwrap();
                assert_eq!(&b[..5], b"RBAK\x02", "{id}: header byte 4");
            }
        }
        let tconn = connect(&target);
        assert_same(
            &as_restored(&msgs),
            &peek(&tconn, "diverse", msgs.len()),
            &format!("{id}: restored"),
        );
        drop(tconn);
        let _ = management().delete_vhost(&target);
        let url = format!("file://{}", store.display());
        let mut validate = vec!["validate", "--path", &url, "--backup-id", id, "--deep"];
        let ident = identity.display().to_string();
        if ext.ends_with(".age") {
            validate.extend(["--identity-file", &ident]);
        }
        let out = run_cli(&validate);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
        let out = run_cli(&["describe", "--path", &url, "--backup-id", id]);
        assert!(
            text(&out).0.contains("Segment format:      version 2"),
            "{id}: {:?}",
            text(&out)
        );
    }
    // The source kept every message.
    assert_same(&msgs, &peek(&conn, "diverse", msgs.len()), "source");

    // A version 1 backup of the same queue: no segment_version in its manifest, byte 4 = 1.
    let target = round_trip(&vh, &dir, "v1", "", "");
    let m = manifest(&store, "v1");
    let s = &m.queues[0].segments[0];
    assert_eq!(s.segment_version, None);
    assert_eq!(std::fs::read(store.join(&s.key)).unwrap()[4], 1);
    let raw = std::fs::read_to_string(store.join("v1").join("manifest.json")).unwrap();
    assert!(!raw.contains("segment_version"), "{raw}");
    let _ = management().delete_vhost(&target);
}

/// A rerun of an interrupted backup keeps the queues an earlier run completed; their segments
/// stay in the version they were written in: a rerun that writes another version refuses such
/// a queue, naming the version to set, and a rerun in the earlier version reuses them.
#[test]
fn a_rerun_in_another_segment_version_refuses_to_keep_the_earlier_segments() {
    let vh = TestVhost::new("v2-rerun");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "done", "classic", FieldTable::new());
    publish(&ch, "done", &diverse_messages(30, 5, false));
    let dir = TempDir::new("v2-rerun");
    let store = dir.path().join("store");
    let id = "rerun";
    let db = dir.path().join("offsets.db");
    let config = |version: u8| {
        write_config(
            dir.path(),
            &format!("b{version}.yaml"),
            &backup_yaml(
                id,
                &vh.name,
                &store,
                &format!(
                    "  segment_version: {version}\noffset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n",
                    db.display()
                ),
            ),
        )
    };
    let out = run_cli(&["backup", "--config", &config(1)]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // As if the run had been interrupted after the queue completed.
    let path = store.join(id).join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["completed_at"] = serde_json::Value::Null;
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let key = m["queues"][0]["segments"][0]["key"]
        .as_str()
        .unwrap()
        .to_string();

    let out = run_cli(&["backup", "--config", &config(2)]);
    let (stdout, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "Configuration error: queue done in vhost {}: the earlier run of this backup stored {key} in segment format version 1, and this run writes version 2 (backup.segment_version); a rerun continues in the version the backup was started with: set backup.segment_version: 1 to resume it, or back up under a new backup_id",
            vh.name
        )),
        "{stdout}{stderr}"
    );

    let out = run_cli(&["backup", "--config", &config(1)]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "queue done in vhost {}: completed by an earlier run; 1 verified segment(s) reused",
            vh.name
        )),
        "{stderr}"
    );
}

#[test]
fn segments_of_random_bodies_are_stored_uncompressed_after_one_that_did_not_shrink() {
    let vh = TestVhost::new("v2-random");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "random", "classic", FieldTable::new());
    let mut rng = Rng::new(7);
    let msgs: Vec<Msg> = (0..60)
        .map(|_| Msg {
            props: Default::default(),
            body: rng.bytes(64 << 10),
        })
        .collect();
    publish(&ch, "random", &msgs);
    let dir = TempDir::new("v2-random");
    let store = dir.path().join("store");
    for (id, version) in [("random-v2", 2), ("random-v1", 1)] {
        let extra = format!("  segment_version: {version}\n  segment_max_bytes: 300000\n");
        let target = round_trip(&vh, &dir, id, &extra, "");
        let m = manifest(&store, id);
        let segments = &m.queues[0].segments;
        let mut plain = 0;
        for s in segments {
            let b = std::fs::read(store.join(&s.key)).unwrap();
            // The header's compression code says what the key's extension says.
            if s.key.ends_with(".zst") {
                assert_eq!(b[5], 1, "{id}: {}", s.key);
            } else {
                assert_eq!(b[5], 0, "{id}: {}", s.key);
                plain += 1;
            }
        }
        assert!(
            segments[0].key.ends_with(".zst"),
            "{id}: the first is tried"
        );
        if version == 2 {
            // Random bodies as raw bytes do not shrink: the first segment says so when it is
            // finished, and the next 15 are stored as they are (then one is tried again).
            let keys: Vec<&str> = segments.iter().map(|s| s.key.as_str()).collect();
            assert!(
                keys.len() > 2 && keys[1..].iter().take(15).all(|k| !k.ends_with(".zst")),
                "{id}: {keys:?}"
            );
        } else {
            // As JSON number arrays they do (about 2.4 times): every segment is compressed.
            assert_eq!(plain, 0, "{id}");
        }
        let tconn = connect(&target);
        assert_same(&as_restored(&msgs), &peek(&tconn, "random", msgs.len()), id);
        drop(tconn);
        let _ = management().delete_vhost(&target);
        let url = format!("file://{}", store.display());
        let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
    }
    assert_eq!(depth(&conn, "random"), 60, "the source kept every message");
}

/// Version 3 (`backup.segment_version: 3`): a message read over AMQP 0-9-1 keeps its
/// properties as the broker sent them. A classic queue is compared by the bytes the broker
/// delivers (the target's content header against the source's, message by message); a
/// quorum queue read once before, so that the broker adds its delivery headers, restores
/// without them (the backup removes them from the kept bytes). zstd and age-encrypted.
#[test]
fn a_version_3_backup_restores_the_brokers_bytes() {
    let vh = TestVhost::new("v3-rt");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "diverse", "classic", FieldTable::new());
    declare(&ch, "diverse-q", "quorum", FieldTable::new());
    let msgs = diverse_messages(120, 33, true);
    publish(&ch, "diverse", &msgs);
    publish(&ch, "diverse-q", &msgs);
    let source = peek_as(&conn, "diverse", msgs.len(), true);
    // A first read: the quorum queue's next deliveries carry x-delivery-count (3.x-4.2) or
    // x-acquired-count (4.3).
    let read = peek_as(&conn, "diverse-q", msgs.len(), true);
    let again = peek_as(&conn, "diverse-q", msgs.len(), true);
    let broker_headers = |d: &rmq_backup::broker::amqp::Delivery| {
        let w = d.wire.as_ref().expect("kept bytes");
        ["x-delivery-count", "x-acquired-count"]
            .iter()
            .any(|k| w.header(k).is_some())
    };
    assert!(
        !read.iter().any(broker_headers),
        "a first delivery has none"
    );
    assert!(again.iter().all(broker_headers), "a second has one");
    let dir = TempDir::new("v3-rt");
    let store = dir.path().join("store");
    let (secret, public) = rmq_backup::repository::encryption::generate();
    let identity = identity_file(dir.path(), &secret);
    let cases = [
        ("v3-zstd", String::new(), String::new()),
        (
            "v3-age",
            format!("  encryption:\n    recipients: [\"{public}\"]\n"),
            format!(
                "  encryption:\n    identity_file: \"{}\"\n",
                identity.display()
            ),
        ),
    ];
    for (id, extra, restore_extra) in cases {
        let extra = format!("  segment_version: 3\n  segment_max_bytes: 500000\n{extra}");
        let target = round_trip(&vh, &dir, id, &extra, &restore_extra);
        let m = manifest(&store, id);
        for q in &m.queues {
            for s in &q.segments {
                assert_eq!(s.segment_version, Some(3), "{id}: {}", s.key);
                if !s.key.ends_with(".age") {
                    let b = std::fs::read(store.join(&s.key)).unwrap();
                    assert_eq!(&b[..5], b"RBAK\x03", "{id}: header byte 4");
                }
            }
        }
        let tconn = connect(&target);
        let got = peek_as(&tconn, "diverse", msgs.len(), true);
        assert_eq!(got.len(), source.len());
        for (i, (s, t)) in source.iter().zip(&got).enumerate() {
            assert_eq!(t.body, s.body, "{id}: body of message {i}");
            let (sw, tw) = (s.wire.as_ref().unwrap(), t.wire.as_ref().unwrap());
            let sp = sw.decode().unwrap();
            if sp.headers.as_ref().is_some_and(|h| h.is_empty()) {
                // A record keeps headers as a list: an empty table is restored as none.
                assert_eq!(
                    tw.decode().unwrap(),
                    restored_props(&sp),
                    "{id}: message {i}"
                );
            } else {
                assert_eq!(
                    tw.as_bytes(),
                    sw.as_bytes(),
                    "{id}: message {i}'s properties as the broker delivers them"
                );
            }
        }
        let quorum = peek_as(&tconn, "diverse-q", msgs.len(), true);
        assert!(
            !quorum.iter().any(broker_headers),
            "{id}: the broker's delivery headers were not restored"
        );
        let quorum: Vec<_> = quorum
            .into_iter()
            .map(|mut d| {
                d.properties = d.wire.take().unwrap().decode().unwrap();
                d
            })
            .collect();
        // A broker that added its header to a message's table may have sorted the table
        // (3.10): the backup keeps what it delivered.
        assert_same_as(
            &in_broker_order(&as_restored(&msgs), "quorum"),
            &quorum,
            Headers::Sorted,
            &format!("{id}: quorum queue restored"),
        );
        drop(tconn);
        let _ = management().delete_vhost(&target);
        let url = format!("file://{}", store.display());
        let out = run_cli(&["describe", "--path", &url, "--backup-id", id]);
        assert!(
            text(&out).0.contains("Segment format:      version 3"),
            "{id}: {:?}",
            text(&out)
        );
    }
    assert_same(&msgs, &peek(&conn, "diverse", msgs.len()), "source kept");
}
