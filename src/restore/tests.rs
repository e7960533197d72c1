use super::publish::RateLimiter;
use super::segments::{in_window, segment_in_window};
use super::*;
use crate::manifest::SegmentMetadata;

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
        key: "k".into(),
        sequence: 1,
        record_count: 1,
        size_bytes: 1,
        uncompressed_bytes: 1,
        first_timestamp: Some(first),
        last_timestamp: Some(last),
        checksum: String::new(),
        encryption: None,
    };
    assert!(!segment_in_window(&seg(10, 99), &opts));
    assert!(segment_in_window(&seg(10, 100), &opts));
    assert!(segment_in_window(&seg(150, 160), &opts));
    assert!(segment_in_window(&seg(200, 300), &opts));
    assert!(!segment_in_window(&seg(201, 300), &opts));
}
