//! The MoltLock fault-injection suite: worker processes contend on one key
//! through a real store while the test kills, pauses or cuts them off, or
//! restarts the store; a checker then proves the lock contract held.
//!
//! - [`service`]: the checker's TCP service run by the test process — a
//!   fenced resource (`write <fence> <worker>` → `ok` / `stale`) and the
//!   shared log of critical sections and events.
//! - [`proxy`]: a loopback TCP proxy that passes, drops, stalls or delays
//!   the traffic between a worker and its store.
//! - [`check`]: the analysis — overlapping valid sections, stale writes
//!   accepted, duplicate fences.
//! - [`workers`]: worker processes and the harness that runs them;
//!   [`scenarios`]: the faults; [`report`]: outcomes and the report table
//!   ([`harness`] names all three).
//! - [`Reporter`]: the worker's side of the service protocol (used by the
//!   `fault-worker` binary).

pub mod check;
pub mod harness;
pub mod proxy;
pub mod report;
pub mod scenarios;
pub mod service;
pub mod workers;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Nanoseconds of the machine's monotonic clock (`CLOCK_MONOTONIC`): shared
/// by every process of the machine, so sections of different workers can be
/// compared, and untouched when a test steps the wall clock of a worker.
pub fn now_ns() -> u128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u128::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u128::try_from(t.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// A worker's connection to the checker's service.
pub struct Reporter {
    id: String,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Reporter {
    /// Connects to the service at `addr` as worker `id` (no spaces).
    ///
    /// # Errors
    /// When the service cannot be reached.
    pub async fn connect(addr: &str, id: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("checker service {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        Ok(Self {
            id: id.replace(' ', "_"),
            reader: BufReader::new(r),
            writer: w,
        })
    }

    async fn call(&mut self, line: String) -> Result<String, String> {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("checker service: {e}"))?;
        let mut reply = String::new();
        let n = self
            .reader
            .read_line(&mut reply)
            .await
            .map_err(|e| format!("checker service: {e}"))?;
        if n == 0 {
            return Err("checker service closed the connection".into());
        }
        Ok(reply.trim().to_owned())
    }

    /// Writes to the fenced resource; `true` when it accepted the write.
    ///
    /// # Errors
    /// When the service cannot be reached or answers nonsense.
    pub async fn write(&mut self, fence: u64) -> Result<bool, String> {
        let reply = self.call(format!("write {fence} {}", self.id)).await?;
        match reply.as_str() {
            "ok" => Ok(true),
            "stale" => Ok(false),
            other => Err(format!("the fenced resource said {other:?}")),
        }
    }

    /// Reports an event (`acquired`, `lost`, `pausing`, …) at wall time `t`.
    ///
    /// # Errors
    /// When the service cannot be reached.
    pub async fn event(
        &mut self,
        kind: &str,
        fence: u64,
        t: u128,
        note: &str,
    ) -> Result<(), String> {
        let note = note.replace(['\n', '\r'], " ");
        self.call(format!("event {} {kind} {fence} {t} {note}", self.id))
            .await
            .map(drop)
    }

    /// Reports a finished critical section.
    ///
    /// # Errors
    /// When the service cannot be reached.
    pub async fn section(&mut self, s: &SectionReport) -> Result<(), String> {
        self.call(format!("section {} {}", self.id, s.words()))
            .await
            .map(drop)
    }
}

/// What a worker reports of one critical section.
#[derive(Clone, Copy, Debug)]
pub struct SectionReport {
    /// The fence of the hold.
    pub fence: u64,
    /// Start (wall ns).
    pub start: u128,
    /// End (wall ns).
    pub end: u128,
    /// The last instant the worker saw its hold valid.
    pub last_held: u128,
    /// Whether the hold was valid before and after the section.
    pub valid: bool,
    /// Whether the first write was accepted.
    pub first_write: bool,
    /// Whether the second (possibly late) write was accepted.
    pub second_write: bool,
}

impl SectionReport {
    /// The report as the service's protocol carries it: eight numbers
    /// separated by spaces (flags as 0 or 1).
    pub fn words(&self) -> String {
        let b = |x: bool| u8::from(x);
        format!(
            "{} {} {} {} {} {} {}",
            self.fence,
            self.start,
            self.end,
            self.last_held,
            b(self.valid),
            b(self.first_write),
            b(self.second_write)
        )
    }

    /// Reads what [`words`](Self::words) wrote; `None` if malformed.
    pub fn parse(words: &[&str]) -> Option<Self> {
        let num = |i: usize| words.get(i).and_then(|s| s.parse::<u128>().ok());
        let flag = |i: usize| num(i).map(|v| v == 1);
        Some(Self {
            fence: u64::try_from(num(0)?).ok()?,
            start: num(1)?,
            end: num(2)?,
            last_held: num(3)?,
            valid: flag(4)?,
            first_write: flag(5)?,
            second_write: flag(6)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::SectionReport;

    #[test]
    fn section_report_reads_back_what_it_writes() {
        let r = SectionReport {
            fence: 7,
            start: 10,
            end: 20,
            last_held: 19,
            valid: false,
            first_write: true,
            second_write: false,
        };
        let text = r.words();
        let words: Vec<&str> = text.split(' ').collect();
        let back = SectionReport::parse(&words).unwrap();
        assert_eq!(back.words(), text);
        assert!(SectionReport::parse(&words[..6]).is_none());
        assert!(SectionReport::parse(&["x"; 7]).is_none());
    }
}
