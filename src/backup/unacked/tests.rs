use super::*;
use crate::broker::management::QueueHolders;

fn consumer(tag: &str, name: Option<&str>, ack_required: bool) -> ConsumerInfo {
    ConsumerInfo {
        consumer_tag: tag.into(),
        connection: format!("127.0.0.1:5{tag} -> 127.0.0.1:5672"),
        connection_name: name.map(str::to_string),
        prefetch_count: 500,
        ack_required,
    }
}

#[test]
fn consumers_are_told_apart_by_their_connection_name_or_their_tag() {
    let all = [
        consumer("1", Some("rmq-backup nightly v/q"), true),
        consumer("2", Some("rmq-backup other-id v/q"), true),
        consumer("3", Some("billing"), true),
        consumer("4", None, true),
        consumer("5", Some("metrics"), false),
        consumer("6", Some("rmq-backupish"), true),
        // A killed run's consumer whose connection the API does not list (any more, or yet).
        consumer("rmq-backup-2067-0", None, true),
        // A tag alone does not make a named connection a backup's.
        consumer("rmq-backup-9-0", Some("billing"), true),
    ];
    let h = holders(&all);
    let tags = |v: &[&ConsumerInfo]| v.iter().map(|c| c.consumer_tag.clone()).collect::<Vec<_>>();
    assert_eq!(
        tags(&h.backups),
        ["1", "2", "rmq-backup-2067-0"],
        "any backup run gives back"
    );
    assert_eq!(
        tags(&h.foreign),
        ["3", "4", "6", "rmq-backup-9-0"],
        "auto-ack consumers hold nothing"
    );
    assert_eq!(
        describe(&h.foreign[..2]),
        "billing (consumer tag 3), 127.0.0.1:54 -> 127.0.0.1:5672 (consumer tag 4)"
    );
    let mut bare = consumer("rmq-backup-1-0", None, true);
    bare.connection.clear();
    assert_eq!(
        describe(&[&bare]),
        "consumer tag rmq-backup-1-0",
        "never ( (...))"
    );
}

fn api(messages: u64, unacknowledged: u64, consumers: Vec<ConsumerInfo>) -> QueueHolders {
    QueueHolders {
        messages,
        ready: messages - unacknowledged,
        unacknowledged,
        statistics: true,
        consumers,
    }
}

fn no_stats() -> QueueHolders {
    QueueHolders::default()
}

fn live(ready: u64, consumers: u32) -> Live {
    Live { ready, consumers }
}

const NOW: Duration = Duration::ZERO;
const LATE: Duration = Duration::from_secs(3600);

fn is_wait(v: &Verdict) -> bool {
    matches!(v, Verdict::Wait(..))
}

#[test]
fn with_statistics_a_count_that_is_whole_starts_at_once() {
    // A reader closed a moment ago: the statistics still count its messages unacknowledged,
    // but the live ready count already has them all (issue 32, item 2: this waited 3.8 s).
    let v = judge_with_statistics(
        &api(100_000, 100_000, vec![]),
        live(100_000, 0),
        100_000,
        Floor(0),
        NOW,
        false,
    );
    assert_eq!(v, Verdict::Start);
    // Short of what was counted, held by no one: wait for the returns.
    let v = judge_with_statistics(
        &api(100_000, 40_000, vec![]),
        live(60_000, 0),
        100_000,
        Floor(0),
        NOW,
        false,
    );
    assert!(is_wait(&v), "{v:?}");
    // The queue shrank and the API says so: nothing is held.
    let v = judge_with_statistics(
        &api(60_000, 0, vec![]),
        live(60_000, 0),
        100_000,
        Floor(0),
        NOW,
        false,
    );
    assert_eq!(v, Verdict::Start);
    // Never back: left out, with the count.
    let v = judge_with_statistics(
        &api(100_000, 40_000, vec![]),
        live(60_000, 0),
        100_000,
        Floor(0),
        LATE,
        false,
    );
    assert!(matches!(v, Verdict::LeftOut(40_000, _)), "{v:?}");
}

#[test]
fn a_retry_never_starts_below_what_the_failed_attempt_saw() {
    // Item 31.1: a node lost; the survivor answers 0 ready, 0 consumers, no statistics.
    let v = judge_with_statistics(&no_stats(), live(0, 0), 30_000, Floor(30_000), NOW, false);
    assert!(is_wait(&v), "{v:?}");
    let v = judge_with_statistics(&no_stats(), live(0, 0), 30_000, Floor(30_000), LATE, false);
    assert!(
        matches!(&v, Verdict::Fail(why) if why.contains("30000 message(s) were in the queue")),
        "{v:?}"
    );
    // With statistics that still count them: wait, then fail (never complete short).
    let v = judge_with_statistics(
        &api(30_000, 30_000, vec![]),
        live(0, 0),
        30_000,
        Floor(30_000),
        LATE,
        false,
    );
    assert!(matches!(v, Verdict::Fail(_)), "{v:?}");
    // Even the API's word that the queue shrank does not lower a floor.
    let v = judge_with_statistics(
        &api(10, 0, vec![]),
        live(10, 0),
        30_000,
        Floor(30_000),
        NOW,
        false,
    );
    assert!(is_wait(&v), "{v:?}");
    // Back: start.
    let v = judge_with_statistics(
        &no_stats(),
        live(30_000, 0),
        30_000,
        Floor(30_000),
        NOW,
        false,
    );
    assert_eq!(v, Verdict::Start);
    let v = judge_without_statistics(live(0, 0), 30_000, Floor(30_000), LATE, false, LATE);
    assert!(matches!(v, Verdict::Fail(_)), "{v:?}");
}

#[test]
fn a_killed_runs_consumer_is_waited_for_even_unnamed() {
    // Item 31.0: the killed run's connection not listed yet: its name is unknown.
    let killed = consumer("rmq-backup-2067-0", None, true);
    let v = judge_with_statistics(
        &api(30_000, 30_000, vec![killed.clone()]),
        live(0, 1),
        30_000,
        Floor(0),
        Duration::from_secs(8),
        true,
    );
    assert!(
        matches!(&v, Verdict::Wait("backup", why) if why.contains("consumer tag rmq-backup-2067-0")),
        "{v:?}"
    );
    // Another application's consumer holding messages: left out at once, named.
    let billing = consumer("ctag", Some("billing"), true);
    let v = judge_with_statistics(
        &api(100, 40, vec![billing.clone()]),
        live(60, 1),
        100,
        Floor(0),
        Duration::from_secs(8),
        false,
    );
    assert!(
        matches!(&v, Verdict::LeftOut(40, why) if why.contains("billing (consumer tag ctag)")),
        "{v:?}"
    );
    // ... holding nothing: start.
    let v = judge_with_statistics(
        &api(60, 0, vec![billing]),
        live(60, 1),
        60,
        Floor(0),
        NOW,
        false,
    );
    assert_eq!(v, Verdict::Start);
    // Consumers the API does not list yet get a grace.
    let v = judge_with_statistics(
        &api(100, 40, vec![]),
        live(60, 1),
        100,
        Floor(0),
        NOW,
        false,
    );
    assert!(matches!(v, Verdict::Wait("unlisted", _)), "{v:?}");
}

#[test]
fn an_earlier_run_without_statistics_waits_for_them_then_starts() {
    let v = judge_with_statistics(&no_stats(), live(5_000, 0), 0, Floor(0), NOW, true);
    assert!(matches!(v, Verdict::Wait("no-statistics", _)), "{v:?}");
    let v = judge_with_statistics(
        &no_stats(),
        live(5_000, 0),
        0,
        Floor(0),
        STATISTICS_LAG + Duration::from_secs(1),
        true,
    );
    assert_eq!(v, Verdict::Start);
}

#[test]
fn without_statistics_the_live_counts_decide() {
    // No consumer, nothing expected: start.
    assert_eq!(
        judge_without_statistics(live(10, 0), 0, Floor(0), NOW, false, NOW),
        Verdict::Start
    );
    // After an earlier run: the ready count must settle first.
    let v = judge_without_statistics(
        live(10, 0),
        0,
        Floor(0),
        NOW,
        true,
        Duration::from_millis(500),
    );
    assert!(matches!(v, Verdict::Wait("settle", _)), "{v:?}");
    assert_eq!(
        judge_without_statistics(live(10, 0), 0, Floor(0), NOW, true, STEADY),
        Verdict::Start
    );
    // Consumers: a moment for a killed run's to go, then left out, the count unknown.
    let v = judge_without_statistics(live(10, 2), 0, Floor(0), NOW, false, NOW);
    assert!(matches!(v, Verdict::Wait("consumers", _)), "{v:?}");
    let v = judge_without_statistics(live(10, 2), 0, Floor(0), UNLISTED_GRACE, false, NOW);
    assert!(
        matches!(&v, Verdict::LeftOut(0, why) if why.contains("statistics are off")),
        "{v:?}"
    );
}

#[test]
fn a_listed_count_whose_statistics_are_gone_is_waited_for() {
    // First attempt, a node lost since the listing: its quorum queue answers 0 and 0 and the
    // API has no statistics. Not "empty": wait, then leave them out (exit 4), never 0 silently.
    let v = judge_with_statistics(&no_stats(), live(0, 0), 30_000, Floor(0), NOW, false);
    assert!(matches!(v, Verdict::Wait("floor", _)), "{v:?}");
    let v = judge_with_statistics(&no_stats(), live(0, 0), 30_000, Floor(0), LATE, false);
    assert!(matches!(v, Verdict::LeftOut(30_000, _)), "{v:?}");
    // A fresh queue (nothing counted): start at once.
    let v = judge_with_statistics(&no_stats(), live(0, 0), 0, Floor(0), NOW, false);
    assert_eq!(v, Verdict::Start);
}
