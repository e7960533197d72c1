//! Command-line parsing, logging set-up, and exit codes (0 success, 1 the job failed, 2 bad
//! usage or configuration, 3 `validate` or `list` found damage; and 4, a backup that completed
//! but skipped selected queues).

use crate::config::{Config, Mode};
use crate::error::{Error, Result};
use crate::inspect::{self, Format};
use crate::metrics::server::MetricsServer;
use crate::repository::storage;
use crate::{backup, restore};
use argh::FromArgs;
use std::time::Instant;

mod commands;
mod completions;
mod config_cmd;
pub mod help_tree;
mod man;

use commands::*;

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
    Completions(completions::CompletionsCmd),
    Man(completions::ManCmd),
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
        crate::out!("{}", version());
        return 0;
    }
    let rest_refs: Vec<&str> = rest.iter().map(String::as_str).collect();
    let cli = match Cli::from_args(&[name.as_str()], &rest_refs) {
        Ok(cli) => cli,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    crate::out!("{}", early.output);
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
                crate::out_raw!("{}", plan.render(cmd.format == Format::Json)?);
                return Ok(0);
            }
            Ok(job(&cfg, started, || {
                let _metrics = start_metrics(&cfg)?;
                crate::run::signals::install()?;
                let storage = storage::open_config(&cfg.storage)?;
                let s = backup::run(&cfg, storage.clone())?;
                print_backup(&s);
                if let Some(report) = crate::retention::after_backup_of(&cfg, &storage) {
                    crate::out!("{report}");
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
            let mut cfg = match load(&cmd.config, Mode::Restore) {
                Ok(cfg) => cfg,
                Err(e) => return Ok(config_failure(&e)),
            };
            cfg.restore.dry_run |= cmd.dry_run;
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
            let storage = open_storage(cmd.path.as_deref(), cmd.config.as_deref())?.storage;
            let list = inspect::list(storage.as_ref())?;
            crate::out_raw!("{}", list.render(cmd.format)?);
            Ok(if list.any_damaged() { EXIT_DAMAGED } else { 0 })
        }
        Command::Describe(cmd) => {
            let opened = open_storage(cmd.path.as_deref(), cmd.config.as_deref())?;
            let backup_id = opened.backup_id(cmd.backup_id)?;
            crate::out_raw!(
                "{}",
                inspect::describe(opened.storage.as_ref(), &backup_id, cmd.format)?
            );
            Ok(0)
        }
        Command::Validate(cmd) => {
            if cmd.read_data_subset.is_some() && !cmd.deep {
                return Err(Error::Config(
                    "--read-data-subset needs --deep (it chooses which segments are read)".into(),
                ));
            }
            let started = Instant::now();
            let result = (|| -> Result<i32> {
                let opened = open_storage(cmd.path.as_deref(), cmd.config.as_deref())?;
                let backup_id = opened.backup_id(cmd.backup_id)?;
                let keys = if cmd.deep {
                    opened.identities(cmd.identity_file.as_deref())?
                } else {
                    None
                };
                let storage = opened.storage;
                let report = inspect::validate_subset(
                    storage.as_ref(),
                    &backup_id,
                    cmd.deep,
                    keys.as_ref(),
                    cmd.read_data_subset.as_ref(),
                )?;
                crate::out_raw!("{}", report.render(cmd.format)?);
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
        Command::Completions(cmd) => cmd.run(),
        Command::Man(cmd) => cmd.run(),
        Command::Config(ConfigCmd {
            action: ConfigAction::Schema(_),
        }) => {
            crate::out!("{}", crate::config::schema::text());
            Ok(0)
        }
        Command::Config(ConfigCmd {
            action: ConfigAction::Check(cmd),
        }) => Ok(config_cmd::check(&cmd.config)),
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
/// whatever the category of the error (`Serialization error:` for text that is not YAML).
fn config_failure(e: &Error) -> i32 {
    crate::run::logging::report_error(e);
    2
}

fn load(path: &std::path::Path, expected: Mode) -> Result<Config> {
    let cfg = crate::config::check::load(path)?;
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

/// The storage of `--path` or `--config` (`crate::repository::storage::args`).
fn open_storage(
    path: Option<&str>,
    config: Option<&std::path::Path>,
) -> Result<storage::args::Opened> {
    storage::args::open(path, config, "--path", "--config")
}

fn print_backup(s: &backup::BackupSummary) {
    let secs = s.elapsed.as_secs_f64();
    crate::out!(
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
        crate::out!("  skipped {q}");
    }
    for q in &s.left_out {
        crate::out!("  {q}");
    }
    for q in &s.deleted {
        crate::out!("  {q} was deleted on the broker during the backup: nothing left to back up");
    }
}

fn print_restore(s: &restore::RestoreSummary) {
    if s.dry_run {
        crate::out!("Dry run of restore {}: nothing was published.", s.backup_id);
        if let Some(d) = &s.definitions {
            crate::out!(
                "Definitions: {} vhosts, {} queues, {} exchanges, {} bindings, {} users would be imported",
                d.vhosts, d.queues, d.exchanges, d.bindings, d.users
            );
            if let (Some(v), false) = (d.target_version, d.changes.is_empty()) {
                crate::out!(
                    "Changed for RabbitMQ {v} ({} change(s), names as in the backup):",
                    d.changes.len()
                );
                for c in &d.changes {
                    crate::out!("  {c}");
                }
            }
        }
        for q in &s.queues {
            crate::out!(
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
    crate::out!(
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
        crate::out!(
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
                assert_eq!(v.backup_id.as_deref(), Some("b"));
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
