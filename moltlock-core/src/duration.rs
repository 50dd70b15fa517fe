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
    Error::Config(format!("{name}={}", not_a_duration(text)))
}

/// Why `text` was refused, without the option's name.
fn not_a_duration(text: &str) -> String {
    format!("{text:?} is not a duration: write a whole number and a unit, e.g. 250ms, 5s, 2m or 1h")
}

/// Reads a duration written as [`parse_duration`] reads it (`"250ms"`,
/// `"5s"`, `"2m"`, `"1h"`) from any serde format, for
/// `#[serde(deserialize_with = "moltlock_core::duration::deserialize")]` on
/// a `Duration` field of an application's own settings.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(serde::Deserialize)]
/// struct Job {
///     #[serde(deserialize_with = "moltlock_core::duration::deserialize")]
///     every: Duration,
/// }
/// let job: Job = serde_json::from_str(r#"{"every": "2m"}"#).unwrap();
/// assert_eq!(job.every, Duration::from_secs(120));
/// assert!(serde_json::from_str::<Job>(r#"{"every": "2 minutes"}"#).is_err());
/// ```
///
/// # Errors
/// The format's error, saying what a duration looks like, for anything
/// but such a string.
#[cfg(feature = "serde")]
pub fn deserialize<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"250ms\", \"5s\", \"2m\" or \"1h\"")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration("duration", text).map_err(|_| E::custom(not_a_duration(text)))
        }
    }
    de.deserialize_str(Text)
}

/// [`deserialize`] for an `Option<Duration>` field: with
/// `#[serde(default, deserialize_with = "moltlock_core::duration::deserialize_option")]`
/// a missing field is `None` and a present one must be a duration.
///
/// # Errors
/// As [`deserialize`].
#[cfg(feature = "serde")]
pub fn deserialize_option<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize(de).map(Some)
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
