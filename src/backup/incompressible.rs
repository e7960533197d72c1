//! Segments whose records do not compress are stored uncompressed: zstd searches every byte of
//! a random or already compressed body for matches before it stores the block as it is, 29% of
//! a version 2 backup's CPU on random bodies (docs/performance.md), for nothing. A segment's
//! header says how it is compressed (SPEC.md "Segment format", compression code), so one queue's
//! segments may differ and every reader reads them.

use crate::repository::manifest::SegmentMetadata;
use crate::repository::segment::Compression;

/// Segments written uncompressed after a segment the configured compression did not shrink,
/// before one is tried with it again.
const PLAIN_SEGMENTS: u32 = 15;

/// The least payload a segment needs for its compressed size to say anything (bytes).
const VERDICT_BYTES: u64 = 256 << 10;

/// A segment "did not shrink" when its stored size is at least this share of its payload
/// (percent): zstd's own frame and block headers on random data, an age file's chunk tags.
const NO_GAIN_PERCENT: u64 = 98;

/// Chooses each new segment's compression for one queue.
#[derive(Debug)]
pub(super) struct Choice {
    configured: Compression,
    state: State,
    /// Stored segments already learnt from.
    seen: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The configured compression.
    Configured,
    /// Uncompressed, this many more segments, then a probe.
    Plain(u32),
    /// A segment was written with the configured compression to try it again; uncompressed
    /// until its size is known.
    Probing,
}

impl Choice {
    /// `configured`: `backup.compression`.
    pub(super) fn new(configured: Compression) -> Choice {
        Choice {
            configured,
            state: State::Configured,
            seen: 0,
        }
    }

    /// Learns from the queue's stored segments (`done`, in sequence order; those already seen
    /// are skipped): a segment of the configured compression, large enough to tell, that did
    /// not shrink sends the next [`PLAIN_SEGMENTS`] uncompressed; one that shrank, or a probe
    /// too small to tell, goes back to the configured compression.
    pub(super) fn learn(&mut self, done: &[SegmentMetadata]) {
        if self.configured == Compression::None {
            return;
        }
        for s in done.iter().skip(self.seen) {
            if Compression::from_key(&s.key) != self.configured {
                continue;
            }
            if s.uncompressed_bytes < VERDICT_BYTES {
                if self.state == State::Probing {
                    self.state = State::Configured;
                }
                continue;
            }
            self.state = if s.size_bytes * 100 >= s.uncompressed_bytes * NO_GAIN_PERCENT {
                if self.state == State::Configured {
                    log::debug!(
                        "{}: {} of {} bytes with {}: the next segments are stored uncompressed, one in {} tried again",
                        s.key,
                        s.size_bytes,
                        s.uncompressed_bytes,
                        self.configured.as_str(),
                        PLAIN_SEGMENTS + 1
                    );
                }
                State::Plain(PLAIN_SEGMENTS)
            } else {
                State::Configured
            };
        }
        self.seen = done.len();
    }

    /// The compression of the segment opened now.
    pub(super) fn next(&mut self) -> Compression {
        match self.state {
            State::Configured => self.configured,
            State::Plain(0) => {
                self.state = State::Probing;
                self.configured
            }
            State::Plain(n) => {
                self.state = State::Plain(n - 1);
                Compression::None
            }
            State::Probing => Compression::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(seq: u64, ext: &str, size: u64, payload: u64) -> SegmentMetadata {
        SegmentMetadata {
            key: format!("b/queues/v/q/segment-{seq:04}{ext}"),
            sequence: seq,
            record_count: 1,
            size_bytes: size,
            uncompressed_bytes: payload,
            first_timestamp: None,
            last_timestamp: None,
            checksum: String::new(),
            encryption: None,
            recipients: None,
            segment_version: None,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn segments_that_do_not_shrink_are_followed_by_plain_ones_and_a_probe() {
        let mut c = Choice::new(Compression::Zstd);
        assert_eq!(c.next(), Compression::Zstd);
        // Shrank: stays.
        let mut done = vec![seg(1, ".zst", MIB / 3, MIB)];
        c.learn(&done);
        assert_eq!(c.next(), Compression::Zstd);
        // Did not shrink (random bodies: zstd's frame adds a little).
        done.push(seg(2, ".zst", MIB + 100, MIB));
        c.learn(&done);
        let plain: Vec<Compression> = (0..PLAIN_SEGMENTS).map(|_| c.next()).collect();
        assert!(plain.iter().all(|&x| x == Compression::None), "{plain:?}");
        // Learning from its own plain segments changes nothing.
        done.push(seg(3, "", MIB + 40, MIB));
        c.learn(&done);
        // The probe, then plain until its size is known.
        assert_eq!(c.next(), Compression::Zstd);
        assert_eq!(c.next(), Compression::None);
        assert_eq!(c.next(), Compression::None);
        // The probe shrank: compressed again.
        done.push(seg(19, ".zst", MIB / 2, MIB));
        c.learn(&done);
        assert_eq!(c.next(), Compression::Zstd);
    }

    #[test]
    fn a_probe_that_still_does_not_shrink_starts_another_plain_run() {
        let mut c = Choice::new(Compression::Lz4);
        c.learn(&[seg(1, ".lz4", 2 * MIB, 2 * MIB)]);
        for _ in 0..PLAIN_SEGMENTS {
            assert_eq!(c.next(), Compression::None);
        }
        assert_eq!(c.next(), Compression::Lz4);
        c.learn(&[seg(1, ".lz4", 2 * MIB, 2 * MIB), seg(17, ".lz4", MIB, MIB)]);
        assert_eq!(c.next(), Compression::None);
    }

    #[test]
    fn small_segments_say_nothing_and_none_stays_none() {
        let mut c = Choice::new(Compression::Zstd);
        // Too small to tell (a queue's last records, a stream's time-rotated segment).
        c.learn(&[seg(1, ".zst", 1000, 1000)]);
        assert_eq!(c.next(), Compression::Zstd);
        // A probe too small to tell goes back to compressing.
        let mut c = Choice::new(Compression::Zstd);
        let mut done = vec![seg(1, ".zst", MIB, MIB)];
        c.learn(&done);
        for _ in 0..=PLAIN_SEGMENTS {
            c.next();
        }
        assert_eq!(c.next(), Compression::None, "probing");
        done.push(seg(17, ".zst", 500, 500));
        c.learn(&done);
        assert_eq!(c.next(), Compression::Zstd);
        // Encrypted segments: the compression is read under `.age`.
        let mut c = Choice::new(Compression::Zstd);
        c.learn(&[seg(1, ".zst.age", MIB + 300, MIB)]);
        assert_eq!(c.next(), Compression::None);
        let mut c = Choice::new(Compression::None);
        c.learn(&[seg(1, "", MIB, MIB)]);
        assert_eq!(c.next(), Compression::None);
    }
}
