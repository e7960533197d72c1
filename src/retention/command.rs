//! `rmq-backup forget`: its options (argh) and its run.

use super::{forget, Count, Options, Policy, Within, DEFAULT_PRUNE_GRACE};
use crate::error::Result;
use crate::inspect::Format;
use argh::FromArgs;

/// Remove backups according to a policy (restic's `forget`): the union of what the --keep-*
/// rules keep is kept; the rest is deleted, manifest first. Running backups are never removed.
/// With --config and no --keep-* rule, the file's `retention:` section is the policy.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "forget",
    example = "{command_name} --path file:///var/backups/rabbitmq --keep-daily 7 --keep-weekly 4 --keep-monthly 12 --dry-run\n{command_name} --path 's3://backups/prod?endpoint=https://minio:9000&path_style=true' --keep-within 30d --prune --format json",
    note = "Each rule is evaluated on the manifests' created_at, newest first, over completed backups: --keep-last N keeps the N newest; --keep-daily/--keep-weekly/--keep-monthly N keep the newest backup of each of the last N UTC days / ISO weeks / months that have backups (and, while a rule has counts left, the oldest backup); --keep-within 1y5m7d2h keeps every backup newer than the newest one minus that duration. Counts accept 'unlimited' (or -1). Interrupted backups newer than the newest completed one are kept (a rerun may resume them); older ones are removed only with --prune-interrupted. A backup whose run lock is held by a run that may be alive is never touched. Exit codes: 0 done; 1 a deletion failed (each named); 2 bad usage (no rule given)."
)]
pub struct ForgetCmd {
    /// storage URL (see `list --help`); or --config
    #[argh(option)]
    path: Option<String>,
    /// a backup configuration file whose storage section (with its credentials and prefix) is
    /// used instead of --path; without a --keep-* rule, its `retention:` section is the policy
    #[argh(option)]
    config: Option<std::path::PathBuf>,
    /// keep the N newest completed backups
    #[argh(option)]
    keep_last: Option<Count>,
    /// keep the newest backup of each of the last N days (UTC) that have backups
    #[argh(option)]
    keep_daily: Option<Count>,
    /// keep the newest backup of each of the last N ISO weeks that have backups
    #[argh(option)]
    keep_weekly: Option<Count>,
    /// keep the newest backup of each of the last N months that have backups
    #[argh(option)]
    keep_monthly: Option<Count>,
    /// keep every backup created within this duration of the newest one (1y5m7d2h: years,
    /// months, days, hours)
    #[argh(option)]
    keep_within: Option<Within>,
    /// list what would be kept and removed; delete nothing
    #[argh(switch)]
    dry_run: bool,
    /// also remove interrupted backups created before the newest completed one
    #[argh(switch)]
    prune_interrupted: bool,
    /// also delete orphaned objects: under a backup's prefix but listed by no manifest (or
    /// under a prefix whose manifest is gone), older than --prune-grace
    #[argh(switch)]
    prune: bool,
    /// minimum age of an orphan --prune deletes (default 24h)
    #[argh(option)]
    prune_grace: Option<Within>,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
}

impl ForgetCmd {
    /// Runs the command; prints the report. Returns the exit code: 0, or 1 when a deletion
    /// failed. Errors: configuration (no rule), storage (listing, reading).
    pub fn run(self) -> Result<i32> {
        let opts = Options {
            policy: Policy {
                keep_last: self.keep_last,
                keep_daily: self.keep_daily,
                keep_weekly: self.keep_weekly,
                keep_monthly: self.keep_monthly,
                keep_within: self.keep_within,
            },
            dry_run: self.dry_run,
            prune_interrupted: self.prune_interrupted,
            prune: self.prune,
            prune_grace: self.prune_grace.unwrap_or(DEFAULT_PRUNE_GRACE),
        };
        let opened = crate::repository::storage::args::open(
            self.path.as_deref(),
            self.config.as_deref(),
            "--path",
            "--config",
        )?;
        let opts = from_config(opts, opened.config.as_ref())?;
        let storage = opened.storage;
        let report = forget(&storage, &opts)?;
        crate::run::write_stdout(format_args!(
            "{}",
            report.render(self.format == Format::Json)?
        ));
        Ok(if report.errors.is_empty() { 0 } else { 1 })
    }
}

/// `opts` from the command line, or, when it gives no `--keep-*` rule, the `retention:`
/// section of the `--config` file (its rules, `prune_interrupted`, `prune`, `prune_grace`),
/// with the command line's `--dry-run`.
///
/// Errors: as `RetentionConfig::options`.
fn from_config(opts: Options, config: Option<&crate::config::Config>) -> Result<Options> {
    match config.and_then(|c| c.retention.as_ref()) {
        Some(retention) if opts.policy.is_empty() => Ok(Options {
            dry_run: opts.dry_run,
            ..retention.options()?
        }),
        _ => Ok(opts),
    }
}
