//! Wrappers and shared backends: [`Forward`] makes a wrapper forward all it
//! does not override, `Arc<B>` and `Box<B>` are backends, and helpers call
//! extensions or list them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::features::{
    CasMulti, Describe, FairQueue, Inspect, RaiseFence, ReleaseWatch, RenewMany, Turns, Watch,
};
use crate::records::{CasOutcome, HolderInfo, MultiMode, MultiOutcome, RenewItem};
use crate::{Backend, Error, Fence, Limits, LockKey, StoreClock, Token};

/// Renews each item with its own owner-checked `cas`: what the manager does
/// when a backend has no [`RenewMany`].
///
/// # Cancel safety
/// Dropping the future leaves the items renewed so far renewed and the
/// rest as they were.
pub async fn renew_each<B: Backend + ?Sized>(
    backend: &B,
    items: &[RenewItem],
) -> Result<Vec<bool>, Error> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let outcome = backend
            .cas(&item.key, Some(&item.token), &item.token, item.ttl)
            .await?;
        out.push(matches!(outcome, CasOutcome::Acquired { .. }));
    }
    Ok(out)
}

/// A backend that wraps another. Implement [`inner`](Self::inner) and
/// override only what the wrapper changes; everything else forwards to the
/// inner backend, extensions included, so a wrapper exposes exactly the
/// extensions of what it wraps. Every `Forward` type is a [`Backend`].
///
/// A wrapper that changes an extension implements that extension trait
/// itself and hands itself out only where the inner backend has it. Mind
/// that extensions bypass the wrapper's `cas`: a wrapper that changes
/// `cas` (to delay or cut requests, say) must also change
/// [`renewer`](Forward::renewer), which renews holds without `cas`, and
/// perhaps [`fair_queue`](Forward::fair_queue).
///
/// ```
/// use moltlock_core::{async_trait, Backend, Error, Forward, Inspect, HolderInfo, LockKey, MemoryBackend};
///
/// struct Quiet(MemoryBackend);
///
/// impl Forward for Quiet {
///     type Inner = MemoryBackend;
///     fn inner(&self) -> &MemoryBackend { &self.0 }
///     fn inspector(&self) -> Option<&dyn Inspect> {
///         self.0.inspector().map(|_| self as &dyn Inspect)
///     }
/// }
///
/// #[async_trait]
/// impl Inspect for Quiet {
///     async fn inspect(&self, _key: &LockKey) -> Result<Option<HolderInfo>, Error> { Ok(None) }
///     async fn list(&self, _prefix: &str) -> Result<Vec<HolderInfo>, Error> { Ok(Vec::new()) }
/// }
/// # let _: &dyn Backend = &Quiet(MemoryBackend::new());
/// ```
#[async_trait]
pub trait Forward: Send + Sync + 'static {
    /// The wrapped backend.
    type Inner: Backend + ?Sized;

    /// The wrapped backend.
    fn inner(&self) -> &Self::Inner;

    /// As [`Backend::cas`]; forwards by default.
    ///
    /// # Cancel safety
    /// That of the inner backend's `cas`.
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        self.inner().cas(key, expected, new, ttl).await
    }

    /// As [`Backend::delete`]; forwards by default.
    ///
    /// # Cancel safety
    /// That of the inner backend's `delete`.
    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        self.inner().delete(key, owner).await
    }

    /// As [`Backend::name`]; forwards by default.
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    /// As [`Backend::limits`]; forwards by default, with the inner
    /// store's [`Limits::in_order`] claim, which a wrapper whose delete
    /// awaits anything before the inner one's first poll makes wrong (at
    /// the cost of an attempt per release, see there).
    fn limits(&self) -> Limits {
        self.inner().limits()
    }

    /// As [`Backend::earliest_expiry`]; forwards by default.
    fn earliest_expiry(
        &self,
        ttl: Duration,
        sent_at: tokio::time::Instant,
    ) -> tokio::time::Instant {
        self.inner().earliest_expiry(ttl, sent_at)
    }

    /// As [`Backend::store_clock`]; forwards by default.
    fn store_clock(&self) -> Option<&StoreClock> {
        self.inner().store_clock()
    }

    /// As [`Backend::watcher`]; forwards by default.
    fn watcher(&self) -> Option<&dyn Watch> {
        self.inner().watcher()
    }

    /// As [`Backend::inspector`]; forwards by default.
    fn inspector(&self) -> Option<&dyn Inspect> {
        self.inner().inspector()
    }

    /// As [`Backend::renewer`]; forwards by default.
    fn renewer(&self) -> Option<&dyn RenewMany> {
        self.inner().renewer()
    }

    /// As [`Backend::describer`]; forwards by default.
    fn describer(&self) -> Option<&dyn Describe> {
        self.inner().describer()
    }

    /// As [`Backend::fence_raiser`]; forwards by default.
    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        self.inner().fence_raiser()
    }

    /// As [`Backend::fair_queue`]; forwards by default.
    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        self.inner().fair_queue()
    }

    /// As [`Backend::batch_cas`]; forwards by default.
    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        self.inner().batch_cas()
    }

    /// As [`Backend::turns`]; forwards by default.
    fn turns(&self) -> Option<&dyn Turns> {
        self.inner().turns()
    }
}

#[async_trait]
impl<W: Forward> Backend for W {
    async fn cas(
        &self,
        key: &LockKey,
        expected: Option<&Token>,
        new: &Token,
        ttl: Duration,
    ) -> Result<CasOutcome, Error> {
        Forward::cas(self, key, expected, new, ttl).await
    }

    async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
        Forward::delete(self, key, owner).await
    }

    fn name(&self) -> &'static str {
        Forward::name(self)
    }

    fn limits(&self) -> Limits {
        Forward::limits(self)
    }

    fn earliest_expiry(
        &self,
        ttl: Duration,
        sent_at: tokio::time::Instant,
    ) -> tokio::time::Instant {
        Forward::earliest_expiry(self, ttl, sent_at)
    }

    fn store_clock(&self) -> Option<&StoreClock> {
        Forward::store_clock(self)
    }

    fn watcher(&self) -> Option<&dyn Watch> {
        Forward::watcher(self)
    }

    fn inspector(&self) -> Option<&dyn Inspect> {
        Forward::inspector(self)
    }

    fn renewer(&self) -> Option<&dyn RenewMany> {
        Forward::renewer(self)
    }

    fn describer(&self) -> Option<&dyn Describe> {
        Forward::describer(self)
    }

    fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
        Forward::fence_raiser(self)
    }

    fn fair_queue(&self) -> Option<&dyn FairQueue> {
        Forward::fair_queue(self)
    }

    fn batch_cas(&self) -> Option<&dyn CasMulti> {
        Forward::batch_cas(self)
    }

    fn turns(&self) -> Option<&dyn Turns> {
        Forward::turns(self)
    }
}

/// `Arc<B>` is the backend it points to (`Arc<dyn Backend>` included), so a
/// shared backend needs no constructor of its own.
macro_rules! pointer_backend {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<B: Backend + ?Sized> Backend for $ptr<B> {
            async fn cas(
                &self,
                key: &LockKey,
                expected: Option<&Token>,
                new: &Token,
                ttl: Duration,
            ) -> Result<CasOutcome, Error> {
                (**self).cas(key, expected, new, ttl).await
            }

            async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
                (**self).delete(key, owner).await
            }

            fn name(&self) -> &'static str {
                (**self).name()
            }

            fn limits(&self) -> Limits {
                (**self).limits()
            }

            fn earliest_expiry(
                &self,
                ttl: Duration,
                sent_at: tokio::time::Instant,
            ) -> tokio::time::Instant {
                (**self).earliest_expiry(ttl, sent_at)
            }

            fn store_clock(&self) -> Option<&StoreClock> {
                (**self).store_clock()
            }

            fn watcher(&self) -> Option<&dyn Watch> {
                (**self).watcher()
            }

            fn inspector(&self) -> Option<&dyn Inspect> {
                (**self).inspector()
            }

            fn renewer(&self) -> Option<&dyn RenewMany> {
                (**self).renewer()
            }

            fn describer(&self) -> Option<&dyn Describe> {
                (**self).describer()
            }

            fn fence_raiser(&self) -> Option<&dyn RaiseFence> {
                (**self).fence_raiser()
            }

            fn fair_queue(&self) -> Option<&dyn FairQueue> {
                (**self).fair_queue()
            }

            fn batch_cas(&self) -> Option<&dyn CasMulti> {
                (**self).batch_cas()
            }

            fn turns(&self) -> Option<&dyn Turns> {
                (**self).turns()
            }
        }
    )*};
}

pointer_backend!(Arc);

/// `Box<B>` is the backend it points to, through [`Forward`] (a box is a
/// type other crates may implement `Forward` for, so it cannot have an
/// impl of its own). With `Forward` in scope, call a boxed backend's
/// methods as `(*boxed).cas(…)`.
impl<B: Backend + ?Sized> Forward for Box<B> {
    type Inner = B;
    fn inner(&self) -> &B {
        self
    }
}

/// Which extensions a backend hands out, by name, in a fixed order: for
/// logs, `moltlock conformance` and tests that a wrapper exposes exactly
/// what it wraps.
pub fn extensions<B: Backend + ?Sized>(backend: &B) -> Vec<&'static str> {
    let present = [
        ("watch", backend.watcher().is_some()),
        ("inspect", backend.inspector().is_some()),
        ("renew_many", backend.renewer().is_some()),
        ("describe", backend.describer().is_some()),
        ("raise_fence", backend.fence_raiser().is_some()),
        ("fair_queue", backend.fair_queue().is_some()),
        ("cas_multi", backend.batch_cas().is_some()),
    ];
    present
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect()
}

/// The extension, or [`Error::Unsupported`] naming the backend and `what`.
pub fn require<'a, T: ?Sized>(
    backend: &'static str,
    extension: Option<&'a T>,
    what: &'static str,
) -> Result<&'a T, Error> {
    extension.ok_or(Error::Unsupported { backend, what })
}

/// The optional operations called through the extensions a backend hands
/// out, each failing with [`Error::Unsupported`] where the backend has
/// none: for callers that need one feature and would report its absence
/// anyway (`moltlock status` lists holds with it).
///
/// # Cancel safety
/// Each method is as cancel safe as the extension method it calls.
#[async_trait]
pub trait BackendExt: Backend {
    /// [`Watch::watch`].
    async fn watch(&self, key: &LockKey) -> Result<Box<dyn ReleaseWatch>, Error> {
        require(self.name(), self.watcher(), "release notifications")?
            .watch(key)
            .await
    }

    /// [`Inspect::inspect`].
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        require(self.name(), self.inspector(), "inspect")?
            .inspect(key)
            .await
    }

    /// [`Inspect::list`].
    async fn list(&self, prefix: &str) -> Result<Vec<HolderInfo>, Error> {
        require(self.name(), self.inspector(), "list")?
            .list(prefix)
            .await
    }

    /// [`RenewMany::renew_many`], or one `cas` per item where the backend
    /// has no batch.
    async fn renew_many(&self, items: &[RenewItem]) -> Result<Vec<bool>, Error> {
        match self.renewer() {
            Some(batch) => batch.renew_many(items).await,
            None => renew_each(self, items).await,
        }
    }

    /// [`Describe::describe`].
    async fn describe(&self, key: &LockKey, owner: &Token, text: &str) -> Result<bool, Error> {
        require(self.name(), self.describer(), "holder descriptions")?
            .describe(key, owner, text)
            .await
    }

    /// [`RaiseFence::raise_fence`].
    async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
        require(self.name(), self.fence_raiser(), "raising fences")?
            .raise_fence(key, minimum)
            .await
    }

    /// [`FairQueue::acquire`].
    async fn fair_acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
    ) -> Result<Fence, Error> {
        require(self.name(), self.fair_queue(), "fair queue")?
            .acquire(key, token, ttl)
            .await
    }

    /// [`CasMulti::cas_multi`], or one `cas` per key
    /// ([`cas_each`](crate::extension::cas_each)) for a single key, and
    /// where the backend has no batch, the list is longer than its batch
    /// takes, or the batch cannot take these keys together.
    async fn cas_multi(
        &self,
        keys: &[LockKey],
        token: &Token,
        ttl: Duration,
        mode: MultiMode,
    ) -> Result<MultiOutcome, Error> {
        match self.batch_cas() {
            // One key needs no batch: the store's `cas` is atomic.
            Some(batch)
                if keys.len() > 1
                    && keys.len() <= batch.max_keys()
                    && batch.takes_together(keys) =>
            {
                batch.cas_multi(keys, token, ttl, mode).await
            }
            _ => crate::batch::cas_each(self, keys, token, ttl, mode).await,
        }
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}

/// Hands out the named extensions from a backend that implements them
/// itself: inside `impl Backend for MyStore`, `hand_out!(Watch, Inspect)`
/// writes `fn watcher(&self) -> Option<&dyn Watch> { Some(self) }` and the
/// same for each extension named (`Watch`, `Inspect`, `RenewMany`,
/// `Describe`, `RaiseFence`, `FairQueue`, `CasMulti`).
///
/// ```
/// use std::time::Duration;
/// use moltlock_core::{async_trait, hand_out, Backend, CasOutcome, Error, Fence, LockKey, RaiseFence, Token};
///
/// struct Store(moltlock_core::MemoryBackend);
///
/// #[async_trait]
/// impl Backend for Store {
///     async fn cas(&self, key: &LockKey, expected: Option<&Token>, new: &Token, ttl: Duration)
///         -> Result<CasOutcome, Error> { self.0.cas(key, expected, new, ttl).await }
///     async fn delete(&self, key: &LockKey, owner: &Token) -> Result<bool, Error> {
///         self.0.delete(key, owner).await
///     }
///     hand_out!(RaiseFence);
/// }
///
/// #[async_trait]
/// impl RaiseFence for Store {
///     async fn raise_fence(&self, key: &LockKey, minimum: Fence) -> Result<(), Error> {
///         moltlock_core::BackendExt::raise_fence(&self.0, key, minimum).await
///     }
/// }
/// # assert!(Store(moltlock_core::MemoryBackend::new()).fence_raiser().is_some());
/// ```
#[macro_export]
macro_rules! hand_out {
    ($($extension:ident),+ $(,)?) => {
        $( $crate::hand_out!(@one $extension); )+
    };
    (@one Watch) => { $crate::hand_out!(@fn watcher Watch); };
    (@one Inspect) => { $crate::hand_out!(@fn inspector Inspect); };
    (@one RenewMany) => { $crate::hand_out!(@fn renewer RenewMany); };
    (@one Describe) => { $crate::hand_out!(@fn describer Describe); };
    (@one RaiseFence) => { $crate::hand_out!(@fn fence_raiser RaiseFence); };
    (@one FairQueue) => { $crate::hand_out!(@fn fair_queue FairQueue); };
    (@one CasMulti) => { $crate::hand_out!(@fn batch_cas CasMulti); };
    (@one Turns) => { $crate::hand_out!(@fn turns Turns); };
    (@fn $accessor:ident $extension:ident) => {
        fn $accessor(&self) -> ::core::option::Option<&dyn $crate::$extension> {
            ::core::option::Option::Some(self)
        }
    };
}
