use super::publish::RateLimiter;
use super::segments::{in_window, segment_in_window, segments_to_read};
use super::*;
use crate::repository::manifest::SegmentMetadata;

#[test]
fn rate_limiter_spaces_publishes() {
    let l = RateLimiter::new(200);
    let t = Instant::now();
    for _ in 0..41 {
        l.acquire();
    }
    // 41 permits at 200/s: the last is due 200 ms after the first.
    assert!(t.elapsed() >= Duration::from_millis(195));
    let unlimited = RateLimiter::new(0);
    unlimited.acquire();
    assert_eq!(
        unlimited.issued.load(Ordering::Relaxed),
        0,
        "0 means no limiter at all"
    );
}

#[test]
fn window_filters() {
    let opts = RestoreOptions {
        time_window_start: Some(100),
        time_window_end: Some(200),
        ..Default::default()
    };
    assert!(!in_window(99, &opts));
    assert!(in_window(100, &opts));
    assert!(in_window(200, &opts));
    assert!(!in_window(201, &opts));
    let seg = |first, last| SegmentMetadata {
        first_timestamp: Some(first),
        last_timestamp: Some(last),
        ..SegmentMetadata::example("k".into(), 1, 1)
    };
    assert!(!segment_in_window(&seg(10, 99), &opts));
    assert!(segment_in_window(&seg(10, 100), &opts));
    assert!(segment_in_window(&seg(150, 160), &opts));
    assert!(segment_in_window(&seg(200, 300), &opts));
    assert!(!segment_in_window(&seg(201, 300), &opts));
}

/// A resumed restore skips whole segments of the published prefix only up to the first one it
/// reads; a short segment later (the last of a queue) is read whatever the rest of the skip.
#[test]
fn only_a_leading_run_of_segments_is_skipped_whole() {
    let seg = |sequence, record_count| {
        SegmentMetadata::example(format!("s{sequence}"), sequence, record_count)
    };
    let segments = [seg(1, 100), seg(2, 100), seg(3, 100), seg(4, 30)];
    let keys = |skip| {
        let (todo, rest) = segments_to_read(&segments, &RestoreOptions::default(), skip);
        (todo.iter().map(|s| s.key.clone()).collect::<Vec<_>>(), rest)
    };
    assert_eq!(
        keys(0),
        (vec!["s1".into(), "s2".into(), "s3".into(), "s4".into()], 0)
    );
    assert_eq!(keys(137), (vec!["s2".into(), "s3".into(), "s4".into()], 37));
    assert_eq!(keys(200), (vec!["s3".into(), "s4".into()], 0));
    assert_eq!(keys(330), (vec![], 0));
    // With a time window every segment in it is read and Forward skips record by record.
    let windowed = RestoreOptions {
        time_window_start: Some(0),
        ..Default::default()
    };
    assert_eq!(segments_to_read(&segments, &windowed, 137).0.len(), 4);
}

/// A queue the definitions import converted (names as in the backup) is restored, and created
/// by `create_missing_queues`, as a quorum queue; a queue of the same name in another vhost, or
/// mapped from another source, is not.
#[test]
fn converted_queues_are_quorum_in_the_plan() {
    let q = |vhost: &str, name: &str| QueueRestore {
        source_vhost: vhost.into(),
        source_queue: name.into(),
        target_vhost: "mapped".into(),
        target_queue: name.into(),
        queue_type: Some(QueueType::Classic),
        ..Default::default()
    };
    let mut queues = [q("v", "ha.orders"), q("w", "ha.orders"), q("v", "plain")];
    plan::mark_converted(&mut queues, &[("v".into(), "ha.orders".into())]);
    let types: Vec<(Option<QueueType>, bool)> = queues
        .iter()
        .map(|q| (q.queue_type, q.converted_to_quorum))
        .collect();
    assert_eq!(
        types,
        [
            (Some(QueueType::Quorum), true),
            (Some(QueueType::Classic), false),
            (Some(QueueType::Classic), false)
        ]
    );
}
