//! `copy` between memory storages, on backups whose segments are real RBAK files written
//! here (the integration tests in tests/copy.rs copy real backups across the emulators).

use super::*;
use crate::repository::encryption::generate;
use crate::repository::segment::{Compression, SegmentWriter};
use crate::repository::storage::memory::MemoryStorage;
use std::sync::Arc;

fn store(tag: &str) -> Arc<MemoryStorage> {
    let s = MemoryStorage::named(&format!("copy-{}-{tag}", std::process::id()));
    s.clear();
    s
}

/// A completed backup `id` of one queue with `n` segments of 3 records each.
fn backup(s: &dyn Storage, id: &str, n: u64, dir: &Path) -> Manifest {
    let mut segments = Vec::new();
    for seq in 1..=n {
        let path = dir.join(format!("{id}-{seq}.rbak"));
        let mut w = SegmentWriter::create(&path, Compression::Zstd, 3).unwrap();
        for i in 0..3 {
            let rec = crate::repository::record::BackupRecord {
                body: format!("message {seq}.{i}").into_bytes(),
                properties: Default::default(),
                headers: Vec::new(),
                exchange: String::new(),
                routing_key: "q".into(),
                delivery_tag: seq * 10 + i,
                redelivered: false,
                backed_up_at: 1_000 + i as i64,
                source_queue: "q".into(),
                source_vhost: "/".into(),
                message_format: None,
                wire: None,
            };
            let mut json = Vec::new();
            crate::repository::record::encode_record(&rec, &mut json);
            w.append(&json, rec.backed_up_at).unwrap();
        }
        let f = w.finish().unwrap();
        let key = manifest::segment_key(id, "/", "q", seq, ".zst");
        match &f.data {
            Some(d) => s.put_bytes(&key, d).unwrap(),
            None => s.put_file(&key, &f.path).unwrap(),
        }
        segments.push(SegmentMetadata::from_finished(key, seq, &f));
    }
    let mut m = Manifest::new(id, 1);
    m.queues.push(QueueBackup::from_segments(
        "/",
        "q",
        crate::broker::QueueType::Classic,
        segments,
    ));
    m.completed_at = Some(2);
    m.recompute_totals();
    s.put_bytes(
        &manifest::manifest_key(id),
        m.to_json_pretty().unwrap().as_bytes(),
    )
    .unwrap();
    m
}

fn temp(tag: &str) -> crate::repository::spool::SpoolDir {
    crate::repository::spool::SpoolDir::create(&format!("copy-test-{tag}")).unwrap()
}

#[test]
fn a_copy_is_verified_resumed_and_left_alone_once_complete() {
    let dir = temp("plain");
    let (from, to) = (store("plain-from"), store("plain-to"));
    let m = backup(from.as_ref(), "b1", 2 * BATCH as u64 + 3, dir.path());
    let opts = CopyOptions::default();
    // An earlier copy stopped after some segments: the target has them, and an interrupted
    // manifest.
    for s in &m.queues[0].segments[..5] {
        to.put_bytes(&s.key, &from.get_bytes(&s.key).unwrap())
            .unwrap();
    }
    // One of them was cut short: copied again.
    let cut = &m.queues[0].segments[4].key;
    to.put_bytes(cut, b"short").unwrap();
    let mut interim = m.clone();
    interim.completed_at = None;
    interim.queues.clear();
    to.put_bytes(
        "b1/manifest.json",
        interim.to_json_pretty().unwrap().as_bytes(),
    )
    .unwrap();
    assert_eq!(
        crate::inspect::status(to.as_ref(), &interim).unwrap(),
        "interrupted"
    );

    let r = copy(from.as_ref(), to.as_ref(), &opts, &Progress::default()).unwrap();
    let b = &r.backups[0];
    assert_eq!(
        (b.status, b.segments, b.segments_in_place),
        ("resumed", m.total_segments, 4)
    );
    assert_eq!(b.segments_copied, m.total_segments - 4);
    assert!(!r.failed());
    let copied = Manifest::read(to.as_ref(), "b1").unwrap();
    assert_eq!(copied, m, "the same backup, byte for byte");
    let v = crate::inspect::validate(to.as_ref(), "b1", true).unwrap();
    assert!(v.is_valid(), "{:?}", v.problems);

    // Run again: nothing to do.
    let r = copy(from.as_ref(), to.as_ref(), &opts, &Progress::default()).unwrap();
    assert_eq!(r.backups[0].status, "already copied");
    assert_eq!(r.backups[0].segments_copied, 0);
}

#[test]
fn a_damaged_source_segment_fails_its_backup_and_leaves_no_manifest() {
    let dir = temp("damaged");
    let (from, to) = (store("damaged-from"), store("damaged-to"));
    let m = backup(from.as_ref(), "b2", 3, dir.path());
    let victim = &m.queues[0].segments[1];
    let mut bytes = from.get_bytes(&victim.key).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 1;
    from.put_bytes(&victim.key, &bytes).unwrap();
    let r = copy(
        from.as_ref(),
        to.as_ref(),
        &CopyOptions::default(),
        &Progress::default(),
    )
    .unwrap();
    assert!(r.failed());
    let e = r.backups[0].error.clone().unwrap();
    // CRC32 and SHA-256 are checked in one pass; the CRC32 is named first when both fail.
    assert!(
        e.starts_with(&format!(
            "Serialization error: {}: CRC32 mismatch",
            victim.key
        )),
        "{e}"
    );
    // The manifest is written once, last: the target has none, so no backup b2 there.
    assert_eq!(to.head("b2/manifest.json").unwrap(), None);
    assert!(to.list_backup_ids().unwrap().is_empty());
}

#[test]
fn a_copy_encrypted_to_a_recipient_opens_only_with_its_identity() {
    let dir = temp("enc");
    let (from, mid, to) = (store("enc-from"), store("enc-mid"), store("enc-to"));
    let m = backup(from.as_ref(), "b3", 3, dir.path());
    let (secret_a, public_a) = generate();
    let (secret_b, public_b) = generate();
    let a = Identities::parse(&secret_a, "a.txt").unwrap();
    let b = Identities::parse(&secret_b, "b.txt").unwrap();
    // Plain -> encrypted to A.
    let opts = CopyOptions {
        recipients: Some(Recipients::parse([public_a.as_str()], "--recipient").unwrap()),
        ..CopyOptions::default()
    };
    copy(from.as_ref(), mid.as_ref(), &opts, &Progress::default()).unwrap();
    let enc = Manifest::read(mid.as_ref(), "b3").unwrap();
    assert_eq!(
        enc.encryption.as_ref().unwrap().recipients,
        vec![public_a.clone()]
    );
    let seg = &enc.queues[0].segments[0];
    assert!(seg.key.ends_with(".zst.age"), "{}", seg.key);
    assert_ne!(seg.checksum, m.queues[0].segments[0].checksum);
    assert!(
        crate::inspect::validate_with_keys(mid.as_ref(), "b3", true, Some(&a))
            .unwrap()
            .is_valid()
    );
    // Encrypted to A -> re-encrypted to B: needs A's identity.
    let opts = CopyOptions {
        recipients: Some(Recipients::parse([public_b.as_str()], "--recipient").unwrap()),
        identities: None,
        ..CopyOptions::default()
    };
    let e = copy(mid.as_ref(), to.as_ref(), &opts, &Progress::default()).unwrap_err();
    assert!(e.to_string().starts_with("Encryption error:"), "{e}");
    let opts = CopyOptions {
        identities: Some(Identities::parse(&secret_a, "a.txt").unwrap()),
        ..opts
    };
    let r = copy(mid.as_ref(), to.as_ref(), &opts, &Progress::default()).unwrap();
    assert!(!r.failed(), "{:?}", r.backups);
    assert_eq!(r.backups[0].encryption, Some(vec![public_b.clone()]));
    let re = Manifest::read(to.as_ref(), "b3").unwrap();
    assert_eq!(re.queues[0].segments[0].recipients, Some(vec![public_b]));
    assert!(
        crate::inspect::validate_with_keys(to.as_ref(), "b3", true, Some(&b))
            .unwrap()
            .is_valid()
    );
    let e = crate::inspect::validate_with_keys(to.as_ref(), "b3", true, Some(&a)).unwrap_err();
    assert!(e.to_string().contains("wrong identity"), "{e}");
}
