//! The documentation's links (issue 34): every relative link in README.md, CHANGELOG.md,
//! ARCHITECTURE.md and the book (docs/) names a file that exists and, with `#anchor`, a heading
//! of that file; every `{{#include file:anchor}}` of the book names a file and an anchor in it;
//! SUMMARY.md lists every chapter and only chapters that exist. So a renamed page or heading
//! fails here, before `mdbook build` (which scripts/test.sh also runs) would show a broken link.
//! No broker, no network: links to `http(s)://` are not fetched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links are checked: the top-level documents and every book page.
fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "ARCHITECTURE.md"]
        .iter()
        .map(|f| root().join(f))
        .collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The text outside code blocks and inline code, line by line (links inside code are examples).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Inline code spans: drop what lies between pairs of backticks.
        let mut kept = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push((i + 1, kept));
    }
    out
}

/// The targets of the inline links `[text](target)` of a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(pos) = rest.find("](") {
        let after = &rest[pos + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// A heading's anchor as mdBook and GitHub make it: lower case, spaces to `-`, every character
/// that is not alphanumeric, `-` or `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            if heading.starts_with(' ') {
                set.insert(slug(heading));
            }
        }
    }
    set
}

/// The link targets between `ANCHOR: name` and `ANCHOR_END: name` of an included file.
fn region_links(text: &str, anchor: &str) -> Vec<String> {
    let start = format!("ANCHOR: {anchor}");
    let end = format!("ANCHOR_END: {anchor}");
    let mut inside = false;
    let mut region = String::new();
    for line in text.lines() {
        if line.contains(&end) {
            inside = false;
        } else if line.contains(&start) {
            inside = true;
        } else if inside {
            region.push_str(line);
            region.push('\n');
        }
    }
    prose_lines(&region)
        .into_iter()
        .flat_map(|(_, l)| link_targets(&l))
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_names_an_existing_file_and_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().expect("a document has a directory");
        for (line_no, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.is_empty()
                    || target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    dir.join(path)
                };
                let at = format!("{}:{line_no}: ({target})", relative(&doc));
                if !file.exists() {
                    broken.push(format!("{at}: no file {}", relative(&file)));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if !anchors(&read(&file)).contains(anchor) {
                        broken.push(format!("{at}: no heading #{anchor} in {}", relative(&file)));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser blind?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_include_names_an_existing_file_and_anchor() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().expect("a document has a directory");
        for (i, line) in text.lines().enumerate() {
            let Some(start) = line.find("{{#include ") else {
                continue;
            };
            let Some(end) = line[start..].find("}}") else {
                broken.push(format!("{}:{}: unclosed include", relative(&doc), i + 1));
                continue;
            };
            checked += 1;
            let spec = line[start + "{{#include ".len()..start + end].trim();
            let (path, anchor) = match spec.split_once(':') {
                Some((p, a)) => (p, Some(a)),
                None => (spec, None),
            };
            let file = dir.join(path);
            let at = format!("{}:{}: {{{{#include {spec}}}}}", relative(&doc), i + 1);
            if !file.exists() {
                broken.push(format!("{at}: no file {}", relative(&file)));
                continue;
            }
            if let Some(anchor) = anchor {
                let included = read(&file);
                let opens = included.contains(&format!("ANCHOR: {anchor} "))
                    || included.contains(&format!("ANCHOR: {anchor}-->"));
                let closes = included.contains(&format!("ANCHOR_END: {anchor} "))
                    || included.contains(&format!("ANCHOR_END: {anchor}-->"));
                if !opens || !closes {
                    broken.push(format!(
                        "{at}: no ANCHOR/ANCHOR_END {anchor} in {}",
                        relative(&file)
                    ));
                    continue;
                }
                // mdBook does not rewrite links in included text: each must also resolve from
                // the page that includes it.
                for target in region_links(&included, anchor) {
                    if !target.contains("://")
                        && !dir.join(target.split('#').next().unwrap_or("")).exists()
                    {
                        broken.push(format!(
                            "{at}: the included link ({target}) does not resolve from {}",
                            relative(&doc)
                        ));
                    }
                }
            }
        }
    }
    assert!(checked >= 2, "only {checked} includes found");
    assert!(broken.is_empty(), "broken includes:\n{}", broken.join("\n"));
}

#[test]
fn the_summary_lists_every_chapter_and_only_existing_ones() {
    let docs = root().join("docs");
    let summary = read(&docs.join("SUMMARY.md"));
    let listed: BTreeSet<String> = summary.lines().flat_map(link_targets).collect();
    let missing: Vec<&String> = listed.iter().filter(|c| !docs.join(c).exists()).collect();
    assert!(
        missing.is_empty(),
        "SUMMARY.md lists missing chapters: {missing:?}"
    );
    let unlisted: Vec<String> = documents()
        .iter()
        .filter(|p| p.starts_with(&docs))
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n != "SUMMARY.md" && !listed.contains(n))
        .collect();
    assert!(
        unlisted.is_empty(),
        "book pages not in SUMMARY.md: {unlisted:?}"
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; the rest belongs in the book (docs/)"
    );
}

#[test]
fn the_link_parser_finds_links_and_skips_code() {
    assert_eq!(
        link_targets("see [a](x.md) and [b](y.md#h)"),
        ["x.md", "y.md#h"]
    );
    let lines = prose_lines("text [a](x.md)\n```\n[b](y.md)\n```\n`[c](z.md)` [d](w.md)");
    let found: Vec<String> = lines.iter().flat_map(|(_, l)| link_targets(l)).collect();
    assert_eq!(found, ["x.md", "w.md"]);
    assert_eq!(slug("From RabbitMQ 3.x to 4.x"), "from-rabbitmq-3x-to-4x");
    assert_eq!(slug("Retention (forget)"), "retention-forget");
}

/// The files a text names: `*.md` names, and paths under the repository's top-level
/// directories (`src/...`, `tests/...`, `scripts/...`), in prose and in code alike, each with
/// its 1-based line.
fn named_files(text: &str) -> Vec<(usize, String)> {
    const DIRS: [&str; 8] = [
        "src/",
        "tests/",
        "docs/",
        "scripts/",
        "packaging/",
        "examples/",
        "fuzz/",
        ".ci/",
    ];
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let tokens = line.split(|c: char| c.is_whitespace() || "()[]{}<>\"'`,;|=!?*".contains(c));
        for token in tokens {
            let token = token
                .split('#')
                .next()
                .unwrap_or("")
                .trim_end_matches(['.', ':'])
                .trim_start_matches("./");
            // A prefix (`tests/faults_*.rs`) or a directory a script creates.
            let generated = ["fuzz/work", "fuzz/artifacts", "fuzz/target"]
                .iter()
                .any(|g| token.starts_with(g));
            if token.is_empty()
                || token.contains("://")
                || token.contains('$')
                || token.ends_with('_')
                || generated
            {
                continue;
            }
            let path_like = token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
            if !path_like {
                continue;
            }
            if token.ends_with(".md") || DIRS.iter().any(|d| token.starts_with(d)) {
                out.push((i + 1, token.to_string()));
            }
        }
    }
    out
}

/// Whether a named file exists: from the naming file's directory, the repository's root, or
/// (for a chapter named by its file name) the book's directory.
fn resolves(dir: &Path, name: &str) -> bool {
    [
        dir.join(name),
        root().join(name),
        root().join("docs").join(name),
    ]
    .iter()
    .any(|p| p.exists())
}

/// Issue 40: the book, README and ARCHITECTURE.md stand alone. Every file they name (and the
/// scripts, packaging and examples name in their comments) is in the repository: no
/// `SPEC.md`, `DESIGN.md` or `ENVIRONMENT.md` that only the authors have. CHANGELOG.md is
/// history: it may name files since renamed, but not those documents.
#[test]
fn every_named_file_is_in_the_repository() {
    let mut files = documents();
    for dir in [
        "scripts",
        "packaging",
        "packaging/k8s",
        "packaging/systemd",
        "examples",
    ] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
            continue;
        };
        for e in entries {
            let p = e.expect("entry").path();
            let text_like = p.extension().is_some_and(|x| {
                ["sh", "yaml", "yml", "json", "service", "timer", "rs", "md"]
                    .contains(&x.to_string_lossy().as_ref())
            });
            if p.is_file() && text_like {
                files.push(p);
            }
        }
    }
    files.push(root().join("Cargo.toml"));
    let mut missing = Vec::new();
    for file in &files {
        let text = read(file);
        let dir = file.parent().expect("a directory");
        let history = file.ends_with("CHANGELOG.md");
        for (line, name) in named_files(&text) {
            if history && !name.ends_with(".md") {
                continue;
            }
            if !resolves(dir, &name) {
                missing.push(format!("{}:{line}: {name}", relative(file)));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files named but not in the repository:\n{}",
        missing.join("\n")
    );
    // The check finds what it must.
    let found = named_files("see SPEC.md \"Errors\", (DESIGN.md) and `src/nothing.rs`.");
    let names: Vec<&str> = found.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["SPEC.md", "DESIGN.md", "src/nothing.rs"]);
    assert!(!resolves(&root(), "SPEC.md"));
}

/// Issue 40: every `RMQ_BACKUP_*` variable the code reads is in the environment variable
/// reference (docs/environment.md).
#[test]
fn every_environment_variable_is_documented() {
    let page = read(&root().join("docs/environment.md"));
    let mut missing = BTreeSet::new();
    let mut seen = 0;
    let mut dirs = vec![root().join("src")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).expect("src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") || p.ends_with("tests.rs") {
                continue;
            }
            let text = read(&p);
            let mut rest = text.as_str();
            while let Some(at) = rest.find("RMQ_BACKUP_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                if name.contains("_TEST_") || name.ends_with('_') {
                    continue;
                }
                seen += 1;
                if !page.contains(&format!("`{name}`")) {
                    missing.insert(format!("{name} ({})", relative(&p)));
                }
            }
        }
    }
    assert!(seen >= 5, "only {seen} variables found");
    assert!(
        missing.is_empty(),
        "not in docs/environment.md: {missing:?}"
    );
}
