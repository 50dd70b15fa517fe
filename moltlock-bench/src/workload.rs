//! The workloads: closed loops of lock → release cycles on distinct keys,
//! and contention on one key with a hand-off log and an overlap detector.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::time::Instant;

use crate::stats::{micros, Summary};

/// Something that can do one acquire + release of a free key.
#[async_trait]
pub trait Cycler: Send + Sync {
    /// Acquires the free key `key` and releases it.
    async fn cycle(&self, key: &str) -> Result<(), String>;
}

/// A lock client that can wait for a key.
#[async_trait]
pub trait Locker: Send + Sync {
    /// Waits at most `wait` for `key`; `None` when the wait ran out.
    async fn lock(&self, key: &str, wait: Duration) -> Result<Option<Box<dyn Holding>>, String>;

    /// Frees what the client holds in the store (leases, sessions).
    async fn close(&self) {}
}

/// A held lock.
#[async_trait]
pub trait Holding: Send {
    /// Releases it.
    async fn release(self: Box<Self>) -> Result<(), String>;

    /// The hold's fencing token, where the client gives one.
    fn fence(&self) -> Option<u64> {
        None
    }
}

/// Turns a [`Locker`] into a [`Cycler`].
pub struct LockerCycler(pub Arc<dyn Locker>);

#[async_trait]
impl Cycler for LockerCycler {
    async fn cycle(&self, key: &str) -> Result<(), String> {
        match self.0.lock(key, Duration::from_secs(10)).await? {
            Some(h) => h.release().await,
            None => Err(format!("the free key {key} was not acquired within 10 s")),
        }
    }
}

/// How long a measurement may run.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Wall-clock budget.
    pub duration: Duration,
    /// Most cycles in all tasks together.
    pub max_cycles: u64,
}

/// The throughput and latency of a closed loop.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LoopResult {
    /// Tasks running cycles at once.
    pub tasks: usize,
    /// Cycles completed.
    pub cycles: u64,
    /// Cycles per second, all tasks together.
    pub per_sec: f64,
    /// Latency of one cycle.
    pub latency: Summary,
}

/// Keys of the loops: each task rotates over its own small set, so keys are
/// distinct between tasks and the store does not fill up.
pub(crate) const KEYS_PER_TASK: u64 = 16;

/// Runs `tasks` tasks doing cycles on distinct keys `key(task, slot)` until
/// the bounds are reached.
///
/// # Errors
/// The first cycle error.
pub async fn closed_loop(
    cycler: Arc<dyn Cycler>,
    key: KeyFn,
    tasks: usize,
    bounds: Bounds,
) -> Result<LoopResult, String> {
    Ok(sample(&cycler, &key, tasks, bounds).await?.result())
}

/// The raw figures of one or more closed loops of the same shape.
#[derive(Default)]
struct Samples {
    tasks: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.tasks = other.tasks;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }

    fn result(mut self) -> LoopResult {
        let cycles = self.latencies.len() as u64;
        let secs = self.elapsed.as_secs_f64();
        LoopResult {
            tasks: self.tasks,
            cycles,
            per_sec: if secs > 0.0 {
                cycles as f64 / secs
            } else {
                0.0
            },
            latency: Summary::of(&mut self.latencies),
        }
    }
}

/// Measures two cyclers side by side (the floor and MoltLock), after a
/// short unmeasured warm-up of each. With one task, cycle by cycle (each
/// cycle of one followed by one of the other); with more, `rounds` rounds
/// of each, each a `rounds`-th of `bounds`, in the order A B B A A B B A
/// …. A machine that speeds up
/// or slows down during the measurement (other work on its cores, a
/// store's background flush) weighs on both alike, where two measurements
/// one after the other would put the whole drift into their ratio.
///
/// # Errors
/// The first cycle error.
pub async fn paired(
    a: (Arc<dyn Cycler>, KeyFn),
    b: (Arc<dyn Cycler>, KeyFn),
    tasks: usize,
    bounds: Bounds,
    rounds: u32,
) -> Result<(LoopResult, LoopResult), String> {
    let rounds = rounds.max(1);
    let slice = Bounds {
        duration: bounds.duration / rounds,
        max_cycles: (bounds.max_cycles / u64::from(rounds)).max(1),
    };
    let warm = Bounds {
        duration: slice.duration / 4,
        max_cycles: (slice.max_cycles / 4).max(1),
    };
    sample(&a.0, &a.1, tasks, warm).await?;
    sample(&b.0, &b.1, tasks, warm).await?;
    let (sa, sb) = match tasks {
        0 | 1 => alternate(&a, &b, bounds).await?,
        _ => in_rounds(&a, &b, tasks, slice, rounds).await?,
    };
    Ok((sa.result(), sb.result()))
}

/// `rounds` rounds of `slice` each of `a` and `b`, in the order A B B A
/// A B B A ….
async fn in_rounds(
    a: &(Arc<dyn Cycler>, KeyFn),
    b: &(Arc<dyn Cycler>, KeyFn),
    tasks: usize,
    slice: Bounds,
    rounds: u32,
) -> Result<(Samples, Samples), String> {
    let (mut sa, mut sb) = (Samples::default(), Samples::default());
    for round in 0..rounds {
        if round % 2 == 0 {
            sa.add(sample(&a.0, &a.1, tasks, slice).await?);
            sb.add(sample(&b.0, &b.1, tasks, slice).await?);
        } else {
            sb.add(sample(&b.0, &b.1, tasks, slice).await?);
            sa.add(sample(&a.0, &a.1, tasks, slice).await?);
        }
    }
    Ok((sa, sb))
}

/// One task running a cycle of `a` and a cycle of `b` in turn (A B, then
/// B A, so neither always follows the other), each cycle timed on its own:
/// a drift of the machine's speed over any span longer than two cycles
/// weighs on both alike, which rounds of a second or so cannot promise on
/// a shared machine. Each one's rate is its cycles over the time its own
/// cycles took.
async fn alternate(
    a: &(Arc<dyn Cycler>, KeyFn),
    b: &(Arc<dyn Cycler>, KeyFn),
    bounds: Bounds,
) -> Result<(Samples, Samples), String> {
    let deadline = Instant::now() + bounds.duration;
    let pairs = (bounds.max_cycles / 2).max(1);
    let (mut sa, mut sb) = (Samples::default(), Samples::default());
    let mut i = 0u64;
    while i < pairs && Instant::now() < deadline {
        let slot = i % KEYS_PER_TASK;
        let mut turn = [(a, &mut sa), (b, &mut sb)];
        if i % 2 == 1 {
            turn.reverse();
        }
        for ((cycler, key), into) in turn {
            let k = key(0, slot);
            let t0 = Instant::now();
            cycler.cycle(&k).await?;
            let took = t0.elapsed();
            into.elapsed += took;
            into.latencies.push(took);
        }
        i += 1;
    }
    sa.tasks = 1;
    sb.tasks = 1;
    Ok((sa, sb))
}

/// Names the key of a task's slot.
pub type KeyFn = Arc<dyn Fn(usize, u64) -> String + Send + Sync>;

async fn sample(
    cycler: &Arc<dyn Cycler>,
    key: &KeyFn,
    tasks: usize,
    bounds: Bounds,
) -> Result<Samples, String> {
    let tasks = tasks.max(1);
    let per_task = (bounds.max_cycles / tasks as u64).max(1);
    let started = Instant::now();
    let deadline = started + bounds.duration;
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (cycler, key) = (cycler.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task.min(100_000) as usize);
            let mut i = 0u64;
            while i < per_task && Instant::now() < deadline {
                let k = key(t, i % KEYS_PER_TASK);
                let t0 = Instant::now();
                cycler.cycle(&k).await?;
                lat.push(t0.elapsed());
                i += 1;
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(Samples {
        tasks,
        elapsed: started.elapsed(),
        latencies,
    })
}

/// One hold in a contended run.
#[derive(Clone, Copy, Debug)]
struct Rec {
    task: usize,
    fence: Option<u64>,
    acquired: Instant,
    release_start: Instant,
    released: Instant,
}

/// What contention on one key looked like.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ContendedResult {
    /// Tasks competing.
    pub tasks: usize,
    /// Acquisitions in all.
    pub acquisitions: u64,
    /// Acquisitions per second.
    pub per_sec: f64,
    /// Share of acquisitions won by the task that had just released, after
    /// the first round (one acquisition per task, while the tasks join).
    pub releaser_won: f64,
    /// From one holder's release returning to another task's lock returning.
    pub handoff: Summary,
    /// How long each holder held: from its lock returning to its release
    /// starting (the hold asked for, as the machine kept it).
    pub held: Summary,
    /// How long each release took, from its start to its return.
    pub release: Summary,
    /// The longest any task waited for the lock, in microseconds.
    pub max_wait_us: f64,
    /// Times two tasks held the lock at once (must be 0).
    pub overlaps: u64,
    /// Waits that ran out (a starving task).
    pub timeouts: u64,
    /// The smallest share of acquisitions any task got.
    pub min_task_share: f64,
    /// The largest share of acquisitions any task got.
    pub max_task_share: f64,
    /// Hand-offs whose new holder's fence was not above the one before
    /// (must be 0; checked on every hand-off where the client has fences).
    pub fence_backwards: u64,
    /// Store requests (acquire, release, renew, inspect) per acquisition,
    /// where they were counted.
    pub requests_per_acquisition: Option<f64>,
    /// Waits on a release watch per acquisition, where they were counted
    /// (a Postgres wait marks the key's row first: one more request each).
    pub waits_per_acquisition: Option<f64>,
}

/// Settings of a contended run.
#[derive(Clone, Copy, Debug)]
pub struct Contention {
    /// Wall-clock budget for asking.
    pub duration: Duration,
    /// How long each holder keeps the lock.
    pub hold: Duration,
    /// Most acquisitions in all.
    pub max_acquisitions: u64,
    /// How long past the budget a waiter may still wait before it counts as starved.
    pub grace: Duration,
}

struct Shared {
    inside: AtomicU64,
    live_overlaps: AtomicU64,
    count: AtomicU64,
    timeouts: AtomicU64,
    max_wait_us: AtomicU64,
}

/// Runs one task per locker on the one key `key`: each takes the lock,
/// holds it for `hold`, releases it and asks again at once.
///
/// # Errors
/// The first lock or release error.
pub async fn contended(
    lockers: &[Arc<dyn Locker>],
    key: &str,
    c: Contention,
) -> Result<ContendedResult, String> {
    let shared = Arc::new(Shared {
        inside: AtomicU64::new(0),
        live_overlaps: AtomicU64::new(0),
        count: AtomicU64::new(0),
        timeouts: AtomicU64::new(0),
        max_wait_us: AtomicU64::new(0),
    });
    let started = Instant::now();
    let deadline = started + c.duration;
    let mut handles = Vec::new();
    for (task, locker) in lockers.iter().enumerate() {
        let (locker, shared, key) = (locker.clone(), shared.clone(), key.to_owned());
        handles.push(tokio::spawn(async move {
            contend(task, locker, &key, &shared, deadline, c).await
        }));
    }
    let mut recs = Vec::new();
    for h in handles {
        recs.extend(h.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(analyse(recs, &shared, lockers.len(), elapsed))
}

async fn contend(
    task: usize,
    locker: Arc<dyn Locker>,
    key: &str,
    shared: &Shared,
    deadline: Instant,
    c: Contention,
) -> Result<Vec<Rec>, String> {
    let mut recs = Vec::new();
    while Instant::now() < deadline && shared.count.load(Ordering::Relaxed) < c.max_acquisitions {
        let asked = Instant::now();
        let wait = deadline.saturating_duration_since(asked) + c.grace;
        let held = locker.lock(key, wait).await?;
        let acquired = Instant::now();
        let waited = micros(acquired - asked) as u64;
        shared.max_wait_us.fetch_max(waited, Ordering::Relaxed);
        let Some(h) = held else {
            shared.timeouts.fetch_add(1, Ordering::Relaxed);
            break;
        };
        if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            shared.live_overlaps.fetch_add(1, Ordering::Relaxed);
        }
        shared.count.fetch_add(1, Ordering::Relaxed);
        hold_for(c.hold).await;
        shared.inside.fetch_sub(1, Ordering::SeqCst);
        let release_start = Instant::now();
        let fence = h.fence();
        h.release().await?;
        recs.push(Rec {
            task,
            fence,
            acquired,
            release_start,
            released: Instant::now(),
        });
    }
    Ok(recs)
}

/// Keeps the lock for `hold`: a thread's sleep, which lasts about 0.1 ms
/// longer than asked, where the runtime's timer rounds a sleep up to its
/// next millisecond tick (a "1 ms" sleep there lasts about 2.1 ms). The
/// contended table reports the holds measured.
async fn hold_for(hold: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(hold))
        .await
        .is_err()
    {
        tokio::time::sleep(hold).await;
    }
}

fn analyse(mut recs: Vec<Rec>, shared: &Shared, tasks: usize, elapsed: f64) -> ContendedResult {
    recs.sort_by_key(|r| r.acquired);
    let mut handoff = Vec::new();
    let (mut same, mut overlaps, mut backwards) = (0u64, 0u64, 0u64);
    // The first round, while the tasks join the queue, is left out of
    // "releaser won": a holder that releases before any other task has
    // joined takes the key again with none passed.
    let first_round = tasks.saturating_sub(1);
    for (i, pair) in recs.windows(2).enumerate() {
        let (a, b) = (pair[0], pair[1]);
        if b.acquired < a.release_start {
            overlaps += 1;
        }
        if let (Some(before), Some(after)) = (a.fence, b.fence) {
            backwards += u64::from(after <= before);
        }
        if a.task == b.task {
            same += u64::from(i >= first_round);
        } else {
            handoff.push(b.acquired.saturating_duration_since(a.released));
        }
    }
    let mut held: Vec<Duration> = recs
        .iter()
        .map(|r| r.release_start.saturating_duration_since(r.acquired))
        .collect();
    let mut release: Vec<Duration> = recs
        .iter()
        .map(|r| r.released.saturating_duration_since(r.release_start))
        .collect();
    let n = recs.len() as u64;
    let mut per_task = vec![0u64; tasks.max(1)];
    for r in &recs {
        if let Some(c) = per_task.get_mut(r.task) {
            *c += 1;
        }
    }
    let min = per_task.iter().copied().min().unwrap_or(0);
    let max = per_task.iter().copied().max().unwrap_or(0);
    ContendedResult {
        tasks,
        acquisitions: n,
        per_sec: if elapsed > 0.0 {
            n as f64 / elapsed
        } else {
            0.0
        },
        releaser_won: crate::stats::ratio(
            same as f64,
            n.saturating_sub(1 + first_round as u64) as f64,
        ),
        handoff: Summary::of(&mut handoff),
        held: Summary::of(&mut held),
        release: Summary::of(&mut release),
        max_wait_us: shared.max_wait_us.load(Ordering::Relaxed) as f64,
        overlaps: overlaps.max(shared.live_overlaps.load(Ordering::Relaxed)),
        timeouts: shared.timeouts.load(Ordering::Relaxed),
        min_task_share: crate::stats::ratio(min as f64, n as f64),
        max_task_share: crate::stats::ratio(max as f64, n as f64),
        fence_backwards: backwards,
        requests_per_acquisition: None,
        waits_per_acquisition: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cycle that takes longer the later it runs: a machine that slows
    /// down as the measurement goes on (whole milliseconds: the timer's
    /// grain).
    struct Slowing(Instant);

    #[async_trait]
    impl Cycler for Slowing {
        async fn cycle(&self, _key: &str) -> Result<(), String> {
            let late = self.0.elapsed().as_secs_f64();
            tokio::time::sleep(Duration::from_millis(20 + (late * 5.0) as u64)).await;
            Ok(())
        }
    }

    fn any_key() -> KeyFn {
        Arc::new(|task, slot| format!("{task}-{slot}"))
    }

    const BOUNDS: Bounds = Bounds {
        duration: Duration::from_secs(2),
        max_cycles: u64::MAX,
    };

    /// The tasks' records, one per acquisition, in order, 1 ms apart.
    fn records(tasks: &[usize]) -> Vec<Rec> {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        tasks
            .iter()
            .enumerate()
            .map(|(i, &task)| {
                let acquired = t0 + ms * (2 * i as u32);
                Rec {
                    task,
                    fence: Some(i as u64 + 1),
                    acquired,
                    release_start: acquired + ms / 2,
                    released: acquired + ms,
                }
            })
            .collect()
    }

    fn shared() -> Shared {
        Shared {
            inside: AtomicU64::new(0),
            live_overlaps: AtomicU64::new(0),
            count: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            max_wait_us: AtomicU64::new(0),
        }
    }

    /// A holder that takes the key again in the first round, before the
    /// other tasks joined, does not count as a releaser winning; one that
    /// does so later counts.
    #[tokio::test(start_paused = true)]
    async fn releaser_won_leaves_out_the_first_round() {
        let first = records(&[0, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
        let r = analyse(first, &shared(), 3, 1.0);
        assert_eq!(r.releaser_won, 0.0);
        let later = records(&[0, 1, 2, 0, 1, 2, 2, 0, 1, 2]);
        let r = analyse(later, &shared(), 3, 1.0);
        assert!(
            (r.releaser_won - 1.0 / 7.0).abs() < 1e-9,
            "{}",
            r.releaser_won
        );
        assert_eq!(r.fence_backwards, 0);
    }

    /// The holds are measured from a holder's lock returning to its
    /// release starting, and the releases from their start to their
    /// return.
    #[tokio::test(start_paused = true)]
    async fn holds_are_measured_from_acquisition_to_release() {
        let r = analyse(records(&[0, 1, 0, 1]), &shared(), 2, 1.0);
        assert_eq!(r.held.count, 4);
        assert!((r.held.p50_us - 500.0).abs() < 1e-6, "{}", r.held.p50_us);
        assert!(
            (r.release.p50_us - 500.0).abs() < 1e-6,
            "{}",
            r.release.p50_us
        );
    }

    /// A contended run keeps each lock at least as long as asked, and
    /// reports every hold (a thread's sleep: the clock must run).
    #[tokio::test]
    async fn a_contended_run_holds_each_lock_as_asked() {
        let backend: Arc<dyn moltlock::Backend> = Arc::new(moltlock::MemoryBackend::new());
        let locker: Arc<dyn Locker> =
            Arc::new(crate::molt::MoltLocker::new(backend, false).unwrap());
        let lockers = [locker.clone(), locker];
        let c = Contention {
            duration: Duration::from_millis(100),
            hold: Duration::from_millis(3),
            max_acquisitions: 1_000,
            grace: Duration::from_secs(5),
        };
        let r = contended(&lockers, "held", c).await.unwrap();
        assert!(r.acquisitions >= 2, "{} acquisitions", r.acquisitions);
        assert_eq!(r.held.count as u64, r.acquisitions);
        assert!(r.held.p50_us >= 3_000.0, "held {} us", r.held.p50_us);
        assert_eq!(r.overlaps, 0);
    }

    /// Slow (60 ms a cycle instead of 20) from 0.5 s to 1.5 s after it
    /// was made: a burst of other work on the machine.
    struct Burst(Instant);

    #[async_trait]
    impl Cycler for Burst {
        async fn cycle(&self, _key: &str) -> Result<(), String> {
            let at = self.0.elapsed();
            let slow = at >= Duration::from_millis(500) && at < Duration::from_millis(1500);
            tokio::time::sleep(Duration::from_millis(if slow { 60 } else { 20 })).await;
            Ok(())
        }
    }

    /// A burst that covers the middle two of four rounds falls on one
    /// cycler's rounds only (B's, in the order A B B A); cycle by cycle, as
    /// one task is measured, it weighs on both alike.
    #[tokio::test(start_paused = true)]
    async fn a_burst_across_rounds_weighs_on_both_cycle_by_cycle() {
        let run = |c: &Arc<dyn Cycler>| (c.clone(), any_key());
        let slice = Bounds {
            duration: Duration::from_millis(500),
            max_cycles: u64::MAX,
        };
        let c: Arc<dyn Cycler> = Arc::new(Burst(Instant::now()));
        let (a, b) = in_rounds(&run(&c), &run(&c), 1, slice, 4).await.unwrap();
        let rounds = b.result().per_sec / a.result().per_sec;
        assert!(rounds < 0.8, "in rounds: {rounds:.2}");
        let c: Arc<dyn Cycler> = Arc::new(Burst(Instant::now()));
        let (a, b) = alternate(&run(&c), &run(&c), BOUNDS).await.unwrap();
        let (a, b) = (a.result(), b.result());
        let turns = b.per_sec / a.per_sec;
        assert!((0.9..=1.1).contains(&turns), "cycle by cycle: {turns:.2}");
        assert!(a.cycles > 0 && b.cycles > 0);
    }

    /// Two identical cyclers measured one after the other on a slowing
    /// machine differ; measured side by side (cycle by cycle with one
    /// task, in alternating rounds with more) they come out alike.
    #[tokio::test(start_paused = true)]
    async fn alternating_rounds_cancel_a_drift() {
        let start = Instant::now();
        let c: Arc<dyn Cycler> = Arc::new(Slowing(start));
        let first = closed_loop(c.clone(), any_key(), 1, BOUNDS).await.unwrap();
        let second = closed_loop(c.clone(), any_key(), 1, BOUNDS).await.unwrap();
        let apart = second.per_sec / first.per_sec;
        assert!(apart < 0.9, "one after the other: {apart:.2}");
        for tasks in [1, 2] {
            let (a, b) = paired(
                (c.clone(), any_key()),
                (c.clone(), any_key()),
                tasks,
                BOUNDS,
                4,
            )
            .await
            .unwrap();
            let side_by_side = b.per_sec / a.per_sec;
            assert!(
                (0.97..=1.03).contains(&side_by_side),
                "side by side, {tasks} tasks: {side_by_side:.2}"
            );
            assert!(a.cycles > 0 && b.cycles > 0);
        }
    }
}
