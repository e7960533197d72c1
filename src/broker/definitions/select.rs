//! Which definitions a restore imports and under which names: `definitions_selection`
//! (SPEC.md "definitions_selection fields") and the `vhost_mapping`, `queue_mapping` and
//! `exchange_mapping` renames (SPEC.md "restore").

use crate::config::{DefinitionsSelection, RestoreOptions};
use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn str_field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn array_mut<'a>(doc: &'a mut Value, k: &str) -> Option<&'a mut Vec<Value>> {
    doc.get_mut(k).and_then(Value::as_array_mut)
}

/// Applies `definitions_selection` (SPEC.md "definitions_selection fields"). An empty selection
/// keeps everything.
pub fn select(mut doc: Value, sel: &DefinitionsSelection) -> Result<Value> {
    if sel.vhosts.is_empty() && sel.queues.is_empty() && sel.exchanges.is_empty() {
        return Ok(doc);
    }
    let names = |doc: &Value, k: &str, field: &str| -> BTreeSet<String> {
        doc.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| str_field(v, field).to_string()).collect())
            .unwrap_or_default()
    };
    let have_vhosts = names(&doc, "vhosts", "name");
    let have_queues = names(&doc, "queues", "name");
    let have_exchanges = names(&doc, "exchanges", "name");
    for (kind, wanted, have) in [
        ("vhost", &sel.vhosts, &have_vhosts),
        ("queue", &sel.queues, &have_queues),
        ("exchange", &sel.exchanges, &have_exchanges),
    ] {
        if let Some(missing) = wanted.iter().find(|w| !have.contains(*w)) {
            return Err(Error::Config(format!(
                "restore.definitions_selection names {kind} {missing}, which is not in the backup definitions; nothing was imported"
            )));
        }
    }
    let in_vhost =
        |v: &Value| sel.vhosts.is_empty() || sel.vhosts.iter().any(|h| h == str_field(v, "vhost"));
    let entity_mode = !sel.queues.is_empty() || !sel.exchanges.is_empty();

    let queues: BTreeSet<&str> = sel.queues.iter().map(String::as_str).collect();
    let mut exchanges: BTreeSet<String> = sel.exchanges.iter().cloned().collect();
    let bindings = doc
        .get("bindings")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut kept_bindings = Vec::new();
    for b in bindings {
        if !in_vhost(&b) {
            continue;
        }
        let to_queue = str_field(&b, "destination_type") == "queue";
        let dest = str_field(&b, "destination");
        let source = str_field(&b, "source");
        let keep = if !entity_mode {
            true
        } else if to_queue && queues.contains(dest) {
            // Bindings routing to a selected queue are kept with their source exchange.
            exchanges.insert(source.to_string());
            true
        } else {
            sel.exchanges.iter().any(|e| e == source)
                && (if to_queue {
                    queues.contains(dest)
                } else {
                    sel.exchanges.iter().any(|e| e == dest)
                })
        };
        if keep {
            kept_bindings.push(b);
        }
    }
    if let Some(b) = array_mut(&mut doc, "bindings") {
        *b = kept_bindings;
    }
    if let Some(q) = array_mut(&mut doc, "queues") {
        q.retain(|q| in_vhost(q) && (!entity_mode || queues.contains(str_field(q, "name"))));
    }
    if let Some(x) = array_mut(&mut doc, "exchanges") {
        x.retain(|x| in_vhost(x) && (!entity_mode || exchanges.contains(str_field(x, "name"))));
    }
    // Vhosts: the selected ones, or (queues/exchanges only) those holding what is kept.
    let vhost_names: BTreeSet<String> = if entity_mode {
        ["queues", "exchanges", "bindings"]
            .iter()
            .filter_map(|k| doc.get(*k).and_then(Value::as_array))
            .flatten()
            .map(|v| str_field(v, "vhost").to_string())
            .collect()
    } else {
        sel.vhosts.iter().cloned().collect()
    };
    if let Some(v) = array_mut(&mut doc, "vhosts") {
        v.retain(|v| vhost_names.contains(str_field(v, "name")));
    }
    for k in ["permissions", "topic_permissions", "policies", "parameters"] {
        if let Some(a) = array_mut(&mut doc, k) {
            a.retain(|v| !entity_mode && in_vhost(v));
        }
    }
    // Users: only those the kept permissions name (vhost selection), so that the import can
    // grant them; global parameters belong to the whole cluster and are left out.
    let users: BTreeSet<String> = doc
        .get("permissions")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|p| str_field(p, "user").to_string()).collect())
        .unwrap_or_default();
    if let Some(a) = array_mut(&mut doc, "users") {
        a.retain(|u| users.contains(str_field(u, "name")));
    }
    if let Some(a) = array_mut(&mut doc, "global_parameters") {
        a.clear();
    }
    Ok(doc)
}

/// Applies `vhost_mapping`, `queue_mapping` and `exchange_mapping` to the definitions.
pub fn rename(mut doc: Value, opts: &RestoreOptions) -> Value {
    fn map_field(v: &mut Value, field: &str, mapping: &BTreeMap<String, String>) {
        if let Some(Value::String(s)) = v.get_mut(field) {
            if let Some(to) = mapping.get(s.as_str()) {
                *s = to.clone();
            }
        }
    }
    if let Some(a) = array_mut(&mut doc, "vhosts") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.vhost_mapping));
    }
    for k in [
        "queues",
        "exchanges",
        "bindings",
        "permissions",
        "topic_permissions",
        "policies",
        "parameters",
    ] {
        if let Some(a) = array_mut(&mut doc, k) {
            a.iter_mut()
                .for_each(|v| map_field(v, "vhost", &opts.vhost_mapping));
        }
    }
    if let Some(a) = array_mut(&mut doc, "queues") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.queue_mapping));
    }
    if let Some(a) = array_mut(&mut doc, "exchanges") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.exchange_mapping));
    }
    if let Some(a) = array_mut(&mut doc, "bindings") {
        for b in a.iter_mut() {
            map_field(b, "source", &opts.exchange_mapping);
            let mapping = if str_field(b, "destination_type") == "queue" {
                &opts.queue_mapping
            } else {
                &opts.exchange_mapping
            };
            map_field(b, "destination", mapping);
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "rabbit_version": "3.10.8",
            "rabbitmq_version": "3.10.8",
            "users": [{"name": "guest"}],
            "vhosts": [{"name": "a"}, {"name": "b"}],
            "permissions": [{"user": "guest", "vhost": "a"}, {"user": "guest", "vhost": "b"}],
            "policies": [{"name": "p", "vhost": "b"}],
            "parameters": [],
            "global_parameters": [{"name": "cluster_name"}],
            "queues": [
                {"name": "q1", "vhost": "a"}, {"name": "q2", "vhost": "a"}, {"name": "q3", "vhost": "b"}
            ],
            "exchanges": [
                {"name": "x1", "vhost": "a"}, {"name": "x2", "vhost": "a"}, {"name": "x3", "vhost": "b"}
            ],
            "bindings": [
                {"source": "x1", "vhost": "a", "destination": "q1", "destination_type": "queue", "routing_key": "k"},
                {"source": "x2", "vhost": "a", "destination": "q2", "destination_type": "queue", "routing_key": "k"},
                {"source": "x1", "vhost": "a", "destination": "x2", "destination_type": "exchange", "routing_key": "k"},
                {"source": "x3", "vhost": "b", "destination": "q3", "destination_type": "queue", "routing_key": "k"}
            ]
        })
    }

    fn names(doc: &Value, k: &str) -> Vec<String> {
        doc[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| str_field(v, "name").to_string())
            .collect()
    }

    #[test]
    fn empty_selection_keeps_everything() {
        let doc = select(sample(), &DefinitionsSelection::default()).unwrap();
        assert_eq!(doc, sample());
    }

    #[test]
    fn vhost_selection_keeps_that_vhost_only() {
        let sel = DefinitionsSelection {
            vhosts: vec!["b".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "vhosts"), vec!["b"]);
        assert_eq!(names(&doc, "queues"), vec!["q3"]);
        assert_eq!(names(&doc, "exchanges"), vec!["x3"]);
        assert_eq!(doc["bindings"].as_array().unwrap().len(), 1);
        assert_eq!(doc["policies"].as_array().unwrap().len(), 1);
        assert_eq!(doc["permissions"].as_array().unwrap().len(), 1);
        assert_eq!(
            names(&doc, "users"),
            vec!["guest"],
            "the user the permissions name"
        );
        assert!(doc["global_parameters"].as_array().unwrap().is_empty());
    }

    #[test]
    fn queue_selection_keeps_source_exchanges_and_bindings() {
        let sel = DefinitionsSelection {
            queues: vec!["q1".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "queues"), vec!["q1"]);
        assert_eq!(names(&doc, "exchanges"), vec!["x1"]);
        assert_eq!(
            names(&doc, "vhosts"),
            vec!["a"],
            "only the vhost holding q1"
        );
        let b = doc["bindings"].as_array().unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(str_field(&b[0], "destination"), "q1");
        assert!(doc["policies"].as_array().unwrap().is_empty());
    }

    #[test]
    fn exchange_selection_keeps_bindings_between_selected() {
        let sel = DefinitionsSelection {
            exchanges: vec!["x1".into(), "x2".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "exchanges"), vec!["x1", "x2"]);
        assert!(names(&doc, "queues").is_empty());
        let b = doc["bindings"].as_array().unwrap();
        assert_eq!(b.len(), 1, "only x1 -> x2: the queues are not selected");
        assert_eq!(str_field(&b[0], "destination"), "x2");
    }

    #[test]
    fn missing_selection_fails_before_import() {
        let sel = DefinitionsSelection {
            queues: vec!["nope".into()],
            ..Default::default()
        };
        let err = select(sample(), &sel).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Configuration error: restore.definitions_selection names queue nope, which is not in the backup definitions; nothing was imported"
        );
    }

    #[test]
    fn renames_vhosts_queues_exchanges() {
        let mut opts = RestoreOptions::default();
        opts.vhost_mapping.insert("a".into(), "a2".into());
        opts.queue_mapping.insert("q1".into(), "q1-new".into());
        opts.exchange_mapping.insert("x2".into(), "x2-new".into());
        let doc = rename(sample(), &opts);
        assert_eq!(names(&doc, "vhosts"), vec!["a2", "b"]);
        assert_eq!(names(&doc, "queues"), vec!["q1-new", "q2", "q3"]);
        assert_eq!(str_field(&doc["queues"][0], "vhost"), "a2");
        assert_eq!(names(&doc, "exchanges"), vec!["x1", "x2-new", "x3"]);
        let b = &doc["bindings"];
        assert_eq!(str_field(&b[0], "destination"), "q1-new");
        assert_eq!(str_field(&b[1], "source"), "x2-new");
        assert_eq!(str_field(&b[2], "destination"), "x2-new");
        assert_eq!(str_field(&b[3], "vhost"), "b");
    }
}
