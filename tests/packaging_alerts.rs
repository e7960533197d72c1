//! The Prometheus rules and the Grafana dashboard of `packaging/`: `promtool check rules` and
//! `promtool test rules` pass; the dashboard is JSON whose queries parse; and every metric and
//! label they name is one a real backup on the local broker exports (`metrics.textfile`).
//!
//! promtool comes from Debian's `prometheus` package (scripts/test.sh installs it); without it
//! the promtool checks say so and return.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(packaging().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// promtool's path, or None (with the reason printed) when it is not installed.
fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: promtool is not installed (scripts/test.sh installs Debian's prometheus \
             package: apt-get install --no-install-recommends prometheus)"
        );
    }
    found
}

fn promtool_run(tool: &Path, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .expect("run promtool");
    let (o, e) = text(&out);
    assert!(out.status.success(), "promtool {args:?}:\n{o}{e}");
    format!("{o}{e}")
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let Some(tool) = promtool() else { return };
    let dir = packaging().join("prometheus");
    let check = promtool_run(
        &tool,
        &[
            "check",
            "rules",
            &dir.join("alerts.yaml").display().to_string(),
        ],
    );
    assert!(check.contains("SUCCESS: 6 rules found"), "{check}");
    let test = promtool_run(
        &tool,
        &[
            "test",
            "rules",
            &dir.join("alerts_test.yaml").display().to_string(),
        ],
    );
    assert!(test.contains("SUCCESS"), "{test}");
    // Every alert has a unit test that expects it to fire.
    let tests = read("prometheus/alerts_test.yaml");
    for alert in alert_names() {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          -"
            )),
            "no test where {alert} fires"
        );
        assert!(
            tests.contains(&format!("alertname: {alert}\n        exp_alerts: []")),
            "no test where {alert} stays quiet"
        );
    }
}

fn alert_names() -> Vec<String> {
    read("prometheus/alerts.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

/// The dashboard's query expressions, with Grafana's variables replaced by values PromQL
/// parses.
fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value =
        serde_json::from_str(&read("grafana/rmq-backup.json")).expect("the dashboard is JSON");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        vars.contains(&"datasource") && vars.contains(&"job"),
        "{vars:?}"
    );
    let mut exprs = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap_or("?");
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {title}: the datasource variable"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {title}");
            let e = t["expr"].as_str().expect("expr");
            exprs.push(
                e.replace("$__rate_interval", "1m")
                    .replace("$__range", "1d")
                    .replace("$__interval", "1m")
                    .replace("$job", ".*"),
            );
        }
    }
    exprs
}

#[test]
fn the_dashboard_is_json_and_its_queries_parse() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 15, "{exprs:?}");
    let Some(tool) = promtool() else { return };
    // promtool parses every expression of a rules file: one recording rule per query.
    let dir = TempDir::new("dashboard-queries");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let quoted = serde_json::to_string(e).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {quoted}\n"
        ));
    }
    let file = write_config(dir.path(), "queries.yaml", &rules);
    let out = promtool_run(&tool, &["check", "rules", &file]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
}

/// The `broker_...` metric names and `rmq_backup:...` recording rules named in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for token in text.split(|c: char| !word(c)) {
        // A name at the end of a sentence ("...seconds: how long") ends in a colon.
        let token = token.trim_end_matches(':');
        if token.starts_with("broker_") || token.starts_with("rmq_backup:") {
            names.insert(token.to_string());
        }
    }
    names
}

/// The label names in `by (...)` and `on (...)` clauses of `text`.
fn grouping_labels_in(text: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for kw in ["by (", "on ("] {
        for part in text.split(kw).skip(1) {
            let inner = part.split(')').next().unwrap_or_default();
            labels.extend(
                inner
                    .split(',')
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    labels
}

/// The exposition a real backup writes to `metrics.textfile` when it ends (every metric of
/// the run, with the `broker_backup_last_*` outcome): the names of its `# TYPE` lines and the
/// label names of its series.
fn served_by_a_real_backup() -> (BTreeSet<String>, BTreeSet<String>) {
    let vh = TestVhost::new("alerts-names");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", Default::default());
    publish_bulk(&ch, "q", 50, 64);
    wait_ready(&ch, "q", 50);
    let dir = TempDir::new("alerts-names");
    let prom = dir.path().join("rmq-backup.prom");
    let yaml = format!(
        "{}metrics:\n  enabled: false\n  textfile: {}\n",
        backup_yaml("names", &vh.name, &dir.path().join("store"), ""),
        prom.display()
    );
    let cfg = write_config(dir.path(), "b.yaml", &yaml);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let body = std::fs::read_to_string(&prom).expect("the backup wrote metrics.textfile");
    let names = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let mut labels = BTreeSet::new();
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some(inner) = l.split_once('{').and_then(|(_, r)| r.split_once('}')) {
            for pair in inner.0.split("\",") {
                if let Some((name, _)) = pair.split_once('=') {
                    labels.insert(name.to_string());
                }
            }
        }
    }
    (names, labels)
}

#[test]
fn every_metric_and_label_named_is_served_by_a_real_backup() {
    let alerts = read("prometheus/alerts.yaml");
    let dashboard = dashboard_exprs().join("\n");
    let (served, served_labels) = served_by_a_real_backup();
    assert!(served.contains("broker_backup_messages_read"), "{served:?}");

    let recorded: BTreeSet<String> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(str::to_string)
        .collect();
    let used: BTreeSet<String> = names_in(&alerts)
        .into_iter()
        .chain(names_in(&dashboard))
        .collect();
    let unknown: Vec<&String> = used
        .iter()
        .filter(|n| !served.contains(*n) && !recorded.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "named in packaging/ but not served: {unknown:?}; served: {served:?}"
    );
    // Every SPEC.md metric is on the dashboard.
    for n in &served {
        assert!(
            dashboard.contains(n.as_str()),
            "{n} is served but not on the dashboard"
        );
    }

    // Labels: those of the series, plus job and instance (added by Prometheus to every
    // scraped series, or the Pushgateway group's). Label sets of series absent from a good run (errors, storage retries)
    // come from the exposition's label constants.
    let mut known = served_labels.clone();
    known.extend(
        rmq_backup::metrics::QUEUE_LABELS
            .iter()
            .chain(&rmq_backup::metrics::ERROR_LABELS)
            .chain(&["backend", "outcome", "job", "instance"])
            .map(|s| s.to_string()),
    );
    assert!(
        served_labels.contains("queue_type"),
        "a series with QueueLabels was scraped: {served_labels:?}"
    );
    let alert_exprs: String = alerts
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let grouped: BTreeSet<String> = grouping_labels_in(&alert_exprs)
        .into_iter()
        .chain(grouping_labels_in(&dashboard))
        .collect();
    assert!(
        grouped.contains("error_type") && grouped.contains("queue"),
        "{grouped:?}"
    );
    let unknown: Vec<&String> = grouped.iter().filter(|l| !known.contains(*l)).collect();
    assert!(unknown.is_empty(), "labels not served: {unknown:?}");
}
