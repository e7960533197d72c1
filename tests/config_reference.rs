//! The book's configuration reference (docs/config-reference.md) is made from the
//! configuration's JSON Schema (`rmq-backup config schema`, itself derived from the config types
//! and their doc comments), so it lists every key with its type and default and cannot drift:
//! this test renders the page and compares it with the committed one. After a change to the
//! configuration, `RMQ_BACKUP_BLESS=1 cargo test --test config_reference` rewrites the page.

use serde_json::{Map, Value};
use std::fmt::Write as _;

const PAGE: &str = "docs/config-reference.md";

/// One row of the reference: a key's dotted path, its type, default and description.
struct Row {
    path: String,
    /// ` (backend `s3`)` for a key of one storage backend.
    qualifier: String,
    kind: String,
    default: String,
    required: bool,
    description: String,
}

struct Walker<'a> {
    defs: &'a Map<String, Value>,
}

impl<'a> Walker<'a> {
    /// The schema a `$ref` names, or the schema itself.
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => self
                .defs
                .get(r.trim_start_matches("#/$defs/"))
                .unwrap_or(schema),
            None => schema,
        }
    }

    /// `anyOf: [X, null]` (an optional field) is X.
    fn unwrap_optional(&self, schema: &'a Value) -> &'a Value {
        if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
            let not_null: Vec<&Value> = any
                .iter()
                .filter(|s| s.get("type").and_then(Value::as_str) != Some("null"))
                .collect();
            if not_null.len() == 1 && schema.get("properties").is_none() {
                return self.resolve(not_null[0]);
            }
        }
        self.resolve(schema)
    }

    /// A short type: `string`, `integer`, `boolean`, `zstd \| lz4 \| none`, `mapping`, ...
    fn kind(&self, schema: &'a Value) -> String {
        let s = self.unwrap_optional(schema);
        if let Some(values) = s.get("enum").and_then(Value::as_array) {
            return values
                .iter()
                .map(|v| format!("`{}`", v.as_str().map_or(v.to_string(), str::to_string)))
                .collect::<Vec<_>>()
                .join(" \\| ");
        }
        if let Some(c) = s.get("const") {
            return format!("`{}`", c.as_str().map_or(c.to_string(), str::to_string));
        }
        if let Some(variants) = s.get("oneOf").and_then(Value::as_array) {
            let values: Vec<String> = variants
                .iter()
                .filter(|v| v.get("const").is_some() || v.get("enum").is_some())
                .map(|v| self.kind(v))
                .collect();
            if values.len() == variants.len() {
                return values.join(" \\| ");
            }
        }
        if s.get("properties").is_some() || s.get("oneOf").is_some() {
            return "mapping".into();
        }
        if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
            let kinds: Vec<String> = any
                .iter()
                .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
                .map(|v| self.kind(v))
                .collect();
            return kinds.join(" or ");
        }
        match s.get("type") {
            Some(Value::String(t)) => self.array_kind(s, t),
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .map(|t| self.array_kind(s, t))
                .collect::<Vec<_>>()
                .join(" or "),
            _ => match s.get("additionalProperties") {
                Some(v) if v.is_object() => format!("mapping of {}", self.kind(v)),
                _ => "any".into(),
            },
        }
    }

    fn array_kind(&self, s: &'a Value, t: &str) -> String {
        match (t, s.get("items"), s.get("additionalProperties")) {
            ("array", Some(items), _) => format!("list of {}", self.kind(items)),
            ("object", _, Some(v)) if v.is_object() => format!("mapping of {}", self.kind(v)),
            _ => t.to_string(),
        }
    }

    fn walk(&self, rows: &mut Vec<Row>, schema: &'a Value, prefix: &str, qualifier: &str) {
        let s = self.unwrap_optional(schema);
        if let Some(variants) = s.get("oneOf").and_then(Value::as_array) {
            for v in variants {
                let v = self.resolve(v);
                let tag = v
                    .pointer("/properties/backend/const")
                    .and_then(Value::as_str)
                    .map(|b| format!(" (backend `{b}`)"))
                    .unwrap_or_default();
                self.walk(rows, v, prefix, &tag);
            }
            return;
        }
        let Some(props) = s.get("properties").and_then(Value::as_object) else {
            return;
        };
        let required: Vec<&str> = s
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (key, prop) in props {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let target = self.unwrap_optional(prop);
            let description = prop
                .get("description")
                .or_else(|| target.get("description"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .split("\n\n")
                .next()
                .unwrap_or("")
                .replace('\n', " ")
                .replace('|', "\\|");
            let default = match prop.get("default") {
                None | Some(Value::Null) => String::new(),
                Some(v) => format!("`{v}`"),
            };
            rows.push(Row {
                path: path.clone(),
                qualifier: qualifier.to_string(),
                kind: self.kind(prop),
                default,
                required: required.contains(&key.as_str()),
                description,
            });
            let nested = target.get("properties").is_some() || target.get("oneOf").is_some();
            if nested {
                self.walk(rows, prop, &path, "");
            }
        }
    }
}

fn render(schema: &Value) -> String {
    let empty = Map::new();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let walker = Walker { defs };
    let mut rows = Vec::new();
    walker.walk(&mut rows, schema, "", "");
    let mut page = String::from(
        "# Configuration reference\n\n\
         Every key of the configuration file, made from `rmq-backup config schema` (the JSON Schema \
         derived from the configuration's types and their documentation; `tests/config_reference.rs` \
         keeps this page equal to it). Units are in the names (`_ms` milliseconds, `_secs` seconds, \
         `_bytes` bytes) or in the description. A blank default means the key is optional and has \
         no fixed default: the description says what applies when it is unset (for a mapping, \
         its own keys have defaults). Durations are written as the description says: \
         `retention` (`keep_within`, `prune_grace`) takes restic's `y`, `m` (months), `d`, `h`; \
         `object_lock.retain_for` takes `y`, `w`, `d`, `h`, `s`. The [Configuration](configuration.md) \
         chapter explains the file as a whole and ends with two complete, commented examples.\n",
    );
    let mut section = String::new();
    for row in &rows {
        let top = row.path.split(['.', ' ']).next().unwrap_or("").to_string();
        if top != section {
            section = top;
            let _ = write!(
                page,
                "\n## `{section}`\n\n| Key | Type | Default | Description |\n|---|---|---|---|\n"
            );
        }
        let required = if row.required { " (required)" } else { "" };
        let _ = writeln!(
            page,
            "| `{}`{}{required} | {} | {} | {} |",
            row.path, row.qualifier, row.kind, row.default, row.description
        );
    }
    page
}

#[test]
fn the_reference_page_lists_every_key_of_the_schema() {
    let schema: Value =
        serde_json::from_str(&rmq_backup::config::schema::text()).expect("the schema is JSON");
    let page = render(&schema);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    if std::env::var_os("RMQ_BACKUP_BLESS").is_some() {
        std::fs::write(&path, &page).expect("write the reference page");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "{PAGE} differs from the configuration's schema: run \
         `RMQ_BACKUP_BLESS=1 cargo test --test config_reference` and commit the page"
    );
    // Spot checks that the walk reaches nested and per-backend keys.
    for key in [
        "`backup.compression`",
        "`source.queues.include`",
        "`storage.bucket` (backend `s3`)",
        "`restore.publish_mode`",
    ] {
        assert!(page.contains(key), "{key} missing from the reference");
    }
}

/// What the reference must not show: the page is for operators, not for readers of the code
/// (issue 40). Rust paths and intra-doc links, `None`/`Some`, Rust type names, and references
/// to documents outside the repository (`SPEC.md`, `DESIGN.md`) or to README sections that are
/// now chapters.
fn rust_leaks(page: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in page.lines().enumerate() {
        let mut hit = |what: &str| found.push(format!("line {}: {what}: {line}", i + 1));
        for needle in [
            "crate::",
            "::",
            "SPEC.md",
            "DESIGN.md",
            "ENVIRONMENT.md",
            "README \"",
        ] {
            if line.contains(needle) {
                hit(needle);
            }
        }
        for word in [
            "None", "Some(", "Option<", "usize", "u64", "i64", "u16", "Vec<",
        ] {
            let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric() && c != '_');
            for (at, _) in line.match_indices(word) {
                let before = line[..at].chars().next_back();
                let after = line[at + word.len()..].chars().next();
                if boundary(before) && (word.ends_with(['(', '<']) || boundary(after)) {
                    hit(word);
                }
            }
        }
        if line.contains("[`") && line.contains("`]") && !line.contains("`](") {
            hit("an intra-doc link");
        }
    }
    found
}

#[test]
fn the_reference_page_shows_no_rust() {
    let schema: Value =
        serde_json::from_str(&rmq_backup::config::schema::text()).expect("the schema is JSON");
    let leaks = rust_leaks(&render(&schema));
    assert!(
        leaks.is_empty(),
        "the reference leaks Rust:\n{}",
        leaks.join("\n")
    );
    // The check itself finds what it must.
    assert_eq!(rust_leaks("| a | `None` selects (`crate::x`) |").len(), 3);
    assert!(rust_leaks("| a | ([`SourceConfig::stream_port_for`]) |").len() >= 2);
    assert!(rust_leaks("| `b` | no value; a Nonesuch key |").is_empty());
}

/// The JSON Schema's descriptions (what an editor shows over a key) name no document outside
/// the repository and no Rust path either.
#[test]
fn the_schema_descriptions_show_no_rust_or_missing_documents() {
    let schema = rmq_backup::config::schema::text();
    let value: Value = serde_json::from_str(&schema).expect("the schema is JSON");
    let mut found = Vec::new();
    fn walk(v: &Value, found: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(d)) = m.get("description") {
                    for needle in [
                        "SPEC.md",
                        "DESIGN.md",
                        "crate::",
                        "not supported yet",
                        "`None`",
                    ] {
                        if d.contains(needle) {
                            found.push(format!("{needle}: {d}"));
                        }
                    }
                }
                m.values().for_each(|x| walk(x, found));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, found)),
            _ => {}
        }
    }
    walk(&value, &mut found);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
