//! `rmq-backup man`: the manual page, roff (man(7)), section 1, from the commands' `--help`
//! texts ([`super::help_tree`]): every command with its usage, description, every option,
//! examples and notes; then exit codes, environment and files.

use super::help_tree::CommandSpec;
use std::fmt::Write as _;

/// Text made safe for roff: backslashes doubled, `-` as `\-`, and a line that would start with
/// `.` or `'` (a request) protected with `\&`.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// The page for `all` (the program first).
pub fn page(all: &[CommandSpec]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        ".TH RMQ\\-BACKUP 1 \"\" \"rmq\\-backup {}\" \"User Commands\"",
        env!("CARGO_PKG_VERSION")
    );
    s.push_str(".SH NAME\nrmq\\-backup \\- back up RabbitMQ queues and topology to storage and restore them\n");
    s.push_str(".SH SYNOPSIS\n.B rmq\\-backup\n[\\fB\\-v\\fR|\\fB\\-vv\\fR] [\\fB\\-\\-log\\-format\\fR \\fItext\\fR|\\fIjson\\fR] \\fIcommand\\fR [\\fIoptions\\fR]\n");
    if let Some(root) = all.first() {
        let _ = writeln!(s, ".SH DESCRIPTION\n{}", roff(&root.about));
        s.push_str(".SH OPTIONS\n");
        options(&mut s, root);
    }
    s.push_str(".SH COMMANDS\n");
    for c in all.iter().skip(1) {
        let _ = writeln!(s, ".SS \"{}\"", roff(&c.name()));
        let _ = writeln!(
            s,
            ".B {}\n.PP",
            roff(&format!("rmq-backup {}", usage_after_program(&c.usage)))
        );
        if !c.about.is_empty() {
            let _ = writeln!(s, "{}", roff(&c.about));
        }
        if !c.options.is_empty() {
            s.push_str(".PP\nOptions:\n");
            options(&mut s, c);
        }
        if !c.examples.is_empty() {
            s.push_str(".PP\nExamples:\n.RS\n.nf\n");
            for e in &c.examples {
                let _ = writeln!(s, "{}", roff(e));
            }
            s.push_str(".fi\n.RE\n");
        }
        for n in &c.notes {
            let _ = writeln!(s, ".PP\n{}", roff(n));
        }
    }
    s.push_str(concat!(
        ".SH EXIT STATUS\n",
        ".TP\n.B 0\nSuccess.\n",
        ".TP\n.B 1\nThe job failed (broker, storage, a damaged backup during restore, a message the target refused).\n",
        ".TP\n.B 2\nBad usage or configuration.\n",
        ".TP\n.B 3\n\\fBvalidate\\fR found damage, or \\fBlist\\fR found a manifest it cannot read.\n",
        ".TP\n.B 4\nA backup completed but left selected queues (or messages held by live consumers) out; each is named.\n",
        ".TP\n.B 130, 143\nStopped by SIGINT or SIGTERM; the backup reads as interrupted and a rerun finishes it.\n",
        ".SH ENVIRONMENT\n",
        ".TP\n.B RMQ_BACKUP_AGE_IDENTITY\nThe age identity that decrypts an encrypted backup.\n",
        ".TP\n.B RMQ_BACKUP_LOG_FORMAT\n\\fBtext\\fR or \\fBjson\\fR, as \\fB\\-\\-log\\-format\\fR.\n",
        ".TP\n.B RMQ_BACKUP_SPOOL_DIR\nWhere segments are built and fetched (default the temporary directory).\n",
        ".TP\n.B RMQ_BACKUP_ZSTD_WORKERS\nzstd worker threads per segment.\n",
        ".TP\n.B RUST_LOG\nOverrides \\fB\\-v\\fR.\n",
        ".PP\nStorage credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, ",
        "GOOGLE_APPLICATION_CREDENTIALS and the other standard variables (the book's \"Environment variables\").\n",
        ".SH FILES\n",
        ".TP\n.I /etc/rmq\\-backup/backup.yaml\nThe configuration of the packaged nightly backup (rmq\\-backup.service, rmq\\-backup.timer).\n",
        ".SH SEE ALSO\n",
        "/usr/share/doc/rmq\\-backup/README.md; the book (docs/ in the source) for every subject; \\fBrmq\\-backup config schema\\fR for every key of the configuration.\n",
    ));
    s
}

/// `rmq-backup backup --config <config>` from argh's `rmq-backup backup --config <config>`.
fn usage_after_program(usage: &str) -> &str {
    usage.strip_prefix("rmq-backup ").unwrap_or(usage)
}

fn options(s: &mut String, c: &CommandSpec) {
    for o in &c.options {
        let mut names = String::new();
        if let Some(short) = &o.short {
            let _ = write!(names, "\\fB{}\\fR, ", roff(short));
        }
        let _ = write!(names, "\\fB{}\\fR", roff(&o.long));
        if o.takes_value {
            let _ = write!(names, " \\fI{}\\fR", roff(o.long.trim_start_matches('-')));
        }
        let _ = writeln!(s, ".TP\n{names}\n{}", roff(&o.help));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_roff_with_every_command_and_flag() {
        let all = super::super::help_tree::commands();
        let page = page(&all);
        assert!(page.starts_with(".TH RMQ\\-BACKUP 1"));
        for c in &all {
            assert!(page.contains(&roff(&c.name())), "{}", c.name());
            for o in &c.options {
                assert!(page.contains(&roff(&o.long)), "{} of {}", o.long, c.name());
            }
        }
        assert_eq!(roff(".hidden - a\\b"), "\\&.hidden \\- a\\eb");
    }
}
