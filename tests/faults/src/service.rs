//! The checker's service: a fenced resource and a shared log, one TCP
//! listener on 127.0.0.1 run by the test process.
//!
//! Line protocol, one reply line per request:
//!
//! - `write <fence> <worker>` → `ok` when `fence` is at least the highest
//!   fence accepted so far (which it then becomes), else `stale`. Every
//!   write is recorded with the instant the service decided it.
//! - `event <worker> <kind> <fence> <t_ns> [note]` → `ok`.
//! - `section <worker> <fence> <start_ns> <end_ns> <last_held_ns> <valid> <w1> <w2>`
//!   → `ok`.
//!
//! Requests of one connection are handled in order and the state is behind
//! one lock, so the resource is atomic.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::{now_ns, SectionReport};

/// One write the fenced resource decided on.
#[derive(Clone, Debug)]
pub struct Write {
    /// When the resource decided (wall ns).
    pub t: u128,
    /// The fence presented.
    pub fence: u64,
    /// The worker that wrote.
    pub worker: String,
    /// Whether it was accepted.
    pub accepted: bool,
}

/// One critical section a worker reported.
#[derive(Clone, Debug)]
pub struct Section {
    /// The worker.
    pub worker: String,
    /// What it reported.
    pub report: SectionReport,
}

/// One event a worker reported.
#[derive(Clone, Debug)]
pub struct Event {
    /// The worker.
    pub worker: String,
    /// `acquired`, `lost`, `pausing`, `resumed`, `released`, `error`, `done`.
    pub kind: String,
    /// The fence of the hold it concerns (0 when none).
    pub fence: u64,
    /// When it happened (wall ns, the worker's clock reading).
    pub t: u128,
    /// Free text (a lost reason, a pid, an error).
    pub note: String,
}

/// Everything the service recorded.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// The highest fence the resource accepted.
    pub highest: u64,
    /// Every write, in the order decided.
    pub writes: Vec<Write>,
    /// Every section reported.
    pub sections: Vec<Section>,
    /// Every event reported.
    pub events: Vec<Event>,
}

/// The running service.
#[derive(Clone)]
pub struct Service {
    /// Where workers reach it (`127.0.0.1:port`).
    pub addr: String,
    state: Arc<Mutex<Log>>,
}

impl Service {
    /// Binds a free loopback port and serves on the current tokio runtime.
    /// With `ignore_fences` the resource accepts every write — a broken
    /// resource, only for showing the checker catches it.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(ignore_fences: bool) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the checker service: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| e.to_string())?
            .to_string();
        let state = Arc::new(Mutex::new(Log::default()));
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, st.clone(), ignore_fences));
            }
        });
        Ok(Self { addr, state })
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        lock(&self.state)
    }

    /// A copy of everything recorded so far.
    pub fn log(&self) -> Log {
        self.lock().clone()
    }

    /// The first event (in arrival order) that satisfies `pred`.
    pub fn find_event(&self, pred: impl Fn(&Event) -> bool) -> Option<Event> {
        self.lock().events.iter().find(|e| pred(e)).cloned()
    }
}

fn lock(m: &Mutex<Log>) -> MutexGuard<'_, Log> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<Log>>, ignore_fences: bool) {
    let _ = stream.set_nodelay(true);
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = handle(&line, &state, ignore_fences);
        if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}

fn handle(line: &str, state: &Mutex<Log>, ignore_fences: bool) -> String {
    let f: Vec<&str> = line.splitn(6, ' ').collect();
    let num = |i: usize| f.get(i).and_then(|s| s.parse::<u128>().ok());
    match f.first().copied() {
        Some("write") => {
            let (Some(fence), Some(worker)) = (num(1), f.get(2)) else {
                return "error bad write".into();
            };
            let fence = u64::try_from(fence).unwrap_or(u64::MAX);
            let mut s = lock(state);
            let accepted = ignore_fences || fence >= s.highest;
            if accepted {
                s.highest = s.highest.max(fence);
            }
            s.writes.push(Write {
                t: now_ns(),
                fence,
                worker: (*worker).to_owned(),
                accepted,
            });
            if accepted { "ok" } else { "stale" }.into()
        }
        Some("event") => {
            let (Some(worker), Some(kind), Some(fence), Some(t)) =
                (f.get(1), f.get(2), num(3), num(4))
            else {
                return "error bad event".into();
            };
            lock(state).events.push(Event {
                worker: (*worker).to_owned(),
                kind: (*kind).to_owned(),
                fence: u64::try_from(fence).unwrap_or(u64::MAX),
                t,
                note: f.get(5).map(|s| (*s).to_owned()).unwrap_or_default(),
            });
            "ok".into()
        }
        Some("section") => {
            let f: Vec<&str> = line.split(' ').collect();
            let (Some(worker), Some(report)) = (
                f.get(1),
                SectionReport::parse(f.get(2..).unwrap_or_default()),
            ) else {
                return "error bad section".into();
            };
            lock(state).sections.push(Section {
                worker: (*worker).to_owned(),
                report,
            });
            "ok".into()
        }
        _ => "error unknown request".into(),
    }
}
