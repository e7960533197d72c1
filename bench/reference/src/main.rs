//! `reference-backup backup|restore CONFIG`: runs rabbitmq-backup-core 0.2.0's backup or
//! restore engine on a configuration file of the shared specification (SPEC.md's YAML), for
//! scripts/bench.sh to time beside rmq-backup. Prints one line: what the engine returned.

use rabbitmq_backup_core::backup::BackupEngine;
use rabbitmq_backup_core::config::config_from_yaml_str;
use rabbitmq_backup_core::restore::RestoreEngine;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: reference-backup backup|restore CONFIG");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(2)
    });
    let config = config_from_yaml_str(&text).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(2)
    });
    let (_tx, rx) = tokio::sync::broadcast::channel(1);
    let done = match mode.as_str() {
        "backup" => BackupEngine::new(config)
            .run(rx)
            .await
            .map(|m| format!("backup: {} messages", m.total_messages)),
        "restore" => RestoreEngine::new(config)
            .run(rx)
            .await
            .map(|s| format!("restore: {s:?}")),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2)
        }
    };
    match done {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    }
}
