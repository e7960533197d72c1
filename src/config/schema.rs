//! The JSON Schema of the configuration file (`rmq-backup config schema`), derived from the
//! configuration's types with `schemars`: their doc comments become descriptions, serde's
//! attributes (`rename_all`, `default`, `deny_unknown_fields`) decide names, what is required
//! and what is refused. Editors that speak the YAML language server protocol complete and check
//! a file that starts with `# yaml-language-server: $schema=<file or URL of the schema>`.
//!
//! Hand-written here: the shapes serde reads through code of its own (`storage`, one mapping per
//! backend chosen by `backend`; [`super::Urls`], one URL or a list; retention counts and
//! durations). `${ENV}` references are allowed where the loader replaces them
//! ([`super::Config::interpolate_env`]): in strings only, so a number or a boolean must be
//! written as one.

use super::storage::{AzureStorage, FilesystemStorage, GcsStorage, S3Storage};
use super::{Config, StorageConfig, Urls};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The schema of the whole file, draft 2020-12, as pretty JSON text.
pub fn text() -> String {
    let mut schema = schemars::schema_for!(Config);
    schema.insert(
        "title".into(),
        Value::String("rmq-backup configuration".into()),
    );
    serde_json::to_string_pretty(&schema).unwrap_or_default()
}

/// A schema from a JSON value (the values below are objects: the conversion cannot fail).
fn schema(v: Value) -> Schema {
    Schema::try_from(v).unwrap_or_default()
}

/// A retention count (`crate::retention::policy::Count`): a whole number up to `u32::MAX`,
/// `-1` or `unlimited`, or a string of one (ASCII whitespace around it, a `+` and leading
/// zeros allowed, as Rust reads a `u32`): the language of its parser (issue 38, item 6:
/// `tests/config_schema_edges.rs`).
pub(super) fn count(_: &mut SchemaGenerator) -> Schema {
    let ws = "[\\t\\n\\f\\r ]*";
    let number = up_to(u64::from(u32::MAX));
    schema(json!({
        "description": "A whole number of backups or buckets, or `unlimited` (also `-1`).",
        "anyOf": [
            {"type": "integer", "minimum": -1, "maximum": u32::MAX},
            {"type": "string", "pattern": format!("^{ws}(unlimited|-1|\\+?0*({number})){ws}$")},
            {"type": "null"}
        ]
    }))
}

/// A regular expression of the decimal numbers from 0 to `max` without leading zeros: the
/// shorter numbers, then for each digit of `max` its prefix, a smaller digit and any digits.
fn up_to(max: u64) -> String {
    let d: Vec<u8> = max.to_string().bytes().map(|b| b - b'0').collect();
    let mut alts = Vec::new();
    if d.len() > 1 {
        alts.push(format!("[0-9]{{1,{}}}", d.len() - 1));
    }
    for i in 0..d.len() {
        if d[i] > 0 {
            let prefix: String = d[..i].iter().map(|x| x.to_string()).collect();
            let rest = d.len() - i - 1;
            let tail = if rest > 0 {
                format!("[0-9]{{{rest}}}")
            } else {
                String::new()
            };
            alts.push(format!("{prefix}[0-{}]{tail}", d[i] - 1));
        }
    }
    alts.push(max.to_string());
    alts.join("|")
}

/// The pattern of numbers each followed by one of `units` (ASCII letters), each unit at most
/// once, in any order, with ASCII whitespace (space, tab, line feed, form feed, carriage
/// return: what the parsers trim) around them, and with `nonzero` at least one digit that is
/// not 0. The language of `crate::retention::policy::Within::parse_unchecked` (units `ymdh`)
/// and of `super::object_lock::RetainFor`'s parser (units `ywdhs`, `nonzero`) but for their
/// numbers' size, which no pattern states (issue 38, item 6: `0d` and `1d1d` were accepted
/// here and refused by the parser, ` 30d` the other way round; `tests/config_schema_edges.rs`
/// compares the two on generated values). An ECMA-262 regular expression: the lookaheads
/// come after the leading whitespace, where `.` would stop at a line feed.
pub fn units_pattern(units: &str, nonzero: bool) -> String {
    let core = format!("[0-9{units}]*");
    let once: String = units
        .chars()
        .map(|u| format!("(?!{core}{u}{core}{u})"))
        .collect();
    let nonzero = if nonzero {
        format!("(?={core}[1-9])")
    } else {
        String::new()
    };
    format!("^[\\t\\n\\f\\r ]*{once}{nonzero}([0-9]+[{units}])+[\\t\\n\\f\\r ]*$")
}

/// A restic duration (`crate::retention::policy::Within`): years, months, days and hours, each
/// at most once (`1y5m7d2h`, `30d`, `36h`), at most 10,000 years.
pub(super) fn duration(_: &mut SchemaGenerator) -> Schema {
    schema(json!({
        "description": "A duration in years, months, days and hours, each unit at most once, in any order: `30d`, `1y6m`, `36h`; at most 10,000 years (a longer one is refused when the file is loaded).",
        "anyOf": [
            {"type": "string", "pattern": units_pattern("ymdh", false)},
            {"type": "null"}
        ]
    }))
}

impl JsonSchema for Urls {
    fn schema_name() -> Cow<'static, str> {
        "Urls".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(json!({
            "description": "One URL, or a list of a cluster's URLs (tried in order).",
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1}
            ]
        }))
    }
}

impl JsonSchema for StorageConfig {
    fn schema_name() -> Cow<'static, str> {
        "StorageConfig".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let backend = |name: &str, fields: Schema, required: &[&str]| -> Value {
            let mut v: Value = fields.into();
            let obj = v.as_object_mut().map(std::mem::take).unwrap_or_default();
            let mut properties = obj
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            properties.insert("backend".into(), json!({"const": name}));
            let mut out = Map::new();
            if let Some(d) = obj.get("description") {
                out.insert("description".into(), d.clone());
            }
            out.insert("type".into(), json!("object"));
            out.insert("properties".into(), Value::Object(properties));
            let mut req = vec![json!("backend")];
            req.extend(required.iter().map(|r| json!(r)));
            out.insert("required".into(), Value::Array(req));
            out.insert("additionalProperties".into(), json!(false));
            Value::Object(out)
        };
        schema(json!({
            "description": "Where backups are stored: one mapping, the backend chosen by `backend`.",
            "oneOf": [
                backend("filesystem", FilesystemStorage::json_schema(generator), &["path"]),
                backend("s3", S3Storage::json_schema(generator), &["bucket"]),
                backend("azure", AzureStorage::json_schema(generator), &["account_name", "container_name"]),
                backend("gcs", GcsStorage::json_schema(generator), &["bucket"]),
                {"type": "object", "description": "In-memory storage for tests, not persisted.",
                 "properties": {"backend": {"const": "memory"}},
                 "required": ["backend"], "additionalProperties": false}
            ]
        }))
    }
}
