//! Client CPU time and memory of this process, read from `/proc/self`.

use std::time::Duration;

/// Ticks per second of the `utime`/`stime` fields (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// User plus system CPU time consumed by this process so far, if known.
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) / USER_HZ))
}

/// The resident set size of this process in bytes, if known.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_proc() {
        assert!(super::rss_bytes().is_some_and(|b| b > 0));
        assert!(super::cpu_time().is_some());
    }
}
