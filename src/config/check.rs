//! `rmq-backup config check --config FILE`: the configuration loaded as a run would load it
//! (parse, `${ENV}` interpolation, `*_file` secrets, validation), touching no broker and no
//! storage, its error pointing at the YAML path and line it is about.
//!
//! A parse or type error carries serde's own `<path>: ... at line N column M`. A validation
//! error names its key path first (`backup.compression_level must be ...`): [`locate`] finds
//! that path's line in the file's text, and the message gets ` (line N)`.

use super::Config;
use crate::error::{Error, Result};
use std::path::Path;

/// Loads and checks the configuration file at `path` as [`Config::load`] does; a
/// configuration error whose message starts with a key path that [`locate`] finds in the file
/// gets that line appended (`... (line 12)`).
///
/// Errors: those of [`Config::load`].
pub fn check(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("Cannot read config file {}: {e}", path.display())))?;
    Config::from_yaml_str(&text).map_err(|e| match e {
        Error::Config(m) => Error::Config(with_line(&text, m)),
        other => other,
    })
}

/// `message` with ` (line N)` when it starts with a key path found in `text`.
fn with_line(text: &str, message: String) -> String {
    let path: String = message
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    let path = path.trim_end_matches('.');
    if path.is_empty() || message.contains(" line ") {
        return message;
    }
    match locate(text, path) {
        Some(line) => format!("{message} (line {line})"),
        None => message,
    }
}

/// The 1-based line of the key at dotted `path` (`backup.shard.count`) in block-style YAML
/// `text`: each component is searched among the keys one level deeper than its parent's
/// (indentation), comments and blank lines skipped. `None` when a component is not found (a
/// flow mapping `{a: 1}`, or a key the file does not write: its default was refused).
pub fn locate(text: &str, path: &str) -> Option<usize> {
    let mut parent_indent: Option<usize> = None;
    let mut from = 0usize;
    let lines: Vec<&str> = text.lines().collect();
    let mut found = None;
    for key in path.split('.') {
        let mut hit = None;
        let mut level: Option<usize> = None;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let content = line.trim_start();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let indent = line.len() - content.len();
            if parent_indent.is_some_and(|p| indent <= p) {
                break; // left the parent's block
            }
            let level = *level.get_or_insert(indent);
            if indent != level {
                continue; // deeper: another key's block
            }
            let name = content
                .split_once(':')
                .map(|(k, _)| k.trim().trim_matches(|c| c == '"' || c == '\''));
            if name == Some(key) {
                hit = Some((i, indent));
                break;
            }
        }
        let (i, indent) = hit?;
        found = Some(i + 1);
        parent_indent = Some(indent);
        from = i + 1;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "mode: backup\nbackup_id: x\n# a comment\nsource:\n  amqp_url: a\n  queues:\n    vhosts: [v]\nbackup:\n  shard:\n    count: 0\n  compression_level: 30\nrestore:\n  count: 1\n";

    #[test]
    fn key_paths_are_found_at_their_depth() {
        assert_eq!(locate(YAML, "mode"), Some(1));
        assert_eq!(locate(YAML, "source.queues.vhosts"), Some(7));
        assert_eq!(locate(YAML, "backup.shard.count"), Some(10));
        assert_eq!(locate(YAML, "backup.compression_level"), Some(11));
        // `count` exists under restore, not directly under backup.
        assert_eq!(locate(YAML, "backup.count"), None);
        assert_eq!(locate(YAML, "restore.count"), Some(13));
        assert_eq!(locate(YAML, "storage"), None);
        assert_eq!(locate(YAML, "source.queues.exclude"), None);
    }

    #[test]
    fn a_validation_message_gets_its_line() {
        assert_eq!(
            with_line(YAML, "backup.shard.count must be at least 1".into()),
            "backup.shard.count must be at least 1 (line 10)"
        );
        // No path first, or a message that already has a line: unchanged.
        assert_eq!(
            with_line(YAML, "Source configuration required".into()),
            "Source configuration required"
        );
        assert_eq!(
            with_line(YAML, "backup: unknown field at line 3 column 1".into()),
            "backup: unknown field at line 3 column 1"
        );
    }
}
