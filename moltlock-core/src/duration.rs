//! Durations in URLs and option strings, written one way everywhere: a
//! whole number and a unit, `250ms`, `5s`, `2m` or `1h`.

use std::time::Duration;

use crate::Error;

/// Parses `250ms`, `5s`, `2m` or `1h` (a whole number and a unit; `0s` is
/// zero). `name` is the option's name, for the error.
///
/// ```
/// use std::time::Duration;
/// use moltlock_core::parse_duration;
/// assert_eq!(parse_duration("connect_timeout", "250ms").unwrap(), Duration::from_millis(250));
/// assert_eq!(parse_duration("connect_timeout", "2m").unwrap(), Duration::from_secs(120));
/// assert!(parse_duration("connect_timeout", "5").is_err());
/// ```
///
/// # Errors
/// [`Error::Config`] naming the option when the text is not such a duration.
pub fn parse_duration(name: &str, text: &str) -> Result<Duration, Error> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad(name, text))?;
    let per_unit = match unit {
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(bad(name, text)),
    };
    u32::try_from(n)
        .ok()
        .and_then(|n| per_unit.checked_mul(n))
        .ok_or_else(|| bad(name, text))
}

fn bad(name: &str, text: &str) -> Error {
    Error::Config(format!(
        "{name}={text:?} is not a duration: write a whole number and a unit, e.g. 250ms, 5s, 2m or 1h"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_mistakes() {
        assert_eq!(parse_duration("t", "0s").ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_duration("t", "1h").ok(),
            Some(Duration::from_secs(3600))
        );
        for bad in ["", "s", "5", "5 s", "1.5s", "-1s", "5sec", "99999999999h"] {
            assert!(
                matches!(parse_duration("t", bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }
}
