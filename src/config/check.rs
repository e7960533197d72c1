//! `rmq-backup config check --config FILE`: the configuration loaded as a run would load it
//! (parse, `${ENV}` interpolation, `*_file` secrets, validation), touching no broker and no
//! storage, its error pointing at the YAML path and line it is about.
//!
//! A parse or type error carries serde's own `<path>: ... at line N column M`. A validation
//! error names its key path first (`backup.compression_level must be ...`): [`locate`] finds
//! that path's line in the file's text, and the message gets ` (line N)`.

use super::lenient::{self, Absent};
use super::Config;
use crate::error::{Error, Result};
use std::path::Path;

/// Loads and checks the configuration file at `path` as [`Config::load`] does, except that an
/// unset `${VAR}` or an absent `*_file` secret is returned, with its key, instead of refused
/// (the job's machine sets them: [`lenient`]); errors as [`load`] gives them.
pub fn check(path: &Path) -> Result<(Config, Vec<Absent>)> {
    let text = read(path)?;
    let (config, absent) = lenient::collecting(|| Config::from_yaml_str(&text));
    Ok((config.map_err(|e| for_people(&text, e))?, absent))
}

/// Loads the configuration file at `path` for a run: [`Config::load`], its errors made for
/// people: a mistake in a value or a key (wrong type, unknown key or value, missing key) is a
/// `Configuration error:` like every other mistake in the file, says what was expected in
/// words (`a whole number from 0 to 65535`, not `u16`), and ends with its line when its key
/// path is found. Text that is not YAML stays a `Serialization error:`.
pub fn load(path: &Path) -> Result<Config> {
    let text = read(path)?;
    Config::from_yaml_str(&text).map_err(|e| for_people(&text, e))
}

/// The configuration at `path` for a command that opens its storage only (`list --config`,
/// ...): loaded as [`check`] does, refused only when the storage section itself needs a
/// variable or file that is not here.
pub fn load_for_storage(path: &Path) -> Result<Config> {
    let (config, absent) = check(path)?;
    if let Some(a) = absent.iter().find(|a| a.key.starts_with("storage.")) {
        return Err(Error::Config(match &a.missing {
            lenient::Missing::Variable(name) => format!(
                "Environment variable {name} referenced in {} of {} is not set",
                a.key,
                path.display()
            ),
            lenient::Missing::File(file) => format!(
                "Cannot read {} {} (of {}): No such file or directory",
                a.key,
                file.display(),
                path.display()
            ),
        }));
    }
    Ok(config)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("Cannot read config file {}: {e}", path.display())))
}

/// `e` as [`load`] reports it.
fn for_people(text: &str, e: Error) -> Error {
    match e {
        Error::Config(m) => Error::Config(with_line(text, m)),
        Error::Serialization(m) if is_value_mistake(&m) => Error::Config(plain_types(&m)),
        Error::Serialization(m) => Error::Serialization(plain_types(&m)),
        other => other,
    }
}

/// A parse error about a key or value of a file that is YAML (serde's data errors), not about
/// YAML itself.
fn is_value_mistake(message: &str) -> bool {
    [
        "invalid type",
        "invalid value",
        "unknown field",
        "unknown variant",
        "missing field",
        "invalid length",
        "duplicate field",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// serde's Rust type names in `message` in words.
fn plain_types(message: &str) -> String {
    const WORDS: [(&str, &str); 11] = [
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number, 0 or more"),
        ("usize", "a whole number, 0 or more"),
        ("i8", "a whole number from -128 to 127"),
        ("i16", "a whole number from -32768 to 32767"),
        ("i32", "a whole number from -2147483648 to 2147483647"),
        ("i64", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
    ];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let after = &rest[at + "expected ".len()..];
        out.push_str(&rest[..at + "expected ".len()]);
        let word_end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let word = &after[..word_end];
        if let Some((_, plain)) = WORDS.iter().find(|(w, _)| *w == word) {
            out.push_str(plain);
            rest = &after[word_end..];
        } else if word == "struct" {
            // `struct BackupOptions`: a mapping of keys.
            let tail = after[word_end..].trim_start();
            let name_end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            out.push_str("a mapping of keys");
            rest = &tail[name_end..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
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

    #[test]
    fn rust_type_names_become_words() {
        assert_eq!(
            plain_types("backup.max_concurrent_queues: invalid type: string \"x\", expected usize at line 3 column 5"),
            "backup.max_concurrent_queues: invalid type: string \"x\", expected a whole number, 0 or more at line 3 column 5"
        );
        assert_eq!(
            plain_types("invalid value: integer `70000`, expected u16"),
            "invalid value: integer `70000`, expected a whole number from 0 to 65535"
        );
        assert_eq!(
            plain_types("invalid type: sequence, expected struct Config"),
            "invalid type: sequence, expected a mapping of keys"
        );
        assert_eq!(plain_types("expected a boolean"), "expected a boolean");
        assert!(is_value_mistake(
            "backup: unknown field `x`, expected one of"
        ));
        assert!(!is_value_mistake(
            "did not find expected key at line 2 column 1"
        ));
    }

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
