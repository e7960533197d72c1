//! Retries with exponential backoff and full jitter for object-storage calls (issue #3:
//! transient failures are retried, 4xx never).
//!
//! A backend runs one request per attempt and classifies its outcome as [`Attempt::Transient`]
//! (HTTP 5xx, 408, 429, a timeout, a reset or refused connection) or [`Attempt::Permanent`]
//! (any other 4xx, a bad answer, a local error). [`run`] retries the transient ones with
//! delays drawn uniformly from `[0, min(max_delay, base_delay * 2^n)]` (AWS's "full jitter"),
//! up to [`Policy::attempts`] attempts in all, and returns the last error.

use crate::error::Error;
use std::time::Duration;

/// How often and how long to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Attempts in all, including the first (at least 1).
    pub attempts: u32,
    /// Upper bound of the first delay.
    pub base_delay: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
    /// The backend whose requests these are (`s3`, `azure`, `gcs`): the `backend` label of
    /// `broker_storage_retries`.
    pub backend: &'static str,
}

impl Policy {
    /// [`Policy::default`] for `backend`.
    pub fn for_backend(backend: &'static str) -> Policy {
        Policy {
            backend,
            ..Policy::default()
        }
    }
}

impl Default for Policy {
    /// 5 attempts, delays up to 0.2 s, 0.4 s, 0.8 s, 1.6 s (at most 3 s in all): long enough for
    /// a restarting endpoint or a throttled bucket, short enough that a dead one fails fast.
    fn default() -> Self {
        Policy {
            attempts: 5,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            backend: "storage",
        }
    }
}

/// The outcome of a failed attempt.
#[derive(Debug)]
pub enum Attempt {
    /// Worth another try (5xx, 408, 429, timeout, connection reset or refused).
    Transient(Error),
    /// Final (4xx other than 408/429, local errors, bad answers).
    Permanent(Error),
}

impl Attempt {
    /// `Transient` for HTTP statuses worth retrying (5xx, 408, 429), else `Permanent`.
    pub fn from_status(status: u16, err: Error) -> Attempt {
        if is_transient_status(status) {
            Attempt::Transient(err)
        } else {
            Attempt::Permanent(err)
        }
    }
}

/// True for HTTP statuses worth retrying: 5xx, 408 Request Timeout, 429 Too Many Requests.
pub fn is_transient_status(status: u16) -> bool {
    status >= 500 || status == 408 || status == 429
}

/// Runs `op` until it succeeds, fails permanently, or `policy.attempts` attempts have failed.
/// `what` names the operation in the debug log line of each retry (no secrets: a key or a path).
pub fn run<T>(
    policy: Policy,
    what: &str,
    mut op: impl FnMut() -> std::result::Result<T, Attempt>,
) -> crate::error::Result<T> {
    let attempts = policy.attempts.max(1);
    let mut n = 0;
    // Retries made, counted once the operation's outcome is known.
    let counted = |n: u32, outcome: &str| {
        if n > 1 {
            crate::metrics::global()
                .storage_retries
                .with([policy.backend, outcome])
                .add(u64::from(n - 1));
        }
    };
    loop {
        n += 1;
        match op() {
            Ok(v) => {
                counted(n, "succeeded");
                return Ok(v);
            }
            Err(Attempt::Permanent(e)) => {
                counted(n, "failed");
                return Err(e);
            }
            Err(Attempt::Transient(e)) if n >= attempts => {
                counted(n, "failed");
                log::warn!("storage: {what} failed after {n} attempts: {e}");
                return Err(e);
            }
            Err(Attempt::Transient(e)) => {
                let delay = backoff(policy, n - 1, jitter_source());
                log::debug!(
                    "storage: {what} failed (attempt {n} of {attempts}), retrying in {} ms: {e}",
                    delay.as_millis()
                );
                std::thread::sleep(delay);
            }
        }
    }
}

/// The delay after failed attempt number `retry` (0-based): `random` in `[0, 1)` times
/// `min(max_delay, base_delay * 2^retry)`.
pub fn backoff(policy: Policy, retry: u32, random: f64) -> Duration {
    let cap = policy
        .base_delay
        .saturating_mul(1u32 << retry.min(20))
        .min(policy.max_delay);
    cap.mul_f64(random.clamp(0.0, 1.0))
}

/// A number in `[0, 1)` that differs between threads and calls (not cryptographic: it only
/// spreads retries of concurrent uploaders apart).
fn jitter_source() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn fast() -> Policy {
        Policy {
            attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            backend: "test",
        }
    }

    #[test]
    fn transient_errors_are_retried_until_success() {
        let calls = Cell::new(0);
        let v = run(fast(), "put k", || {
            calls.set(calls.get() + 1);
            if calls.get() < 3 {
                Err(Attempt::Transient(Error::Storage("503".into())))
            } else {
                Ok(7)
            }
        });
        assert_eq!(v, Ok(7));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let calls = Cell::new(0);
        let v: crate::error::Result<()> = run(fast(), "put k", || {
            calls.set(calls.get() + 1);
            Err(Attempt::Permanent(Error::Storage("403".into())))
        });
        assert_eq!(v, Err(Error::Storage("403".into())));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn attempts_are_bounded_and_the_last_error_wins() {
        let calls = Cell::new(0);
        let v: crate::error::Result<()> = run(fast(), "get k", || {
            calls.set(calls.get() + 1);
            Err(Attempt::Transient(Error::Storage(format!(
                "500 #{}",
                calls.get()
            ))))
        });
        assert_eq!(v, Err(Error::Storage("500 #4".into())));
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let p = Policy::default();
        assert_eq!(backoff(p, 0, 0.999_999).as_millis(), 199);
        assert_eq!(backoff(p, 1, 0.999_999).as_millis(), 399);
        assert_eq!(backoff(p, 3, 0.999_999).as_millis(), 1599);
        assert_eq!(backoff(p, 10, 1.0), Duration::from_secs(5));
        assert_eq!(backoff(p, 40, 1.0), Duration::from_secs(5));
        assert_eq!(backoff(p, 2, 0.0), Duration::ZERO);
        let r = jitter_source();
        assert!((0.0..1.0).contains(&r));
    }

    #[test]
    fn statuses_are_classified() {
        for s in [500, 502, 503, 504, 408, 429] {
            assert!(is_transient_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 412] {
            assert!(!is_transient_status(s), "{s}");
        }
    }
}
