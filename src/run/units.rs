//! Numbers for people: byte sizes (`1.5 KiB`), counts with thousands separators (`1,234,567`)
//! and durations (`3m05s`), as `list`, `describe`, the summaries and the progress display
//! print them, and calendar dates of a day count (for `list` and HTTP `Date` headers). Pure
//! functions; nothing here reads a clock or a terminal.

use std::time::Duration;

/// Bytes as B, KiB, MiB, GiB, TiB with one decimal: `1023 B`, `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration to the second: `42s`, `3m05s`, `2h07m`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    }
}

/// Epoch milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Epoch ms as RFC 3339 UTC with milliseconds (`2026-11-25T10:58:06.123Z`).
pub fn rfc3339_ms(ms: i64) -> String {
    let date_time = format_ms(ms).replacen(' ', "T", 1);
    format!("{date_time}.{:03}Z", ms.rem_euclid(1000))
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01, proleptic Gregorian, UTC
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of [`civil_from_days`],
/// Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A point in time given on the command line, as epoch milliseconds: an integer is epoch ms
/// (`1764068286123`), anything else RFC 3339 (`2026-11-25T10:58:06Z`,
/// `2026-11-25T10:58:06.123+01:00`; `t`, `z` and a space for `T` accepted; fractions beyond
/// milliseconds are cut).
///
/// Errors: a sentence saying what was expected (the caller adds the option's name).
pub fn parse_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || {
        format!(
            "{s:?} is neither epoch milliseconds nor an RFC 3339 time such as 2026-11-25T10:58:06Z"
        )
    };
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<u32, String> {
        let part = s.get(r).ok_or_else(bad)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut i = 19;
    let mut millis = 0u32;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let digits = &s[start..i.min(start + 3)];
        millis = digits.parse::<u32>().map_err(|_| bad())? * 10u32.pow(3 - digits.len() as u32);
    }
    let offset_secs: i64 = match &s[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let oh = i64::from(num(i + 1..i + 3)?);
            let om = i64::from(num(i + 4..i + 6)?);
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(i64::from(y), mo, d);
    let secs =
        days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(sec) - offset_secs;
    Ok(secs * 1000 + i64::from(millis))
}

/// Renders rows under headers with columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                l.push_str(cell);
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_times() {
        assert_eq!(parse_time("1764068286123"), Ok(1_764_068_286_123));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
        assert_eq!(
            parse_time("2023-11-14t22:13:20.1234z"),
            Ok(1_700_000_000_123)
        );
        assert_eq!(
            parse_time("2023-11-14 23:13:20.5+01:00"),
            Ok(1_700_000_000_500)
        );
        assert_eq!(parse_time("1969-12-31T23:59:59.999Z"), Ok(-1));
        for bad in [
            "",
            "yesterday",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-13-14T22:13:20Z",
            "2023-11-14T22:13:20+0100",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        for days in [-800_000, -1, 0, 1, 59, 20_000, 3_000_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn formats() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(duration(Duration::from_secs(42)), "42s");
        assert_eq!(duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration(Duration::from_secs(7620)), "2h07m");
    }
}
