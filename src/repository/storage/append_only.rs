//! Deletes a backup run may skip (docs/protecting-backups.md "Protecting backups from deletion", append-only
//! credentials): a run needs put, get and list only. The run lock is never deleted (a run ends
//! it in place, `crate::repository::lock`), and the few deletes a run still tries (a retry's abandoned
//! segments, the earlier run's segments its manifest does not list, the clock probe) tidy up
//! only: when the storage refuses one, the object stays, listed by no manifest, for
//! `forget --prune` run with delete rights, and the run goes on.
//!
//! One warning per process says so (the first refusal); every other is a debug line.

use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static WARNED: AtomicBool = AtomicBool::new(false);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Records that the delete of `key` (`what` it is, for the log) failed with `e` and is
/// skipped: a warning the first time in this process, a debug line after.
pub fn skip_delete(what: &str, key: &str, e: &Error) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    if WARNED.swap(true, Ordering::Relaxed) {
        log::debug!("{key}: {what} not removed: {e}");
    } else {
        log::warn!(
            "{key}: {what} not removed: {e}. The storage refuses deletes (append-only credentials, or an object lock): objects this run would tidy away are left in place, listed by no manifest; `forget --prune` run with delete rights will clean them. Further refused deletes are logged at debug level."
        );
    }
}

/// Deletes this process skipped so far.
pub fn skipped() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_deletes_are_counted() {
        let before = skipped();
        skip_delete(
            "segment",
            "b/x",
            &Error::Storage("Failed to delete b/x: 403".into()),
        );
        skip_delete(
            "segment",
            "b/y",
            &Error::Storage("Failed to delete b/y: 403".into()),
        );
        assert!(skipped() >= before + 2);
        assert!(WARNED.load(Ordering::Relaxed));
    }
}
