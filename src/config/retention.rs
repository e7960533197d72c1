//! The `retention:` section of a backup configuration (issue 23, item 1): `forget`'s rules,
//! applied after each successful backup (`crate::retention`). Checked here: the section belongs
//! to mode backup and keeps something.

use crate::error::{Error, Result};
use crate::retention::policy::{Count, Policy, Within};
use crate::retention::{Options, DEFAULT_PRUNE_GRACE};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The configuration's `retention:` section: the same rules as `forget`, applied after each
/// successful backup (docs/retention.md "Retention (forget)"). Counts are whole numbers or `unlimited`;
/// `keep_within` and `prune_grace` are restic durations (`30d`, `1y6m`, `36h`), at most
/// 10,000 years: a longer one fails the
/// configuration's loading with `Configuration error: ...` (exit 2), as on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Keep the N newest completed backups: a whole number, or `unlimited` (also `-1`): all.
    #[schemars(schema_with = "super::schema::count")]
    pub keep_last: Option<Count>,
    /// Keep the newest backup of each of the N last days (UTC) that have one: a whole number,
    /// or `unlimited` (also `-1`).
    #[schemars(schema_with = "super::schema::count")]
    pub keep_daily: Option<Count>,
    /// Keep the newest backup of each of the N last ISO weeks that have one: a whole number,
    /// or `unlimited` (also `-1`).
    #[schemars(schema_with = "super::schema::count")]
    pub keep_weekly: Option<Count>,
    /// Keep the newest backup of each of the N last months that have one: a whole number, or
    /// `unlimited` (also `-1`).
    #[schemars(schema_with = "super::schema::count")]
    pub keep_monthly: Option<Count>,
    /// Keep every backup newer than this duration before the newest (`30d`, `1y6m`, `36h`).
    #[serde(deserialize_with = "Within::deserialize_unchecked")]
    #[schemars(schema_with = "super::schema::duration")]
    pub keep_within: Option<Within>,
    /// Remove interrupted backups older than the newest completed one.
    pub prune_interrupted: bool,
    /// Delete orphaned objects older than `prune_grace`.
    pub prune: bool,
    /// Orphans younger than this are left alone; default 24h.
    #[serde(deserialize_with = "Within::deserialize_unchecked")]
    #[schemars(schema_with = "super::schema::duration")]
    #[schemars(extend("default" = "24h"))]
    pub prune_grace: Option<Within>,
}

impl RetentionConfig {
    /// The [`Options`] of this section (never a dry run).
    ///
    /// Errors: `Configuration error: retention: no keep_* rule ...` when it keeps nothing;
    /// `Configuration error: retention.keep_within: 1000000000y is past 10,000 years ...`
    /// (or `prune_grace`) for a duration longer than [`crate::retention::policy::MAX_WITHIN_MS`].
    pub fn options(&self) -> Result<Options> {
        for (field, w) in [
            ("keep_within", self.keep_within),
            ("prune_grace", self.prune_grace),
        ] {
            if let Some(w) = w {
                w.check_length()
                    .map_err(|e| Error::Config(format!("retention.{field}: {w} {e}")))?;
            }
        }
        let policy = Policy {
            keep_last: self.keep_last,
            keep_daily: self.keep_daily,
            keep_weekly: self.keep_weekly,
            keep_monthly: self.keep_monthly,
            keep_within: self.keep_within,
        };
        if policy.is_empty() {
            return Err(Error::Config(
                "retention: no keep_last, keep_daily, keep_weekly, keep_monthly (above 0) or keep_within is set, so every backup would be removed: set at least one".into(),
            ));
        }
        Ok(Options {
            policy,
            dry_run: false,
            prune_interrupted: self.prune_interrupted,
            prune: self.prune,
            prune_grace: self.prune_grace.unwrap_or(DEFAULT_PRUNE_GRACE),
        })
    }
}
