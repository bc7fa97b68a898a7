#![doc = include_str!("../README.md")]

#[cfg(feature = "system-clock")]
pub mod now;

/// RFC 3339 with any offset and fraction to UTC Unix seconds. None when it does not parse.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            let o = rest.get(1..)?;
            let (oh, om) = o.split_once(':')?;
            if oh.len() != 2 || om.len() != 2 {
                return None;
            }
            let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset)
}

/// UTC Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if !(0..=9999).contains(&y) {
        return format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z");
    }
    // The digits by hand: a dry-run stamps every status change with this, and the
    // formatting machinery was most of its cost.
    let mut out = *b"0000-00-00T00:00:00Z";
    let mut put = |at: usize, value: i64, width: usize| {
        let mut v = value;
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y, 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, hh, 2);
    put(14, mm, 2);
    put(17, ss, 2);
    out.iter().map(|&b| b as char).collect()
}

// Howard Hinnant's civil calendar algorithms: exact for every proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Milliseconds (as the clock capability gives them) as RFC 3339 UTC, to the second.
pub fn format_rfc3339_millis(ms: u64) -> String {
    format_rfc3339((ms / 1000) as i64)
}

/// Milliseconds as RFC 3339 UTC with them: `YYYY-MM-DDTHH:MM:SS.mmmZ` (audit lines).
pub fn format_rfc3339_with_millis(ms: u64) -> String {
    let seconds = format_rfc3339((ms / 1000) as i64);
    let whole = seconds.trim_end_matches('Z');
    format!("{whole}.{:03}Z", ms % 1000)
}

/// RFC 3339 to UTC Unix milliseconds (a fraction's first three digits; none before 1970).
pub fn parse_rfc3339_millis(s: &str) -> Option<u64> {
    let secs = u64::try_from(parse_rfc3339(s)?).ok()?;
    let frac = s
        .get(19..)
        .and_then(|r| r.strip_prefix('.'))
        .map(|f| {
            let digits: String = f.chars().take_while(char::is_ascii_digit).take(3).collect();
            format!("{digits:0<3}").parse::<u64>().unwrap_or(0)
        })
        .unwrap_or(0);
    Some(secs * 1000 + frac)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn milliseconds_go_there_and_back() {
        for ms in [0u64, 1, 999, 1_000, 1_765_134_123_456] {
            let text = format_rfc3339_with_millis(ms);
            assert_eq!(parse_rfc3339_millis(&text), Some(ms), "{text}");
        }
        assert_eq!(
            format_rfc3339_with_millis(1_765_134_123_456),
            "2025-12-07T19:02:03.456Z"
        );
        assert_eq!(
            parse_rfc3339_millis("2025-12-07T19:02:03.4Z"),
            Some(1_765_134_123_400)
        );
        assert_eq!(
            parse_rfc3339_millis("2025-12-07T19:02:03Z"),
            Some(1_765_134_123_000)
        );
        assert_eq!(parse_rfc3339_millis("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn formatting_matches_the_formatter_over_every_year_and_time_of_day() {
        let by_format = |secs: i64| {
            let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
            let rem = secs.rem_euclid(86_400);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                rem / 3600,
                rem % 3600 / 60,
                rem % 60
            )
        };
        // A second of every third day from year -1 to 10000 (drifting through the day), and
        // every second of one day.
        let first = days_from_civil(-1, 1, 1) * 86_400;
        let last = days_from_civil(10_001, 1, 1) * 86_400;
        let mut secs = first;
        while secs < last {
            assert_eq!(format_rfc3339(secs), by_format(secs));
            secs += 3 * 86_400 + 7;
        }
        for secs in 0..86_400 {
            assert_eq!(format_rfc3339(secs), by_format(secs));
        }
    }

    #[test]
    fn round_trips_and_offsets() {
        for s in [
            "1970-01-01T00:00:00Z",
            "2026-11-30T11:46:56Z",
            "2000-02-29T23:59:59Z",
        ] {
            assert_eq!(format_rfc3339(parse_rfc3339(s).unwrap()), s);
        }
        assert_eq!(
            parse_rfc3339("2026-01-01T04:05:06.789-08:00"),
            parse_rfc3339("2026-01-01T12:05:06Z")
        );
        assert_eq!(
            format_rfc3339_millis(1_767_225_600_999),
            "2026-01-01T00:00:00Z"
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00+0100",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
