//! The tracing spans around acquire, wait, renew and release carry the
//! key, the backend and the fence. A small subscriber records every span
//! with its fields.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moltlock_core::{LockManager, MemoryBackend};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span's fields, by name.
type FieldMap = BTreeMap<String, String>;

/// Each span's name and fields, by span id.
#[derive(Clone, Default)]
struct Spans {
    next: Arc<AtomicU64>,
    seen: Arc<Mutex<BTreeMap<u64, (String, FieldMap)>>>,
}

struct Fields<'a>(&'a mut FieldMap);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        span.record(&mut Fields(&mut fields));
        let name = span.metadata().name().to_string();
        self.seen.lock().unwrap().insert(id, (name, fields));
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some((_, fields)) = self.seen.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Spans {
    /// The fields of every span named `name`.
    fn named(&self, name: &str) -> Vec<FieldMap> {
        let seen = self.seen.lock().unwrap();
        seen.values()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn acquire_wait_renew_and_release_have_spans_with_key_backend_and_fence() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    let mgr = LockManager::builder(MemoryBackend::new())
        .ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let guard = mgr.lock("jobs/k").await.unwrap();
    let fence = guard.fence().0.to_string();
    let waiter = mgr.lock_timeout("jobs/k", Duration::from_millis(300)).await;
    assert!(waiter.is_err(), "the key was taken twice");
    tokio::time::sleep(Duration::from_secs(2)).await; // past one renewal
    guard.release().await.unwrap();

    let acquires = spans.named("moltlock.acquire");
    let granted = acquires
        .iter()
        .find(|f| f.get("fence") == Some(&fence))
        .expect("no acquire span recorded the fence");
    assert_eq!(granted.get("key").map(String::as_str), Some("jobs/k"));
    assert_eq!(granted.get("backend").map(String::as_str), Some("memory"));
    assert_eq!(acquires.len(), 2, "one span per acquisition");

    let waits = spans.named("moltlock.wait");
    assert!(!waits.is_empty(), "the waiter's pauses had no span");
    for wait in &waits {
        assert_eq!(
            wait.get("key").map(String::as_str),
            Some("jobs/k"),
            "{wait:?}"
        );
        assert_eq!(wait.get("backend").map(String::as_str), Some("memory"));
    }

    let renews = spans.named("moltlock.renew");
    let renew = renews.first().expect("no renew span");
    assert_eq!(renew.get("key").map(String::as_str), Some("jobs/k"));
    assert_eq!(renew.get("holds").map(String::as_str), Some("1"));
    assert_eq!(renew.get("fence"), Some(&fence));

    let releases = spans.named("moltlock.release");
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].get("fence"), Some(&fence));
    assert_eq!(releases[0].get("key").map(String::as_str), Some("jobs/k"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_guard_is_released_in_a_span_of_its_own() {
    let spans = Spans::default();
    let _default = tracing::subscriber::set_default(spans.clone());
    let mgr = LockManager::new(MemoryBackend::new());
    let guard = mgr.lock("jobs/dropped").await.unwrap();
    let fence = guard.fence().0.to_string();
    drop(guard);
    // The background release has run once the key can be taken again.
    let next = mgr
        .lock_timeout("jobs/dropped", Duration::from_secs(1))
        .await
        .unwrap();

    let releases = spans.named("moltlock.release");
    let dropped = releases
        .iter()
        .find(|f| f.get("background").map(String::as_str) == Some("true"))
        .expect("the dropped guard's release had no span");
    assert_eq!(dropped.get("key").map(String::as_str), Some("jobs/dropped"));
    assert_eq!(dropped.get("backend").map(String::as_str), Some("memory"));
    assert_eq!(dropped.get("fence"), Some(&fence));
    next.release().await.unwrap();
}
