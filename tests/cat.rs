//! `cat` through the real binary on real backups (filesystem and S3 on SeaweedFS): every header
//! shown with its AMQP type, base64 for binary bodies, text for JSON and text bodies, the
//! filters, `--format body`, bad input, and a reader that closes the pipe early (`| head -n 1`):
//! exit 0 and nothing on stderr.

mod common;

use base64::Engine as _;
use common::*;
use rmq_backup::broker::amqp::{BasicProperties, FieldTable};
use serde_json::Value;
use std::io::BufRead;
use std::process::{Command, Stdio};

const BULK: usize = 3000;

/// Seeds three queues: `a-bulk` (BULK messages of 1 KiB), `b-mixed` (diverse messages:
/// every header type, binary and empty bodies), `c-text` (a JSON and a text body).
fn seed(vh: &TestVhost) -> (Vec<Msg>, Vec<Msg>) {
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in ["a-bulk", "b-mixed", "c-text"] {
        declare(&ch, q, "classic", FieldTable::new());
    }
    publish_bulk(&ch, "a-bulk", BULK, 1024);
    let mixed = diverse_messages(12, 7, false);
    publish(&ch, "b-mixed", &mixed);
    let text = vec![
        Msg {
            props: BasicProperties {
                content_type: Some("application/json".into()),
                ..Default::default()
            },
            body: br#"{"order":42,"name":"caf\u00e9 \u2713"}"#.to_vec(),
        },
        Msg {
            props: BasicProperties {
                content_type: Some("text/plain; charset=utf-8".into()),
                ..Default::default()
            },
            body: "line one — ✓".as_bytes().to_vec(),
        },
    ];
    publish(&ch, "c-text", &text);
    (mixed, text)
}

fn lines(out: &std::process::Output) -> Vec<Value> {
    assert_eq!(out.status.code(), Some(0), "{:?}", text(out));
    String::from_utf8(out.stdout.clone())
        .expect("utf-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn body_of(line: &Value) -> Vec<u8> {
    let body = line["body"].as_str().unwrap();
    match line["body_encoding"].as_str().unwrap() {
        "utf8" => body.as_bytes().to_vec(),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap(),
        other => panic!("{other}"),
    }
}

/// Runs `cat` with stdout on a pipe, reads one line, closes the pipe and checks that the
/// command ends with exit 0 and an empty stderr.
fn head_n_1(args: &[&str], env: &[(&str, &str)]) {
    // A spool directory of its own: in the shared one, this run would remove (and log) the
    // spool of another test's process killed meanwhile, and stderr must hold nothing else
    // here (seen in the suite).
    let spool = TempDir::new("cat-spool");
    let mut child = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .env("RMQ_BACKUP_SPOOL_DIR", spool.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cat");
    let mut first = String::new();
    {
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut first).unwrap();
    } // closed here, long before BULK lines (several MB) are written
    let out = child.wait_with_output().expect("wait");
    let v: Value = serde_json::from_str(&first).expect("first line");
    assert_eq!(v["queue"], "a-bulk");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(out.stderr.is_empty(), "stderr: {}", text(&out).1);
}

fn check_all(url: &str, id: &str, mixed: &[Msg], text_msgs: &[Msg], env: &[(&str, &str)]) {
    let all = lines(&run_cli_env(
        &["cat", "--path", url, "--backup-id", id],
        env,
    ));
    assert_eq!(all.len(), BULK + mixed.len() + text_msgs.len());
    // Backup order: queues by name, each in queue order.
    let queues: Vec<&str> = all.iter().map(|l| l["queue"].as_str().unwrap()).collect();
    assert!(queues.windows(2).all(|w| w[0] <= w[1]));
    let bulk = &all[..BULK];
    for (i, l) in bulk.iter().enumerate() {
        assert_eq!(l["body_encoding"], "base64");
        let body = body_of(l);
        assert_eq!(body.len(), 1024);
        assert_eq!(l["body_bytes"], 1024);
        assert_eq!(
            u64::from_be_bytes(body[..8].try_into().unwrap()),
            i as u64,
            "order"
        );
    }
    let mixed_lines = &all[BULK..BULK + mixed.len()];
    for (l, m) in mixed_lines.iter().zip(mixed) {
        assert_eq!(body_of(l), m.body, "body of {l}");
        assert_eq!(l["body_encoding"], "base64", "no text content type: base64");
        assert_eq!(l["vhost"].as_str(), l["vhost"].as_str());
        assert_eq!(
            l["properties"]["message_id"].as_str(),
            m.props.message_id.as_deref()
        );
    }
    // diverse_messages(…)[1]: every AMQP header type, in order, each with its type.
    let types: Vec<(&str, &str)> = mixed_lines[1]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["name"].as_str().unwrap(), h["type"].as_str().unwrap()))
        .collect();
    let mut expected = vec![
        ("bool", "Bool"),
        ("i8", "ShortShortInt"),
        ("u8", "ShortShortUInt"),
        ("i16", "ShortInt"),
        ("u16", "ShortUInt"),
        ("i32", "LongInt"),
        ("u32", "LongUInt"),
        ("i64", "LongLongInt"),
        ("f32", "Float"),
        ("f64", "Double"),
        ("decimal", "Decimal"),
        ("text", "LongString"),
        ("not-utf8", "LongString"),
        ("timestamp", "Timestamp"),
        ("void", "Void"),
        ("bytes", "Bytes"),
        ("array", "Array"),
        ("table", "Table"),
    ];
    if broker().is_4x() {
        // RabbitMQ 4.x sorts every message's header keys when it is published.
        expected.sort_by_key(|(name, _)| name.as_bytes());
    }
    assert_eq!(types, expected);
    let h = |name: &str| {
        mixed_lines[1]["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name)
            .unwrap_or_else(|| panic!("header {name}"))
            .clone()
    };
    assert_eq!(h("bool")["value"], false); // bool: i = 1 is odd
    assert_eq!(h("u16")["value"], 60_000);
    assert_eq!(h("f32")["value"], 1.5);
    assert_eq!(
        h("decimal")["value"],
        serde_json::json!({"scale": 2, "value": 12345})
    );
    assert_eq!(h("text")["value"], "héllo wörld ✓ 1");
    assert_eq!(h("not-utf8")["encoding"], "base64");
    assert_eq!(h("not-utf8")["value"], "//4AYcM=");
    assert_eq!(h("timestamp")["value"], 1_700_000_001u64);
    assert_eq!(h("void")["value"], Value::Null);
    assert_eq!(h("bytes")["value"], "AAEC/w==");
    assert_eq!(
        h("array")["value"][0],
        serde_json::json!({"type": "LongInt", "value": 1})
    );
    assert_eq!(h("table")["value"][1]["value"][0]["type"], "ShortShortUInt");
    assert_eq!(mixed_lines[1]["properties"]["app_id"], "rmq-backup-tests");
    let text_lines = &all[BULK + mixed.len()..];
    for (l, m) in text_lines.iter().zip(text_msgs) {
        assert_eq!(l["body_encoding"], "utf8");
        assert_eq!(l["body"].as_str().unwrap().as_bytes(), m.body.as_slice());
        assert!(l["backed_up_at"].as_i64().unwrap() > 1_700_000_000_000);
        assert!(l["backed_up_at_utc"].as_str().unwrap().ends_with('Z'));
    }
    head_n_1(&["cat", "--path", url, "--backup-id", id], env);
}

#[test]
fn cat_filesystem_and_s3() {
    let vh = TestVhost::new("cat");
    let (mixed, text_msgs) = seed(&vh);
    let dir = TempDir::new("cat");
    let store = dir.path().join("store");
    let id = "cat-backup";
    let cfg = write_config(dir.path(), "b.yaml", &backup_yaml(id, &vh.name, &store, ""));
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let url = format!("file://{}", store.display());
    check_all(&url, id, &mixed, &text_msgs, &[]);

    // Filters.
    let args = |extra: &[&str]| {
        let mut a = vec!["cat", "--path", url.as_str(), "--backup-id", id];
        a.extend_from_slice(extra);
        lines(&run_cli(&a))
    };
    assert_eq!(args(&["--limit", "3"]).len(), 3);
    assert_eq!(args(&["--queue", "c-text"]).len(), 2);
    assert_eq!(
        args(&["--vhost", &vh.name, "--queue", "b-mixed", "--limit", "100"]).len(),
        12
    );
    assert_eq!(args(&["--since", "2999-01-01T00:00:00Z"]).len(), 0);
    assert_eq!(args(&["--until", "1000"]).len(), 0);
    let now = rmq_backup::now_ms().to_string();
    assert_eq!(
        args(&[
            "--since",
            "2020-01-01T00:00:00.000+02:00",
            "--until",
            &now,
            "--queue",
            "c-text"
        ])
        .len(),
        2
    );

    // Raw bodies, with a chosen delimiter.
    let out = run_cli(&[
        "cat",
        "--path",
        &url,
        "--backup-id",
        id,
        "--queue",
        "c-text",
        "--format",
        "body",
        "--delimiter",
        "\\0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let mut expected = Vec::new();
    for m in &text_msgs {
        expected.extend_from_slice(&m.body);
        expected.push(0);
    }
    assert_eq!(out.stdout, expected);

    // Bad input: exit 2, a clear message, nothing on stdout.
    for (extra, needle) in [
        (
            &["--since", "yesterday"][..],
            "Configuration error: --since: \"yesterday\"",
        ),
        (
            &["--queue", "nope"][..],
            "Configuration error: backup cat-backup holds no queue nope",
        ),
        (&["--format", "xml"][..], "unknown format xml"),
        (
            &["--delimiter", "\\q"][..],
            "Configuration error: --delimiter",
        ),
    ] {
        let mut a = vec!["cat", "--path", url.as_str(), "--backup-id", id];
        a.extend_from_slice(extra);
        let out = run_cli(&a);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
        assert!(stdout.is_empty());
    }
    let out = run_cli(&["cat", "--path", &url, "--backup-id", "absent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.starts_with("Storage error: Key not found"),
        "{:?}",
        text(&out)
    );

    // The same backup made to S3 (SeaweedFS).
    let bucket = S3Bucket::new("cat");
    let s3_yaml = backup_yaml(id, &vh.name, &store, "").replace(
        &format!("  backend: filesystem\n  path: \"{}\"\n", store.display()),
        &format!(
            "  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key: {}\n",
            bucket.name(),
            S3_ADMIN.0,
            S3_ADMIN.1
        ),
    );
    assert!(s3_yaml.contains("backend: s3"));
    let cfg = write_config(dir.path(), "s3.yaml", &s3_yaml);
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let s3_url = format!(
        "s3://{}?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        bucket.name()
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    check_all(&s3_url, id, &mixed, &text_msgs, &env);
}
