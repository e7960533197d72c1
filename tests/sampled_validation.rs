//! `validate --deep --read-data-subset` (restic's forms) through the real binary on a real
//! backup: the slices 1/3, 2/3 and 3/3 together read every segment exactly once, a damaged
//! segment is found by the one slice that holds it, random subsets read their share, and the
//! `broker_backup_validate_*` metrics say what was read and what failed.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::collections::BTreeMap;

fn validate_json(
    url: &str,
    id: &str,
    subset: &str,
    prom: &str,
) -> (Option<i32>, serde_json::Value) {
    let out = run_cli(&[
        "validate",
        "--path",
        url,
        "--backup-id",
        id,
        "--deep",
        "--read-data-subset",
        subset,
        "--format",
        "json",
        "--metrics-textfile",
        prom,
    ]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{subset}: {e}: {:?}", text(&out)));
    (out.status.code(), v)
}

fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[test]
fn slices_read_every_segment_once_and_random_subsets_their_share() {
    let vh = TestVhost::new("subset");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in ["a", "b", "c"] {
        declare(&ch, q, "classic", FieldTable::new());
        publish(&ch, q, &diverse_messages(120, 7, false));
    }
    let dir = TempDir::new("subset");
    let store = dir.path().join("store");
    let id = "subset-backup";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, "  segment_max_bytes: 20000\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let m = manifest(&store, id);
    let all: Vec<String> = m
        .queues
        .iter()
        .flat_map(|q| &q.segments)
        .map(|s| s.key.clone())
        .collect();
    assert!(all.len() >= 9, "need several segments, got {}", all.len());
    let url = format!("file://{}", store.display());
    let prom = dir.path().join("validate.prom").display().to_string();

    let mut reads: BTreeMap<String, u32> = BTreeMap::new();
    let mut records = 0;
    for n in 1..=3 {
        let (code, v) = validate_json(&url, id, &format!("{n}/3"), &prom);
        assert_eq!(code, Some(0), "{v}");
        assert_eq!(v["read_data_subset"], format!("{n}/3"));
        assert_eq!(
            v["segments_checked"],
            all.len() as u64,
            "every segment checked shallowly"
        );
        let keys = v["segments_read_keys"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(v["segments_read"], keys.len() as u64);
        for k in keys {
            *reads.entry(k.as_str().unwrap().to_string()).or_default() += 1;
        }
        records += v["records_checked"].as_u64().unwrap();
        let file = std::fs::read_to_string(&prom).unwrap();
        assert_eq!(
            sample(&file, "broker_backup_validate_segments_read"),
            v["segments_read"].as_u64().unwrap()
        );
        assert_eq!(sample(&file, "broker_backup_validate_segments_failed"), 0);
        assert!(
            file.contains("broker_backup_last_run_exit_code{mode=\"validate\"} 0"),
            "{file}"
        );
    }
    let expected: BTreeMap<String, u32> = all.iter().map(|k| (k.clone(), 1)).collect();
    assert_eq!(
        reads, expected,
        "1/3, 2/3 and 3/3 read every segment exactly once"
    );
    assert_eq!(
        records, 360,
        "every record verified once over the three nights"
    );

    // Random subsets: a share of the segments, or of the bytes.
    let (code, v) = validate_json(&url, id, "34%", &prom);
    assert_eq!(code, Some(0), "{v}");
    let want = (all.len() as f64 * 0.34).ceil() as u64;
    assert_eq!(v["segments_read"], want, "{v}");
    let smallest = m
        .queues
        .iter()
        .flat_map(|q| &q.segments)
        .map(|s| s.size_bytes)
        .min()
        .unwrap();
    let (code, v) = validate_json(&url, id, &format!("{smallest}"), &prom);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["segments_read"], 1, "{v}");

    // One damaged segment: only the slice holding it finds it (exit 3), and the metric says so.
    let victim = &all[all.len() / 2];
    let path = store.join(victim);
    let mut bytes = std::fs::read(&path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let mut found = 0;
    for n in 1..=3 {
        let (code, v) = validate_json(&url, id, &format!("{n}/3"), &prom);
        let read_it = v["segments_read_keys"]
            .as_array()
            .is_some_and(|a| a.iter().any(|k| k == victim.as_str()));
        let file = std::fs::read_to_string(&prom).unwrap();
        if read_it {
            found += 1;
            assert_eq!(code, Some(3), "{v}");
            assert_eq!(v["problems"][0]["key"], victim.as_str());
            assert_eq!(sample(&file, "broker_backup_validate_segments_failed"), 1);
            assert!(
                file.contains("broker_backup_last_run_exit_code{mode=\"validate\"} 3"),
                "{file}"
            );
        } else {
            assert_eq!(code, Some(0), "{n}/3 does not read {victim}: {v}");
        }
    }
    assert_eq!(found, 1);

    // Without --deep the option is bad usage.
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        id,
        "--read-data-subset",
        "1/3",
    ]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        id,
        "--deep",
        "--read-data-subset",
        "4/3",
    ]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("invalid --read-data-subset"),
        "{:?}",
        text(&out)
    );
}
