//! `rmq-backup copy`: its options (argh), progress bar and run.

use super::{copy, CopyOptions, Progress};
use crate::error::{Error, Result};
use crate::inspect::Format;
use crate::repository::encryption::Recipients;
use argh::FromArgs;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Copy completed backups to another storage (restic's `copy`: a second site or account).
/// Every segment is verified on the way (SHA-256 against the manifest; CRC32 of a plain
/// segment, or of an encrypted one with --identity-file), and the definitions export against
/// its SHA-256; each object is written once at the target (a bucket that keeps its objects
/// works), the progress under the backup's state/ and the manifest last, so a copy that has not
/// completed is not listed there and a rerun copies only what is missing or is not what it
/// stores. With --recipient the copy is encrypted to those recipients (an encrypted source
/// re-encrypted, decrypted with --identity-file); its manifest records them and the new
/// checksums.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "copy",
    example = "{command_name} --from file:///var/backups/rabbitmq --to 's3://offsite/rabbitmq?region=eu-west-1'\n{command_name} --from gs://backups --to azure://acct.blob.core.windows.net/copies --backup-id nightly-2026-11-27 --recipient age1... --identity-file key.txt",
    note = "Storage URLs as `list --help` describes them; both take credentials from the environment. Exit codes: 0 every backup copied (or already there); 1 a copy failed (each named in the summary) or the source cannot be read; 2 bad usage."
)]
pub struct CopyCmd {
    /// source storage URL (see `list --help`); or --from-config
    #[argh(option)]
    from: Option<String>,
    /// a backup or restore configuration file whose storage section (credentials, prefix) is
    /// the source, instead of --from; its restore.encryption.identity_file decrypts
    #[argh(option)]
    from_config: Option<PathBuf>,
    /// target storage URL; or --to-config
    #[argh(option)]
    to: Option<String>,
    /// a configuration file whose storage section is the target, instead of --to
    #[argh(option)]
    to_config: Option<PathBuf>,
    /// a backup to copy (repeatable); default: every completed backup of the source
    #[argh(option)]
    backup_id: Vec<String>,
    /// encrypt the copy to this age recipient (age1..., repeatable): a plain backup is
    /// encrypted, an encrypted one re-encrypted (needs --identity-file)
    #[argh(option)]
    recipient: Vec<String>,
    /// age identity file that decrypts an encrypted source (default: the --from-config file's
    /// restore.encryption.identity_file, else RMQ_BACKUP_AGE_IDENTITY)
    #[argh(option)]
    identity_file: Option<PathBuf>,
    /// output format of the summary: table (default) or json
    #[argh(option, default = "Format::Table")]
    format: Format,
}

impl CopyCmd {
    /// Runs the command; prints the summary. Returns 0, or 1 when a backup's copy failed.
    ///
    /// Errors: configuration (URLs, recipients, identity file), the source's listing and
    /// manifests, an identity that cannot open a backup to re-encrypt.
    pub fn run(self) -> Result<i32> {
        let recipients = if self.recipient.is_empty() {
            None
        } else {
            Some(Recipients::parse(
                self.recipient.iter().map(String::as_str),
                "--recipient",
            )?)
        };
        use crate::repository::storage::args;
        let source = args::open(
            self.from.as_deref(),
            self.from_config.as_deref(),
            "--from",
            "--from-config",
        )?;
        let identities = source.identities(self.identity_file.as_deref())?;
        let from = source.storage;
        let to = args::open(
            self.to.as_deref(),
            self.to_config.as_deref(),
            "--to",
            "--to-config",
        )?
        .storage;
        if from.location() == to.location() {
            return Err(Error::Config(format!(
                "--from and --to are the same storage ({}): a copy needs another one",
                from.location()
            )));
        }
        crate::run::signals::install()?;
        let opts = CopyOptions {
            backup_ids: self.backup_id,
            recipients,
            identities,
        };
        let progress = Arc::new(Progress::default());
        let bar = bar(progress.clone());
        let report = copy(from.as_ref(), to.as_ref(), &opts, &progress);
        drop(bar);
        let report = report?;
        crate::run::write_stdout(format_args!("{}", report.render(self.format)?));
        if let Some(why) = crate::run::signals::stop_reason("copy") {
            return Err(Error::Io(why));
        }
        Ok(if report.failed() { 1 } else { 0 })
    }
}

/// Stops the bar's thread on drop.
struct Bar(
    Option<crossbeam_channel::Sender<()>>,
    Option<std::thread::JoinHandle<()>>,
);

impl Drop for Bar {
    fn drop(&mut self) {
        drop(self.0.take());
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}

/// A bytes bar on stderr when it is a terminal (not at trace level), fed from `progress`
/// four times a second.
fn bar(progress: Arc<Progress>) -> Option<Bar> {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    if !std::io::stderr().is_terminal() || log::max_level() >= log::LevelFilter::Trace {
        return None;
    }
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(4));
    pb.set_style(
        ProgressStyle::with_template(
            "copy: [{bar:25}] {binary_bytes}/{binary_total_bytes} ({percent}%), {msg}, {binary_bytes_per_sec}, ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let (tx, rx) = crossbeam_channel::bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || loop {
            pb.set_length(progress.total.load(Ordering::Relaxed));
            pb.set_position(progress.bytes.load(Ordering::Relaxed));
            pb.set_message(format!(
                "{} segments",
                progress.segments.load(Ordering::Relaxed)
            ));
            if !matches!(
                rx.recv_timeout(Duration::from_millis(250)),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ) {
                pb.finish_and_clear();
                break;
            }
        })
        .ok()?;
    Some(Bar(Some(tx), Some(thread)))
}
