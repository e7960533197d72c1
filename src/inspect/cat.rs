//! `cat`: the records of a backup on stdout, in backup order (the manifest's queues, sorted by
//! vhost and name, each queue's segments by sequence, each segment's records as stored), as
//! JSON lines ([`super::cat_json`]) or raw bodies.
//!
//! Segments are fetched, verified (CRC32, SHA-256, record count) and decoded by the restore's
//! own reader (`crate::restore::segments::decode_segments`) on a thread of their own, and handed
//! over in bounded batches (at most 256 records or 1 MiB of body per batch, one batch waiting):
//! memory stays the same whatever the size of the backup. When the reader of stdout goes away
//! (`| head`) the command stops quietly with exit 0.
//!
//! `--since` / `--until` filter on the record's `backed_up_at` (when the tool captured it, epoch
//! ms), both ends included, as `restore.time_window_start` / `_end` do; segments entirely outside
//! the window are not fetched. The AMQP `timestamp` property is left alone: it is optional,
//! whole seconds, and set by the publisher.

use super::cat_json::CatLine;
use crate::config::RestoreOptions;
use crate::error::{Error, Result};
use crate::repository::encryption::Identities;
use crate::repository::manifest::{Manifest, QueueBackup};
use crate::repository::record::BackupRecord;
use crate::repository::spool::SpoolDir;
use crate::repository::storage::Storage;
use crate::restore::segments::{decode_segments, segment_in_window};
use argh::FromArgs;
use std::io::Write;
use std::sync::atomic::AtomicU64;

/// Write the messages of a backup to stdout: JSON lines (body as text when it is valid UTF-8
/// and the content type is text or JSON, else base64; every header with its AMQP type; the
/// properties), or the raw bodies. Stops quietly when stdout is closed (`| head`).
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "cat",
    example = "{command_name} --path file:///var/backups/rabbitmq --backup-id nightly --queue orders --limit 10\n{command_name} --path file:///var/backups/rabbitmq --backup-id nightly --since 2026-11-25T10:00:00Z --until 1795610000000 | jq .body\n{command_name} --path file:///var/backups/rabbitmq --backup-id nightly --queue orders --format body --delimiter '\\0' | xargs -0 -n1 echo",
    note = "Records come in backup order: queues sorted by vhost and name, each queue's records in the order they were read. --since and --until take epoch milliseconds or RFC 3339 times and compare them with each record's backed_up_at (when the backup captured it), both ends included, as restore.time_window_start/end do. Every segment read is verified first (CRC32, SHA-256, record count): a damaged one stops the command with a Serialization error, exit 1. A --vhost or --queue that the backup does not hold is exit 2."
)]
pub struct CatCmd {
    /// storage URL (see `list --help`); or --config
    #[argh(option)]
    path: Option<String>,
    /// a backup or restore configuration file whose storage section (with its credentials and
    /// prefix) is used instead of --path
    #[argh(option)]
    config: Option<std::path::PathBuf>,
    /// the backup id to read (with --config, default: the file's backup_id)
    #[argh(option)]
    backup_id: Option<String>,
    /// only queues of this vhost (exact name; `/` for the default vhost)
    #[argh(option)]
    vhost: Option<String>,
    /// only the queue or stream of this name (exact name)
    #[argh(option)]
    queue: Option<String>,
    /// only records with backed_up_at at or after this time: epoch ms or RFC 3339
    #[argh(option)]
    since: Option<String>,
    /// only records with backed_up_at at or before this time: epoch ms or RFC 3339
    #[argh(option)]
    until: Option<String>,
    /// stop after this many records
    #[argh(option)]
    limit: Option<u64>,
    /// output format: jsonl (default, one JSON object per record) or body (raw bodies)
    #[argh(option, default = "CatFormat::Jsonl")]
    format: CatFormat,
    /// what follows each body with --format body (default a newline); \n, \r, \t, \0 and a
    /// doubled backslash are understood
    #[argh(option, default = "String::from(\"\\\\n\")")]
    delimiter: String,
    /// age identity file that decrypts an encrypted backup (default: the --config file's
    /// restore.encryption.identity_file, else the environment variable RMQ_BACKUP_AGE_IDENTITY)
    #[argh(option)]
    identity_file: Option<std::path::PathBuf>,
}

/// How `cat` writes a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatFormat {
    /// One JSON object per line ([`CatLine`]).
    Jsonl,
    /// The raw body, then the delimiter.
    Body,
}

impl std::str::FromStr for CatFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "jsonl" | "json" => Ok(CatFormat::Jsonl),
            "body" => Ok(CatFormat::Body),
            other => Err(format!("unknown format {other}: expected jsonl or body")),
        }
    }
}

/// What `cat` reads and how it writes, checked.
#[derive(Debug, Clone)]
pub struct CatOptions {
    pub vhost: Option<String>,
    pub queue: Option<String>,
    /// Epoch ms, inclusive.
    pub since: Option<i64>,
    /// Epoch ms, inclusive.
    pub until: Option<i64>,
    pub limit: Option<u64>,
    pub format: CatFormat,
    /// Bytes written after each body (`--format body`).
    pub delimiter: Vec<u8>,
}

impl CatCmd {
    /// Runs the command on stdout; returns the exit code (0, also when stdout was closed early).
    ///
    /// Errors: `Configuration error:` (exit 2) for a bad time, delimiter, vhost or queue; the
    /// storage's errors; `Manifest error:`; `Serialization error:` for a damaged segment.
    pub fn run(self) -> Result<i32> {
        let time = |name: &str, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    crate::run::units::parse_time(s)
                        .map_err(|e| Error::Config(format!("--{name}: {e}")))
                })
                .transpose()
        };
        let opts = CatOptions {
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            vhost: self.vhost,
            queue: self.queue,
            limit: self.limit,
            format: self.format,
            delimiter: unescape(&self.delimiter)?,
        };
        let opened = crate::repository::storage::args::open(
            self.path.as_deref(),
            self.config.as_deref(),
            "--path",
            "--config",
        )?;
        let keys = opened.identities(self.identity_file.as_deref())?;
        let backup_id = opened.backup_id(self.backup_id)?;
        let storage = opened.storage;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
        cat(storage.as_ref(), &backup_id, &opts, keys.as_ref(), &mut out)?;
        Ok(0)
    }
}

/// `\n`, `\r`, `\t`, `\0` and `\\` in a delimiter; anything else as given.
fn unescape(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        out.push(match chars.next() {
            Some('n') => b'\n',
            Some('r') => b'\r',
            Some('t') => b'\t',
            Some('0') => 0,
            Some('\\') => b'\\',
            other => {
                return Err(Error::Config(format!(
                    "--delimiter: unknown escape \\{} (known: \\n \\r \\t \\0 \\\\)",
                    other.map(String::from).unwrap_or_default()
                )))
            }
        });
    }
    Ok(out)
}

/// How a `cat` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatOutcome {
    /// Records written.
    pub records: u64,
    /// True when the writer went away (broken pipe) before the end.
    pub closed: bool,
}

/// Writes the records of `backup_id` that `opts` selects to `out`, in backup order, and
/// flushes it. A broken pipe ends it early without an error. `keys` decrypt an encrypted
/// backup.
///
/// Errors: `Configuration error:` when `opts.vhost` / `opts.queue` match no queue of the
/// backup; the storage's; `Manifest error:`; `Encryption error:` for an encrypted backup
/// without `keys`, with keys that do not open every segment of the queues and window
/// selected, or holding a segment in clear, before any record is written
/// (`crate::repository::fetch::check_readable`); `Serialization error:`
/// for a segment that fails verification; `IO error: cannot write the output: ...` for other
/// write failures.
pub fn cat(
    storage: &dyn Storage,
    backup_id: &str,
    opts: &CatOptions,
    keys: Option<&Identities>,
    out: &mut dyn Write,
) -> Result<CatOutcome> {
    let manifest = Manifest::read(storage, backup_id)?;
    let queues = selected(&manifest, opts)?;
    let window = RestoreOptions {
        time_window_start: opts.since,
        time_window_end: opts.until,
        ..RestoreOptions::default()
    };
    // Every segment this may read opens with `keys`, before anything is written.
    crate::repository::fetch::check_readable(
        &manifest,
        keys,
        queues
            .iter()
            .flat_map(|q| &q.segments)
            .filter(|s| segment_in_window(s, &window)),
        false,
    )?;
    let spool = SpoolDir::create(&format!("cat-{backup_id}"))?;
    let mut outcome = CatOutcome {
        records: 0,
        closed: false,
    };
    for q in queues {
        if opts.limit.is_some_and(|l| outcome.records >= l) {
            break;
        }
        let (tx, rx) = crossbeam_channel::bounded::<Vec<BackupRecord>>(1);
        let outside = AtomicU64::new(0);
        let (window, outside, spool) = (&window, &outside, spool.path());
        let written = std::thread::scope(|s| {
            // The sender moves into the reader: when it ends, the loop below ends.
            let decoder = crate::repository::spool::spawn_named(s, "segment-reader", move || {
                decode_segments(window, storage, spool, q, &tx, outside, 0, 1, keys)
            });
            let written = write_queue(&rx, opts, out, &mut outcome);
            // Stops the decoder at its next batch when this side stopped first.
            drop(rx);
            let decoded = decoder
                .join()
                .unwrap_or_else(|_| Err(Error::Io("the segment reader panicked".into())));
            (written, decoded)
        });
        // What the reader met after this side stopped (the limit, a closed pipe) is not
        // reported: those records were not asked for.
        if !written.0? {
            break;
        }
        written.1?;
    }
    match out.flush() {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => outcome.closed = true,
        Err(e) => return Err(write_error(&e)),
    }
    Ok(outcome)
}

/// The queues of the manifest that `opts` selects, in backup order.
fn selected<'m>(manifest: &'m Manifest, opts: &CatOptions) -> Result<Vec<&'m QueueBackup>> {
    let mut queues: Vec<&QueueBackup> = manifest
        .queues
        .iter()
        .filter(|q| opts.vhost.as_ref().is_none_or(|v| *v == q.vhost))
        .filter(|q| opts.queue.as_ref().is_none_or(|n| *n == q.name))
        .collect();
    if queues.is_empty() && (opts.vhost.is_some() || opts.queue.is_some()) {
        let held: Vec<String> = manifest
            .queues
            .iter()
            .map(|q| format!("{} in vhost {}", q.name, q.vhost))
            .collect();
        return Err(Error::Config(format!(
            "backup {} holds no queue{}{}; it holds: {}",
            manifest.backup_id,
            opts.queue
                .as_ref()
                .map(|q| format!(" {q}"))
                .unwrap_or_default(),
            opts.vhost
                .as_ref()
                .map(|v| format!(" in vhost {v}"))
                .unwrap_or_default(),
            if held.is_empty() {
                "no queues".to_string()
            } else {
                held.join(", ")
            }
        )));
    }
    queues.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    Ok(queues)
}

/// Writes one queue's batches; false when the limit was reached or the writer went away.
fn write_queue(
    rx: &crossbeam_channel::Receiver<Vec<BackupRecord>>,
    opts: &CatOptions,
    out: &mut dyn Write,
    outcome: &mut CatOutcome,
) -> Result<bool> {
    for batch in rx {
        for record in &batch {
            if opts.limit.is_some_and(|l| outcome.records >= l) {
                return Ok(false);
            }
            let written = match opts.format {
                CatFormat::Jsonl => serde_json::to_writer(&mut *out, &CatLine::of(record))
                    .map_err(std::io::Error::from)
                    .and_then(|()| out.write_all(b"\n")),
                CatFormat::Body => out
                    .write_all(&record.body)
                    .and_then(|()| out.write_all(&opts.delimiter)),
            };
            match written {
                Ok(()) => outcome.records += 1,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    outcome.closed = true;
                    return Ok(false);
                }
                Err(e) => return Err(write_error(&e)),
            }
        }
    }
    Ok(true)
}

fn write_error(e: &std::io::Error) -> Error {
    Error::Io(format!("cannot write the output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delimiters() {
        assert_eq!(unescape("\\n").unwrap(), b"\n");
        assert_eq!(unescape("\\0--\\t\\\\").unwrap(), b"\0--\t\\");
        assert_eq!(unescape("✓").unwrap(), "✓".as_bytes());
        let e = unescape("\\x").unwrap_err().to_string();
        assert!(e.starts_with("Configuration error: --delimiter"), "{e}");
    }
}
