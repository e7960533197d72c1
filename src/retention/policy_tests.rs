use super::*;
use crate::run::units::days_from_civil;

/// Epoch ms of a UTC date and hour.
fn at(y: i64, m: u32, d: u32, h: i64) -> i64 {
    days_from_civil(y, m, d) * DAY_MS + h * HOUR_MS
}

fn kept(p: &Policy, created: &[i64]) -> Vec<bool> {
    p.apply(created).iter().map(|r| !r.is_empty()).collect()
}

fn labels(p: &Policy, created: &[i64]) -> Vec<String> {
    p.apply(created)
        .iter()
        .map(|r| {
            r.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

#[test]
fn counts_and_durations_parse_as_restic_writes_them() {
    assert_eq!(Count::parse("7"), Ok(Count::N(7)));
    assert_eq!(Count::parse("unlimited"), Ok(Count::Unlimited));
    assert_eq!(Count::parse("-1"), Ok(Count::Unlimited));
    assert!(Count::parse("-2").is_err() && Count::parse("x").is_err());
    assert_eq!(
        Within::parse("1y5m7d2h"),
        Ok(Within {
            years: 1,
            months: 5,
            days: 7,
            hours: 2
        })
    );
    assert_eq!(Within::parse("36h").unwrap().to_string(), "36h");
    assert_eq!(Within::parse("2h30d").unwrap().to_string(), "30d2h");
    for bad in ["", "5", "d", "1w", "1d1d", "1.5d", "-1d", "1d "] {
        if bad == "1d " {
            assert!(Within::parse(bad).is_ok(), "trailing space is trimmed");
            continue;
        }
        let e = Within::parse(bad).unwrap_err();
        assert!(e.contains("1y5m7d2h"), "{bad}: {e}");
    }
}

#[test]
fn an_empty_policy_is_refused() {
    assert!(Policy::default().is_empty());
    let zero = Policy {
        keep_last: Some(Count::N(0)),
        keep_daily: Some(Count::N(0)),
        ..Policy::default()
    };
    assert!(zero.is_empty());
    let zero_within = Policy {
        keep_within: Some(Within::parse("0d").unwrap()),
        ..Policy::default()
    };
    assert!(zero_within.is_empty());
    let with_last = Policy {
        keep_last: Some(Count::N(1)),
        ..zero_within
    };
    assert_eq!(
        kept(&with_last, &[0, 1]),
        [false, true],
        "0d keeps nothing more"
    );
    let p = Policy {
        keep_within: Some(Within::parse("1h").unwrap()),
        ..Policy::default()
    };
    assert!(!p.is_empty());
    assert_eq!(p.describe(), "keep-within 1h");
}

#[test]
fn iso_weeks_match_go() {
    let w = |y, m, d| iso_week(days_from_civil(y, m, d));
    assert_eq!(
        w(2021, 1, 3),
        (2020, 53),
        "a Sunday in the last week of 2020"
    );
    assert_eq!(w(2021, 1, 4), (2021, 1), "the Monday after");
    assert_eq!(w(2024, 12, 30), (2025, 1), "a Monday counted in 2025");
    assert_eq!(w(2026, 11, 26), (2026, 48));
    assert_eq!(w(1970, 1, 1), (1970, 1));
    assert_eq!(w(2027, 1, 1), (2026, 53));
}

#[test]
fn keep_last_keeps_the_newest_n_in_any_input_order() {
    let created = [
        at(2026, 1, 3, 0),
        at(2026, 1, 1, 0),
        at(2026, 1, 5, 0),
        at(2026, 1, 4, 0),
    ];
    let p = Policy {
        keep_last: Some(Count::N(2)),
        ..Policy::default()
    };
    assert_eq!(kept(&p, &created), [false, false, true, true]);
    let all = Policy {
        keep_last: Some(Count::Unlimited),
        ..Policy::default()
    };
    assert_eq!(kept(&all, &created), [true; 4]);
    assert!(p.apply(&[]).is_empty());
}

#[test]
fn keep_daily_keeps_the_newest_of_each_of_the_last_days_that_have_backups() {
    // Three backups a day on Jan 1, 2, 4 and 5 (none on Jan 3).
    let mut created = Vec::new();
    for d in [1, 2, 4, 5] {
        for h in [1, 9, 17] {
            created.push(at(2026, 1, d, h));
        }
    }
    let p = Policy {
        keep_daily: Some(Count::N(3)),
        ..Policy::default()
    };
    let k = kept(&p, &created);
    let want: Vec<bool> = created
        .iter()
        .map(|&t| [at(2026, 1, 5, 17), at(2026, 1, 4, 17), at(2026, 1, 2, 17)].contains(&t))
        .collect();
    assert_eq!(k, want, "the day without backups does not count");
    // More days asked than there are: every day's newest, and the oldest backup too.
    let p = Policy {
        keep_daily: Some(Count::N(10)),
        ..Policy::default()
    };
    let l = labels(&p, &created);
    assert_eq!(l[0], "oldest daily", "Jan 1 01:00, the oldest");
    assert_eq!(l[2], "daily", "Jan 1 17:00");
    assert_eq!(l[1], "", "Jan 1 09:00");
    assert_eq!(kept(&p, &created).iter().filter(|k| **k).count(), 5);
}

#[test]
fn a_rule_with_no_count_left_does_not_keep_the_oldest() {
    let created = [at(2026, 1, 1, 1), at(2026, 1, 1, 2), at(2026, 1, 2, 1)];
    let p = Policy {
        keep_daily: Some(Count::N(2)),
        ..Policy::default()
    };
    assert_eq!(kept(&p, &created), [false, true, true]);
}

#[test]
fn keep_weekly_uses_iso_weeks_starting_on_monday() {
    // Sun Jan 4 2026 ends ISO week 1; Mon Jan 5 starts week 2.
    let created = [
        at(2026, 1, 3, 12),  // Sat, week 1
        at(2026, 1, 4, 12),  // Sun, week 1 (newest of week 1)
        at(2026, 1, 5, 12),  // Mon, week 2
        at(2026, 1, 11, 12), // Sun, week 2 (newest of week 2)
        at(2026, 1, 12, 12), // Mon, week 3
    ];
    let p = Policy {
        keep_weekly: Some(Count::N(3)),
        ..Policy::default()
    };
    assert_eq!(kept(&p, &created), [false, true, false, true, true]);
    let two = Policy {
        keep_weekly: Some(Count::N(2)),
        ..Policy::default()
    };
    assert_eq!(kept(&two, &created), [false, false, false, true, true]);
}

#[test]
fn keep_monthly_keeps_the_newest_of_each_month() {
    let created = [
        at(2025, 11, 30, 23),
        at(2025, 12, 1, 0),
        at(2025, 12, 31, 23),
        at(2026, 1, 1, 0),
        at(2026, 1, 15, 0),
        at(2026, 3, 2, 0),
    ];
    let p = Policy {
        keep_monthly: Some(Count::N(3)),
        ..Policy::default()
    };
    assert_eq!(kept(&p, &created), [false, false, true, false, true, true]);
    let u = Policy {
        keep_monthly: Some(Count::Unlimited),
        ..Policy::default()
    };
    assert_eq!(kept(&u, &created), [true, false, true, false, true, true]);
}

#[test]
fn keep_within_is_relative_to_the_newest_backup_and_strict() {
    let newest = at(2026, 3, 10, 12);
    let created = [
        newest,
        newest - 2 * DAY_MS,     // exactly at the cut: not kept (restic: After)
        newest - 2 * DAY_MS + 1, // just inside
        newest - 30 * DAY_MS,
    ];
    let p = Policy {
        keep_within: Some(Within::parse("2d").unwrap()),
        ..Policy::default()
    };
    assert_eq!(kept(&p, &created), [true, false, true, false]);
    assert_eq!(labels(&p, &created)[0], "within 2d");
}

#[test]
fn keep_within_moves_months_on_the_calendar_like_go() {
    let w = |s| Within::parse(s).unwrap();
    // Mar 31 minus one month is "Feb 31", which Go normalises to Mar 3 (2026 is not leap).
    assert_eq!(w("1m").before(at(2026, 3, 31, 5)), Some(at(2026, 3, 3, 5)));
    assert_eq!(w("1y").before(at(2024, 2, 29, 0)), Some(at(2023, 3, 1, 0)));
    assert_eq!(
        w("1y2m3d4h").before(at(2026, 5, 10, 6)),
        Some(at(2025, 3, 7, 2))
    );
    assert_eq!(
        w("13m").before(at(2026, 1, 15, 0)),
        Some(at(2024, 12, 15, 0))
    );
}

#[test]
fn the_union_of_the_rules_is_kept_with_every_reason() {
    let created = [
        at(2026, 1, 1, 10),
        at(2026, 1, 2, 10),
        at(2026, 1, 3, 9),
        at(2026, 1, 3, 10),
        at(2026, 2, 1, 10),
    ];
    let p = Policy {
        keep_last: Some(Count::N(1)),
        keep_daily: Some(Count::N(2)),
        keep_monthly: Some(Count::N(2)),
        keep_within: Some(Within::parse("1d").unwrap()),
        ..Policy::default()
    };
    assert_eq!(
        labels(&p, &created),
        ["", "", "", "daily,monthly", "last,daily,monthly,within 1d"]
    );
}

/// A second, independent statement of the bucket rules (group, sort the groups, take the
/// newest of the first `n`, plus the oldest backup when fewer than `n` groups), compared with
/// [`Policy::apply`] on many generated histories.
#[test]
fn bucket_rules_agree_with_a_reference_on_generated_histories() {
    let mut seed = 0x2545_f491_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..400 {
        let len = (next() % 30) as usize;
        let start = at(2025, 12, 20, 0);
        let created: Vec<i64> = (0..len)
            .map(|_| start + (next() % (120 * DAY_MS as u64)) as i64)
            .collect();
        for rule in [Bucket::Daily, Bucket::Weekly, Bucket::Monthly] {
            let n = (next() % 8) as u32;
            let p = Policy {
                keep_daily: (rule == Bucket::Daily).then_some(Count::N(n)),
                keep_weekly: (rule == Bucket::Weekly).then_some(Count::N(n)),
                keep_monthly: (rule == Bucket::Monthly).then_some(Count::N(n)),
                ..Policy::default()
            };
            // Reference: newest of each bucket, the n newest buckets.
            let mut order: Vec<usize> = (0..len).collect();
            order.sort_by(|&a, &b| created[b].cmp(&created[a]).then(a.cmp(&b)));
            let mut want = vec![false; len];
            let mut buckets: Vec<i64> = Vec::new();
            for &i in &order {
                let b = rule.of(created[i]);
                if !buckets.contains(&b) {
                    buckets.push(b);
                    if buckets.len() <= n as usize {
                        want[i] = true;
                    }
                }
            }
            if n > 0 && buckets.len() < n as usize {
                if let Some(&oldest) = order.last() {
                    want[oldest] = true;
                }
            }
            assert_eq!(
                kept(&p, &created),
                want,
                "round {round} {rule:?} {n} {created:?}"
            );
        }
    }
}

/// Issue 31, item 3: a duration is at most 10,000 years (365.2425 days each, the Gregorian
/// year: 315,569,520,000,000 ms); past it, or past what a number can hold at any unit, it is
/// refused, never wrapped.
#[test]
fn durations_past_ten_thousand_years_are_refused() {
    for ok in [
        "10000y",
        "120000m",
        "3652425d",
        "87658200h",
        "9999y12m",
        "9999y11m30d10h",
    ] {
        assert!(Within::parse(ok).is_ok(), "{ok} is 10,000 years at most");
    }
    for past in [
        "10001y",
        "120001m",
        "3652426d",
        "87658201h",
        "10000y1h",
        "9999y12m1h",
        "1000000000y",
        "4294967295y",
        "4294967296y",
        "4294967296m",
        "4294967296d",
        "4294967296h",
        "18446744073709551616y",
        "99999999999999999999999999999h",
        "4294967295y4294967295m4294967295d4294967295h",
    ] {
        let e = Within::parse(past).unwrap_err();
        assert!(e.contains("10,000 years"), "{past}: {e}");
    }
    // The longest duration still moves a time back without wrapping, at both ends of time.
    let longest = Within::parse("10000y").unwrap();
    assert_eq!(
        longest.before(at(2026, 1, 1, 0)),
        Some(at(-7974, 1, 1, 0)),
        "calendar years"
    );
    for w in ["10000y", "120000m", "3652425d", "87658200h"] {
        let w = Within::parse(w).unwrap();
        assert_eq!(w.before(i64::MIN), None, "{w} before the earliest time");
        assert!(w.before(i64::MAX).is_some_and(|t| t < i64::MAX), "{w}");
        assert!(w.before(0).is_some_and(|t| t < 0), "{w}");
    }
    // A duration built in code (not parsed) at the counters' limits never wraps either.
    let huge = Within {
        years: u32::MAX,
        months: u32::MAX,
        days: u32::MAX,
        hours: u32::MAX,
    };
    for t in [i64::MIN, -1, 0, at(2026, 1, 1, 0), i64::MAX] {
        assert!(huge.before(t).is_none_or(|b| b < t), "{t}");
    }
    // Every backup within 10,000 years of the newest is kept, the newest always.
    let p = Policy {
        keep_within: Some(longest),
        ..Policy::default()
    };
    let created = [at(2026, 1, 1, 0), at(1970, 1, 1, 0), i64::MIN + 1];
    assert_eq!(kept(&p, &created), [true, true, false]);
}
