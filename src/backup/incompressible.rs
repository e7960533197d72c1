//! Segments whose records do not compress are stored uncompressed: zstd searches every byte of
//! a random or already compressed body for matches before it stores the block as it is, 29% of
//! a version 2 backup's CPU on random bodies (docs/performance.md), for nothing. Each segment is
//! judged by its compressor's progress when it is finished, before it is stored. A segment's
//! header says how it is compressed (SPEC.md "Segment format", compression code), so one queue's
//! segments may differ and every reader reads them.

use crate::repository::segment::Compression;

/// Segments written uncompressed after a segment the configured compression did not shrink,
/// before one is tried with it again.
const PLAIN_SEGMENTS: u32 = 15;

/// The least payload a segment needs for its compressed size to say anything (bytes).
const VERDICT_BYTES: u64 = 256 << 10;

/// A segment "did not shrink" when its stored size is at least this share of its payload
/// (percent): zstd's own frame and block headers on random data, an age file's chunk tags.
const NO_GAIN_PERCENT: u64 = 98;

/// Payload after which a segment being compressed is judged once before it is full: one that
/// has not shrunk by then is finished there (a segment of this size), so the next ones are
/// stored uncompressed without zstd searching a whole segment (128 MiB by default) of random
/// bodies first. Measured (docs/performance.md): that first segment was most of a version 2
/// backup's CPU for 5,000 x 64 KiB random bodies.
pub(super) const EARLY_VERDICT_BYTES: u64 = 8 << 20;

/// True when `consumed` payload bytes compressed to `produced` tell that the compression does
/// not pay: enough bytes to tell, and at least [`NO_GAIN_PERCENT`] of them left.
pub(super) fn no_gain(consumed: u64, produced: u64) -> bool {
    consumed >= VERDICT_BYTES && produced * 100 >= consumed * NO_GAIN_PERCENT
}

/// Chooses each new segment's compression for one queue.
#[derive(Debug)]
pub(super) struct Choice {
    configured: Compression,
    state: State,
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
    /// `configured`: `backup.compression`; only zstd is ever switched off (lz4 passes
    /// incompressible input at memory speed).
    pub(super) fn new(configured: Compression) -> Choice {
        Choice {
            configured,
            state: State::Configured,
        }
    }

    /// Learns from a segment finished now that was written with the configured compression:
    /// `consumed` payload bytes compressed to `produced` bytes so far
    /// ([`crate::repository::segment::SegmentWriter::zstd_progress`]; judged before it is
    /// stored, so the next segment already follows it). One large enough to tell that did not
    /// shrink sends the next [`PLAIN_SEGMENTS`] uncompressed; one that shrank, or a probe too
    /// small to tell, goes back to the configured compression.
    pub(super) fn judge(&mut self, consumed: u64, produced: u64) {
        if consumed < VERDICT_BYTES {
            if self.state == State::Probing {
                self.state = State::Configured;
            }
            return;
        }
        self.state = if no_gain(consumed, produced) {
            if self.state == State::Configured {
                log::debug!(
                    "{consumed} bytes of records became {produced} with {}: the next segments are stored uncompressed, one in {} tried again",
                    self.configured.as_str(),
                    PLAIN_SEGMENTS + 1
                );
            }
            State::Plain(PLAIN_SEGMENTS)
        } else {
            State::Configured
        };
    }

    /// The compression of the segment opened now.
    pub(super) fn next(&mut self) -> Compression {
        if self.configured != Compression::Zstd {
            return self.configured;
        }
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

    const MIB: u64 = 1 << 20;

    #[test]
    fn segments_that_do_not_shrink_are_followed_by_plain_ones_and_a_probe() {
        let mut c = Choice::new(Compression::Zstd);
        assert_eq!(c.next(), Compression::Zstd);
        // Shrank: stays.
        c.judge(MIB, MIB / 3);
        assert_eq!(c.next(), Compression::Zstd);
        // Did not shrink (random bodies: zstd's block headers add a little).
        c.judge(MIB, MIB + 100);
        let plain: Vec<Compression> = (0..PLAIN_SEGMENTS).map(|_| c.next()).collect();
        assert!(plain.iter().all(|&x| x == Compression::None), "{plain:?}");
        // The probe, then plain until it is judged.
        assert_eq!(c.next(), Compression::Zstd);
        assert_eq!(c.next(), Compression::None);
        // The probe shrank: compressed again.
        c.judge(MIB, MIB / 2);
        assert_eq!(c.next(), Compression::Zstd);
        // 98%: no gain worth zstd's search.
        c.judge(100 * MIB, 98 * MIB);
        assert_eq!(c.next(), Compression::None);
        let mut c = Choice::new(Compression::Zstd);
        c.judge(100 * MIB, 97 * MIB);
        assert_eq!(c.next(), Compression::Zstd);
        // The early verdict's test: too few bytes say nothing.
        assert!(no_gain(EARLY_VERDICT_BYTES, EARLY_VERDICT_BYTES + 100));
        assert!(!no_gain(EARLY_VERDICT_BYTES, EARLY_VERDICT_BYTES / 2));
        assert!(!no_gain(VERDICT_BYTES - 1, VERDICT_BYTES));
    }

    #[test]
    fn a_probe_that_still_does_not_shrink_starts_another_plain_run() {
        let mut c = Choice::new(Compression::Zstd);
        c.judge(2 * MIB, 2 * MIB);
        for _ in 0..PLAIN_SEGMENTS {
            assert_eq!(c.next(), Compression::None);
        }
        assert_eq!(c.next(), Compression::Zstd);
        c.judge(MIB, MIB);
        for _ in 0..PLAIN_SEGMENTS {
            assert_eq!(c.next(), Compression::None);
        }
        assert_eq!(c.next(), Compression::Zstd);
    }

    #[test]
    fn small_segments_say_nothing_and_only_zstd_is_switched_off() {
        let mut c = Choice::new(Compression::Zstd);
        // Too small to tell (a queue's last records, a stream's time-rotated segment).
        c.judge(1000, 1000);
        assert_eq!(c.next(), Compression::Zstd);
        // A probe too small to tell goes back to compressing.
        c.judge(MIB, MIB);
        for _ in 0..=PLAIN_SEGMENTS {
            c.next();
        }
        assert_eq!(c.next(), Compression::None, "probing");
        c.judge(500, 500);
        assert_eq!(c.next(), Compression::Zstd);
        for kind in [Compression::Lz4, Compression::None] {
            let mut c = Choice::new(kind);
            c.judge(MIB, MIB);
            assert_eq!(c.next(), kind);
        }
    }
}
