//! The retention policy and its evaluation: restic's `forget --keep-*` rules, pure (no storage,
//! no clock).
//!
//! The rules, as restic documents them ("Removing snapshots according to a policy") and its
//! `internal/restic/snapshot_policy.go` implements them, applied to backups by `created_at`:
//!
//! - backups are taken newest first;
//! - `keep_last n`: the `n` newest are kept;
//! - `keep_daily n` (`weekly`, `monthly`): each backup falls in a calendar bucket (its UTC day;
//!   its ISO 8601 week; its month); going from the newest, a backup is kept when its bucket
//!   differs from the bucket of the backup this rule kept last, until `n` were kept: the newest
//!   backup of each of the last `n` days (weeks, months) that have backups. A rule that still has
//!   a count left when it reaches the oldest backup keeps that one too (restic 0.17: "If there
//!   are not enough snapshots to keep one for each duration related `--keep-{within-,}` option,
//!   the oldest snapshot in the group is kept additionally");
//! - `keep_within d`: every backup created strictly after the newest backup's `created_at`
//!   minus `d` is kept; `d` is restic's `1y5m7d2h` (calendar years and months, then days and
//!   hours);
//! - a count may be [`Count::Unlimited`] (restic's `unlimited`, or `-1`): every bucket;
//! - the union is kept: a backup kept by any rule is kept, with every rule that keeps it.

use crate::run::units::{civil_from_days, days_from_civil};
use serde::{Deserialize, Serialize};
use std::fmt;

const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;

/// How many backups (or buckets) a rule keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// At most this many.
    N(u32),
    /// All of them (restic's `unlimited`, also written `-1`).
    Unlimited,
}

impl Count {
    /// Parses `N` (a `u32`, as Rust reads one: ASCII digits, an optional `+`), `unlimited` or
    /// `-1`, with ASCII whitespace around it. Errors: a sentence saying what was expected.
    pub fn parse(s: &str) -> Result<Count, String> {
        match s.trim_matches(|c: char| c.is_ascii_whitespace()) {
            "unlimited" | "-1" => Ok(Count::Unlimited),
            t => t.parse::<u32>().map(Count::N).map_err(|_| {
                format!("{s:?} is not a count: expected a whole number, unlimited or -1")
            }),
        }
    }

    fn is_zero(self) -> bool {
        self == Count::N(0)
    }
}

impl std::str::FromStr for Count {
    type Err = String;
    fn from_str(s: &str) -> Result<Count, String> {
        Count::parse(s)
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::N(n) => write!(f, "{n}"),
            Count::Unlimited => f.write_str("unlimited"),
        }
    }
}

impl Serialize for Count {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Count::N(n) => s.serialize_u32(*n),
            Count::Unlimited => s.serialize_str("unlimited"),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    /// A whole number (also written as a float with no fraction, `5.0` or `1e3`, which JSON
    /// Schema's `integer` takes too: `crate::config::schema::count`), `-1`, or a string that
    /// [`Count::parse`] takes.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
            Text(String),
        }
        let text = match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("not a count: expected a whole number, unlimited or -1")
        })? {
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) if f.fract() == 0.0 && (-1.0..=f64::from(u32::MAX)).contains(&f) => {
                (f as i64).to_string()
            }
            Raw::Float(f) => f.to_string(),
            Raw::Text(t) => t,
        };
        Count::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// restic's duration of `--keep-within`: years, months, days and hours (`1y5m7d2h`, `30d`,
/// `36h`; each unit at most once, in any order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Within {
    pub years: u32,
    pub months: u32,
    pub days: u32,
    pub hours: u32,
}

/// The longest duration accepted: 10,000 Gregorian years of 365.2425 days, in ms. Longer ones
/// are refused (issue 31: a wrapped multiplication once turned `1000000000y` into "keep
/// nothing"); any time it moves back still fits epoch milliseconds.
pub const MAX_WITHIN_MS: u128 = 10_000 * YEAR_MS;

/// A Gregorian year (365.2425 days) and a twelfth of it, in ms: how [`MAX_WITHIN_MS`] weighs
/// years and months.
const YEAR_MS: u128 = 31_556_952_000;
const MONTH_MS: u128 = YEAR_MS / 12;

impl Within {
    /// Parses `1y5m7d2h` (`m` is months, as in restic). Errors: a sentence saying what was
    /// expected, or that the duration is past 10,000 years ([`MAX_WITHIN_MS`]; a number too
    /// long for any counter included).
    pub fn parse(s: &str) -> Result<Within, String> {
        let w = Within::parse_unchecked(s)?;
        w.check_length().map_err(|e| format!("{s:?} {e}"))?;
        Ok(w)
    }

    /// [`Within::parse`] without the length limit: the syntax only, each count saturating at
    /// `u32::MAX` (then past the limit). For a configuration file, whose loader reports the
    /// limit as a configuration error ([`Within::check_length`]) rather than a parse error.
    pub fn parse_unchecked(s: &str) -> Result<Within, String> {
        let bad = || {
            format!("{s:?} is not a duration such as 1y5m7d2h, 30d or 36h (y years, m months, d days, h hours)")
        };
        let mut w = Within::default();
        let mut seen = String::new();
        let mut digits = String::new();
        for c in s.trim_matches(|c: char| c.is_ascii_whitespace()).chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            if digits.is_empty() || seen.contains(c) || !"ymdh".contains(c) {
                return Err(bad());
            }
            // Only digits: a number that does not parse is too long for a u32.
            let n: u32 = digits.parse().unwrap_or(u32::MAX);
            digits.clear();
            seen.push(c);
            match c {
                'y' => w.years = n,
                'm' => w.months = n,
                'd' => w.days = n,
                _ => w.hours = n,
            }
        }
        if !digits.is_empty() || seen.is_empty() {
            return Err(bad());
        }
        Ok(w)
    }

    /// `Ok` when this duration is 10,000 years at most ([`MAX_WITHIN_MS`]). Errors: `is past
    /// 10,000 years, the longest duration accepted` (the caller names the value).
    pub fn check_length(&self) -> Result<(), String> {
        if self.length_ms() > MAX_WITHIN_MS {
            return Err("is past 10,000 years, the longest duration accepted".into());
        }
        Ok(())
    }

    /// The nominal length in ms (years of 365.2425 days, months a twelfth of that); exact in
    /// u128 for any four u32 counts.
    fn length_ms(&self) -> u128 {
        u128::from(self.years) * YEAR_MS
            + u128::from(self.months) * MONTH_MS
            + u128::from(self.days) * DAY_MS as u128
            + u128::from(self.hours) * HOUR_MS as u128
    }

    /// `latest` (epoch ms) moved back by this duration: years and months on the calendar (a
    /// day past the month's end rolls over, as Go's `AddDate`), then days and hours. `None` when
    /// that moment is before the earliest epoch ms an i64 holds (every time is after it).
    /// Checked arithmetic throughout: any `latest` (a manifest's `created_at` is untrusted) and
    /// any duration, parsed or built, gives a time or `None`, never a wrapped one.
    pub fn before(&self, latest: i64) -> Option<i64> {
        let days = latest.div_euclid(DAY_MS);
        let time_of_day = latest.rem_euclid(DAY_MS);
        let (y, m, d) = civil_from_days(days);
        let months = (y.checked_mul(12)? + i64::from(m) - 1)
            .checked_sub(i64::from(self.years).checked_mul(12)?)?
            .checked_sub(i64::from(self.months))?;
        let (ny, nm) = (months.div_euclid(12), months.rem_euclid(12) as u32 + 1);
        let shifted = days_from_civil(ny, nm, 1)
            .checked_add(i64::from(d) - 1)?
            .checked_sub(i64::from(self.days))?;
        shifted
            .checked_mul(DAY_MS)?
            .checked_add(time_of_day)?
            .checked_sub(i64::from(self.hours).checked_mul(HOUR_MS)?)
    }
}

impl std::str::FromStr for Within {
    type Err = String;
    fn from_str(s: &str) -> Result<Within, String> {
        Within::parse(s)
    }
}

impl fmt::Display for Within {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut any = false;
        for (n, u) in [
            (self.years, 'y'),
            (self.months, 'm'),
            (self.days, 'd'),
            (self.hours, 'h'),
        ] {
            if n > 0 {
                write!(f, "{n}{u}")?;
                any = true;
            }
        }
        if !any {
            f.write_str("0h")?;
        }
        Ok(())
    }
}

impl Serialize for Within {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Within {
    /// Deserializes a duration as [`Within::parse_unchecked`] does (for `#[serde(deserialize_with)]`
    /// on configuration fields whose length [`Within::check_length`] checks afterwards).
    pub fn deserialize_unchecked<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Within>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| Within::parse_unchecked(&s))
            .transpose()
            .map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Within {
    /// [`Within::parse`]: the syntax and the 10,000-year limit.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Within, D::Error> {
        Within::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// The `--keep-*` rules of one `forget` (or the config's `retention:`). No rule set keeps
/// everything: [`Policy::is_empty`] is refused by the callers, as restic refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Policy {
    pub keep_last: Option<Count>,
    pub keep_daily: Option<Count>,
    pub keep_weekly: Option<Count>,
    pub keep_monthly: Option<Count>,
    pub keep_within: Option<Within>,
}

/// Why a backup is kept: the rule that keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// One of the `keep_last` newest.
    Last,
    /// The newest of its day, week or month; `oldest` when kept as the oldest backup while the
    /// rule had counts left.
    Bucket { rule: Bucket, oldest: bool },
    /// Newer than the newest backup minus the duration.
    Within(Within),
}

/// The calendar bucket rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Daily,
    Weekly,
    Monthly,
}

impl Bucket {
    /// The bucket of `ms` (epoch ms, UTC): `yyyymmdd`, ISO `yyyyww`, `yyyymm`.
    pub fn of(self, ms: i64) -> i64 {
        let days = ms.div_euclid(DAY_MS);
        let (y, m, d) = civil_from_days(days);
        match self {
            Bucket::Daily => y * 10_000 + i64::from(m) * 100 + i64::from(d),
            Bucket::Weekly => {
                let (iy, w) = iso_week(days);
                iy * 100 + i64::from(w)
            }
            Bucket::Monthly => y * 100 + i64::from(m),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Bucket::Daily => "daily",
            Bucket::Weekly => "weekly",
            Bucket::Monthly => "monthly",
        }
    }
}

/// ISO 8601 (year, week) of a day count since 1970-01-01 (weeks start on Monday; week 1 holds
/// the year's first Thursday), as Go's `Time.ISOWeek`.
pub fn iso_week(days: i64) -> (i64, u32) {
    // 1970-01-01 was a Thursday: weekday 0 = Monday.
    let weekday = (days + 3).rem_euclid(7);
    let thursday = days - weekday + 3;
    let (year, _, _) = civil_from_days(thursday);
    let week = (thursday - days_from_civil(year, 1, 1)) / 7 + 1;
    (year, week as u32)
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Last => f.write_str("last"),
            Reason::Bucket {
                rule,
                oldest: false,
            } => f.write_str(rule.name()),
            Reason::Bucket { rule, oldest: true } => write!(f, "oldest {}", rule.name()),
            Reason::Within(w) => write!(f, "within {w}"),
        }
    }
}

impl Policy {
    /// True when no rule is given (or every count and the duration are 0): such a policy would
    /// remove everything, so it is refused (restic: "no policy was specified, no snapshots will
    /// be removed").
    pub fn is_empty(&self) -> bool {
        let zero = |c: Option<Count>| c.is_none_or(Count::is_zero);
        zero(self.keep_last)
            && zero(self.keep_daily)
            && zero(self.keep_weekly)
            && zero(self.keep_monthly)
            && self.keep_within.is_none_or(|w| w == Within::default())
    }

    /// `keep-last 3, keep-daily 7, keep-within 30d`, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (name, c) in [
            ("keep-last", self.keep_last),
            ("keep-daily", self.keep_daily),
            ("keep-weekly", self.keep_weekly),
            ("keep-monthly", self.keep_monthly),
        ] {
            if let Some(c) = c {
                parts.push(format!("{name} {c}"));
            }
        }
        if let Some(w) = self.keep_within {
            parts.push(format!("keep-within {w}"));
        }
        parts.join(", ")
    }

    /// Applies the rules to backups given by their `created_at` (epoch ms), in any order.
    /// Returns, for each input in the input's order, the rules that keep it (empty: removed).
    /// Ties in `created_at` keep the input order (earlier input is taken as newer).
    pub fn apply(&self, created: &[i64]) -> Vec<Vec<Reason>> {
        let mut order: Vec<usize> = (0..created.len()).collect();
        order.sort_by(|&a, &b| created[b].cmp(&created[a]).then(a.cmp(&b)));
        let mut reasons = vec![Vec::new(); created.len()];
        let Some(&newest) = order.first() else {
            return reasons;
        };
        // A zero duration is no rule (restic: an empty `Duration`), not "keep nothing".
        let within = self.keep_within.filter(|w| *w != Within::default());
        // `Some(None)`: before every representable time, so every backup is within.
        let within_after = within.map(|w| w.before(created[newest]));
        let mut buckets: Vec<(Bucket, Count, Option<i64>)> = [
            (Bucket::Daily, self.keep_daily),
            (Bucket::Weekly, self.keep_weekly),
            (Bucket::Monthly, self.keep_monthly),
        ]
        .into_iter()
        .filter_map(|(b, c)| c.map(|c| (b, c, None)))
        .collect();
        let last = order.len() - 1;
        for (nr, &i) in order.iter().enumerate() {
            let t = created[i];
            let r = &mut reasons[i];
            match self.keep_last {
                Some(Count::Unlimited) => r.push(Reason::Last),
                Some(Count::N(n)) if nr < n as usize => r.push(Reason::Last),
                _ => {}
            }
            for (rule, count, seen) in buckets.iter_mut() {
                if count.is_zero() {
                    continue;
                }
                let val = rule.of(t);
                let new_bucket = *seen != Some(val);
                if new_bucket || nr == last {
                    r.push(Reason::Bucket {
                        rule: *rule,
                        oldest: !new_bucket,
                    });
                    *seen = Some(val);
                    if let Count::N(n) = count {
                        *n -= 1;
                    }
                }
            }
            if let (Some(w), Some(after)) = (within, within_after) {
                if after.is_none_or(|a| t > a) {
                    r.push(Reason::Within(w));
                }
            }
        }
        reasons
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
