//! Stream consumer offsets after a restore (`restore.stream_offsets: translate`, README
//! "Stream consumer offsets"). A consumer that tracks its place under a reference (the stream
//! protocol's StoreOffset) would be lost in the restored stream, whose offsets differ. The
//! backup holds each named reference's offset (`QueueBackup::consumer_offsets`); the restore
//! gives each reference the offset that the last restored message at or before it took in the
//! target, and stores it there under the same reference.
//!
//! Why at or before: a stored offset is the last message its consumer processed, and the
//! consumer resumes at the next one (stored + 1). A reference that falls in a gap of the
//! restored records (a time window, or below the first backed-up offset) mapped to the record
//! after it would make the consumer skip that record; mapped to the record before it, the
//! consumer resumes at the first record it has not seen. When no restored record lies at or
//! before it, no offset says "before the first", so the reference is left unset with a warning
//! (the consumer then starts where its own application says).
//!
//! How the target's offsets are known: a stream gives each message the next offset, and the
//! records of a queue are published in order (`super::publish`), so once every publish is
//! confirmed, the `n` messages this run published are the last `n` of the target: offsets
//! `end - n .. end`, `end` read from the target's last chunk. This holds when nothing else
//! publishes to the target stream during the restore (README says so).

use crate::broker::stream::offsets::last_offset;
use crate::broker::stream::{StreamConnection, StreamOptions};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the target's last chunk is waited for (it holds what was just confirmed).
const END_WAIT: Duration = Duration::from_secs(10);

/// The references to translate, matched against the records as they are published.
#[derive(Debug, Default)]
pub(super) struct Translation {
    /// (offset in the backup, reference) not reached yet, highest offset first.
    pending: Vec<(u64, String)>,
    /// (reference, offset in the backup, index in this run's publish order of the last record
    /// at or before it; `None` when it lies before every record this run published).
    found: Vec<(String, u64, Option<u64>)>,
    /// The source offset of the first record this run published.
    first: Option<u64>,
    published: u64,
}

/// A reference's place in the target, as [`Translation::finish`] stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Translated {
    pub reference: String,
    /// Its offset in the backup's source stream.
    pub from: u64,
    /// Its offset in the target stream.
    pub to: u64,
}

impl Translation {
    /// The consumer offsets of a backed-up stream (reference → offset).
    pub(super) fn new(offsets: &BTreeMap<String, u64>) -> Translation {
        let mut pending: Vec<(u64, String)> =
            offsets.iter().map(|(r, o)| (*o, r.clone())).collect();
        pending.sort_unstable_by(|a, b| b.cmp(a));
        Translation {
            pending,
            ..Translation::default()
        }
    }

    /// The next record published, by its source offset (a stream record's `delivery_tag`,
    /// SPEC.md "Segment file").
    pub(super) fn observe(&mut self, offset: u64) {
        self.first.get_or_insert(offset);
        // A reference below this record lies after the previous one (or before them all).
        let previous = self.published.checked_sub(1);
        while let Some((o, _)) = self.pending.last() {
            let index = match (*o).cmp(&offset) {
                std::cmp::Ordering::Less => previous,
                std::cmp::Ordering::Equal => Some(self.published),
                std::cmp::Ordering::Greater => break,
            };
            if let Some((o, reference)) = self.pending.pop() {
                self.found.push((reference, o, index));
            }
        }
        self.published += 1;
    }

    /// Where each reference goes, once this run's `published` messages are the last of a
    /// target whose next offset is `end` (see the module documentation). `earlier`: records
    /// of the queue an earlier run published (`restore.checkpoint_state`), whose target
    /// offsets this run does not know: a reference before this run's first record is left out
    /// with a warning. Each reference goes to the last restored record at or before it (see
    /// the module documentation); one past every restored record goes to the last one (its
    /// consumer had read them all); one before every restored record is left unset with a
    /// warning.
    pub(super) fn finish(mut self, end: u64, earlier: u64, name: &str) -> Vec<Translated> {
        if self.published == 0 {
            return Vec::new();
        }
        let base = end.saturating_sub(self.published);
        let last = self.published - 1;
        let beyond = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        let placed = self.found.into_iter().chain(
            beyond
                .into_iter()
                .map(|(from, reference)| (reference, from, Some(last))),
        );
        for (reference, from, index) in placed {
            match index {
                Some(index) => out.push(Translated {
                    reference,
                    from,
                    to: base + index,
                }),
                None if earlier > 0 => log::warn!(
                    "{name}: consumer reference {reference} (offset {from}) points among the records an earlier run restored; its offset is not restored"
                ),
                None => log::warn!(
                    "{name}: consumer reference {reference} (offset {from}) lies before every restored record (the first is offset {}); its offset is not restored, so its consumer starts where its application says",
                    self.first.unwrap_or_default()
                ),
            }
        }
        out
    }

    /// Messages observed so far.
    pub(super) fn published(&self) -> u64 {
        self.published
    }
}

/// Stores the translated offsets of `translation` on `stream` of the target (connection
/// `options`), after this run published `translation.published()` messages to it; returns
/// what it stored.
///
/// Errors: the stream protocol's; `Stream protocol error: ...` when the target shows no chunk
/// after messages were confirmed into it.
pub(super) fn store(
    translation: Translation,
    options: &StreamOptions,
    stream: &str,
    earlier: u64,
    name: &str,
) -> Result<Vec<Translated>> {
    if translation.published() == 0 {
        return Ok(Vec::new());
    }
    let conn = StreamConnection::open(options)?;
    let end = last_offset(&conn, stream, END_WAIT)?.ok_or_else(|| {
        Error::Stream(format!(
            "{name}: the target stream shows no message after the restore published to it; consumer offsets not stored"
        ))
    })?;
    let translated = translation.finish(end + 1, earlier, name);
    for t in &translated {
        conn.store_offset(&t.reference, stream, t.to)?;
        log::info!(
            "{name}: consumer reference {}: offset {} in the backup is offset {} in stream {stream}",
            t.reference,
            t.from,
            t.to
        );
    }
    // StoreOffset has no response: a query after it is answered only once the broker has
    // handled it, so the offsets are stored when this returns.
    if let Some(t) = translated.first() {
        conn.query_offset(&t.reference, stream)?;
    }
    let _ = conn.close();
    Ok(translated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(
        refs: &[(&str, u64)],
        published: &[u64],
        end: u64,
        earlier: u64,
    ) -> Vec<(String, u64, u64)> {
        let map = refs.iter().map(|(r, o)| (r.to_string(), *o)).collect();
        let mut t = Translation::new(&map);
        for o in published {
            t.observe(*o);
        }
        let mut out: Vec<_> = t
            .finish(end, earlier, "q")
            .into_iter()
            .map(|t| (t.reference, t.from, t.to))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_reference_on_a_restored_record_goes_to_that_record() {
        // Source offsets 100..=109 restored into a stream that held 5 messages: 5..=14.
        let published: Vec<u64> = (100..110).collect();
        assert_eq!(
            translate(&[("a", 100), ("b", 104), ("c", 109)], &published, 15, 0),
            vec![
                ("a".into(), 100, 5),
                ("b".into(), 104, 9),
                ("c".into(), 109, 14)
            ]
        );
    }

    #[test]
    fn a_reference_in_a_gap_goes_to_the_last_record_before_it() {
        // Offsets 10, 20, 30 restored (a time window left the others out) into an empty
        // stream: 0, 1, 2. A consumer whose place is 15 processed 10, not 20: it resumes at
        // stored + 1, so 15 -> 0 (the first record after it, 1, would be skipped).
        assert_eq!(
            translate(&[("gap", 15), ("gap2", 29)], &[10, 20, 30], 3, 0),
            vec![("gap".into(), 15, 0), ("gap2".into(), 29, 1)]
        );
    }

    #[test]
    fn a_reference_past_every_record_goes_to_the_last_one() {
        assert_eq!(
            translate(&[("after", 99)], &[10, 20, 30], 3, 0),
            vec![("after".into(), 99, 2)]
        );
    }

    #[test]
    fn a_reference_before_every_restored_record_is_left_unset() {
        // Below the first backed-up offset (retention had removed 0..=9): its consumer has
        // processed none of the restored records, and no offset says "before the first".
        assert_eq!(
            translate(&[("before", 3), ("exact", 20)], &[10, 20, 30], 3, 0),
            vec![("exact".into(), 20, 1)]
        );
        assert_eq!(translate(&[("before", 9)], &[10], 1, 0), vec![]);
    }

    #[test]
    fn references_among_an_earlier_runs_records_are_left_out() {
        // An earlier run restored 0..=4; this one 5..=9 into offsets 105..=109.
        assert_eq!(
            translate(&[("old", 2), ("new", 7)], &[5, 6, 7, 8, 9], 110, 5),
            vec![("new".into(), 7, 107)]
        );
    }

    #[test]
    fn nothing_published_translates_nothing() {
        assert!(translate(&[("a", 1)], &[], 0, 0).is_empty());
        assert!(translate(&[], &[1, 2], 2, 0).is_empty());
    }
}
