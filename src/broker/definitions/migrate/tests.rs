use super::*;
use serde_json::json;

/// A 3.10 export: a mirroring policy over `ha.` queues with a TTL, one that only mirrors, one
/// that only locates, an unrelated one, an operator policy, and queues of each kind.
fn export() -> Value {
    json!({
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "vhosts": [{"name": "v"}, {"name": "w"}],
        "policies": [
            {"vhost": "v", "name": "ha-ttl", "pattern": "^ha\\.", "apply-to": "all", "priority": 1,
             "definition": {"ha-mode": "all", "ha-sync-mode": "automatic", "message-ttl": 86400000}},
            {"vhost": "v", "name": "ha-only", "pattern": "^only\\.", "apply-to": "queues", "priority": 2,
             "definition": {"ha-mode": "exactly", "ha-params": 2, "ha-sync-batch-size": 10,
                            "ha-promote-on-shutdown": "always", "ha-promote-on-failure": "always"}},
            {"vhost": "v", "name": "locate", "pattern": "^loc", "apply-to": "queues", "priority": 0,
             "definition": {"queue-master-locator": "min-masters", "max-length": 10}},
            {"vhost": "v", "name": "catch-all", "pattern": ".*", "apply-to": "queues", "priority": 0,
             "definition": {"max-length": 1000}},
            {"vhost": "w", "name": "ha-w", "pattern": "^", "apply-to": "all", "priority": 0,
             "definition": {"ha-mode": "all"}}
        ],
        "parameters": [
            {"vhost": "v", "component": "operator_policy", "name": "op",
             "value": {"pattern": "^", "apply-to": "queues", "priority": 0,
                       "definition": {"message-ttl": 5000, "queue-master-locator": "random"}}},
            {"vhost": "v", "component": "operator_policy", "name": "op-locate",
             "value": {"pattern": "^", "apply-to": "queues", "priority": 0,
                       "definition": {"queue-master-locator": "random"}}},
            {"vhost": "v", "component": "federation-upstream", "name": "up",
             "value": {"uri": "amqp://x", "ha-mode": "not a policy"}}
        ],
        "queues": [
            {"vhost": "v", "name": "ha.orders", "durable": true, "auto_delete": false,
             "arguments": {"x-max-priority": 5, "x-queue-mode": "lazy", "x-message-ttl": 1000,
                           "x-queue-version": 2, "x-overflow": "reject-publish-dlx"}},
            {"vhost": "v", "name": "ha.temp", "durable": true, "auto_delete": true, "arguments": {}},
            {"vhost": "v", "name": "ha.transient", "durable": false, "auto_delete": false, "arguments": {}},
            {"vhost": "v", "name": "ha.quorum", "durable": true, "auto_delete": false,
             "arguments": {"x-queue-type": "quorum"}},
            {"vhost": "v", "name": "only.one", "durable": true, "auto_delete": false},
            {"vhost": "v", "name": "located", "durable": true, "auto_delete": false,
             "arguments": {"x-queue-master-locator": "min-masters", "x-queue-version": 1}},
            {"vhost": "v", "name": "plain", "durable": true, "auto_delete": false, "arguments": {}},
            {"vhost": "w", "name": "ha.orders", "durable": true, "auto_delete": false, "arguments": {}}
        ]
    })
}

fn texts(changes: &[Change]) -> Vec<String> {
    changes.iter().map(ToString::to_string).collect()
}

fn queue<'a>(doc: &'a Value, vhost: &str, name: &str) -> &'a Value {
    doc["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["vhost"] == vhost && q["name"] == name)
        .unwrap()
}

fn policy_names(doc: &Value) -> Vec<&str> {
    doc["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect()
}

#[test]
fn only_4x_needs_it() {
    let v = |s| BrokerVersion::parse(s).unwrap();
    assert!(!needed(v("3.10.8")));
    assert!(!needed(v("3.13.7")));
    assert!(needed(v("4.0.5")));
    assert!(needed(v("4.3.6")));
}

#[test]
fn removed_keys_are_dropped_and_empty_policies_skipped() {
    let mut doc = export();
    let changes = for_4x(&mut doc, None);
    let t = texts(&changes);
    let expect = [
        "policy ha-ttl in vhost v: key ha-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-ttl in vhost v: key ha-sync-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: key ha-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: key ha-params dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: key ha-promote-on-failure dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: key ha-promote-on-shutdown dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: key ha-sync-batch-size dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-only in vhost v: not imported: no key is left once the keys RabbitMQ 4.x refuses are dropped",
        "policy locate in vhost v: key queue-master-locator dropped: deprecated since RabbitMQ 4.0 and refused by default since 4.3 (queue-leader-locator replaces it)",
        "policy ha-w in vhost w: key ha-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "policy ha-w in vhost w: not imported: no key is left once the keys RabbitMQ 4.x refuses are dropped",
        "operator policy op in vhost v: key queue-master-locator dropped: deprecated since RabbitMQ 4.0 and refused by default since 4.3 (queue-leader-locator replaces it)",
        "operator policy op-locate in vhost v: key queue-master-locator dropped: deprecated since RabbitMQ 4.0 and refused by default since 4.3 (queue-leader-locator replaces it)",
        "operator policy op-locate in vhost v: not imported: no key is left once the keys RabbitMQ 4.x refuses are dropped",
    ];
    assert_eq!(&t[..expect.len()], &expect[..], "{t:#?}");
    assert_eq!(policy_names(&doc), ["ha-ttl", "locate", "catch-all"]);
    assert_eq!(
        doc["policies"][0]["definition"],
        json!({"message-ttl": 86400000})
    );
    assert_eq!(doc["policies"][0]["pattern"], "^ha\\.");
    assert_eq!(doc["policies"][1]["definition"], json!({"max-length": 10}));
    let params = doc["parameters"].as_array().unwrap();
    assert_eq!(params.len(), 2, "op-locate skipped, the upstream kept");
    assert_eq!(
        params[0]["value"]["definition"],
        json!({"message-ttl": 5000})
    );
    assert_eq!(
        params[1]["value"]["ha-mode"], "not a policy",
        "other parameters are left alone"
    );
    // Every removed key is in the list.
    for k in MIRRORING_KEYS {
        assert!(REMOVED_POLICY_KEYS.contains(&k));
    }
}

#[test]
fn queues_lose_the_arguments_4x_refuses_and_nothing_else() {
    let mut doc = export();
    let changes = for_4x(&mut doc, None);
    assert_eq!(queue(&doc, "v", "located")["arguments"], json!({}));
    assert_eq!(
        queue(&doc, "v", "ha.orders")["arguments"],
        export()["queues"][0]["arguments"],
        "without convert_mirrored_queues a classic queue keeps x-max-priority, x-queue-mode, x-queue-version 2"
    );
    let t = texts(&changes);
    assert!(t.contains(&"queue located in vhost v: argument x-queue-master-locator = \"min-masters\" dropped: deprecated since RabbitMQ 4.0, and 4.3 leaves out a queue declared with it (x-queue-leader-locator replaces it)".to_string()), "{t:#?}");
    assert!(t.contains(&"queue located in vhost v: argument x-queue-version = 1 dropped: RabbitMQ 4.0 removed classic queue storage version 1 and 4.3 refuses it".to_string()), "{t:#?}");
    assert!(!t.iter().any(|c| c.contains("quorum")), "{t:#?}");
}

#[test]
fn an_export_without_anything_4x_refuses_is_left_alone() {
    let mut doc = json!({
        "rabbitmq_version": "3.10.8",
        "policies": [{"vhost": "v", "name": "ttl", "pattern": "^", "definition": {"message-ttl": 1}}],
        "parameters": [{"vhost": "v", "component": "operator_policy", "name": "op",
                        "value": {"pattern": "^", "definition": {"max-length": 1}}}],
        "queues": [{"vhost": "v", "name": "q", "durable": true, "arguments": {"x-queue-version": 2}}]
    });
    let before = doc.clone();
    assert!(for_4x(&mut doc, None).is_empty());
    assert_eq!(doc, before);
    let mut empty = json!({});
    assert!(for_4x(&mut empty, None).is_empty());
    assert_eq!(empty, json!({}));
}

#[test]
fn mirrored_queues_follow_pattern_priority_apply_to_and_type() {
    let (mirrored, unreadable) = mirrored_queues(&export());
    let names: Vec<(&str, &str, &str)> = mirrored
        .iter()
        .map(|((v, q), p)| (v.as_str(), q.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("v", "ha.orders", "ha-ttl"),
            ("v", "ha.temp", "ha-ttl"),
            ("v", "ha.transient", "ha-ttl"),
            ("v", "only.one", "ha-only"),
            ("w", "ha.orders", "ha-w"),
        ],
        "ha.quorum is a quorum queue; located and plain are matched by non-mirroring policies"
    );
    assert!(unreadable.is_empty());

    // A higher-priority policy without ha- keys takes the queue away from the mirroring one.
    let mut doc = export();
    doc["policies"].as_array_mut().unwrap().push(json!(
        {"vhost": "v", "name": "orders-ttl", "pattern": "orders$", "priority": 5, "definition": {"message-ttl": 1}}
    ));
    let (mirrored, _) = mirrored_queues(&doc);
    assert!(!mirrored.contains_key(&("v".into(), "ha.orders".into())));
    assert!(mirrored.contains_key(&("w".into(), "ha.orders".into())));
    // A mirroring policy with exchanges-only apply-to mirrors nothing; classic_queues does.
    for (apply, expect) in [("exchanges", false), ("classic_queues", true)] {
        let doc = json!({"policies": [{"vhost": "v", "name": "p", "pattern": "^", "apply-to": apply,
                                        "definition": {"ha-mode": "all"}}],
                         "queues": [{"vhost": "v", "name": "q", "durable": true}]});
        assert_eq!(
            mirrored_queues(&doc).0.len(),
            usize::from(expect),
            "{apply}"
        );
    }
    // A 3.10 mirroring policy with a quorum-only key did not apply to classic queues.
    let doc = json!({"rabbitmq_version": "3.10.8",
        "policies": [{"vhost": "v", "name": "p", "pattern": "^", "definition": {"ha-mode": "all", "delivery-limit": 3}}],
        "queues": [{"vhost": "v", "name": "q", "durable": true}]});
    assert!(mirrored_queues(&doc).0.is_empty());
}

#[test]
fn an_unreadable_mirroring_pattern_is_reported() {
    let doc = json!({"policies": [
        {"vhost": "v", "name": "not-tmp", "pattern": "^(?!tmp\\.)", "definition": {"ha-mode": "all"}},
        {"vhost": "v", "name": "ttl", "pattern": "(a)\\1", "definition": {"message-ttl": 1}}],
        "queues": [{"vhost": "v", "name": "q", "durable": true}]});
    let (mirrored, unreadable) = mirrored_queues(&doc);
    assert!(mirrored.is_empty());
    assert_eq!(
        unreadable.len(),
        1,
        "only mirroring policies matter: {unreadable:?}"
    );
    let t = unreadable[0].to_string();
    assert!(
        t.starts_with(
            "policy not-tmp in vhost v: its pattern \"^(?!tmp\\\\.)\" cannot be evaluated here ("
        ) && t.ends_with("): the queues it mirrored are not converted"),
        "{t}"
    );
}

#[test]
fn mirrored_classic_queues_become_quorum_queues() {
    let mut doc = export();
    let (mirrored, _) = mirrored_queues(&doc);
    let changes = for_4x(&mut doc, Some(&mirrored));
    let t = texts(&changes);
    let orders = queue(&doc, "v", "ha.orders");
    assert_eq!(
        orders["arguments"],
        json!({"x-message-ttl": 1000, "x-queue-type": "quorum"}),
        "x-max-priority, x-queue-mode, x-queue-version and reject-publish-dlx dropped"
    );
    assert_eq!(orders["durable"], true);
    assert_eq!(
        queue(&doc, "v", "only.one")["arguments"],
        json!({"x-queue-type": "quorum"}),
        "arguments created"
    );
    assert_eq!(
        queue(&doc, "w", "ha.orders")["arguments"],
        json!({"x-queue-type": "quorum"})
    );
    assert_eq!(
        queue(&doc, "v", "ha.temp")["arguments"],
        json!({}),
        "auto-delete stays classic"
    );
    assert_eq!(
        queue(&doc, "v", "ha.transient")["arguments"],
        json!({}),
        "non-durable stays classic"
    );
    assert_eq!(queue(&doc, "v", "plain")["arguments"], json!({}));
    for expected in [
        "queue ha.orders in vhost v: declared as a quorum queue (restore.convert_mirrored_queues), policy ha-ttl mirrored it; a quorum queue delivers messages of a higher priority property first",
        "queue ha.orders in vhost v: argument x-max-priority = 5 dropped: a quorum queue refuses it",
        "queue ha.orders in vhost v: argument x-queue-mode = \"lazy\" dropped: a quorum queue refuses it",
        "queue ha.orders in vhost v: argument x-queue-version = 2 dropped: a quorum queue refuses it",
        "queue ha.orders in vhost v: argument x-overflow = \"reject-publish-dlx\" dropped: quorum queues do not support reject-publish-dlx (the broker would use drop-head)",
        "queue ha.temp in vhost v: policy ha-ttl mirrored it, but it stays a classic queue: a quorum queue cannot be auto-delete",
        "queue ha.transient in vhost v: policy ha-ttl mirrored it, but it stays a classic queue: a quorum queue is always durable, and this one is not (4.x leaves out a non-durable quorum queue)",
        "queue only.one in vhost v: declared as a quorum queue (restore.convert_mirrored_queues), policy ha-only mirrored it; a quorum queue delivers messages of a higher priority property first",
    ] {
        assert!(t.contains(&expected.to_string()), "{expected}\nnot in {t:#?}");
    }
    assert_eq!(
        t.iter()
            .filter(|c| c.contains("declared as a quorum queue"))
            .count(),
        3
    );
}

#[test]
fn a_queue_that_loses_its_policy_is_named() {
    let mut doc = export();
    let (mirrored, _) = mirrored_queues(&doc);
    let t = texts(&for_4x(&mut doc, Some(&mirrored)));
    let changed: Vec<&String> = t
        .iter()
        .filter(|c| c.contains("applied to it in the backup"))
        .collect();
    assert_eq!(
        changed,
        [
            // ha-only was skipped: the catch-all (priority 0) reaches only.one now.
            "queue only.one in vhost v: policy ha-only applied to it in the backup, policy catch-all applies on the target instead: ha-only was not imported",
            "queue ha.orders in vhost w: policy ha-w applied to it in the backup, no policy applies on the target: ha-w was not imported",
        ],
        "ha.orders in v keeps ha-ttl (as a quorum queue too); ha.temp and ha.transient too"
    );

    // A converted queue whose policy applies to classic queues only, or holds queue-mode.
    for (apply, definition, why) in [
        ("classic_queues", json!({"ha-mode": "all", "message-ttl": 1}), "p applies to classic queues only"),
        ("all", json!({"ha-mode": "all", "queue-mode": "lazy", "message-ttl": 1}),
         "p holds queue-mode, which keeps the whole policy off a quorum queue (queue-mode has no effect on RabbitMQ 4.x: without it the rest of p applies)"),
    ] {
        let mut doc = json!({"rabbitmq_version": "3.13.7",
            "policies": [{"vhost": "v", "name": "p", "pattern": "^", "apply-to": apply, "priority": 0, "definition": definition}],
            "queues": [{"vhost": "v", "name": "q", "durable": true, "arguments": {}}]});
        let (mirrored, _) = mirrored_queues(&doc);
        let changes = for_4x(&mut doc, Some(&mirrored));
        assert_eq!(
            changes.last().map(ToString::to_string),
            Some(format!("queue q in vhost v: policy p applied to it in the backup, no policy applies on the target: {why}")),
            "{apply}"
        );
        // Not converted, it keeps the policy: nothing to say.
        let mut doc = json!({"rabbitmq_version": "3.13.7",
            "policies": [{"vhost": "v", "name": "p", "pattern": "^", "apply-to": apply, "priority": 0, "definition": definition}],
            "queues": [{"vhost": "v", "name": "q", "durable": true, "arguments": {}}]});
        assert!(!texts(&for_4x(&mut doc, None)).iter().any(|c| c.contains("applied to it")));
    }
}

#[test]
fn argument_drops_are_exact() {
    let mut args =
        json!({"x-queue-version": 2, "x-max-priority": 10, "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx", "x-custom": true, "x-queue-master-locator": "random"})
        .as_object()
        .unwrap()
        .clone();
    let mut classic = args.clone();
    assert_eq!(
        drop_arguments(&mut classic, false),
        [(
            "x-queue-master-locator".to_string(),
            "\"random\"".to_string(),
            false
        )]
    );
    let dropped = drop_arguments(&mut args, true);
    let names: Vec<&str> = dropped.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "x-max-priority",
            "x-queue-master-locator",
            "x-queue-version"
        ]
    );
    assert_eq!(
        Value::Object(args),
        json!({"x-overflow": "reject-publish", "x-dead-letter-exchange": "dlx", "x-custom": true})
    );
}

/// `prepare` decides the mirrored queues on the whole export, so a selection of one queue
/// (which keeps no policy) still converts it; the mappings apply after the migration; a 3.x
/// target or an unknown version changes nothing.
#[test]
fn prepare_migrates_between_selection_and_renaming() {
    use crate::config::{ConvertMirroredQueues, DefinitionsSelection, RestoreOptions};
    let mut opts = RestoreOptions {
        convert_mirrored_queues: Some(ConvertMirroredQueues::Quorum),
        definitions_selection: DefinitionsSelection {
            queues: vec!["only.one".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    opts.vhost_mapping.insert("v".into(), "v2".into());
    opts.queue_mapping
        .insert("only.one".into(), "renamed".into());
    let v43 = BrokerVersion::parse("4.3.6");
    let (doc, changes) = crate::broker::definitions::prepare(export(), &opts, v43, &[]).unwrap();
    assert_eq!(
        doc["queues"],
        json!([{"vhost": "v2", "name": "renamed", "durable": true, "auto_delete": false,
                "arguments": {"x-queue-type": "quorum"}}])
    );
    assert_eq!(
        texts(&changes),
        ["queue only.one in vhost v: declared as a quorum queue (restore.convert_mirrored_queues), policy ha-only mirrored it; a quorum queue delivers messages of a higher priority property first"]
    );
    for target in [BrokerVersion::parse("3.10.8"), None] {
        let (doc, changes) =
            crate::broker::definitions::prepare(export(), &opts, target, &[]).unwrap();
        assert!(changes.is_empty(), "{target:?}");
        assert_eq!(doc["queues"][0]["arguments"], json!(null), "{target:?}");
    }
    // Without the option the queue stays classic; the policies are still migrated.
    let plain = RestoreOptions::default();
    let (doc, changes) = crate::broker::definitions::prepare(export(), &plain, v43, &[]).unwrap();
    assert_eq!(queue(&doc, "v", "only.one").get("arguments"), None);
    assert_eq!(policy_names(&doc), ["ha-ttl", "locate", "catch-all"]);
    assert!(!texts(&changes).iter().any(|c| c.contains("quorum")));
}
