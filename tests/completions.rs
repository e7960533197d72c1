//! Issue 40: the shell completions (bash, zsh, fish) and the man page hold every flag of every
//! command. The flags are read here from each command's `--help` (what argh makes of the
//! definitions the parser uses), independently of the generator, and each script is checked
//! by its shell's own syntax check where the shell is installed.

mod common;

use common::*;
use std::collections::BTreeSet;

/// `--help` of the command at `path`.
fn help(path: &[&str]) -> String {
    let mut args = path.to_vec();
    args.push("--help");
    let out = run_cli(&args);
    assert_eq!(out.status.code(), Some(0), "{path:?} --help");
    text(&out).0
}

/// The `--flags` of a help text (the usage line and the Options section) and its
/// subcommands.
fn flags_and_commands(help: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut flags = BTreeSet::new();
    let mut commands = Vec::new();
    let mut section = "";
    for line in help.lines() {
        if let Some(usage) = line.strip_prefix("Usage:") {
            for word in usage.split(|c: char| c.is_whitespace() || "[],<>".contains(c)) {
                if word.starts_with("--") && word.len() > 2 {
                    flags.insert(word.to_string());
                }
            }
            continue;
        }
        if !line.starts_with(' ') && line.ends_with(':') {
            section = if line == "Options:" || line == "Commands:" {
                line
            } else {
                ""
            };
            continue;
        }
        // An entry: two spaces, its names, two spaces or more, its text.
        if !line.starts_with("  ") || line.starts_with("   ") {
            continue;
        }
        let names = line.trim_start().split("  ").next().unwrap_or("");
        match section {
            "Options:" => flags.extend(
                names
                    .split(", ")
                    .map(str::trim)
                    .filter(|n| n.starts_with('-'))
                    .map(str::to_string),
            ),
            "Commands:" => commands.push(names.trim().to_string()),
            _ => {}
        }
    }
    (flags, commands)
}

/// Every command path and its flags, the program first, from the binary's `--help`.
fn every_command() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let (flags, commands) = flags_and_commands(&help(&refs));
        for c in commands {
            let mut p = path.clone();
            p.push(c);
            todo.push(p);
        }
        out.push((path, flags));
    }
    out
}

#[test]
fn every_flag_of_every_command_is_in_the_completions_and_the_man_page() {
    let all = every_command();
    let names: Vec<String> = all.iter().map(|(p, _)| p.join(" ")).collect();
    for expected in [
        "backup",
        "restore",
        "list",
        "describe",
        "validate",
        "cat",
        "forget",
        "copy",
        "config check",
        "completions",
        "man",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    let mut outputs = Vec::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = run_cli(&["completions", shell]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "completions {shell}: {:?}",
            text(&out)
        );
        outputs.push((shell, text(&out).0));
    }
    let out = run_cli(&["man"]);
    assert_eq!(out.status.code(), Some(0));
    let man = text(&out).0;
    let mut checked = 0;
    for (path, flags) in &all {
        for flag in flags {
            checked += 1;
            for (shell, script) in &outputs {
                let found = match *shell {
                    "fish" => match flag.strip_prefix("--") {
                        Some(long) => {
                            script.contains(&format!(" -l {long} "))
                                || script.contains(&format!(" -l {long}\n"))
                        }
                        None => script.contains(&format!(" -s {}", &flag[1..])),
                    },
                    _ => script.contains(flag.as_str()),
                };
                assert!(found, "{shell}: {flag} of `rmq-backup {}`", path.join(" "));
            }
            assert!(
                man.contains(&flag.replace('-', "\\-")),
                "man page: {flag} of `rmq-backup {}`",
                path.join(" ")
            );
        }
        for word in path {
            for (shell, script) in &outputs {
                assert!(script.contains(word.as_str()), "{shell}: command {word}");
            }
        }
    }
    assert!(
        checked > 60,
        "only {checked} flags found: is the --help parser blind?"
    );
    for flag in [
        "--from-config",
        "--read-data-subset",
        "--keep-within",
        "--dry-run",
        "--identity-file",
    ] {
        assert!(
            all.iter().any(|(_, f)| f.contains(flag)),
            "{flag} read from --help"
        );
    }

    // Each script passes its shell's syntax check (where the shell is installed).
    let dir = TempDir::new("completions");
    for (shell, script) in &outputs {
        let path = dir.path().join(format!("rmq-backup.{shell}"));
        std::fs::write(&path, script).unwrap();
        match std::process::Command::new(shell)
            .arg("-n")
            .arg(&path)
            .output()
        {
            Ok(o) => assert!(
                o.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("{shell} not installed ({e}): syntax not checked"),
        }
    }
    let out = run_cli(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out)
            .1
            .starts_with("Configuration error: completions: unknown shell"),
        "{:?}",
        text(&out)
    );
}

/// bash's completion answers as a user at a prompt would see it.
#[test]
fn bash_completes_commands_flags_and_values() {
    let out = run_cli(&["completions", "bash"]);
    let dir = TempDir::new("bash-completion");
    let script = dir.path().join("rmq-backup.bash");
    std::fs::write(&script, text(&out).0).unwrap();
    let complete = |words: &str| -> String {
        let n = words.split(' ').count() - 1;
        let cmd = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={n}; _rmq_backup; echo \"${{COMPREPLY[*]}}\"",
            script.display()
        );
        let o = std::process::Command::new("bash")
            .arg("-c")
            .arg(cmd)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(complete("rmq-backup val"), "validate");
    assert_eq!(complete("rmq-backup validate --read"), "--read-data-subset");
    assert_eq!(complete("rmq-backup cat --format ''"), "jsonl body");
    assert_eq!(complete("rmq-backup -v config ''"), "schema check --help");
    assert_eq!(complete("rmq-backup copy --from-c"), "--from-config");
    assert_eq!(complete("rmq-backup completions ''"), "bash zsh fish");
}
