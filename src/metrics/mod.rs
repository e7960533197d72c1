//! The metrics of SPEC.md "Metrics HTTP server", their text exposition (format 0.0.4), and the
//! health state behind `/health`; [`server`] serves them over HTTP.
//!
//! One process-wide registry ([`global`]). Every metric is registered at start, so each appears
//! with its `# HELP` and `# TYPE` lines from the first scrape on, even before it has a series.
//!
//! Hot path: a job resolves the labelled counters of a queue once ([`Metrics::backup_queue`],
//! [`Metrics::restore_queue`]) and keeps the [`Counter`] handles; an update is then one relaxed
//! atomic add, no lock and no label hashing. Locks are taken only to create a series (once per
//! queue) and to render a scrape.
//!
//! Written by hand on atomics rather than with a metrics crate: the tikv `prometheus` crate
//! omits a labelled family until its first series exists (SPEC.md wants every metric with
//! HELP and TYPE) and builds its metrics fallibly; `prometheus-client` writes OpenMetrics,
//! which appends `_total` to counter names and has another content type. Both would update the
//! same relaxed atomic on the hot path as this module does.

pub mod export;
mod outcome;
pub mod server;

pub use outcome::GaugeFamily;

use crate::error::Error;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Content type of the metrics endpoint (SPEC.md "Versioning" 3: text exposition 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Label names of QueueLabels (SPEC.md "Metrics HTTP server").
pub const QUEUE_LABELS: [&str; 3] = ["queue", "vhost", "queue_type"];
/// Label names of ErrorLabels (SPEC.md "Metrics HTTP server").
pub const ERROR_LABELS: [&str; 3] = ["queue", "vhost", "error_type"];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A monotonically increasing count; cloning shares the value. Updates are one relaxed atomic
/// add (scrapes need no ordering with other memory).
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds 1.
    #[inline]
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (active connections).
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds 1.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtracts 1.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A counter family with `N` labels (three unless said): one [`Counter`] per distinct label
/// values.
#[derive(Debug)]
pub struct CounterFamily<const N: usize = 3> {
    name: &'static str,
    help: &'static str,
    labels: [&'static str; N],
    /// Series by their label values joined with NUL (no label value holds one: they are
    /// queue, vhost and type names); a backup of 5,000 queues resolved each queue's series by
    /// a scan of every earlier one, a third of its CPU in `memcmp`.
    series: Mutex<HashMap<String, ([String; N], Counter)>>,
}

impl<const N: usize> CounterFamily<N> {
    fn new(name: &'static str, help: &'static str, labels: [&'static str; N]) -> Self {
        CounterFamily {
            name,
            help,
            labels,
            series: Mutex::new(HashMap::new()),
        }
    }

    /// The counter of these label values, created at 0 when new. Takes a lock and hashes the
    /// values: call it once per queue, not per message.
    pub fn with(&self, values: [&str; N]) -> Counter {
        let key = values.join("\0");
        lock(&self.series)
            .entry(key)
            .or_insert_with(|| (values.map(str::to_string), Counter::default()))
            .1
            .clone()
    }

    /// Sum over every series.
    pub fn total(&self) -> u64 {
        lock(&self.series).values().map(|(_, c)| c.get()).sum()
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        let mut series: Vec<([String; N], u64)> = lock(&self.series)
            .values()
            .map(|(v, c)| (v.clone(), c.get()))
            .collect();
        series.sort();
        for (values, value) in series {
            out.push_str(self.name);
            out.push('{');
            for (i, (name, v)) in self.labels.iter().zip(&values).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_label_value(v, out);
                out.push('"');
            }
            let _ = writeln!(out, "}} {value}");
        }
    }
}

/// Counters of one queue in a backup (QueueLabels), resolved once.
#[derive(Debug, Clone)]
pub struct BackupQueueMetrics {
    /// `broker_backup_messages_read`.
    pub messages_read: Counter,
    /// `broker_backup_bytes_read` (uncompressed body bytes).
    pub bytes_read: Counter,
    /// `broker_backup_segments_written`.
    pub segments_written: Counter,
    /// `broker_backup_segments_bytes` (compressed bytes stored).
    pub segments_bytes: Counter,
}

/// Counters of one queue in a restore (QueueLabels of the target queue), resolved once.
#[derive(Debug, Clone)]
pub struct RestoreQueueMetrics {
    /// `broker_restore_messages_published`.
    pub published: Counter,
    /// `broker_restore_messages_confirmed`.
    pub confirmed: Counter,
    /// `broker_restore_messages_failed` (nacked or returned).
    pub failed: Counter,
}

/// Every metric of SPEC.md, and the health state.
#[derive(Debug)]
pub struct Metrics {
    /// `broker_backup_messages_read` (QueueLabels).
    pub messages_read: CounterFamily,
    /// `broker_backup_bytes_read` (QueueLabels).
    pub bytes_read: CounterFamily,
    /// `broker_backup_segments_written` (QueueLabels).
    pub segments_written: CounterFamily,
    /// `broker_backup_segments_bytes` (QueueLabels).
    pub segments_bytes: CounterFamily,
    /// `broker_backup_checkpoint_syncs` (no labels). Stays 0 until checkpoints exist
    /// (`offset_storage` is not supported yet).
    pub checkpoint_syncs: Counter,
    /// `broker_backup_checkpoint_sync_failures` (no labels): checkpoint database syncs to
    /// storage that failed (`crate::repository::checkpoint::sync`; a periodic one is tried again at the
    /// next interval). Not in SPEC.md's list.
    pub checkpoint_sync_failures: Counter,
    /// `broker_backup_errors` (ErrorLabels).
    pub errors: CounterFamily,
    /// `broker_backup_queues_skipped` (QueueLabels, `queue_type` as the management API names
    /// it): selected queues a backup left alone (exclusive, quorum with a delivery limit,
    /// streams, unknown types). Not in SPEC.md's list: the exit code 4 says the same to scripts.
    pub queues_skipped: CounterFamily,
    /// `broker_backup_messages_left_out` (QueueLabels): messages a queue held unacknowledged by
    /// a live consumer of another application when its backup started, not in the backup
    /// (`crate::backup`, exit 4). Not in SPEC.md's list.
    pub messages_left_out: CounterFamily,
    /// `broker_backup_queue_retries` (QueueLabels): reads of a queue started again after its
    /// connection was lost (`crate::backup`). Not in SPEC.md's list.
    pub queue_retries: CounterFamily,
    /// `broker_storage_retries` (labels `backend`, `outcome`: `succeeded` or `failed`):
    /// storage requests made again after a transient failure (5xx, 408, 429, a timeout, a
    /// reset), by the outcome of the operation they belong to (`crate::repository::storage::retry`). Not in
    /// SPEC.md's list.
    pub storage_retries: CounterFamily<2>,
    /// `broker_backup_retention_runs` (label `outcome`: `succeeded` or `failed`): the
    /// configuration's `retention:` applied after a successful backup (`crate::retention`);
    /// a failure leaves the backup's exit code alone, so this and the log say it. Not in
    /// SPEC.md's list.
    pub retention_runs: CounterFamily<1>,
    /// `broker_backup_validate_segments_read` (no labels): segments `validate --deep` fetched
    /// and read (all, or its `--read-data-subset`). Not in SPEC.md's list.
    pub validate_segments_read: Counter,
    /// `broker_backup_validate_bytes_read` (no labels): stored bytes of those segments.
    pub validate_bytes_read: Counter,
    /// `broker_backup_validate_segments_failed` (no labels): segments `validate` found
    /// missing or damaged.
    pub validate_segments_failed: Counter,
    /// `broker_restore_messages_published` (QueueLabels).
    pub restore_published: CounterFamily,
    /// `broker_restore_messages_confirmed` (QueueLabels).
    pub restore_confirmed: CounterFamily,
    /// `broker_restore_messages_failed` (QueueLabels).
    pub restore_failed: CounterFamily,
    /// `broker_backup_amqp_connections_active`: up when an AMQP connection opens, down when
    /// its reader thread ends (closed or lost).
    pub amqp_connections: Gauge,
    /// `broker_backup_stream_connections_active`: stream-protocol connections open now (one
    /// per stream being backed up, `backup::stream`).
    pub stream_connections: Gauge,
    /// `broker_backup_last_run_timestamp_seconds` (label `mode`: `backup` or `restore`):
    /// when this process's run ended, in seconds since the Unix epoch ([`Metrics::run_ended`]).
    /// This and the three below are not in SPEC.md's list; they exist to outlive the process
    /// ([`export`]).
    pub last_run_timestamp: GaugeFamily,
    /// `broker_backup_last_run_exit_code` (label `mode`): the exit code of the run (0, 1, 2,
    /// 4, or 130/143 when stopped by a signal).
    pub last_run_exit_code: GaugeFamily,
    /// `broker_backup_last_success_timestamp_seconds` (label `mode`): when the run ended, set
    /// only when it exited 0 (a backup exiting 4, queues left out, is no success).
    pub last_success_timestamp: GaugeFamily,
    /// `broker_backup_last_run_duration_seconds` (label `mode`): how long the run took, from
    /// the configuration loaded to its end.
    pub last_run_duration: GaugeFamily,
    /// What `/health` reports.
    pub health: Health,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric at zero and no series.
    pub fn new() -> Self {
        let q = |name, help| CounterFamily::new(name, help, QUEUE_LABELS);
        Metrics {
            messages_read: q(
                "broker_backup_messages_read",
                "Messages successfully consumed from a queue (AMQP) or stream.",
            ),
            bytes_read: q(
                "broker_backup_bytes_read",
                "Uncompressed message payload bytes read.",
            ),
            segments_written: q(
                "broker_backup_segments_written",
                "Segments finalized and stored (size or time threshold reached, or backup complete).",
            ),
            segments_bytes: q(
                "broker_backup_segments_bytes",
                "Compressed segment bytes written to storage.",
            ),
            checkpoint_syncs: Counter::default(),
            checkpoint_sync_failures: Counter::default(),
            errors: CounterFamily::new(
                "broker_backup_errors",
                "Errors by type and queue.",
                ERROR_LABELS,
            ),
            queues_skipped: q(
                "broker_backup_queues_skipped",
                "Selected queues the backup left alone (exclusive, delivery limit, unsupported type).",
            ),
            messages_left_out: q(
                "broker_backup_messages_left_out",
                "Messages unacknowledged by another application's consumer at the start of a queue's backup, not backed up.",
            ),
            queue_retries: q(
                "broker_backup_queue_retries",
                "Reads of a queue started again after its connection was lost.",
            ),
            storage_retries: CounterFamily::new(
                "broker_storage_retries",
                "Storage requests made again after a transient failure, by backend and the outcome of their operation.",
                ["backend", "outcome"],
            ),
            retention_runs: CounterFamily::new(
                "broker_backup_retention_runs",
                "Retention (the configuration's retention section) applied after a successful backup, by outcome.",
                ["outcome"],
            ),
            validate_segments_read: Counter::default(),
            validate_bytes_read: Counter::default(),
            validate_segments_failed: Counter::default(),
            restore_published: q(
                "broker_restore_messages_published",
                "Messages published to the target during restore.",
            ),
            restore_confirmed: q(
                "broker_restore_messages_confirmed",
                "Messages confirmed by the target broker (with publisher confirms).",
            ),
            restore_failed: q(
                "broker_restore_messages_failed",
                "Messages that failed to publish (nacked or returned by the target).",
            ),
            amqp_connections: Gauge::default(),
            stream_connections: Gauge::default(),
            last_run_timestamp: GaugeFamily::new(
                "broker_backup_last_run_timestamp_seconds",
                "When the last run ended, in seconds since the Unix epoch.",
                "mode",
            ),
            last_run_exit_code: GaugeFamily::new(
                "broker_backup_last_run_exit_code",
                "Exit code of the last run (0 success, 1 failed, 2 configuration, 4 queues left out, 130/143 stopped).",
                "mode",
            ),
            last_success_timestamp: GaugeFamily::new(
                "broker_backup_last_success_timestamp_seconds",
                "When the last run that exited 0 ended, in seconds since the Unix epoch.",
                "mode",
            ),
            last_run_duration: GaugeFamily::new(
                "broker_backup_last_run_duration_seconds",
                "How long the last run took, in seconds.",
                "mode",
            ),
            health: Health::default(),
        }
    }

    /// The backup counters of one queue; `queue_type` is `classic`, `quorum` or `stream`.
    pub fn backup_queue(&self, queue: &str, vhost: &str, queue_type: &str) -> BackupQueueMetrics {
        let l = [queue, vhost, queue_type];
        BackupQueueMetrics {
            messages_read: self.messages_read.with(l),
            bytes_read: self.bytes_read.with(l),
            segments_written: self.segments_written.with(l),
            segments_bytes: self.segments_bytes.with(l),
        }
    }

    /// The restore counters of one target queue.
    pub fn restore_queue(&self, queue: &str, vhost: &str, queue_type: &str) -> RestoreQueueMetrics {
        let l = [queue, vhost, queue_type];
        RestoreQueueMetrics {
            published: self.restore_published.with(l),
            confirmed: self.restore_confirmed.with(l),
            failed: self.restore_failed.with(l),
        }
    }

    /// Counts `err` in `broker_backup_errors` with its `error_type` ([`Error::error_type`]);
    /// `queue` and `vhost` are empty for errors of the whole job.
    pub fn error(&self, queue: &str, vhost: &str, err: &Error) {
        self.errors.with([queue, vhost, err.error_type()]).inc();
    }

    /// Runs a whole job (a backup or a restore) and counts its failure in
    /// `broker_backup_errors` with empty queue and vhost, unless the job set its flag to say
    /// the error is a queue's, already counted with that queue's labels.
    pub fn job<T>(
        &self,
        run: impl FnOnce(&mut bool) -> crate::error::Result<T>,
    ) -> crate::error::Result<T> {
        let mut queue_failed = false;
        let result = run(&mut queue_failed);
        if let (Err(e), false) = (&result, queue_failed) {
            self.error("", "", e);
        }
        result
    }

    /// Messages read by backups plus messages published by restores so far: the job's progress.
    pub fn progress(&self) -> u64 {
        self.messages_read.total() + self.restore_published.total()
    }

    /// The text exposition (format 0.0.4) of every metric, in SPEC.md's order.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.messages_read.render(&mut out);
        self.bytes_read.render(&mut out);
        self.segments_written.render(&mut out);
        self.segments_bytes.render(&mut out);
        header(
            &mut out,
            "broker_backup_checkpoint_syncs",
            "Checkpoint sync operations (local database to remote storage).",
            "counter",
        );
        let _ = writeln!(
            out,
            "broker_backup_checkpoint_syncs {}",
            self.checkpoint_syncs.get()
        );
        header(
            &mut out,
            "broker_backup_checkpoint_sync_failures",
            "Checkpoint syncs (local database to remote storage) that failed.",
            "counter",
        );
        let _ = writeln!(
            out,
            "broker_backup_checkpoint_sync_failures {}",
            self.checkpoint_sync_failures.get()
        );
        self.errors.render(&mut out);
        self.queues_skipped.render(&mut out);
        self.messages_left_out.render(&mut out);
        self.queue_retries.render(&mut out);
        self.storage_retries.render(&mut out);
        self.retention_runs.render(&mut out);
        for (name, help, counter) in [
            (
                "broker_backup_validate_segments_read",
                "Segments validate --deep fetched and read (all, or its --read-data-subset).",
                &self.validate_segments_read,
            ),
            (
                "broker_backup_validate_bytes_read",
                "Stored bytes of the segments validate --deep read.",
                &self.validate_bytes_read,
            ),
            (
                "broker_backup_validate_segments_failed",
                "Segments validate found missing or damaged.",
                &self.validate_segments_failed,
            ),
        ] {
            header(&mut out, name, help, "counter");
            let _ = writeln!(out, "{name} {}", counter.get());
        }
        self.restore_published.render(&mut out);
        self.restore_confirmed.render(&mut out);
        self.restore_failed.render(&mut out);
        for (name, help, gauge) in [
            (
                "broker_backup_amqp_connections_active",
                "Open AMQP connections.",
                &self.amqp_connections,
            ),
            (
                "broker_backup_stream_connections_active",
                "Open stream protocol connections.",
                &self.stream_connections,
            ),
        ] {
            header(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name} {}", gauge.get());
        }
        for family in self.run_outcome() {
            family.render(&mut out);
        }
        out
    }

    /// The four `broker_backup_last_*` families, in rendering order.
    pub fn run_outcome(&self) -> [&GaugeFamily; 4] {
        [
            &self.last_run_timestamp,
            &self.last_run_exit_code,
            &self.last_success_timestamp,
            &self.last_run_duration,
        ]
    }

    /// Records the end of a run of `mode` (`backup` or `restore`) that exits `exit_code`,
    /// `ended` being the time it ended and `duration` how long it took. The last-success
    /// timestamp is set only for exit code 0.
    pub fn run_ended(
        &self,
        mode: &str,
        exit_code: i32,
        ended: std::time::SystemTime,
        duration: std::time::Duration,
    ) {
        let at = ended
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // Millisecond resolution is plenty and keeps the text short.
        let at = (at * 1000.0).round() / 1000.0;
        self.last_run_timestamp.set(mode, at);
        self.last_run_exit_code.set(mode, f64::from(exit_code));
        self.last_run_duration
            .set(mode, (duration.as_secs_f64() * 1000.0).round() / 1000.0);
        if exit_code == 0 {
            self.last_success_timestamp.set(mode, at);
        }
    }
}

/// The process-wide registry.
pub fn global() -> &'static Metrics {
    static GLOBAL: OnceLock<Metrics> = OnceLock::new();
    GLOBAL.get_or_init(Metrics::new)
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    // HELP text escapes backslash and line feed (text format 0.0.4).
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('\n');
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Appends `v` escaped as a label value of the text format 0.0.4: backslash, double quote and
/// line feed become `\\`, `\"` and `\n`.
pub fn escape_label_value(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// What `/health` reports: healthy unless the broker connection was lost and has not
/// recovered. Recovery is a connection opened since, or real progress since the loss (more
/// than [`RECOVERY_PROGRESS`] messages read or published), which shows that other connections
/// still work.
///
/// Messages a lost connection had already delivered are still counted after the loss is seen
/// (a consumer's buffer holds up to 512), so a smaller step proves nothing.
#[derive(Debug, Default)]
pub struct Health {
    /// The reason of the last loss, and the job's progress at that moment.
    lost: Mutex<Option<(String, u64)>>,
}

/// A `/health` answer: `ok`, or the reason it is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthStatus {
    /// The job works.
    Ok,
    /// The broker connection is lost; the reason (an error message, passwords masked).
    Lost(String),
}

/// Messages read or published after a connection loss that count as recovery (see [`Health`]).
pub const RECOVERY_PROGRESS: u64 = 1_000;

impl Health {
    /// A broker connection failed or could not be opened. `reason` must hold no secret
    /// (error messages mask URLs).
    pub fn connection_lost(&self, reason: String, progress: u64) {
        *lock(&self.lost) = Some((reason, progress));
    }

    /// A broker connection opened: any earlier loss is recovered.
    pub fn connection_ok(&self) {
        *lock(&self.lost) = None;
    }

    /// The status now, given the job's progress now ([`Metrics::progress`]).
    pub fn status(&self, progress: u64) -> HealthStatus {
        let mut lost = lock(&self.lost);
        match &*lost {
            Some((_, at)) if progress > at + RECOVERY_PROGRESS => {
                *lost = None;
                HealthStatus::Ok
            }
            Some((reason, _)) => HealthStatus::Lost(reason.clone()),
            None => HealthStatus::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_and_type_before_any_series() {
        let m = Metrics::new();
        let text = m.render();
        for (name, kind) in [
            ("broker_backup_messages_read", "counter"),
            ("broker_backup_bytes_read", "counter"),
            ("broker_backup_segments_written", "counter"),
            ("broker_backup_segments_bytes", "counter"),
            ("broker_backup_checkpoint_syncs", "counter"),
            ("broker_backup_errors", "counter"),
            ("broker_restore_messages_published", "counter"),
            ("broker_restore_messages_confirmed", "counter"),
            ("broker_restore_messages_failed", "counter"),
            ("broker_backup_amqp_connections_active", "gauge"),
            ("broker_backup_stream_connections_active", "gauge"),
            ("broker_backup_checkpoint_sync_failures", "counter"),
            ("broker_backup_validate_segments_read", "counter"),
            ("broker_backup_validate_bytes_read", "counter"),
            ("broker_backup_validate_segments_failed", "counter"),
            ("broker_backup_last_run_timestamp_seconds", "gauge"),
            ("broker_backup_last_run_exit_code", "gauge"),
            ("broker_backup_last_success_timestamp_seconds", "gauge"),
            ("broker_backup_last_run_duration_seconds", "gauge"),
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name}: {text}"
            );
        }
        assert!(text.contains("\nbroker_backup_checkpoint_syncs 0\n"));
        assert!(text.contains("\nbroker_backup_amqp_connections_active 0\n"));
        assert!(!text.contains("_total"), "names exactly as SPEC.md");
    }

    #[test]
    fn series_with_labels_and_values() {
        let m = Metrics::new();
        let q = m.backup_queue("orders", "/", "quorum");
        q.messages_read.inc();
        q.messages_read.inc();
        q.bytes_read.add(1000);
        // Resolving again gives the same series.
        m.backup_queue("orders", "/", "quorum").messages_read.inc();
        m.error("orders", "/", &Error::Storage("x".into()));
        m.amqp_connections.inc();
        m.amqp_connections.inc();
        m.amqp_connections.dec();
        let text = m.render();
        assert!(
            text.contains(
                "broker_backup_messages_read{queue=\"orders\",vhost=\"/\",queue_type=\"quorum\"} 3\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "broker_backup_bytes_read{queue=\"orders\",vhost=\"/\",queue_type=\"quorum\"} 1000\n"
        ));
        assert!(text.contains(
            "broker_backup_errors{queue=\"orders\",vhost=\"/\",error_type=\"storage\"} 1\n"
        ));
        assert!(text.contains("broker_backup_amqp_connections_active 1\n"));
        assert_eq!(m.progress(), 3);
    }

    #[test]
    fn run_outcome_sets_last_success_only_on_exit_0() {
        let m = Metrics::new();
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_250);
        m.run_ended("backup", 4, at, std::time::Duration::from_millis(1500));
        let text = m.render();
        assert!(text.contains("broker_backup_last_run_exit_code{mode=\"backup\"} 4\n"));
        assert!(text
            .contains("broker_backup_last_run_timestamp_seconds{mode=\"backup\"} 1700000000.25\n"));
        assert!(text.contains("broker_backup_last_run_duration_seconds{mode=\"backup\"} 1.5\n"));
        assert!(!text.contains("broker_backup_last_success_timestamp_seconds{"));
        m.run_ended("backup", 0, at, std::time::Duration::from_secs(2));
        assert!(m.render().contains(
            "broker_backup_last_success_timestamp_seconds{mode=\"backup\"} 1700000000.25\n"
        ));
        assert_eq!(m.last_run_exit_code.get("backup"), Some(0.0));
        assert_eq!(m.last_run_exit_code.get("restore"), None);
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut s = String::new();
        escape_label_value("a\\b\"c\nd ✓", &mut s);
        assert_eq!(s, "a\\\\b\\\"c\\nd ✓");
        let m = Metrics::new();
        m.restore_queue("q\"x", "v\\h\n", "classic")
            .published
            .add(7);
        let text = m.render();
        assert!(
            text.contains(
                "broker_restore_messages_published{queue=\"q\\\"x\",vhost=\"v\\\\h\\n\",queue_type=\"classic\"} 7\n"
            ),
            "{text}"
        );
        let mut h = String::new();
        header(&mut h, "n", "a\\b\nc", "counter");
        assert_eq!(h, "# HELP n a\\\\b\\nc\n# TYPE n counter\n");
    }

    #[test]
    fn health_recovers_on_connection_or_progress() {
        let h = Health::default();
        assert_eq!(h.status(0), HealthStatus::Ok);
        h.connection_lost("Connection error: lost".into(), 10);
        assert_eq!(
            h.status(10),
            HealthStatus::Lost("Connection error: lost".into())
        );
        h.connection_ok();
        assert_eq!(h.status(10), HealthStatus::Ok);
        h.connection_lost("again".into(), 10);
        assert_eq!(
            h.status(10 + RECOVERY_PROGRESS),
            HealthStatus::Lost("again".into()),
            "what a lost connection had delivered is no recovery"
        );
        assert_eq!(
            h.status(11 + RECOVERY_PROGRESS),
            HealthStatus::Ok,
            "progress since the loss"
        );
        assert_eq!(h.status(11), HealthStatus::Ok);
    }
}
