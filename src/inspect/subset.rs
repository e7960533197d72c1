//! `validate --deep --read-data-subset`: which segments a sampled deep check reads, with
//! restic's meanings (`restic check --read-data-subset`):
//!
//! - `N/T`: slice N of T (1 <= N <= T), deterministic: a segment is in slice
//!   `1 + h mod T`, `h` the first 8 bytes (big-endian) of the SHA-256 of its storage key. The
//!   T slices part the segments: a cron job that reads slice `(day mod T) + 1` every night
//!   reads the whole backup every T nights, each segment once.
//! - `P%` (0 < P <= 100): a random P% of the segments (rounded up, at least one when there is
//!   one), drawn anew each run.
//! - `SIZE` (`500M`, `2G`, `1024`; K, M, G, T are powers of 1024, an optional `iB`/`B` after
//!   them): random segments until their stored sizes reach SIZE (the last one may pass it).
//!
//! Segments not selected are still checked shallowly (present, with the manifest's size).

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};

/// Which segments a deep check reads (the argument of `--read-data-subset`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Subset {
    /// Slice `n` (from 1) of `t`, by the hash of the segment key.
    Slice { n: u64, t: u64 },
    /// A random share of the segments, in percent (0 < p <= 100).
    Percent(f64),
    /// Random segments up to this many stored bytes.
    Size(u64),
}

impl std::str::FromStr for Subset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "invalid --read-data-subset {s:?}: {why} (expected N/T, P% or a size such as 500M)"
            )
        };
        let s = s.trim();
        if let Some((n, t)) = s.split_once('/') {
            let n: u64 = n.trim().parse().map_err(|_| bad("N is not a number"))?;
            let t: u64 = t.trim().parse().map_err(|_| bad("T is not a number"))?;
            if t == 0 || n == 0 || n > t {
                return Err(bad("N must be from 1 to T"));
            }
            return Ok(Subset::Slice { n, t });
        }
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad("P is not a number"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad("P must be above 0 and at most 100"));
            }
            return Ok(Subset::Percent(p));
        }
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(digits);
        let num: u64 = num.parse().map_err(|_| bad("not a number"))?;
        let unit = unit.trim().to_ascii_uppercase();
        let unit = unit
            .strip_suffix("IB")
            .or_else(|| unit.strip_suffix('B'))
            .unwrap_or(&unit);
        let shift = match unit {
            "" => 0,
            "K" => 10,
            "M" => 20,
            "G" => 30,
            "T" => 40,
            _ => return Err(bad("unknown size unit")),
        };
        let size = num
            .checked_mul(1u64 << shift)
            .ok_or_else(|| bad("too large"))?;
        if size == 0 {
            return Err(bad("the size must be above 0"));
        }
        Ok(Subset::Size(size))
    }
}

impl std::fmt::Display for Subset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subset::Slice { n, t } => write!(f, "{n}/{t}"),
            Subset::Percent(p) => write!(f, "{p}%"),
            Subset::Size(b) => write!(f, "{}", crate::run::units::human_bytes(*b)),
        }
    }
}

/// The slice (from 1) of `t` that `key` belongs to.
pub fn slice_of(key: &str, t: u64) -> u64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut h = [0u8; 8];
    h.copy_from_slice(&digest[..8]);
    1 + u64::from_be_bytes(h) % t
}

impl Subset {
    /// For each of `segments` (storage key, stored size), whether the deep check reads it.
    ///
    /// Errors: `I/O error:` when the system's random source fails (the random subsets only).
    pub fn select(&self, segments: &[(&str, u64)]) -> Result<Vec<bool>> {
        match *self {
            Subset::Slice { n, t } => {
                Ok(segments.iter().map(|(k, _)| slice_of(k, t) == n).collect())
            }
            Subset::Percent(p) => {
                let want = ((segments.len() as f64) * p / 100.0).ceil() as usize;
                let order = shuffled(segments.len())?;
                let mut picked = vec![false; segments.len()];
                for &i in order.iter().take(want.min(segments.len())) {
                    picked[i] = true;
                }
                Ok(picked)
            }
            Subset::Size(limit) => {
                let order = shuffled(segments.len())?;
                let mut picked = vec![false; segments.len()];
                let mut total = 0u64;
                for i in order {
                    if total >= limit {
                        break;
                    }
                    picked[i] = true;
                    total = total.saturating_add(segments[i].1);
                }
                Ok(picked)
            }
        }
    }
}

/// The indices `0..len` in a random order (Fisher-Yates over the system's random source).
fn shuffled(len: usize) -> Result<Vec<usize>> {
    use ring::rand::{SecureRandom, SystemRandom};
    let rng = SystemRandom::new();
    let mut order: Vec<usize> = (0..len).collect();
    let mut buf = [0u8; 8];
    for i in (1..len).rev() {
        rng.fill(&mut buf)
            .map_err(|_| Error::Io("the system's random source failed".into()))?;
        let j = (u64::from_le_bytes(buf) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_restic_forms() {
        assert_eq!("2/3".parse(), Ok(Subset::Slice { n: 2, t: 3 }));
        assert_eq!("12.5%".parse(), Ok(Subset::Percent(12.5)));
        assert_eq!("500M".parse(), Ok(Subset::Size(500 << 20)));
        assert_eq!("2GiB".parse(), Ok(Subset::Size(2 << 30)));
        assert_eq!("4096".parse(), Ok(Subset::Size(4096)));
        for bad in ["0/3", "4/3", "1/0", "0%", "101%", "5X", "", "x/y"] {
            let e = bad.parse::<Subset>().unwrap_err();
            assert!(e.starts_with("invalid --read-data-subset"), "{bad}: {e}");
        }
    }

    #[test]
    fn slices_part_the_segments() {
        let keys: Vec<String> = (0..300)
            .map(|i| format!("b/queues/v/q/segment-{i:04}.zst"))
            .collect();
        let segs: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 10)).collect();
        let mut seen = vec![0u32; segs.len()];
        for n in 1..=3 {
            let picked = Subset::Slice { n, t: 3 }.select(&segs).unwrap();
            let count = picked.iter().filter(|p| **p).count();
            assert!((60..=140).contains(&count), "slice {n}: {count}");
            for (i, p) in picked.iter().enumerate() {
                seen[i] += u32::from(*p);
            }
        }
        assert!(seen.iter().all(|&s| s == 1));
    }

    #[test]
    fn random_subsets_take_their_share() {
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let segs: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 100)).collect();
        let count = |p: Vec<bool>| p.iter().filter(|p| **p).count();
        assert_eq!(count(Subset::Percent(25.0).select(&segs).unwrap()), 3);
        assert_eq!(count(Subset::Percent(100.0).select(&segs).unwrap()), 10);
        assert_eq!(count(Subset::Size(250).select(&segs).unwrap()), 3);
        assert_eq!(count(Subset::Size(1).select(&segs).unwrap()), 1);
        assert_eq!(count(Subset::Size(1 << 40).select(&segs).unwrap()), 10);
    }
}
