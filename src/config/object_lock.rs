//! `storage.object_lock` (docs/protecting-backups.md "Protecting backups from deletion"): a retention date set on
//! every object a backup writes, so that nobody (with `compliance`), or nobody without the
//! right to bypass it (with `governance`), deletes or overwrites it before that date. The
//! backends apply it (`crate::repository::storage::object_lock`); this file only parses it.

use serde::{Deserialize, Deserializer};
use std::borrow::Cow;

/// `storage.object_lock`: the retention every object of a backup gets (S3 Object Lock, Azure
/// Blob version-level immutability, GCS object retention). The bucket or container must allow
/// it (S3: created with Object Lock; Azure: version-level immutability enabled; GCS: object
/// retention enabled). Run locks and checkpoint databases (keys under `{backup_id}/state/`),
/// which a run rewrites, are never locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectLockConfig {
    /// `governance` (S3 GOVERNANCE, Azure and GCS unlocked: an identity with the bypass right
    /// may still remove an object) or `compliance` (S3 COMPLIANCE, Azure and GCS locked: no one
    /// can, until the date).
    pub mode: LockMode,
    /// How long each object is kept from when it is written: a number and a unit, units `y`
    /// (365 days), `w`, `d`, `h`, `s`, each at most once (`30d`, `1y`, `2w3d`, `36h`).
    pub retain_for: RetainFor,
}

/// The object lock mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// Removable before the date only by an identity allowed to bypass governance retention.
    Governance,
    /// Removable before the date by no one, the account's root included.
    Compliance,
}

impl LockMode {
    /// `governance` or `compliance`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Governance => "governance",
            LockMode::Compliance => "compliance",
        }
    }
}

/// A retention period, in seconds (at least 1, at most 100 years).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainFor(pub u64);

/// The longest period accepted: 100 years of 365 days, in seconds.
pub const MAX_RETAIN_SECS: u64 = 100 * 365 * 86_400;

impl std::str::FromStr for RetainFor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("storage.object_lock.retain_for {s:?}: {why} (expected a number and a unit y, w, d, h or s, e.g. 30d)")
        };
        let mut total: u64 = 0;
        let mut seen = String::new();
        let mut num = String::new();
        for c in s.trim_matches(|c: char| c.is_ascii_whitespace()).chars() {
            if c.is_ascii_digit() {
                num.push(c);
                continue;
            }
            let unit: u64 = match c {
                'y' => 365 * 86_400,
                'w' => 7 * 86_400,
                'd' => 86_400,
                'h' => 3_600,
                's' => 1,
                'm' => return Err(bad("`m` is ambiguous (months or minutes): use d or h")),
                _ => return Err(bad("unknown unit")),
            };
            if num.is_empty() {
                return Err(bad("a unit without a number"));
            }
            if seen.contains(c) {
                return Err(bad("a unit given twice"));
            }
            seen.push(c);
            let n: u64 = num.parse().map_err(|_| bad("too large"))?;
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| bad("too large"))?;
            num.clear();
        }
        if !num.is_empty() {
            return Err(bad("a number without a unit"));
        }
        if total == 0 {
            return Err(bad("the period must be above 0"));
        }
        if total > MAX_RETAIN_SECS {
            return Err(bad("longer than 100 years"));
        }
        Ok(RetainFor(total))
    }
}

impl<'de> Deserialize<'de> for RetainFor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for RetainFor {
    fn schema_name() -> Cow<'static, str> {
        "RetainFor".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::try_from(serde_json::json!({
            "description": "A period above 0: numbers with units y (365 days), w, d, h, s, each unit at most once: `30d`, `1y`, `36h`; at most 100 years (a longer one is refused when the file is loaded).",
            "type": "string",
            "pattern": super::schema::units_pattern("ywdhs", true)
        }))
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_parse_with_their_units() {
        assert_eq!("30d".parse(), Ok(RetainFor(30 * 86_400)));
        assert_eq!("1y2w".parse(), Ok(RetainFor(365 * 86_400 + 14 * 86_400)));
        assert_eq!("36h".parse(), Ok(RetainFor(36 * 3_600)));
        assert_eq!("20s".parse(), Ok(RetainFor(20)));
        for bad in [
            "",
            "0d",
            "30",
            "d",
            "1m",
            "1d1d",
            "101y",
            "99999999999999999999d",
            "3x",
        ] {
            let e = bad.parse::<RetainFor>().unwrap_err();
            assert!(
                e.starts_with("storage.object_lock.retain_for"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_section_reads_from_yaml() {
        let c: ObjectLockConfig =
            serde_norway::from_str("mode: compliance\nretain_for: 30d\n").unwrap();
        assert_eq!(c.mode, LockMode::Compliance);
        assert_eq!(c.retain_for, RetainFor(30 * 86_400));
        assert!(
            serde_norway::from_str::<ObjectLockConfig>("mode: strict\nretain_for: 1d\n").is_err()
        );
        assert!(serde_norway::from_str::<ObjectLockConfig>("mode: governance\n").is_err());
    }
}
