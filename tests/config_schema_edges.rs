//! The configuration's JSON Schema (`rmq-backup config schema`) against the loader, at the
//! edges of the values whose syntax both state (issue 38, item 6): `storage.object_lock.retain_for`
//! and the retention durations `keep_within` and `prune_grace`. Before, the schema took `0d`
//! and `1d1d`, which the loader refuses, and refused ` 30d`, which it trims.
//!
//! Generated values, valid and invalid, each put in a whole configuration file: the schema
//! (what an editor checks) and the loader (`Config::from_yaml_str`, what a run checks) must
//! agree on every one, except that only the loader measures a number's size (a period past
//! 100 years, a duration past 10,000 years: the schema's descriptions say so).

mod common;

use common::*;

/// A small deterministic generator (xorshift64*), so that a failure repeats.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Values made of numbers, unit letters (the field's and others), whitespace the parsers
/// trim and whitespace they do not, and stray characters; every other one only of numbers,
/// the field's `units` and trimmed whitespace (mostly valid); the hand-picked edges first.
fn values(seed: u64, n: usize, units: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = [
        "30d",
        "0d",
        "00s",
        "0d0h",
        "0d1h",
        "1d1d",
        "1d2h1d",
        " 30d",
        "30d ",
        "\t30d\n",
        "\r\n1y\x0c",
        "\u{a0}30d",
        "30d\u{feff}",
        "\u{85}1h",
        "",
        " ",
        "30",
        "d",
        "1 d",
        "1d 2h",
        "1y2w3d4h5s",
        "5s4h3d2w1y",
        "1y6m",
        "36h",
        "1m",
        "m",
        "-1d",
        "+1d",
        "1.5d",
        "1D",
        "1y1y",
        "10000y",
        "10001y",
        "100y",
        "101y",
        "99999999999999999999999d",
        "4294967296h",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut g = Gen(seed);
    let numbers = ["0", "1", "7", "30", "007", "365", "00", "12"];
    let any_units = ["y", "w", "d", "h", "s", "m", "x", "Y"];
    let any_spaces = [
        "", "", "", " ", "\t", "\n", "\r", "\x0c", "\u{a0}", "\u{feff}", "\u{85}", "\x0b",
    ];
    let any_stray = ["", "", "", "", "", " ", "-", ".", "+", "_"];
    let trimmed = ["", "", "", " ", "\t", "\n", "\r", "\x0c"];
    while out.len() < n {
        let (units, spaces, stray): (&[&str], &[&str], &[&str]) = if out.len().is_multiple_of(2) {
            (units, &trimmed, &[""])
        } else {
            (&any_units, &any_spaces, &any_stray)
        };
        let mut v = g.pick(spaces).to_string();
        for _ in 0..=(g.next() % 4) {
            v.push_str(g.pick(&numbers));
            v.push_str(g.pick(stray));
            v.push_str(g.pick(units));
        }
        if g.next().is_multiple_of(5) {
            v.push_str(g.pick(&numbers));
        }
        v.push_str(g.pick(spaces));
        out.push(v);
    }
    out
}

/// A value as a YAML double-quoted scalar (JSON's escapes are YAML's).
fn quoted(v: &str) -> String {
    serde_json::to_string(v).unwrap()
}

const BASE: &str = "mode: backup\nbackup_id: x\nsource:\n  amqp_url: amqp://a\n  management_url: http://a\n  management_username: u\n  management_password: p\n";

fn with_retain_for(v: &str) -> String {
    format!(
        "{BASE}storage:\n  backend: s3\n  bucket: b\n  region: us-east-1\n  object_lock:\n    mode: governance\n    retain_for: {}\n",
        quoted(v)
    )
}

fn with_retention(field: &str, v: &str) -> String {
    format!(
        "{BASE}storage:\n  backend: filesystem\n  path: /tmp/x\nretention:\n  keep_last: 1\n  {field}: {}\n",
        quoted(v)
    )
}

/// Checks every generated value of one field: the schema and the loader agree, but where the
/// loader refuses a number's size (`size_refusal` says which errors are that).
fn agree(
    field: &str,
    units: &[&str],
    file: impl Fn(&str) -> String,
    size_refusal: &[&str],
) -> (usize, usize) {
    let out = run_cli(&["config", "schema"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let (mut accepted, mut refused) = (0, 0);
    let mut disagree = Vec::new();
    for v in values(0x9e37_79b9_7f4a_7c15 ^ field.len() as u64, 3_000, units) {
        let yaml = file(&v);
        let doc: serde_json::Value = serde_norway::from_str(&yaml).expect("YAML");
        let by_schema = validator.is_valid(&doc);
        let by_loader = rmq_backup::config::Config::from_yaml_str(&yaml);
        match (&by_loader, by_schema) {
            (Ok(_), true) => accepted += 1,
            (Err(_), false) => refused += 1,
            (Err(e), true) if size_refusal.iter().any(|s| e.to_string().contains(s)) => {
                refused += 1
            }
            (Ok(_), false) => {
                disagree.push(format!("{v:?}: the loader takes it, the schema refuses it"))
            }
            (Err(e), true) => disagree.push(format!(
                "{v:?}: the schema takes it, the loader refuses it: {e}"
            )),
        }
    }
    assert!(
        disagree.is_empty(),
        "{field}: {} disagreement(s):\n{}",
        disagree.len(),
        disagree.join("\n")
    );
    println!("{field}: {accepted} values accepted by both, {refused} refused by both");
    assert!(
        accepted >= 500 && refused >= 500,
        "{field}: {accepted} / {refused}"
    );
    (accepted, refused)
}

#[test]
fn retain_for_is_the_same_language_for_the_schema_and_the_loader() {
    agree(
        "storage.object_lock.retain_for",
        &["y", "w", "d", "h", "s"],
        with_retain_for,
        &["too large", "longer than 100 years"],
    );
}

#[test]
fn retention_durations_are_the_same_language_for_the_schema_and_the_loader() {
    for field in ["keep_within", "prune_grace"] {
        agree(
            &format!("retention.{field}"),
            &["y", "m", "d", "h"],
            |v| with_retention(field, v),
            &["past 10,000 years"],
        );
    }
}

/// Count values as YAML scalars: numbers (around 0 and `u32::MAX`, floats, exponents) plain
/// and quoted, with a sign, leading zeros and whitespace; `unlimited` in several spellings.
/// Not YAML's `.inf` and `.nan`, which have no JSON form (serde_json makes them null, which the
/// schema takes; the loader refuses them).
fn count_values(seed: u64, n: usize) -> Vec<String> {
    let mut out: Vec<String> = [
        "-2",
        "-1",
        "0",
        "1",
        "7",
        "4294967295",
        "4294967296",
        "5.0",
        "5.5",
        "1e3",
        "-1.0",
        "\"5\"",
        "\" 5 \"",
        "\"unlimited\"",
        "\" unlimited\"",
        "\"Unlimited\"",
        "\"-1\"",
        "\"+5\"",
        "\"05\"",
        "null",
        "true",
        "\"\"",
        "0x10",
        "\"4294967296\"",
        "\"\\u00a05\"",
        "unlimited",
        "\"-0\"",
        "\"+-1\"",
        "\"+\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut g = Gen(seed);
    let edges = [
        0u64,
        1,
        9,
        10,
        99,
        100,
        999_999_999,
        1_000_000_000,
        4_294_967_295,
        4_294_967_296,
    ];
    let spaces = ["", "", " ", "\\t", "\\n", "\\u00a0", "\\u0085"];
    while out.len() < n {
        let base = edges[(g.next() % edges.len() as u64) as usize];
        let n = match g.next() % 4 {
            0 => base,
            1 => base.saturating_sub(g.next() % 3),
            2 => base + g.next() % 3,
            _ => g.next() % 10_000_000_000,
        };
        let v = match g.next() % 6 {
            0 => n.to_string(),
            1 => format!("-{n}"),
            2 => format!("{n}.0"),
            _ => {
                let sign = g.pick(&["", "", "+", "-"]);
                let zeros = g.pick(&["", "", "0", "000"]);
                let (a, b) = (g.pick(&spaces), g.pick(&spaces));
                format!("\"{a}{sign}{zeros}{n}{b}\"")
            }
        };
        out.push(v);
    }
    out
}

#[test]
fn retention_counts_are_the_same_language_for_the_schema_and_the_loader() {
    let out = run_cli(&["config", "schema"]);
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let (mut accepted, mut refused) = (0, 0);
    let mut disagree = Vec::new();
    for raw in count_values(0x2545_f491_4f6c_dd1d, 3_000) {
        let yaml = format!(
            "{BASE}storage:\n  backend: filesystem\n  path: /tmp/x\nretention:\n  keep_within: 1d\n  keep_daily: {raw}\n"
        );
        let doc: serde_json::Value = serde_norway::from_str(&yaml).expect("YAML");
        let by_schema = validator.is_valid(&doc);
        let by_loader = rmq_backup::config::Config::from_yaml_str(&yaml);
        match (by_schema, &by_loader) {
            (true, Ok(_)) => accepted += 1,
            (false, Err(_)) => refused += 1,
            _ => disagree.push(format!(
                "{raw}: the schema {}, the loader {:?}",
                if by_schema { "takes it" } else { "refuses it" },
                by_loader.err().map(|e| e.to_string())
            )),
        }
    }
    assert!(
        disagree.is_empty(),
        "retention.keep_daily: {} disagreement(s):\n{}",
        disagree.len(),
        disagree.join("\n")
    );
    println!("retention.keep_daily: {accepted} values accepted by both, {refused} refused by both");
    assert!(accepted >= 500 && refused >= 500, "{accepted} / {refused}");
}
