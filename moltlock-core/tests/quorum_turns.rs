//! A quorum turns off its members' own choice of the next holder
//! ([`Turns`]): each member would keep a released key for a different
//! client, and the votes would split. A member reached only later is
//! turned off once it is reached.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moltlock_core::{
    Backend, ConnectMember, Forward, LateMember, Limits, LockKey, MemoryBackend, QuorumBackend,
    Token, Turns,
};

/// The memory store, handing out a [`Turns`] switch (on when made).
struct Chooser {
    store: MemoryBackend,
    on: Arc<AtomicBool>,
}

impl Chooser {
    fn member() -> (Arc<dyn Backend>, Arc<AtomicBool>) {
        let on = Arc::new(AtomicBool::new(true));
        let member = Chooser {
            store: MemoryBackend::new(),
            on: on.clone(),
        };
        (Arc::new(member), on)
    }
}

impl Forward for Chooser {
    type Inner = MemoryBackend;

    fn inner(&self) -> &MemoryBackend {
        &self.store
    }

    fn turns(&self) -> Option<&dyn Turns> {
        Some(self)
    }
}

impl Turns for Chooser {
    fn set_turns(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }
}

#[test]
fn a_quorum_turns_its_members_choice_off() {
    let (members, switches): (Vec<_>, Vec<_>) = (0..3).map(|_| Chooser::member()).unzip();
    let _quorum = QuorumBackend::new(members).unwrap();
    for on in &switches {
        assert!(
            !on.load(Ordering::SeqCst),
            "a member still picks the next holder"
        );
    }
}

#[tokio::test]
async fn a_member_reached_later_is_turned_off_when_reached() {
    let made: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
    let connect: ConnectMember = {
        let made = made.clone();
        Arc::new(move || {
            let (member, on) = Chooser::member();
            made.lock().unwrap().push(on);
            Box::pin(async move { Ok(member) })
        })
    };
    let late = Arc::new(LateMember::new("memory", Limits::default(), connect));
    let (first, first_on) = Chooser::member();
    let quorum = QuorumBackend::new([first, late.clone() as Arc<dyn Backend>]).unwrap();
    assert!(!first_on.load(Ordering::SeqCst));
    assert!(
        made.lock().unwrap().is_empty(),
        "the late member was reached early"
    );
    // A request reaches the late member's store.
    let key = LockKey::new("turns/late").unwrap();
    let token = Token::random();
    quorum
        .cas(&key, None, &token, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(late.is_connected());
    let made = made.lock().unwrap();
    assert_eq!(made.len(), 1);
    assert!(
        !made[0].load(Ordering::SeqCst),
        "the member reached later still picks the next holder"
    );
}
