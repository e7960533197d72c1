//! The argh definitions of the commands that `cli` runs itself (`backup`, `restore`, `list`,
//! `describe`, `validate`, `config`); `cat`, `forget` and `copy` keep theirs beside their code.

use crate::inspect::{self, Format};
use argh::FromArgs;
use std::path::PathBuf;

/// The configuration file: print its JSON Schema, or check a file without running it.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "config",
    example = "{command_name} schema > rmq-backup.schema.json\n{command_name} check --config backup.yaml",
    note = "An editor with the YAML language server completes and checks a file whose first line is `# yaml-language-server: $schema=rmq-backup.schema.json` (a path or URL of the schema)."
)]
pub(super) struct ConfigCmd {
    #[argh(subcommand)]
    pub(super) action: ConfigAction,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub(super) enum ConfigAction {
    Schema(SchemaCmd),
    Check(CheckCmd),
}

/// Print the JSON Schema (draft 2020-12) of the configuration file, made from its types: every
/// key with its type, default and description.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "schema")]
pub(super) struct SchemaCmd {}

/// Check a configuration file as a run would load it (YAML, every value, URL syntax, TLS
/// certificate and key files, `*_file` secrets) without connecting to a broker or a storage:
/// exit 0 when it is valid, 2 with the error, its key path and line, when not. Environment
/// variables that are unset here and secret files that are not here are listed with the keys
/// that need them (a run needs them where it runs), and the rest is checked.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "check")]
pub(super) struct CheckCmd {
    /// the YAML configuration file
    #[argh(option)]
    pub(super) config: PathBuf,
}

/// Run a backup: read every selected queue without removing a message, write segments, the
/// definitions and, last, the manifest. With --dry-run, only print the plan. A `retention:`
/// section (keep_last, keep_daily, keep_weekly, keep_monthly, keep_within, prune_interrupted,
/// prune, prune_grace: the rules of `forget --help`) is applied after a successful backup; its
/// failure is logged and printed but leaves the exit code of the backup.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "backup")]
pub(super) struct BackupCmd {
    /// the YAML configuration file (mode: backup)
    #[argh(option)]
    pub(super) config: PathBuf,
    /// print the plan and exit 0: the queues and streams that would be read (vhost, name,
    /// type, depth and bytes from the management API, estimated stored size), the selected
    /// ones that would be skipped and why, and the storage prefix. Reads no message, writes
    /// nothing, takes no lock.
    #[argh(switch)]
    pub(super) dry_run: bool,
    /// output format of --dry-run: table (default) or json
    #[argh(option, default = "Format::Table")]
    pub(super) format: Format,
}

/// Run a restore: publish the messages of a backup to the target broker, optionally with its
/// definitions first.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "restore")]
pub(super) struct RestoreCmd {
    /// the YAML configuration file (mode: restore)
    #[argh(option)]
    pub(super) config: PathBuf,
    /// check the plan and print it, publish nothing: as `restore.dry_run: true` in the file
    /// (the backup's manifest and definitions are read, the target's queues looked up)
    #[argh(switch)]
    pub(super) dry_run: bool,
}

/// List the backups in a storage location.
#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "list",
    example = "{command_name} --path file:///var/backups/rabbitmq\n{command_name} --config /etc/rmq-backup/backup.yaml\nAWS_ACCESS_KEY_ID=.. AWS_SECRET_ACCESS_KEY=.. {command_name} --path 's3://backups/prod?endpoint=https://minio:9000&path_style=true'\nAZURE_STORAGE_ACCOUNT_KEY=.. {command_name} --path azure://acct.blob.core.windows.net/backups --format json\nGOOGLE_APPLICATION_CREDENTIALS=sa.json {command_name} --path gs://backups/prod",
    note = "Instead of --path, --config FILE takes the storage section of a backup or restore configuration, with its credentials (also from *_file secrets and environment references) and prefix: list, describe, validate, cat and forget take --config, copy --from-config and --to-config. A storage URL never holds credentials: s3 reads AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or a profile, web identity, the container or instance role) and AWS_REGION; azure reads AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET (or workload or managed identity); gcs reads GOOGLE_APPLICATION_CREDENTIALS (or application default credentials; STORAGE_EMULATOR_HOST for an emulator). A path after the bucket or container is a key prefix. SSL_CERT_FILE adds a private CA."
)]
pub(super) struct ListCmd {
    /// storage URL: file:///abs/path, memory://, s3://bucket[/prefix]?region=..&endpoint=..&path_style=true&allow_http=true,
    /// azure://account.blob.core.windows.net/container[/prefix], gcs://bucket[/prefix]; or --config
    #[argh(option)]
    pub(super) path: Option<String>,
    /// a backup or restore configuration file whose storage section (with its credentials and
    /// prefix) is used instead of --path
    #[argh(option)]
    pub(super) config: Option<PathBuf>,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    pub(super) format: Format,
}

/// Describe one backup: its manifest, queue by queue.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "describe")]
pub(super) struct DescribeCmd {
    /// storage URL (see `list --help`); or --config
    #[argh(option)]
    pub(super) path: Option<String>,
    /// a backup or restore configuration file whose storage section (with its credentials and
    /// prefix) is used instead of --path
    #[argh(option)]
    pub(super) config: Option<PathBuf>,
    /// the backup id to describe (with --config, default: the file's backup_id)
    #[argh(option)]
    pub(super) backup_id: Option<String>,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    pub(super) format: Format,
}

/// Validate a backup: every segment present with its size; with --deep also fetched and
/// checked (CRC32, SHA-256, record count, every record; an encrypted backup decrypted with
/// --identity-file or RMQ_BACKUP_AGE_IDENTITY). Exit 3 when damaged.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "validate")]
pub(super) struct ValidateCmd {
    /// storage URL (see `list --help`); or --config
    #[argh(option)]
    pub(super) path: Option<String>,
    /// a backup or restore configuration file whose storage section (with its credentials and
    /// prefix) is used instead of --path
    #[argh(option)]
    pub(super) config: Option<PathBuf>,
    /// the backup id to validate (with --config, default: the file's backup_id)
    #[argh(option)]
    pub(super) backup_id: Option<String>,
    /// fetch every segment and verify its checksums and records
    #[argh(switch)]
    pub(super) deep: bool,
    /// with --deep, read only a subset of the segments (restic's forms): N/T the slice N of T
    /// by a hash of the segment key (slices 1/T..T/T together read each segment once), P% a
    /// random P percent of the segments, SIZE (500M, 2G) random segments up to that many
    /// stored bytes. The others are checked shallowly.
    #[argh(option)]
    pub(super) read_data_subset: Option<inspect::Subset>,
    /// write the metrics (broker_backup_validate_segments_read, _bytes_read,
    /// _segments_failed, broker_backup_last_* with mode="validate") to this file for
    /// node_exporter's textfile collector when the check ends
    #[argh(option)]
    pub(super) metrics_textfile: Option<PathBuf>,
    /// output format: table (default) or json
    #[argh(option, default = "Format::Table")]
    pub(super) format: Format,
    /// age identity file that decrypts an encrypted backup for --deep (default: the
    /// --config file's restore.encryption.identity_file, else the environment variable
    /// RMQ_BACKUP_AGE_IDENTITY; a shallow check needs none)
    #[argh(option)]
    pub(super) identity_file: Option<PathBuf>,
}
