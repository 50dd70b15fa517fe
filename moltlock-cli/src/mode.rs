//! Which lock `moltlock run` takes: one key, a semaphore's permit, the
//! shared or exclusive hold of a read-write lock, or several keys at once.

use clap::Args;
use moltlock::{Error, HolderInfo, LockKey, LockManager, LockOptions, RwOptions};

use crate::derived::{role, slot_prefix, writer_key};
use crate::exit::Failure;
use crate::hold::Hold;

/// The largest `--permits` and `--readers` (the library's `MAX_PERMITS`).
const MAX_COUNT: i64 = 1024;

/// How many holders to name when a lock is busy.
const MAX_NAMED: usize = 4;

/// The lock options of `moltlock run`.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// The lock's key (the name of the semaphore or read-write lock with
    /// --permits, --shared or --exclusive). Given more than once, every key
    /// is held at once (a multi-lock, taken in bytewise key order, all or
    /// nothing); the command then gets MOLTLOCK_KEYS (how many) and
    /// MOLTLOCK_KEY_<i> and MOLTLOCK_FENCE_<i> for each key in bytewise
    /// order, i from 0, instead of MOLTLOCK_KEY and MOLTLOCK_FENCE.
    #[arg(long, required = true, value_name = "KEY", verbatim_doc_comment)]
    pub key: Vec<String>,
    /// At most N runs hold the key at once (a semaphore of N permits; every
    /// run of the key must give the same N). The command gets MOLTLOCK_SLOT
    /// (its permit, 0 to N-1) and MOLTLOCK_FENCE (that slot's fence: it
    /// rises per slot, not across slots).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_COUNT),
        conflicts_with_all = ["shared", "exclusive"],
        verbatim_doc_comment
    )]
    pub permits: Option<u32>,
    /// Hold the key's read-write lock shared (as `flock -s`): shared runs
    /// run together, and none runs while an --exclusive run does. The
    /// command gets MOLTLOCK_MODE=shared, MOLTLOCK_SLOT (its reader slot) and
    /// MOLTLOCK_FENCE (that slot's fence).
    #[arg(short = 's', long, conflicts_with = "exclusive", verbatim_doc_comment)]
    pub shared: bool,
    /// Hold the key's read-write lock exclusive (as `flock -x`): no other
    /// --shared or --exclusive run of the key runs meanwhile; a waiting
    /// exclusive run keeps new shared runs out. The command gets
    /// MOLTLOCK_MODE=exclusive and MOLTLOCK_FENCE (the writer's fence,
    /// rising from writer to writer). The read-write lock lives beside the
    /// plain lock of the same key: a run without --shared or --exclusive
    /// holds the plain lock, and does not exclude --shared or --exclusive
    /// runs (nor they it).
    #[arg(short = 'x', long, verbatim_doc_comment)]
    pub exclusive: bool,
    /// How many --shared runs may hold the read-write lock at once [default:
    /// 16]; every run of the key must give the same number, and an
    /// --exclusive run takes one store key per reader.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_COUNT))]
    pub readers: Option<u32>,
}

/// The lock to take, checked.
#[derive(Debug)]
pub enum Mode {
    /// One key.
    One(String),
    /// A permit of the semaphore `name`.
    Permit { name: String, permits: u32 },
    /// A shared (`write == false`) or exclusive hold of a read-write lock.
    Rw {
        name: String,
        readers: Option<u32>,
        write: bool,
    },
    /// Every key, deduplicated, in bytewise order.
    All(Vec<String>),
}

impl Mode {
    /// The mode the options ask for; `fair` is for one plain key only.
    ///
    /// # Errors
    /// A usage failure for options that do not go together.
    pub fn new(args: &LockArgs, fair: bool) -> Result<Self, Failure> {
        let mut keys = args.key.clone();
        keys.sort();
        keys.dedup();
        let rw = args.shared || args.exclusive;
        if args.readers.is_some() && !rw {
            return Err(Failure::usage("--readers needs --shared or --exclusive"));
        }
        let special = rw || args.permits.is_some();
        if keys.len() > 1 && special {
            return Err(Failure::usage(
                "--permits, --shared and --exclusive take one --key (the lock's name)",
            ));
        }
        if fair && (special || keys.len() > 1) {
            return Err(Failure::usage(
                "--fair is for one plain key: not with --permits, --shared, --exclusive \
                 or several --key",
            ));
        }
        let name = keys.first().cloned().unwrap_or_default();
        Ok(match (args.permits, rw) {
            (Some(permits), _) => Self::Permit { name, permits },
            (None, true) => Self::Rw {
                name,
                readers: args.readers,
                write: args.exclusive,
            },
            (None, false) if keys.len() > 1 => Self::All(keys),
            (None, false) => Self::One(name),
        })
    }

    /// The key, or the primitive's name, or the first key of several.
    pub fn name(&self) -> &str {
        match self {
            Self::One(name) | Self::Permit { name, .. } | Self::Rw { name, .. } => name,
            Self::All(keys) => keys.first().map(String::as_str).unwrap_or_default(),
        }
    }

    /// The lock in messages: `"key"`, or `"a" + "b"` for several keys.
    pub fn label(&self) -> String {
        match self {
            Self::All(keys) => keys
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(" + "),
            _ => format!("{:?}", self.name()),
        }
    }

    /// Acquires the lock (`no_wait` must match `opts`).
    ///
    /// # Cancel safety
    /// As the library's acquisitions: dropping the future holds nothing.
    ///
    /// # Errors
    /// As the library's acquisitions.
    pub async fn acquire(
        &self,
        mgr: &LockManager,
        opts: LockOptions,
        no_wait: bool,
    ) -> Result<Option<Hold>, Error> {
        match self {
            Self::One(key) => Ok(mgr.acquire(key, opts).await?.map(Hold::One)),
            Self::Permit { name, permits } => {
                let sem = mgr.semaphore(name, *permits)?;
                Ok(sem.acquire_with(opts).await?.map(Hold::Permit))
            }
            Self::Rw {
                name,
                readers,
                write,
            } => {
                let shape = readers.map_or_else(RwOptions::new, |n| RwOptions::new().readers(n));
                let rw = mgr.rw_lock(name, shape)?;
                if *write {
                    Ok(rw.write_with(opts).await?.map(Hold::Write))
                } else {
                    Ok(rw.read_with(opts).await?.map(Hold::Read))
                }
            }
            Self::All(keys) if no_wait => Ok(mgr.try_lock_all(keys, opts).await?.map(Hold::All)),
            Self::All(keys) => Ok(Some(Hold::All(mgr.lock_all(keys, opts).await?))),
        }
    }

    /// A store key of the hold, as messages name it: the key itself, or
    /// `"name" permit 2` for a derived key.
    pub fn part(&self, key: &str) -> String {
        match role(key) {
            Some((name, role)) => format!("{name:?} {role}"),
            None => format!("{key:?}"),
        }
    }

    /// Who holds the lock now, where the store can tell: each busy part,
    /// as `part` names it, with its holder (at most a few). For a
    /// read-write lock or several keys, only described holders.
    pub async fn holders(&self, mgr: &LockManager) -> Vec<(String, HolderInfo)> {
        let mut found = match self {
            Self::One(key) => inspect(mgr, key).await.into_iter().collect(),
            Self::All(keys) => {
                let mut found = Vec::new();
                for k in keys {
                    found.extend(inspect(mgr, k).await);
                }
                found
            }
            Self::Permit { name, .. } => list(mgr, &slot_prefix(name, 's')).await,
            Self::Rw { name, .. } => {
                let mut found: Vec<_> = inspect(mgr, &writer_key(name)).await.into_iter().collect();
                found.extend(list(mgr, &slot_prefix(name, 'r')).await);
                found
            }
        };
        // A read-write lock's writer key and a multi-lock's keys are held
        // undescribed while their holder (this run, say) still waits for the
        // rest: name only holders that have said who they are.
        if matches!(self, Self::Rw { .. } | Self::All(_)) {
            found.retain(|h| h.description.is_some());
        }
        found.truncate(MAX_NAMED);
        found.into_iter().map(|h| (self.part(&h.key), h)).collect()
    }
}

/// The holder of one store key, where the store can tell.
async fn inspect(mgr: &LockManager, key: &str) -> Option<HolderInfo> {
    let k = LockKey::new(key).ok()?;
    let inspector = mgr.backend().inspector()?;
    inspector.inspect(&k).await.ok().flatten()
}

/// The slot holds under `prefix` (derived slot keys only).
async fn list(mgr: &LockManager, prefix: &str) -> Vec<HolderInfo> {
    let Some(inspector) = mgr.backend().inspector() else {
        return Vec::new();
    };
    let mut held = inspector.list(prefix).await.unwrap_or_default();
    held.retain(|h| role(&h.key).is_some());
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lock: LockArgs,
    }

    fn mode(args: &[&str], fair: bool) -> Result<Mode, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| Failure::usage(e.to_string()))?;
        Mode::new(&cli.lock, fair)
    }

    #[test]
    fn options_choose_the_mode() {
        let m = mode(&["--key", "b", "--key", "a", "--key", "b"], false);
        assert!(matches!(&m, Ok(Mode::All(k)) if k == &["a", "b"]), "{m:?}");
        assert!(matches!(mode(&["--key", "a", "--key", "a"], false), Ok(Mode::One(k)) if k == "a"));
        let m = mode(&["--key", "s", "--permits", "3"], false);
        assert!(matches!(m, Ok(Mode::Permit { permits: 3, .. })));
        let m = mode(&["--key", "r", "-s", "--readers", "4"], false);
        assert!(matches!(
            m,
            Ok(Mode::Rw {
                readers: Some(4),
                write: false,
                ..
            })
        ));
        assert!(matches!(
            mode(&["--key", "r", "-x"], false),
            Ok(Mode::Rw { write: true, .. })
        ));
        assert_eq!(
            mode(&["--key", "b", "--key", "a"], false)
                .map(|m| m.label())
                .ok(),
            Some("\"a\" + \"b\"".to_owned())
        );
    }

    #[test]
    fn options_that_do_not_go_together() {
        for bad in [
            &["--key", "a", "--readers", "2"][..],
            &["--key", "a", "--key", "b", "--permits", "2"],
            &["--key", "a", "--key", "b", "--shared"],
            &["--key", "a", "--shared", "--exclusive"],
            &["--key", "a", "--permits", "2", "--exclusive"],
            &["--key", "a", "--permits", "0"],
            &["--key", "a", "--permits", "1025"],
        ] {
            assert!(mode(bad, false).is_err(), "{bad:?}");
        }
        assert!(mode(&["--key", "a", "--permits", "2"], true).is_err());
        assert!(mode(&["--key", "a", "--key", "b"], true).is_err());
        assert!(mode(&["--key", "a"], true).is_ok());
    }

    #[test]
    fn parts_are_named() {
        let m = Mode::One("x".into());
        assert_eq!(m.part("jobs#~s1"), "\"jobs\" permit 1");
        assert_eq!(m.part("jobs"), "\"jobs\"");
    }
}
