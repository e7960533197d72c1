//! Command-line parsing, logging set-up, and exit codes (DESIGN.md decision 8: 0 success, 1 the
//! job failed, 2 bad usage or configuration, 3 `validate` or `list` found damage; and 4, a
//! backup that completed but skipped selected queues).

use crate::config::{Config, Mode};
use crate::error::{Error, Result};
use crate::inspect::{self, Format};
use crate::metrics::server::MetricsServer;
use crate::repository::storage::{self, Storage};
use crate::{backup, restore};
use argh::FromArgs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Back up the queues and topology of a RabbitMQ broker to storage, and restore them
/// byte for byte.
#[derive(FromArgs, Debug)]
#[argh(
    help_triggers("-h", "--help"),
    example = "{command_name} backup --config backup.yaml\n{command_name} validate --path file:///var/backups/rabbitmq --backup-id nightly --deep\n{command_name} restore --config restore.yaml\n{command_name} forget --path file:///var/backups/rabbitmq --keep-daily 7 --keep-weekly 4",
    note = "Exit codes: 0 success; 1 the job failed; 2 bad usage or configuration; 3 validate (or list) found damage; 4 a backup completed but left selected queues alone (each named in its summary). Errors go to stderr and start with their category (\"Storage error: ...\"). Logs go to stderr as text, or with --log-format json (anywhere on the line; or RMQ_BACKUP_LOG_FORMAT=json) as one JSON object per line: timestamp (RFC 3339, ms), level, target, message, and backup_id, vhost, queue, segment, error_type where a line is about them. See README.md and its book (docs/, docs/config-reference.md) for the configuration file (TLS to the broker: amqps:// URLs and source.tls / target.tls; metrics: serves /metrics while backup or restore runs unless enabled: false, and at the end of the run writes textfile: PATH for node_exporter and POSTs to pushgateway_url (pushgateway_job, pushgateway_grouping) the run's metrics with broker_backup_last_run_exit_code and broker_backup_last_success_timestamp_seconds). --version prints the version and the git commit of the build."
)]
struct Cli {
    /// more output: -v debug, -vv trace (AMQP frames, storage operations, segment details);
    /// accepted anywhere on the line. RUST_LOG overrides.
    #[argh(switch, short = 'v')]
    verbose: bool,

    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum Command {
    Backup(BackupCmd),
    Restore(RestoreCmd),
    List(ListCmd),
    Describe(DescribeCmd),
    Validate(ValidateCmd),
    Cat(inspect::cat::CatCmd),
    Forget(crate::retention::command::ForgetCmd),
    Copy(crate::copy::command::CopyCmd),
    Config(ConfigCmd),
}

/// The configuration file: print its JSON Schema, or check a file without running it.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "config",
    example = "{command_name} schema > rmq-backup.schema.json\n{command_name} check --config backup.yaml",
    note = "An editor with the YAML language server completes and checks a file whose first line is `# yaml-language-server: $schema=rmq-backup.schema.json` (a path or URL of the schema)."
)]
struct ConfigCmd {
    #[argh(subcommand)]
    action: ConfigAction,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum ConfigAction {
    Schema(SchemaCmd),
    Check(CheckCmd),
}

/// Print the JSON Schema (draft 2020-12) of the configuration file, made from its types: every
/// key with its type, default and description.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "schema")]
struct SchemaCmd {}

/// Check a configuration file as a run would load it (YAML, `${ENV}` references, `*_file`
/// secrets, every value) without connecting to a broker or a storage: exit 0 when it is valid,
/// 2 with the error, its key path and line, when not.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "check")]
struct CheckCmd {
    /// the YAML configuration file
    #[argh(option)]
    config: PathBuf,
}

/// Run a backup: read every selected queue without removing a message, write segments, the
/// definitions and, last, the manifest. With --dry-run, only print the plan. A `retention:`
/// section (keep_last, keep_daily, keep_weekly, keep_monthly, keep_within, prune_interrupted,
/// prune, prune_grace: the rules of `forget --help`) is applied after a successful backup; its
/// failure is logged and printed but leaves the exit code of the backup.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "backup")]
struct BackupCmd {
    /// the YAML configuration file (mode: backup)
    #[argh(option)]
    config: PathBuf,
    /// print the plan and exit 0: the queues and streams that would be read (vhost, name,
    /// type, depth and bytes from the management API, estimated stored size), the selected
    /// ones that would be skipped and why, and the storage prefix. Reads no message, writes
    /// nothing, takes no lock.
    #[argh(switch)]
    dry_run: bool,
    /// output format of --dry-run: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
}

/// Run a restore: publish the messages of a backup to the target broker, optionally with its
/// definitions first.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "restore")]
struct RestoreCmd {
    /// the YAML configuration file (mode: restore)
    #[argh(option)]
    config: PathBuf,
}

/// List the backups in a storage location.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "list",
    example = "{command_name} --path file:///var/backups/rabbitmq\nAWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. {command_name} --path 's3://backups/prod?endpoint=https://minio:9000&path_style=true'\nAZURE_STORAGE_ACCOUNT_KEY=.. {command_name} --path azure://acct.blob.core.windows.net/backups --format json\nGOOGLE_APPLICATION_CREDENTIALS=sa.json {command_name} --path gs://backups/prod",
    note = "A storage URL never holds credentials: s3 reads AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or a profile, web identity, the container or instance role) and AWS_REGION; azure reads AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET (or workload or managed identity); gcs reads GOOGLE_APPLICATION_CREDENTIALS (or application default credentials; STORAGE_EMULATOR_HOST for an emulator). A path after the bucket or container is a key prefix. SSL_CERT_FILE adds a private CA."
)]
struct ListCmd {
    /// storage URL: file:///abs/path, memory://, s3://bucket[/prefix]?region=..&endpoint=..&path_style=true&allow_http=true,
    /// azure://account.blob.core.windows.net/container[/prefix], gcs://bucket[/prefix]
    #[argh(option)]
    path: String,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
}

/// Describe one backup: its manifest, queue by queue.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "describe")]
struct DescribeCmd {
    /// storage URL (see `list --help`)
    #[argh(option)]
    path: String,
    /// the backup id to describe
    #[argh(option)]
    backup_id: String,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
}

/// Validate a backup: every segment present with its size; with --deep also fetched and
/// checked (CRC32, SHA-256, record count, every record; an encrypted backup decrypted with
/// --identity-file or RMQ_BACKUP_AGE_IDENTITY). Exit 3 when damaged.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "validate")]
struct ValidateCmd {
    /// storage URL (see `list --help`)
    #[argh(option)]
    path: String,
    /// the backup id to validate
    #[argh(option)]
    backup_id: String,
    /// fetch every segment and verify its checksums and records
    #[argh(switch)]
    deep: bool,
    /// with --deep, read only a subset of the segments (restic's forms): N/T the slice N of T
    /// by a hash of the segment key (slices 1/T..T/T together read each segment once), P% a
    /// random P percent of the segments, SIZE (500M, 2G) random segments up to that many
    /// stored bytes. The others are checked shallowly.
    #[argh(option)]
    read_data_subset: Option<inspect::Subset>,
    /// write the metrics (broker_backup_validate_segments_read, _bytes_read,
    /// _segments_failed, broker_backup_last_* with mode="validate") to this file for
    /// node_exporter's textfile collector when the check ends
    #[argh(option)]
    metrics_textfile: Option<PathBuf>,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
    /// age identity file that decrypts an encrypted backup for --deep (default: the
    /// environment variable RMQ_BACKUP_AGE_IDENTITY; a shallow check needs none)
    #[argh(option)]
    identity_file: Option<PathBuf>,
}

/// Exit code when `validate` finds damage, or `list` finds a manifest it cannot read.
pub const EXIT_DAMAGED: i32 = 3;

/// Exit code of a backup that completed for every queue it read but left selected queues
/// alone (exclusive, quorum with a delivery limit, unsupported type): each is named in the
/// summary and the log, and counted in `broker_backup_queues_skipped`.
pub const EXIT_SKIPPED: i32 = 4;

/// Splits verbosity flags out of `args` (anywhere on the line: `-v`, `-vv`, `-v -v`,
/// `--verbose`) and expands `--opt=value` into `--opt value`. Returns (verbosity, the rest).
pub fn preprocess(args: &[String]) -> (u8, Vec<String>) {
    let mut verbosity = 0u8;
    let mut rest = Vec::new();
    let mut after_double_dash = false;
    for a in args {
        if after_double_dash {
            rest.push(a.clone());
        } else if a == "--" {
            after_double_dash = true;
            rest.push(a.clone());
        } else if a == "--verbose" {
            verbosity = verbosity.saturating_add(1);
        } else if a.len() >= 2
            && a.starts_with('-')
            && !a.starts_with("--")
            && a[1..].chars().all(|c| c == 'v')
        {
            verbosity = verbosity.saturating_add((a.len() - 1) as u8);
        } else if let Some((k, v)) = a.strip_prefix("--").and_then(|s| s.split_once('=')) {
            rest.push(format!("--{k}"));
            rest.push(v.to_string());
        } else {
            rest.push(a.clone());
        }
    }
    (verbosity, rest)
}

/// `rmq-backup <version> (commit <git commit>)`: what `--version` prints. The commit is the one
/// the binary was built from (`build.rs`; `-modified` when the tree had uncommitted changes,
/// `unknown` outside a git checkout).
pub fn version() -> String {
    format!(
        "rmq-backup {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        env!("RMQ_BACKUP_GIT_COMMIT")
    )
}

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().collect();
    let program = args.first().cloned().unwrap_or_else(|| "rmq-backup".into());
    let (verbosity, mut rest) = preprocess(args.get(1..).unwrap_or_default());
    let log_format = match crate::run::logging::take_log_format(&mut rest) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("Configuration error: {e}");
            return 2;
        }
    };
    let name = std::path::Path::new(&program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("rmq-backup")
        .to_string();
    if matches!(rest.as_slice(), [v] if v == "--version" || v == "-V") {
        println!("{}", version());
        return 0;
    }
    let rest_refs: Vec<&str> = rest.iter().map(String::as_str).collect();
    let cli = match Cli::from_args(&[name.as_str()], &rest_refs) {
        Ok(cli) => cli,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    println!("{}", early.output);
                    0
                }
                Err(()) => {
                    eprintln!("Configuration error: {}", early.output.trim_end());
                    eprintln!("Run {name} --help for usage.");
                    2
                }
            };
        }
    };
    crate::run::logging::init(verbosity + u8::from(cli.verbose), log_format);
    exit_code(run(cli.command))
}

/// The exit code of a command's result, its error reported (logged and printed) first: the
/// one place outcomes become exit codes. `Ok(code)` is the code the command chose (0, 3, 4);
/// an error exits [`Error::exit_code`] (1, or 2 for configuration), and a job stopped by
/// SIGTERM or SIGINT exits 143 or 130, whatever error it ended with.
fn exit_code(result: Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            crate::run::logging::report_error(&e);
            crate::run::signals::requested().map_or(e.exit_code(), crate::run::signals::exit_code)
        }
    }
}

/// Runs a backup or restore job (`mode`) of `cfg` begun at `started`, and returns its exit
/// code ([`exit_code`]) after recording it in the `broker_backup_last_*` metrics and exporting
/// them (`metrics.textfile`, `metrics.pushgateway_url`; `crate::metrics::export`).
fn job(cfg: &Config, started: Instant, run: impl FnOnce() -> Result<i32>) -> i32 {
    let code = exit_code(run());
    crate::metrics::export::finish_run(cfg.metrics.as_ref(), cfg.mode.as_str(), code, started);
    code
}

fn run(command: Command) -> Result<i32> {
    match command {
        Command::Backup(cmd) => {
            let started = Instant::now();
            let cfg = match load(&cmd.config, Mode::Backup) {
                Ok(cfg) => cfg,
                Err(e) => return Ok(config_failure(&e)),
            };
            crate::run::logging::set_backup_id(&cfg.backup_id);
            if cmd.dry_run {
                let plan = backup::dry_run::plan(&cfg)?;
                print!("{}", plan.render(cmd.format == Format::Json)?);
                return Ok(0);
            }
            Ok(job(&cfg, started, || {
                let _metrics = start_metrics(&cfg)?;
                crate::run::signals::install()?;
                let storage = storage::open_config(&cfg.storage)?;
                let s = backup::run(&cfg, storage.clone())?;
                print_backup(&s);
                if let Some(report) = crate::retention::after_backup_of(&cfg, &storage) {
                    println!("{report}");
                }
                Ok(if s.skipped.is_empty() && s.left_out.is_empty() {
                    0
                } else {
                    EXIT_SKIPPED
                })
            }))
        }
        Command::Restore(cmd) => {
            let started = Instant::now();
            let cfg = match load(&cmd.config, Mode::Restore) {
                Ok(cfg) => cfg,
                Err(e) => return Ok(config_failure(&e)),
            };
            crate::run::logging::set_backup_id(&cfg.backup_id);
            Ok(job(&cfg, started, || {
                let _metrics = start_metrics(&cfg)?;
                crate::run::signals::install()?;
                let storage = storage::open_config(&cfg.storage)?;
                let s = restore::run(&cfg, storage)?;
                print_restore(&s);
                Ok(0)
            }))
        }
        Command::List(cmd) => {
            let storage = open_url(&cmd.path)?;
            let list = inspect::list(storage.as_ref())?;
            print!("{}", list.render(cmd.format)?);
            Ok(if list.any_damaged() { EXIT_DAMAGED } else { 0 })
        }
        Command::Describe(cmd) => {
            let storage = open_url(&cmd.path)?;
            print!(
                "{}",
                inspect::describe(storage.as_ref(), &cmd.backup_id, cmd.format)?
            );
            Ok(0)
        }
        Command::Validate(cmd) => {
            let keys = if cmd.deep {
                crate::repository::encryption::Identities::load(
                    cmd.identity_file.as_deref(),
                    "--identity-file",
                )?
            } else {
                None
            };
            if cmd.read_data_subset.is_some() && !cmd.deep {
                return Err(Error::Config(
                    "--read-data-subset needs --deep (it chooses which segments are read)".into(),
                ));
            }
            let started = Instant::now();
            let result = (|| -> Result<i32> {
                let storage = open_url(&cmd.path)?;
                let report = inspect::validate_subset(
                    storage.as_ref(),
                    &cmd.backup_id,
                    cmd.deep,
                    keys.as_ref(),
                    cmd.read_data_subset.as_ref(),
                )?;
                print!("{}", report.render(cmd.format)?);
                Ok(if report.is_valid() { 0 } else { EXIT_DAMAGED })
            })();
            if let Some(path) = &cmd.metrics_textfile {
                let code = match &result {
                    Ok(c) => *c,
                    Err(e) => e.exit_code(),
                };
                crate::metrics::export::write_run_textfile(path, "validate", code, started);
            }
            result
        }
        Command::Cat(cmd) => cmd.run(),
        Command::Forget(cmd) => cmd.run(),
        Command::Copy(cmd) => cmd.run(),
        Command::Config(ConfigCmd {
            action: ConfigAction::Schema(_),
        }) => {
            println!("{}", crate::config::schema::text());
            Ok(0)
        }
        Command::Config(ConfigCmd {
            action: ConfigAction::Check(cmd),
        }) => {
            let cfg = match crate::config::check::check(&cmd.config) {
                Ok(cfg) => cfg,
                Err(e) => return Ok(config_failure(&e)),
            };
            println!(
                "{}: a valid configuration (mode {}, backup_id {}, storage {})",
                cmd.config.display(),
                cfg.mode,
                cfg.backup_id,
                cfg.storage.backend_name()
            );
            Ok(0)
        }
    }
}

/// The metrics server of `cfg.metrics` when it is present and enabled, before anything
/// touches the broker or storage, so a taken port fails the run at once. `enabled: false`
/// serves nothing; `metrics.textfile` and `metrics.pushgateway_url` still work.
fn start_metrics(cfg: &Config) -> Result<Option<MetricsServer>> {
    match &cfg.metrics {
        Some(m) if m.enabled => MetricsServer::start(m).map(Some),
        _ => Ok(None),
    }
}

/// A configuration file that cannot be read, parsed or validated is bad usage: exit 2,
/// whatever the category of the error (`Serialization error:` for YAML).
fn config_failure(e: &Error) -> i32 {
    crate::run::logging::report_error(e);
    2
}

fn load(path: &std::path::Path, expected: Mode) -> Result<Config> {
    let cfg = Config::load(path)?;
    if cfg.mode != expected {
        return Err(Error::Config(format!(
            "{} has mode {}, but this command runs a {}",
            path.display(),
            cfg.mode.as_str(),
            expected.as_str()
        )));
    }
    Ok(cfg)
}

fn open_url(url: &str) -> Result<Arc<dyn Storage>> {
    storage::open_url(&storage::parse_storage_url(url)?)
}

fn print_backup(s: &backup::BackupSummary) {
    let secs = s.elapsed.as_secs_f64();
    println!(
        "Backup {} completed: {} queues, {} messages, {} segments, {} in {:.1} s ({:.0} msg/s){}{}",
        s.backup_id,
        s.queues,
        s.messages,
        s.segments,
        crate::run::units::human_bytes(s.bytes),
        secs,
        s.messages as f64 / secs.max(0.001),
        if s.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; {} selected queue(s) skipped, not backed up (exit code {EXIT_SKIPPED})",
                s.skipped.len()
            )
        },
        if s.left_out.is_empty() {
            String::new()
        } else {
            format!(
                "; {} message(s) of {} queue(s) left out (exit code {EXIT_SKIPPED})",
                s.left_out.iter().map(|q| q.messages).sum::<u64>(),
                s.left_out.len()
            )
        }
    );
    for q in &s.skipped {
        println!("  skipped {q}");
    }
    for q in &s.left_out {
        println!("  {q}");
    }
    for q in &s.deleted {
        println!("  {q} was deleted on the broker during the backup: nothing left to back up");
    }
}

fn print_restore(s: &restore::RestoreSummary) {
    if s.dry_run {
        println!("Dry run of restore {}: nothing was published.", s.backup_id);
        if let Some(d) = &s.definitions {
            println!(
                "Definitions: {} vhosts, {} queues, {} exchanges, {} bindings, {} users would be imported",
                d.vhosts, d.queues, d.exchanges, d.bindings, d.users
            );
            if let (Some(v), false) = (d.target_version, d.changes.is_empty()) {
                println!(
                    "Changed for RabbitMQ {v} ({} change(s), names as in the backup):",
                    d.changes.len()
                );
                for c in &d.changes {
                    println!("  {c}");
                }
            }
        }
        for q in &s.queues {
            println!(
                "  {}/{} -> {}/{}{}: {} messages in backup, {} segment(s) in the time window",
                q.source_vhost,
                q.source_queue,
                q.target_vhost,
                q.target_queue,
                if q.converted_to_quorum {
                    " (a quorum queue)"
                } else {
                    ""
                },
                q.in_backup,
                q.segments
            );
        }
        return;
    }
    let secs = s.elapsed.as_secs_f64();
    let published = s.published();
    println!(
        "Restore {} completed: {} queues, {} messages published, {} confirmed, {} failed, {} outside the time window, in {:.1} s ({:.0} msg/s)",
        s.backup_id,
        s.queues.len(),
        published,
        s.confirmed(),
        s.failed(),
        s.queues.iter().map(|q| q.outside_window).sum::<u64>(),
        secs,
        published as f64 / secs.max(0.001)
    );
    let earlier: u64 = s.queues.iter().map(|q| q.done_earlier).sum();
    if earlier > 0 {
        println!(
            "  {earlier} message(s) were published by an earlier run (restore.checkpoint_state) and not again; {} queue(s) were complete already",
            s.queues.iter().filter(|q| q.completed_earlier).count()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn verbosity_anywhere() {
        assert_eq!(
            preprocess(&strs(&["-vv", "list", "--path", "x"])),
            (2, strs(&["list", "--path", "x"]))
        );
        assert_eq!(preprocess(&strs(&["list", "-v", "-v", "--path", "x"])).0, 2);
        assert_eq!(preprocess(&strs(&["list", "--path", "x", "-vvv"])).0, 3);
        assert_eq!(
            preprocess(&strs(&["--verbose", "list"])),
            (1, strs(&["list"]))
        );
    }

    #[test]
    fn expands_equals_options() {
        assert_eq!(
            preprocess(&strs(&["validate", "--path=file:///a?b=c", "--deep"])).1,
            strs(&["validate", "--path", "file:///a?b=c", "--deep"])
        );
    }

    #[test]
    fn parses_subcommands() {
        let cli = Cli::from_args(
            &["rmq-backup"],
            &[
                "validate",
                "--path",
                "memory://",
                "--backup-id",
                "b",
                "--deep",
                "--format",
                "json",
            ],
        )
        .unwrap();
        match cli.command {
            Command::Validate(v) => {
                assert!(v.deep);
                assert_eq!(v.backup_id, "b");
                assert_eq!(v.format, Format::Json);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::from_args(&["rmq-backup"], &["list", "--path", "x", "--format", "xml"]).is_err()
        );
        assert!(Cli::from_args(&["rmq-backup"], &["backup"]).is_err());
    }
}
