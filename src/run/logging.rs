//! Logging to stderr: the level rules, and two formats. `text` (default) is one line per record
//! (`2026-11-25T10:58:06.123Z INFO  message`); `json` (`--log-format json`, or
//! `RMQ_BACKUP_LOG_FORMAT=json`) is one JSON object per line for Loki or ELK:
//!
//! ```json
//! {"timestamp":"2026-11-25T10:58:06.123Z","level":"INFO","target":"rmq_backup::backup",
//!  "message":"...","backup_id":"nightly","vhost":"/","queue":"orders","segment":"..."}
//! ```
//!
//! `backup_id` comes from the run's context ([`set_backup_id`], once per process: a process runs
//! one job); `vhost` and `queue` from the thread's context ([`queue_scope`], set by the thread
//! that works on one queue); further fields (`segment`, `error_type`, ...) from the log call's
//! key-values (`log::warn!(segment = key; "...")`). A field appears only where it is known.
//! Nothing is added to the messages themselves, which never hold a secret (ARCHITECTURE.md
//! "Invariants"): the JSON form only escapes them.

use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

/// How log records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other}: expected text or json")),
        }
    }
}

/// Environment variable that chooses the log format when `--log-format` is not given.
pub const LOG_FORMAT_ENV: &str = "RMQ_BACKUP_LOG_FORMAT";

/// Takes `--log-format <f>` (anywhere before `--`; `--log-format=f` is expanded before) out of
/// `args`; without it, [`LOG_FORMAT_ENV`]; else text.
///
/// Errors: the sentence for a missing or unknown value (the caller prefixes its category).
pub fn take_log_format(args: &mut Vec<String>) -> Result<LogFormat, String> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(i) = args[..end].iter().position(|a| a == "--log-format") {
        let value = args
            .get(i + 1)
            .filter(|_| i + 1 < end)
            .cloned()
            .ok_or("--log-format needs a value: text or json")?;
        args.drain(i..=i + 1);
        return value.parse();
    }
    match std::env::var(LOG_FORMAT_ENV) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .map_err(|e: String| format!("{LOG_FORMAT_ENV}: {e}")),
        _ => Ok(LogFormat::Text),
    }
}

static BACKUP_ID: OnceLock<String> = OnceLock::new();
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Writes the error a command ends with to stderr: the bare message (`Storage error: ...`) in
/// text format; in JSON format a log record at error level with its `error_type`, so that every
/// line of stderr is JSON.
pub fn report_error(e: &crate::error::Error) {
    if FORMAT.get() == Some(&LogFormat::Json) && log::log_enabled!(log::Level::Error) {
        log::error!(target: "rmq_backup::cli", error_type = e.error_type(); "{e}");
    } else {
        eprintln!("{e}");
    }
}

thread_local! {
    static QUEUE: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
}

/// Sets the backup id every later log record of this process carries (the first call wins).
pub fn set_backup_id(id: &str) {
    let _ = BACKUP_ID.set(id.to_string());
}

/// The vhost and queue this thread's log records are about, until the guard is dropped (the
/// previous ones come back then).
pub fn queue_scope(vhost: &str, queue: &str) -> QueueScope {
    let previous = QUEUE.with(|q| q.replace(Some((vhost.to_string(), queue.to_string()))));
    QueueScope { previous }
}

/// Guard of [`queue_scope`].
pub struct QueueScope {
    previous: Option<(String, String)>,
}

impl Drop for QueueScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        QUEUE.with(|q| *q.borrow_mut() = previous);
    }
}

/// Logging to stderr: info by default, `-v` debug, `-vv` trace for this crate (and libraries
/// too at trace, but HTTP clients never above info), `RUST_LOG` instead when set. On a
/// terminal, records go through [`crate::run::progress::LogWriter`] so that they never mix with the
/// progress display.
pub fn init(verbosity: u8, format: LogFormat) {
    let mut b = env_logger::Builder::new();
    if std::io::stderr().is_terminal() {
        b.target(env_logger::Target::Pipe(Box::new(
            crate::run::progress::LogWriter,
        )));
    } else {
        b.target(env_logger::Target::Stderr);
    }
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            b.parse_filters(&spec);
        }
        _ => {
            let level = match verbosity {
                0 => log::LevelFilter::Info,
                1 => log::LevelFilter::Debug,
                _ => log::LevelFilter::Trace,
            };
            // Our own crate at the chosen level; libraries stay quieter unless -vv.
            b.filter_level(if verbosity >= 2 {
                level
            } else {
                log::LevelFilter::Warn
            });
            b.filter_module("rmq_backup", level);
        }
    }
    // HTTP clients print whole URLs (a SAS signature, an STS web-identity token in a query),
    // request heads (bearer tokens) and response bodies (OAuth access tokens) at debug and
    // trace: they are capped at info whatever -vv or RUST_LOG asks for. Our own storage trace
    // lines say what was requested, without secrets.
    for module in [
        "ureq",
        "ureq_proto",
        "attohttpc",
        "s3",
        "awscreds",
        "aws_creds",
    ] {
        b.filter_module(module, log::LevelFilter::Info);
    }
    match format {
        LogFormat::Text => b.format(|buf, record| {
            writeln!(
                buf,
                "{} {:<5} {}",
                buf.timestamp_millis(),
                record.level(),
                record.args()
            )
        }),
        LogFormat::Json => b.format(|buf, record| {
            let line = json_line(record);
            buf.write_all(line.as_bytes())?;
            buf.write_all(b"\n")
        }),
    };
    if b.try_init().is_ok() {
        let _ = FORMAT.set(format);
    }
}

/// The JSON object of one record (see the module documentation): `timestamp`, `level`,
/// `target`, `message` first, then the other fields sorted by key.
pub fn json_line(record: &log::Record) -> String {
    let mut fields: std::collections::BTreeMap<String, String> = Default::default();
    struct Collect<'a>(&'a mut std::collections::BTreeMap<String, String>);
    impl<'kvs> log::kv::VisitSource<'kvs> for Collect<'_> {
        fn visit_pair(
            &mut self,
            key: log::kv::Key<'kvs>,
            value: log::kv::Value<'kvs>,
        ) -> Result<(), log::kv::Error> {
            self.0
                .entry(key.to_string())
                .or_insert_with(|| value.to_string());
            Ok(())
        }
    }
    // The call's own fields win over the context: a line about another queue than the
    // thread's names its own.
    let _ = record.key_values().visit(&mut Collect(&mut fields));
    if let Some(id) = BACKUP_ID.get() {
        fields
            .entry("backup_id".into())
            .or_insert_with(|| id.clone());
    }
    QUEUE.with(|q| {
        if let Some((vhost, queue)) = q.borrow().as_ref() {
            fields
                .entry("vhost".into())
                .or_insert_with(|| vhost.clone());
            fields
                .entry("queue".into())
                .or_insert_with(|| queue.clone());
        }
    });
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let mut line = format!(
        "{{\"timestamp\":{},\"level\":{},\"target\":{},\"message\":{}",
        text(&crate::run::units::rfc3339_ms(crate::now_ms())),
        text(record.level().as_str()),
        text(record.target()),
        text(&record.args().to_string())
    );
    for (k, v) in fields
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "timestamp" | "level" | "target" | "message"))
    {
        line.push(',');
        line.push_str(&text(k));
        line.push(':');
        line.push_str(&text(v));
    }
    line.push('}');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn takes_the_option_anywhere() {
        let mut a = strs(&["backup", "--log-format", "json", "--config", "c"]);
        assert_eq!(take_log_format(&mut a), Ok(LogFormat::Json));
        assert_eq!(a, strs(&["backup", "--config", "c"]));
        let mut a = strs(&["list", "--log-format"]);
        assert!(take_log_format(&mut a).is_err());
        let mut a = strs(&["list", "--log-format", "xml"]);
        assert!(take_log_format(&mut a).unwrap_err().contains("xml"));
    }

    #[test]
    fn json_lines_carry_the_context_and_the_fields() {
        let _scope = queue_scope("/", "orders");
        let line = json_line(
            &log::Record::builder()
                .args(format_args!("stored \"x\""))
                .level(log::Level::Warn)
                .target("rmq_backup::t")
                .key_values(&[("segment", "b/queues/_default/orders/segment-0001.zst")])
                .build(),
        );
        assert!(line.starts_with("{\"timestamp\":\""), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["message"], "stored \"x\"");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "rmq_backup::t");
        assert_eq!(v["vhost"], "/");
        assert_eq!(v["queue"], "orders");
        assert_eq!(v["segment"], "b/queues/_default/orders/segment-0001.zst");
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
        drop(_scope);
        let line = json_line(&log::Record::builder().args(format_args!("m")).build());
        assert!(!line.contains("\"queue\""), "{line}");
    }
}
