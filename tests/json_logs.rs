//! `--log-format json` (and `RMQ_BACKUP_LOG_FORMAT=json`) on a real backup: every stderr line
//! is one JSON object with timestamp, level, target, message and the run's backup_id; lines
//! about a queue carry vhost and queue, segment lines the segment; the password of the
//! configuration never appears.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use serde_json::Value;

/// A broker user with a unique password (any trace of it in the output is a leak), deleted on
/// drop.
struct SecretUser {
    name: String,
    password: String,
}

impl SecretUser {
    fn new(vhost: &str) -> SecretUser {
        let name = format!("rmqb-jsonlog-{}", unique_suffix());
        let password = format!("Pw-{}-json-Secret", unique_suffix());
        ureq::put(&format!("{}/api/users/{name}", management_url()))
            .header("authorization", MANAGEMENT_AUTH)
            .header("content-type", "application/json")
            .send(format!(r#"{{"password":"{password}","tags":"administrator"}}"#).as_bytes())
            .expect("create user");
        let enc: String = vhost.bytes().map(|b| format!("%{b:02X}")).collect();
        ureq::put(&format!(
            "{}/api/permissions/{enc}/{name}",
            management_url()
        ))
        .header("authorization", MANAGEMENT_AUTH)
        .header("content-type", "application/json")
        .send(r#"{"configure":".*","write":".*","read":".*"}"#.as_bytes())
        .expect("permissions");
        SecretUser { name, password }
    }
}

impl Drop for SecretUser {
    fn drop(&mut self) {
        let _ = ureq::delete(&format!("{}/api/users/{}", management_url(), self.name))
            .header("authorization", MANAGEMENT_AUTH)
            .call();
    }
}

fn json_lines(stderr: &str) -> Vec<Value> {
    assert!(!stderr.is_empty());
    stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn a_backup_logs_json_lines_with_their_fields_and_no_secret() {
    let vh = TestVhost::new("jsonlog");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q1", "classic", FieldTable::new());
    declare(&ch, "q2", "classic", FieldTable::new());
    publish_bulk(&ch, "q1", 200, 512);
    publish_bulk(&ch, "q2", 10, 64);
    let user = SecretUser::new(&vh.name);
    let dir = TempDir::new("jsonlog");
    let store = dir.path().join("store");
    let id = "json-logs";
    let amqp =
        amqp_url(&vh.name).replace("guest:guest@", &format!("{}:{}@", user.name, user.password));
    let yaml = backup_yaml(id, &vh.name, &store, "  segment_max_bytes: 40000\n")
        .replace(&amqp_url(&vh.name), &amqp)
        .replace(
            "management_username: guest",
            &format!("management_username: {}", user.name),
        )
        .replace(
            "management_password: guest",
            &format!("management_password: \"{}\"", user.password),
        );
    assert!(yaml.contains(&user.password));
    let cfg = write_config(dir.path(), "b.yaml", &yaml);

    let out = run_cli(&["-v", "backup", "--config", &cfg, "--log-format", "json"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains(&user.password) && !stderr.contains(&user.password));
    let lines = json_lines(&stderr);
    for l in &lines {
        let ts = l["timestamp"].as_str().unwrap();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(
            ts.ends_with('Z') && &ts[10..11] == "T" && &ts[19..20] == ".",
            "{ts}"
        );
        assert!(["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&l["level"].as_str().unwrap()));
        assert!(
            l["target"].as_str().unwrap().starts_with("rmq_backup"),
            "{l}"
        );
        assert!(l["message"].is_string());
        assert_eq!(l["backup_id"], id, "{l}");
    }
    let about = |q: &str| {
        lines
            .iter()
            .filter(|l| l["queue"] == q)
            .inspect(|l| assert_eq!(l["vhost"], vh.name.as_str(), "{l}"))
            .count()
    };
    assert!(about("q1") > 0 && about("q2") > 0, "{stderr}");
    let backing_up = lines
        .iter()
        .find(|l| {
            l["message"].as_str().unwrap().contains("queue q1 in vhost")
                && l["message"].as_str().unwrap().contains("backing up")
        })
        .expect("the line that starts q1");
    assert_eq!(backing_up["queue"], "q1");
    let segments: Vec<&Value> = lines.iter().filter(|l| l["segment"].is_string()).collect();
    assert!(segments.len() >= 2, "{stderr}");
    assert!(segments.iter().all(|l| l["segment"]
        .as_str()
        .unwrap()
        .starts_with("json-logs/queues/")));
    println!("{}", stderr.lines().take(12).collect::<Vec<_>>().join("\n"));

    // A restore of it into a sibling vhost: its lines carry backup_id, and its queue lines
    // the source vhost and queue.
    let target = vh.sibling("target");
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["-v", "restore", "--config", &r, "--log-format", "json"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let lines = json_lines(&stderr);
    assert!(lines.iter().all(|l| l["backup_id"] == id), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l["queue"] == "q1" && l["vhost"] == vh.name.as_str()),
        "{stderr}"
    );

    // The environment variable, and the error a command ends with, as JSON with its type.
    let out = run_cli_env(
        &[
            "describe",
            "--path",
            &format!("file://{}", store.display()),
            "--backup-id",
            "absent",
        ],
        &[("RMQ_BACKUP_LOG_FORMAT", "json")],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines = json_lines(&stderr);
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR");
    assert_eq!(last["error_type"], "storage");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .starts_with("Storage error: Key not found"),
        "{last}"
    );
    println!("{stderr}");

    // A bad value is a usage error.
    let out = run_cli(&["list", "--path", "memory://", "--log-format", "xml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out)
        .1
        .starts_with("Configuration error: unknown log format xml"));
}
