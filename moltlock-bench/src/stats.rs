//! Latency samples and their summaries.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of durations, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The median.
    pub p50_us: f64,
    /// The 99th percentile.
    pub p99_us: f64,
    /// The largest sample.
    pub max_us: f64,
}

impl Summary {
    /// Summarises `samples` (sorted here).
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        Self {
            count: samples.len(),
            p50_us: micros(percentile(samples, 0.50)),
            p99_us: micros(percentile(samples, 0.99)),
            max_us: micros(samples.last().copied().unwrap_or_default()),
        }
    }
}

/// The `p`-quantile (0..=1) of sorted samples, nearest rank; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A duration in microseconds.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `a / b`, or zero when `b` is zero.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = Summary::of(&mut v);
        assert_eq!(s.count, 100);
        assert!((s.p50_us - 50.0).abs() < 1e-6);
        assert!((s.p99_us - 99.0).abs() < 1e-6);
        assert!((s.max_us - 100.0).abs() < 1e-6);
        assert_eq!(Summary::of(&mut []).count, 0);
    }
}
