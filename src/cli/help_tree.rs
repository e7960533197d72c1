//! The command line as data, read from the parser itself: every command's `--help` text (what
//! argh makes from the `FromArgs` definitions) parsed into its usage, description, options and
//! subcommands. The shell completions and the man page are made from this tree, so they list
//! exactly the flags the parser accepts (`tests/completions.rs` checks it against `--help`).

use super::Cli;
use argh::FromArgs;

/// One option of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptSpec {
    /// `--config`.
    pub long: String,
    /// `-v`.
    pub short: Option<String>,
    /// Whether it takes a value (`--config <config>` in the usage line).
    pub takes_value: bool,
    /// Its help text, on one line.
    pub help: String,
}

/// One command: `rmq-backup` itself, `backup`, `config check`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// The words after `rmq-backup` (empty for the program itself).
    pub path: Vec<String>,
    /// The usage line, without `Usage: `.
    pub usage: String,
    /// The description paragraph.
    pub about: String,
    /// Its options, `--help` included.
    pub options: Vec<OptSpec>,
    /// Its positional arguments (`shell`).
    pub positionals: Vec<String>,
    /// Its subcommands: name and first sentence of their description.
    pub subcommands: Vec<(String, String)>,
    /// The `Examples:` and `Notes:` sections, as written.
    pub examples: Vec<String>,
    /// The notes.
    pub notes: Vec<String>,
}

impl CommandSpec {
    /// `rmq-backup config check`.
    pub fn name(&self) -> String {
        std::iter::once("rmq-backup")
            .chain(self.path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Options every command understands that are taken off the line before argh parses it
/// (`cli::preprocess`, `--log-format`, `--version`): listed with the program itself.
fn program_extras() -> Vec<OptSpec> {
    vec![
        OptSpec {
            long: "--log-format".into(),
            short: None,
            takes_value: true,
            help: "log format: text (default) or json, anywhere on the line (or RMQ_BACKUP_LOG_FORMAT)".into(),
        },
        OptSpec {
            long: "--version".into(),
            short: Some("-V".into()),
            takes_value: false,
            help: "print the version and the git commit of the build".into(),
        },
    ]
}

/// The `--help` text of the command at `path`.
pub fn help_text(path: &[&str]) -> String {
    let mut args: Vec<&str> = path.to_vec();
    args.push("--help");
    match Cli::from_args(&["rmq-backup"], &args) {
        Err(early) => early.output,
        Ok(_) => String::new(),
    }
}

/// Every command, the program first, then depth first in the order `--help` lists them.
pub fn commands() -> Vec<CommandSpec> {
    let mut out = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let mut spec = parse(&help_text(&refs), path.clone());
        if path.is_empty() {
            spec.options.extend(program_extras());
        }
        for (sub, _) in spec.subcommands.iter().rev() {
            let mut p = path.clone();
            p.push(sub.clone());
            todo.push(p);
        }
        out.push(spec);
    }
    out
}

/// A `--help` text parsed (argh's layout: `Usage:` line, description, then sections
/// `Options:`, `Positional Arguments:`, `Commands:`, `Examples:`, `Notes:`, each entry at two
/// spaces with its text from column 20, continued on deeper-indented lines).
pub fn parse(help: &str, path: Vec<String>) -> CommandSpec {
    let mut spec = CommandSpec {
        path,
        usage: String::new(),
        about: String::new(),
        options: Vec::new(),
        positionals: Vec::new(),
        subcommands: Vec::new(),
        examples: Vec::new(),
        notes: Vec::new(),
    };
    let mut section = "";
    for line in help.lines() {
        if let Some(u) = line.strip_prefix("Usage: ") {
            spec.usage = u.trim().to_string();
            section = "about";
            continue;
        }
        if !line.starts_with(' ') && line.ends_with(':') && !line.contains("  ") {
            section = match line {
                "Options:" => "options",
                "Positional Arguments:" => "positionals",
                "Commands:" => "commands",
                "Examples:" => "examples",
                "Notes:" => "notes",
                _ => "",
            };
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        match section {
            "about" => join(&mut spec.about, line.trim()),
            "examples" => spec.examples.push(line.trim().to_string()),
            "notes" => spec.notes.push(line.trim().to_string()),
            "options" | "positionals" | "commands" => {
                let entry = line.starts_with("  ") && !line.starts_with("   ");
                if !entry {
                    // A continuation of the last entry's text.
                    let text = line.trim();
                    match section {
                        "options" => {
                            if let Some(o) = spec.options.last_mut() {
                                join(&mut o.help, text);
                            }
                        }
                        "commands" => {
                            if let Some(c) = spec.subcommands.last_mut() {
                                join(&mut c.1, text);
                            }
                        }
                        _ => {}
                    }
                    continue;
                }
                let body = line.trim_start();
                let (names, text) = match body.find("  ") {
                    Some(i) => (&body[..i], body[i..].trim()),
                    None => (body, ""),
                };
                match section {
                    "options" => spec.options.push(option(names, text, &spec.usage)),
                    "positionals" => spec.positionals.push(names.trim().to_string()),
                    _ => spec
                        .subcommands
                        .push((names.trim().to_string(), text.to_string())),
                }
            }
            _ => {}
        }
    }
    spec
}

fn join(to: &mut String, text: &str) {
    if !to.is_empty() {
        to.push(' ');
    }
    to.push_str(text);
}

/// An option entry (`-v, --verbose`, `--help, help`, `--config`) and its help.
fn option(names: &str, help: &str, usage: &str) -> OptSpec {
    let mut long = String::new();
    let mut short = None;
    for n in names.split(',').map(str::trim) {
        if n.starts_with("--") {
            long = n.to_string();
        } else if n.starts_with('-') {
            short = Some(n.to_string());
        }
    }
    let takes_value = usage.contains(&format!("{long} <"));
    OptSpec {
        long,
        short,
        takes_value,
        help: help.to_string(),
    }
}

/// The first sentence of `text` (to its first `. ` or `: `), at most `max` characters.
pub fn first_sentence(text: &str, max: usize) -> String {
    // The first `. `, `: ` or `; ` outside parentheses.
    let mut depth = 0i32;
    let mut end = text.len();
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'.' | b':' | b';' if depth <= 0 && bytes.get(i + 1) == Some(&b' ') => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let s = text[..end].trim_end_matches('.');
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{}...", cut.trim_end())
    }
}

/// The values an option takes, where they are a fixed set.
pub fn values(command: &[String], long: &str) -> Option<&'static [&'static str]> {
    let cmd = command.first().map(String::as_str).unwrap_or("");
    match (cmd, long) {
        (_, "--log-format") => Some(&["text", "json"]),
        ("cat", "--format") => Some(&["jsonl", "body"]),
        (_, "--format") => Some(&["table", "json"]),
        _ => None,
    }
}

/// Whether an option's value is a file name.
pub fn takes_file(long: &str) -> bool {
    long == "--config"
        || long.ends_with("-config")
        || long.ends_with("-file")
        || long.ends_with("textfile")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_holds_every_command_with_its_flags() {
        let all = commands();
        let names: Vec<String> = all.iter().map(CommandSpec::name).collect();
        for n in [
            "rmq-backup",
            "rmq-backup backup",
            "rmq-backup restore",
            "rmq-backup list",
            "rmq-backup describe",
            "rmq-backup validate",
            "rmq-backup cat",
            "rmq-backup forget",
            "rmq-backup copy",
            "rmq-backup config",
            "rmq-backup config schema",
            "rmq-backup config check",
            "rmq-backup completions",
            "rmq-backup man",
        ] {
            assert!(names.contains(&n.to_string()), "{n} in {names:?}");
        }
        let validate = all.iter().find(|c| c.path == ["validate"]).unwrap();
        let deep = validate
            .options
            .iter()
            .find(|o| o.long == "--deep")
            .unwrap();
        assert!(!deep.takes_value);
        let subset = validate
            .options
            .iter()
            .find(|o| o.long == "--read-data-subset")
            .unwrap();
        assert!(
            subset.takes_value && subset.help.starts_with("with --deep"),
            "{subset:?}"
        );
        let root = &all[0];
        assert!(root
            .options
            .iter()
            .any(|o| o.short.as_deref() == Some("-v")));
        assert!(root.options.iter().any(|o| o.long == "--log-format"));
        assert_eq!(
            first_sentence("Run a backup: read every queue. More.", 60),
            "Run a backup"
        );
    }
}
