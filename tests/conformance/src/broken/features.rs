//! The flawed store's optional features and its queue and watch helpers.

use super::*;

/// Leaves the fair queue when a waiter goes away.
struct QueueGuard {
    store: Flawed,
    key: String,
    token: Token,
    ttl: Duration,
    done: bool,
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let keep = self.store.has(Flaw::FairKeepsDroppedPlace);
        let until = Instant::now() + self.ttl;
        let mut st = self.store.store();
        if let Some(q) = st.queues.get_mut(&self.key) {
            if keep {
                for p in q.iter_mut().filter(|p| p.token == self.token) {
                    p.alive_until = until;
                    p.dropped = true;
                }
            } else {
                q.retain(|p| p.token != self.token);
            }
        }
    }
}

/// Subscribes only when first awaited (a flaw).
struct LazyWatch {
    events: Arc<KeyEvents>,
    key: String,
    inner: Option<Box<dyn ReleaseWatch>>,
}

#[async_trait]
impl ReleaseWatch for LazyWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        let events = self.events.clone();
        let key = self.key.clone();
        let w = self.inner.get_or_insert_with(|| events.subscribe(&key));
        w.released(held).await
    }
}

/// Resolves once, then never again (a flaw).
struct OnceWatch {
    inner: Box<dyn ReleaseWatch>,
    fired: bool,
}

#[async_trait]
impl ReleaseWatch for OnceWatch {
    async fn released(&mut self, held: &Held) -> Result<(), Error> {
        if self.fired {
            std::future::pending::<()>().await;
        }
        self.inner.released(held).await?;
        self.fired = true;
        Ok(())
    }
}

#[async_trait]
impl Backend for Flawed {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        if self.has(Flaw::LongKeysRefused) && key.as_str().len() > 191 {
            return Err(Error::invalid_key(
                key.as_str(),
                "longer than the key column",
            ));
        }
        if !self.has(Flaw::LateLandingAfterCancel) {
            return Ok(self.cas_flawed(key.as_str(), expected, new, ttl).await);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (me, key2, expected2, new2) = (
            self.clone(),
            key.as_str().to_owned(),
            expected.cloned(),
            new.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if tx.is_closed() {
                tokio::time::sleep(Duration::from_millis(5_300)).await;
            }
            let out = me.cas_flawed(&key2, expected2.as_ref(), &new2, ttl).await;
            let _ = tx.send(out);
        });
        rx.await
            .map_err(|_| Error::store("flawed", "the request task went away", true))
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        if self.has(Flaw::DeleteLandsLate) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let now = Instant::now();
        let mut nk = self.norm(key.as_str());
        if self.has(Flaw::DeleteMissesKey) {
            nk.push('/');
        }
        let removed = {
            let mut st = self.store();
            let ours = st.entries.get(&nk).is_some_and(|e| {
                self.same(&e.holder, owner)
                    && (self.alive(e, now) || self.has(Flaw::DeleteIgnoresExpiry))
            });
            (ours || self.has(Flaw::UnconditionalDelete)) && st.entries.remove(&nk).is_some()
        };
        if removed && !self.has(Flaw::ReleaseNotAnnounced) {
            self.events.fire(&nk);
        }
        Ok(removed || self.has(Flaw::DeleteAlwaysTrue))
    }

    fn name(&self) -> &'static str {
        "flawed"
    }

    /// Every request takes effect when first polled (but for the flaws
    /// that delay one): in order.
    fn limits(&self) -> moltlock_core::Limits {
        moltlock_core::Limits::new().with_in_order(true)
    }

    moltlock_core::hand_out!(Watch, Inspect, RenewMany, Describe, RaiseFence, FairQueue);

    fn batch_cas(&self) -> Option<&dyn moltlock_core::CasMulti> {
        self.flaw.in_cas_multi().then_some(self as _)
    }
}

#[async_trait]
impl Watch for Flawed {
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        let nk = self.norm(key.as_str());
        if self.has(Flaw::WatchSubscribesLazily) {
            return Ok(Box::new(LazyWatch {
                events: self.events.clone(),
                key: nk,
                inner: None,
            }));
        }
        let w = self.events.subscribe(&nk);
        if self.has(Flaw::WatchFiresOnce) {
            return Ok(Box::new(OnceWatch {
                inner: w,
                fired: false,
            }));
        }
        Ok(w)
    }
}

#[async_trait]
impl Inspect for Flawed {
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let now = Instant::now();
        let st = self.store();
        Ok(st
            .entries
            .get(&self.norm(key.as_str()))
            .filter(|e| self.shown(e, now))
            .map(|e| self.info(&st, key.as_str(), e, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        let now = Instant::now();
        let st = self.store();
        let mut out: Vec<HolderInfo> = st
            .entries
            .iter()
            .filter(|(k, e)| {
                let under = match self.flaw {
                    Flaw::ListIgnoresPrefix => true,
                    Flaw::ListPrefixAsPattern => like(k.as_bytes(), prefix.as_bytes()),
                    _ => k.starts_with(prefix),
                };
                under && self.shown(e, now)
            })
            .map(|(k, e)| self.info(&st, k, e, now))
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

#[async_trait]
impl RenewMany for Flawed {
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        let first_ttl = items.first().map(|i| i.ttl);
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let ttl = match first_ttl {
                Some(t) if self.has(Flaw::BatchUsesFirstTtl) => t,
                _ => item.ttl,
            };
            let expected = if self.has(Flaw::BatchRecreatesDeleted) {
                let now = Instant::now();
                let st = self.store();
                let live = st
                    .entries
                    .get(&self.norm(item.key.as_str()))
                    .is_some_and(|e| self.alive(e, now));
                (live).then_some(&item.token)
            } else {
                Some(&item.token)
            };
            let outcome = self.cas_now(
                &mut self.store(),
                item.key.as_str(),
                expected,
                &item.token,
                ttl,
                None,
                None,
            );
            out.push(matches!(outcome, CasOutcome::Acquired { .. }));
        }
        if self.has(Flaw::BatchAnswersFirstForAll) {
            let first = out.first().copied().unwrap_or(false);
            return Ok(vec![first; out.len()]);
        }
        Ok(out)
    }
}

#[async_trait]
impl Describe for Flawed {
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        let now = Instant::now();
        let nk = self.norm(key.as_str());
        let mut st = self.store();
        let ignore_owner = self.has(Flaw::DescribeIgnoresOwner);
        let ours = st
            .entries
            .get(&nk)
            .is_some_and(|e| self.alive(e, now) && (ignore_owner || self.same(&e.holder, owner)));
        if !ours {
            return Ok(false);
        }
        if let Some(e) = st.entries.get_mut(&nk) {
            e.description = Some(text.to_owned());
        }
        st.descriptions.insert(nk, text.to_owned());
        Ok(true)
    }
}

#[async_trait]
impl RaiseFence for Flawed {
    async fn raise_fence(&self, _key: &LockKey, minimum: Fence) -> Result<(), Error> {
        if self.has(Flaw::RaiseFenceReadThenWrite) {
            let read = self.store().fence;
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.store().fence = read.max(minimum.get());
            return Ok(());
        }
        let mut st = self.store();
        st.fence = if self.has(Flaw::RaiseFenceSets) {
            minimum.get()
        } else {
            st.fence.max(minimum.get())
        };
        Ok(())
    }
}

#[async_trait]
impl FairQueue for Flawed {
    async fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Result<Fence, Error> {
        if self.has(Flaw::FairBarges) {
            if let CasOutcome::Acquired { fence } =
                self.cas_flawed(key.as_str(), None, token, ttl).await
            {
                return Ok(fence);
            }
        }
        let nk = self.norm(key.as_str());
        let ahead = {
            let mut st = self.store();
            let q = st.queues.entry(nk.clone()).or_default();
            let ahead = q.back().map(|p| p.token.clone());
            let place = QueuePlace {
                token: token.clone(),
                alive_until: Instant::now() + ttl,
                dropped: false,
            };
            if self.has(Flaw::FairServesNewestFirst) {
                q.push_front(place);
            } else {
                q.push_back(place);
            }
            ahead.filter(|_| self.has(Flaw::FairPassesAhead))
        };
        let mut guard = QueueGuard {
            store: self.clone(),
            key: nk,
            token: token.clone(),
            ttl,
            done: false,
        };
        loop {
            if let Some(fence) = self.take_turn(key.as_str(), token, ttl, ahead.as_ref()) {
                guard.done = true;
                return Ok(fence);
            }
            tokio::time::sleep(FAIR_POLL).await;
        }
    }
}
