//! Durations, parsed in one place: the forms of the `humantime` crate
//! (`90s`, `1h30m`, `250ms`, `2m 30s`, `0`), and a bare number of seconds.

use std::time::Duration;

/// Parses a duration.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}; try 90s, 1h30m or 250ms)"))
}

/// Formats a duration briefly: `850ms`, `29.5s`, `4m05s`, `2h10m`.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_type() {
        let cases = [
            ("30s", 30_000),
            ("30", 30_000),
            ("90s", 90_000),
            ("1h30m", 5_400_000),
            ("250ms", 250),
            ("2m 30s", 150_000),
            ("0", 0),
            ("1h", 3_600_000),
        ];
        for (s, ms) in cases {
            assert_eq!(parse(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        for bad in ["", "s", "10x", "-1s", "1.5.5s"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn formats_briefly() {
        assert_eq!(format(Duration::from_millis(850)), "850ms");
        assert_eq!(format(Duration::from_millis(12_300)), "12.3s");
        assert_eq!(format(Duration::from_secs(245)), "4m05s");
        assert_eq!(format(Duration::from_secs(7800)), "2h10m");
    }
}
