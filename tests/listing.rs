//! How a backup lists its queues (issue 41, item 2; src/backup/listing.rs), against the real
//! broker: the listing without statistics where it holds what the backup decides on, its
//! gaps filled (a user policy's definition, streams and quorum queues asked one by one), the
//! full listing where an operator policy could set what it cannot show; and a small queue of
//! large messages, whose bytes that listing does not give, read whole with its builder started
//! when the batches fill the channel.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::time::Duration;

/// PUTs `definition` for `pattern` as policy `name` of `vhost`: `kind` `policies` or
/// `operator-policies`.
fn set_policy(kind: &str, vhost: &str, name: &str, pattern: &str, definition: &str) {
    let url = format!(
        "{}/api/{kind}/{}/{name}",
        management_url(),
        rmq_backup::broker::management::encode_segment(vhost)
    );
    ureq::put(&url)
        .header("authorization", MANAGEMENT_AUTH)
        .header("content-type", "application/json")
        .send(format!(
            r#"{{"pattern":"{pattern}","definition":{definition},"apply-to":"queues"}}"#
        ))
        .expect("set policy");
    // Policies apply asynchronously.
    std::thread::sleep(Duration::from_millis(500));
}

/// The drop-head warning of `queue`, as `backup` logs it.
fn warned(stderr: &str, queue: &str) -> bool {
    stderr.lines().any(|l| {
        l.contains(&format!("queue {queue} in vhost "))
            && l.contains("has a length limit with overflow drop-head")
    })
}

#[test]
fn a_user_policy_is_read_from_the_policies_and_the_live_listing_is_used() {
    let vh = TestVhost::new("listing-policy");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in ["limited-a", "limited-b", "plain"] {
        declare(&ch, q, "classic", FieldTable::new());
    }
    declare(&ch, "events", "stream", FieldTable::new());
    declare(&ch, "votes", "quorum", FieldTable::new());
    set_policy(
        "policies",
        &vh.name,
        "lengths",
        "^limited-",
        r#"{"max-length":1000}"#,
    );
    let msgs = diverse_messages(5, 41, false);
    for q in ["limited-a", "plain", "votes"] {
        publish(&ch, q, &msgs);
    }
    let dir = TempDir::new("listing-policy");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("lp", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg, "-v", "-v"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        warned(&stderr, "limited-a") && warned(&stderr, "limited-b"),
        "{stderr}"
    );
    assert!(!warned(&stderr, "plain"), "{stderr}");
    assert!(
        stderr.contains("queue(s) listed without statistics"),
        "the live listing was not used: {stderr}"
    );
    for q in ["limited-a", "plain", "votes"] {
        let kind = if q == "votes" { "quorum" } else { "classic" };
        assert_same_as(
            &as_restored(&in_broker_order(&msgs, kind)),
            &backed_up(&store, "lp", q),
            Headers::of(kind),
            q,
        );
    }
    let m = manifest(&store, "lp");
    assert_eq!(m.queues.len(), 5, "{:?}", m.queues);
}

#[test]
fn an_operator_policy_with_a_length_limit_sends_the_backup_to_the_full_listing() {
    let vh = TestVhost::new("listing-operator");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "capped", "classic", FieldTable::new());
    declare(&ch, "open", "classic", FieldTable::new());
    set_policy(
        "operator-policies",
        &vh.name,
        "cap",
        "^capped$",
        r#"{"max-length":500}"#,
    );
    // The full listing shows a queue's effective policy once the broker has collected its
    // statistics (up to an interval after the declare), as it did before the live listing.
    let m = management();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !m
        .get_queue(&vh.name, "capped")
        .unwrap()
        .effective_policy_definition
        .contains_key("max-length")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "operator policy not shown"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let dir = TempDir::new("listing-operator");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("lo", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg, "-v", "-v"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("full listing: operator policy cap (vhost "),
        "{stderr}"
    );
    // Only the full listing shows that the operator policy applies to it.
    assert!(warned(&stderr, "capped"), "{stderr}");
    assert!(!warned(&stderr, "open"), "{stderr}");
}

#[test]
fn a_small_queue_of_large_messages_is_read_whole_and_built_beside_the_read() {
    let vh = TestVhost::new("listing-large");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "large", "classic", FieldTable::new());
    declare(&ch, "small", "classic", FieldTable::new());
    // Ten bodies of 1 MiB: more batches (1 MiB each) than the channel holds, so the read
    // starts the builder; the listing without statistics gives no bytes to decide on before.
    let mut rng = Rng::new(7);
    let large: Vec<Msg> = diverse_messages(10, 42, false)
        .into_iter()
        .map(|mut m| {
            m.body = rng.bytes(1 << 20);
            m
        })
        .collect();
    publish(&ch, "large", &large);
    let small = diverse_messages(3, 43, false);
    publish(&ch, "small", &small);
    let dir = TempDir::new("listing-large");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("ll", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_same(
        &as_restored(&large),
        &backed_up(&store, "ll", "large"),
        "large",
    );
    assert_same(
        &as_restored(&small),
        &backed_up(&store, "ll", "small"),
        "small",
    );
    // Every message back in its queue.
    assert_eq!(depth(&conn, "large"), 10);
    assert_eq!(depth(&conn, "small"), 3);
}
