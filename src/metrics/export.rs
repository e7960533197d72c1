//! The metrics of a run after the process exits: at the end of every `backup` and `restore`
//! that reaches the normal exit (success or error, not SIGKILL), [`finish_run`] records the
//! outcome (`broker_backup_last_*`, [`super::Metrics::run_ended`]) and exports the whole text
//! exposition to where `metrics:` says:
//!
//! - `textfile: PATH`: written to `PATH.tmp-<pid>` then renamed over PATH, for node_exporter's
//!   textfile collector. The `broker_backup_last_*` series of the other mode, and this mode's
//!   last success when the run failed, are carried over from the previous file ([`merge`]), so
//!   "time since the last success" survives a failed run.
//! - `pushgateway_url: URL`: POSTed to `URL/metrics/job/<pushgateway_job>[/<label>/<value>...]
//!   /mode/<backup|restore>`. POST replaces only the metric names pushed, and a run that did not
//!   exit 0 pushes no `broker_backup_last_success_timestamp_seconds`, so the group keeps the
//!   last success. `mode` is part of the group so a restore never replaces a backup's series.
//!
//! An export that fails is logged as a warning and leaves the exit code alone.

use super::{global, CONTENT_TYPE};
use crate::config::MetricsConfig;
use crate::error::{mask_url, Error, Result};
use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Name of the metric carried over by a failed run.
pub const LAST_SUCCESS: &str = "broker_backup_last_success_timestamp_seconds";

/// Time limit of the whole Pushgateway request (connect, send, answer).
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Records the outcome of a run of `mode` (`backup` or `restore`) that began at `started` and
/// exits `exit_code` in the global registry, then writes the textfile and pushes to the
/// Pushgateway when `cfg` names them. Failures are logged as warnings; nothing is returned.
pub fn finish_run(cfg: Option<&MetricsConfig>, mode: &str, exit_code: i32, started: Instant) {
    let metrics = global();
    metrics.run_ended(mode, exit_code, SystemTime::now(), started.elapsed());
    let Some(cfg) = cfg else { return };
    if cfg.textfile.is_none() && cfg.pushgateway_url.is_none() {
        return;
    }
    let text = metrics.render();
    let succeeded = exit_code == 0;
    if let Some(path) = &cfg.textfile {
        match write_textfile(path, &text, mode, succeeded) {
            Ok(()) => log::info!("metrics: written to {}", path.display()),
            Err(e) => log::warn!("metrics textfile not written: {e}"),
        }
    }
    if let Some(url) = &cfg.pushgateway_url {
        let target = mask_url(url);
        match push(
            url,
            &cfg.pushgateway_job,
            &cfg.pushgateway_grouping,
            mode,
            &text,
            succeeded,
        ) {
            Ok(()) => log::info!("metrics: pushed to the Pushgateway at {target}"),
            Err(e) => log::warn!("metrics not pushed to the Pushgateway at {target}: {e}"),
        }
    }
}

/// Records the end of a command run of `mode` (`validate`) that exits `exit_code` and writes
/// the whole exposition to the textfile `path` ([`write_textfile`]); a failure is a warning.
pub fn write_run_textfile(path: &Path, mode: &str, exit_code: i32, started: Instant) {
    let metrics = global();
    metrics.run_ended(mode, exit_code, SystemTime::now(), started.elapsed());
    match write_textfile(path, &metrics.render(), mode, exit_code == 0) {
        Ok(()) => log::info!("metrics: written to {}", path.display()),
        Err(e) => log::warn!("metrics textfile not written: {e}"),
    }
}

/// Writes `text` (merged with the previous file, [`merge`]) to `path` atomically: a file
/// `path.tmp-<pid>` beside it, renamed over `path`. Readable by others (mode 0644 from the
/// umask), as node_exporter usually runs as another user.
///
/// Errors: `IO error: metrics.textfile <path>: <reason>` when the directory is missing or not
/// writable.
pub fn write_textfile(path: &Path, text: &str, mode: &str, succeeded: bool) -> Result<()> {
    let io = |e: std::io::Error| Error::Io(format!("metrics.textfile {}: {e}", path.display()));
    let old = match std::fs::read_to_string(path) {
        Ok(old) => old,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io(e)),
    };
    let merged = merge(&old, text, mode, succeeded);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::write(&tmp, merged.as_bytes()).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

/// The mode label value of a sample line (`name{mode="backup"} 1`), if any.
fn mode_of(line: &str) -> Option<&str> {
    let rest = &line[line.find("mode=\"")? + 6..];
    Some(&rest[..rest.find('"')?])
}

/// The metric name of a sample line.
fn name_of(line: &str) -> &str {
    line.split(['{', ' ']).next().unwrap_or("")
}

/// The series of a sample line: name and labels, without the value.
fn series_of(line: &str) -> &str {
    line.rsplit_once(' ').map_or(line, |(s, _)| s)
}

/// `new` (this run's exposition) with the series carried over from `old` (the previous
/// textfile): every `broker_backup_last_*` sample of another mode than `mode` (a restore
/// sharing the file keeps the backup's outcome), and, when the run did not succeed, the
/// [`LAST_SUCCESS`] sample of `mode`. A series `new` has is never taken from `old`. Carried
/// lines go right after their family's samples, so every family stays one block.
pub fn merge(old: &str, new: &str, mode: &str, succeeded: bool) -> String {
    let families: Vec<&str> = global().run_outcome().iter().map(|f| f.name()).collect();
    let in_new: std::collections::HashSet<&str> = new
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(series_of)
        .collect();
    let mut carried: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in old.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = name_of(line);
        if !families.contains(&name) || in_new.contains(series_of(line)) {
            continue;
        }
        let keep = match mode_of(line) {
            Some(m) if m != mode => true,
            Some(_) => !succeeded && name == LAST_SUCCESS,
            None => false,
        };
        if keep {
            carried.entry(name).or_default().push(line);
        }
    }
    let mut out = String::with_capacity(new.len() + 256);
    let mut current: Option<&str> = None;
    let flush = |current: Option<&str>, out: &mut String| {
        for line in current.and_then(|c| carried.get(c)).into_iter().flatten() {
            out.push_str(line);
            out.push('\n');
        }
    };
    for line in new.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(current, &mut out);
            current = rest.split(' ').next();
        }
        out.push_str(line);
        out.push('\n');
    }
    flush(current, &mut out);
    out
}

/// `text` without the [`LAST_SUCCESS`] family (HELP, TYPE and samples): what a run that did
/// not succeed pushes, so the Pushgateway group keeps the earlier value.
pub fn without_last_success(text: &str) -> String {
    text.lines()
        .filter(|l| {
            let name = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            name_of(name) != LAST_SUCCESS
        })
        .flat_map(|l| [l, "\n"])
        .collect()
}

/// A Pushgateway path segment: the value as is when it is URL-safe, else the `@base64` form of
/// the Pushgateway (`<label>@base64/<url-safe base64>`). Returns (label part, value part).
fn path_pair(label: &str, value: &str) -> (String, String) {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c));
    if plain {
        (label.to_string(), value.to_string())
    } else {
        (
            format!("{label}@base64"),
            base64::engine::general_purpose::URL_SAFE.encode(value.as_bytes()),
        )
    }
}

/// The Pushgateway URL of a group (credentials removed) and the `Authorization` header the
/// URL's `user:password@` gives, if any.
pub fn group_url(
    base: &str,
    job: &str,
    grouping: &BTreeMap<String, String>,
    mode: &str,
) -> (String, Option<String>) {
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let (auth, host) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            let pair = format!("{}:{}", decode(user), decode(password));
            (
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
                )),
                host,
            )
        }
        None => (None, authority),
    };
    let mut url = format!("{scheme}://{host}{}/metrics", path.trim_end_matches('/'));
    let pairs = std::iter::once(("job", job))
        .chain(grouping.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .chain(std::iter::once(("mode", mode)));
    for (label, value) in pairs {
        let (l, v) = path_pair(label, value);
        url.push('/');
        url.push_str(&l);
        url.push('/');
        url.push_str(&v);
    }
    (url, auth)
}

/// POSTs `text` (without [`LAST_SUCCESS`] unless `succeeded`) to the group of `job`,
/// `grouping` and `mode` at the Pushgateway `base`, within [`PUSH_TIMEOUT`].
///
/// Errors: `Connection error: ...` when the request fails or the Pushgateway answers other
/// than 200 or 202 (its answer quoted, shortened); the URL in it has its password masked.
pub fn push(
    base: &str,
    job: &str,
    grouping: &BTreeMap<String, String>,
    mode: &str,
    text: &str,
    succeeded: bool,
) -> Result<()> {
    let (url, auth) = group_url(base, job, grouping, mode);
    let body = if succeeded {
        text.to_string()
    } else {
        without_last_success(text)
    };
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PUSH_TIMEOUT))
        .max_redirects(0)
        .user_agent(concat!("rmq-backup/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent();
    let mut request = agent.post(&url).header("Content-Type", CONTENT_TYPE);
    if let Some(auth) = &auth {
        request = request.header("Authorization", auth);
    }
    let mut response = request
        .send(body.as_bytes())
        .map_err(|e| Error::Connection(format!("POST {url}: {e}")))?;
    let status = response.status().as_u16();
    if status == 200 || status == 202 {
        return Ok(());
    }
    let answer = response
        .body_mut()
        .with_config()
        .limit(4096)
        .read_to_string()
        .unwrap_or_default();
    let answer: String = answer.trim().chars().take(300).collect();
    Err(Error::Connection(format!(
        "POST {url}: the Pushgateway answered {status}: {answer}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "\
# HELP broker_backup_errors Errors by type and queue.
# TYPE broker_backup_errors counter
broker_backup_errors{queue=\"\",vhost=\"\",error_type=\"storage\"} 1
# HELP broker_backup_last_run_exit_code Exit code.
# TYPE broker_backup_last_run_exit_code gauge
broker_backup_last_run_exit_code{mode=\"backup\"} 0
broker_backup_last_run_exit_code{mode=\"restore\"} 1
# HELP broker_backup_last_success_timestamp_seconds When.
# TYPE broker_backup_last_success_timestamp_seconds gauge
broker_backup_last_success_timestamp_seconds{mode=\"backup\"} 1700000000.5
# HELP broker_backup_last_run_duration_seconds How long.
# TYPE broker_backup_last_run_duration_seconds gauge
broker_backup_last_run_duration_seconds{mode=\"backup\"} 3
";

    fn failed_backup() -> String {
        "\
# HELP broker_backup_errors Errors by type and queue.
# TYPE broker_backup_errors counter
# HELP broker_backup_last_run_exit_code Exit code.
# TYPE broker_backup_last_run_exit_code gauge
broker_backup_last_run_exit_code{mode=\"backup\"} 1
# HELP broker_backup_last_success_timestamp_seconds When.
# TYPE broker_backup_last_success_timestamp_seconds gauge
# HELP broker_backup_last_run_duration_seconds How long.
# TYPE broker_backup_last_run_duration_seconds gauge
broker_backup_last_run_duration_seconds{mode=\"backup\"} 1
"
        .to_string()
    }

    #[test]
    fn a_failed_run_keeps_the_last_success_and_the_other_mode() {
        let merged = merge(OLD, &failed_backup(), "backup", false);
        assert_eq!(
            merged,
            "\
# HELP broker_backup_errors Errors by type and queue.
# TYPE broker_backup_errors counter
# HELP broker_backup_last_run_exit_code Exit code.
# TYPE broker_backup_last_run_exit_code gauge
broker_backup_last_run_exit_code{mode=\"backup\"} 1
broker_backup_last_run_exit_code{mode=\"restore\"} 1
# HELP broker_backup_last_success_timestamp_seconds When.
# TYPE broker_backup_last_success_timestamp_seconds gauge
broker_backup_last_success_timestamp_seconds{mode=\"backup\"} 1700000000.5
# HELP broker_backup_last_run_duration_seconds How long.
# TYPE broker_backup_last_run_duration_seconds gauge
broker_backup_last_run_duration_seconds{mode=\"backup\"} 1
"
        );
    }

    #[test]
    fn a_successful_run_replaces_the_last_success() {
        let new = failed_backup().replace(
            "# TYPE broker_backup_last_success_timestamp_seconds gauge\n",
            "# TYPE broker_backup_last_success_timestamp_seconds gauge\nbroker_backup_last_success_timestamp_seconds{mode=\"backup\"} 1800000000\n",
        );
        let merged = merge(OLD, &new, "backup", true);
        assert!(
            merged.contains("{mode=\"backup\"} 1800000000\n"),
            "{merged}"
        );
        assert!(!merged.contains("1700000000.5"), "{merged}");
        assert!(
            !merged.contains("error_type=\"storage\""),
            "counters are this run's"
        );
        // Even when told it failed, a series of this run wins over the old one.
        assert!(!merge(OLD, &new, "backup", false).contains("1700000000.5"));
    }

    #[test]
    fn a_restore_keeps_the_backup_series() {
        let new = failed_backup().replace("mode=\"backup\"", "mode=\"restore\"");
        let merged = merge(OLD, &new, "restore", false);
        assert!(merged.contains("broker_backup_last_run_exit_code{mode=\"backup\"} 0\n"));
        assert!(merged.contains(
            "broker_backup_last_success_timestamp_seconds{mode=\"backup\"} 1700000000.5\n"
        ));
        assert!(merged.contains("broker_backup_last_run_duration_seconds{mode=\"backup\"} 3\n"));
        assert_eq!(merged.matches("{mode=\"restore\"}").count(), 2, "{merged}");
    }

    #[test]
    fn no_old_file_or_garbage_carries_nothing() {
        assert_eq!(
            merge("", &failed_backup(), "backup", false),
            failed_backup()
        );
        assert_eq!(
            merge("not metrics\n{{{\n", &failed_backup(), "backup", false),
            failed_backup()
        );
    }

    #[test]
    fn the_failed_push_has_no_last_success() {
        let text = merge(OLD, &failed_backup(), "backup", false);
        let pushed = without_last_success(&text);
        assert!(!pushed.contains(LAST_SUCCESS), "{pushed}");
        assert!(pushed.contains("broker_backup_last_run_exit_code{mode=\"backup\"} 1\n"));
    }

    #[test]
    fn group_urls() {
        let mut g = BTreeMap::new();
        assert_eq!(
            group_url("http://pgw:9091/", "rmq-backup", &g, "backup"),
            (
                "http://pgw:9091/metrics/job/rmq-backup/mode/backup".to_string(),
                None
            )
        );
        g.insert("instance".to_string(), "prod/eu 1".to_string());
        let (url, auth) = group_url("https://u%40x:p%3Aw@pgw.example/base", "j", &g, "restore");
        assert_eq!(
            url,
            "https://pgw.example/base/metrics/job/j/instance@base64/cHJvZC9ldSAx/mode/restore"
        );
        let expected = base64::engine::general_purpose::STANDARD.encode("u@x:p:w");
        assert_eq!(auth, Some(format!("Basic {expected}")));
    }
}
