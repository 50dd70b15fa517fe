//! The flaws, each breaking one point of the contract.

/// The flaw a [`Flawed`](super::Flawed) backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// None: a correct backend, to show the self-tests can pass.
    None,
    /// `delete` removes the key whoever holds it.
    UnconditionalDelete,
    /// `cas` reads, yields, then writes: not atomic.
    ReadThenWrite,
    /// Holds never expire.
    IgnoresTtl,
    /// `cas(None)` takes a live hold too (an upsert that forgot the expiry
    /// check).
    TakesHeldKey,
    /// `cas(Some(x))` hands a live hold over whoever holds it (it checks
    /// only that the key is held).
    CasIgnoresExpected,
    /// Every acquisition gets fence 1.
    RepeatingFence,
    /// Fences are counted per hold record, and a taker of an expired hold
    /// starts a new record: its count starts again from 1.
    FenceRestartsAfterExpiry,
    /// Renewal succeeds whatever token asks.
    RenewsForeignToken,
    /// Taking over an *expired* hold reads, yields, then writes (a free or
    /// live key is handled atomically).
    ExpiredTakeoverReadThenWrite,
    /// TTLs are truncated to whole seconds (`EX ttl.as_secs()`).
    WholeSecondTtl,
    /// Expiry instants are stored in whole seconds of the store's clock.
    CoarseClock,
    /// Holds end 2 ms before their TTL (an expiry judged by a clock read
    /// low, or a key freed in the millisecond it expires).
    EndsEarly,
    /// Holds of one client hang on one lease taken with its first hold, but
    /// `earliest_expiry` reports `sent_at + ttl` for every hold.
    SharedLeaseWrongBound,
    /// Renewal compares the holder but not the expiry: it revives an
    /// expired hold.
    RenewsExpiredHold,
    /// Renewal adds the TTL to the old expiry instead of setting now + TTL.
    RenewalAddsTtl,
    /// Taking over an expired hold updates its expiry and fence but keeps
    /// the old owner token.
    TakeoverKeepsOldToken,
    /// `cas(Some(a), b)` keeps `a`'s fence.
    HandOverKeepsFence,
    /// `cas(Some(a), b)` keeps `a`'s expiry instead of now + TTL.
    HandOverKeepsExpiry,
    /// Declares its requests in order, but `delete` yields before it takes
    /// effect: a request sent after it lands first.
    DeleteLandsLate,
    /// `delete` compares the owner but not the expiry: deleting one's own
    /// expired hold reports success.
    DeleteIgnoresExpiry,
    /// `delete` reports success whatever it did.
    DeleteAlwaysTrue,
    /// Each client draws fences from a block of 100 of its own.
    PerClientFenceBlocks,
    /// The fence is drawn before the compare (Postgres `nextval()` in the
    /// `VALUES` row): a slower winner gets an older fence.
    FenceDrawnBeforeConflict,
    /// `renew_many` answers every item with the first item's answer.
    BatchAnswersFirstForAll,
    /// `renew_many` renews every item with the first item's TTL.
    BatchUsesFirstTtl,
    /// `renew_many` upserts: it re-creates deleted or absent holds.
    BatchRecreatesDeleted,
    /// `watch()` subscribes only when `released()` is first awaited.
    WatchSubscribesLazily,
    /// `delete` announces nothing: a waiter learns of a release only when
    /// it looks again.
    ReleaseNotAnnounced,
    /// A watch resolves once, then never again.
    WatchFiresOnce,
    /// `inspect` reports the full TTL as time left, always.
    InspectReportsFullTtl,
    /// `inspect` and `list` report expired holds.
    InspectShowsExpired,
    /// `list` ignores its prefix.
    ListIgnoresPrefix,
    /// `list` matches its prefix as a SQL `LIKE` pattern (`prefix%`,
    /// unescaped), so `_` and `%` in it are wildcards.
    ListPrefixAsPattern,
    /// `inspect` and `list` report the store's latest fence, not the hold's.
    InspectReportsLatestFence,
    /// `inspect` and `list` report the first holder the key ever had (a
    /// holder column that a takeover does not update).
    InspectReportsFirstHolder,
    /// A fair acquisition first tries to take a free key directly.
    FairBarges,
    /// The fair queue serves its newest place first (sorted the wrong way).
    FairServesNewestFirst,
    /// A dropped fair waiter's queue place stays until its TTL.
    FairKeepsDroppedPlace,
    /// A fair waiter that stopped looking (a crash, a long pause) keeps its
    /// place for good: nothing ends a place but its waiter.
    FairKeepsFrozenPlace,
    /// A fair waiter takes a free key once the place just ahead of its own
    /// is gone, without looking further ahead (as a waiter that watches
    /// only its predecessor and does not check it became the head).
    FairPassesAhead,
    /// A fair waiter that finds the key held by its own token (an earlier
    /// attempt that landed unseen) waits for that hold to end.
    FairWaitsOnOwnHold,
    /// Fair acquisitions draw fences from a counter of their own.
    FairFenceSeparate,
    /// `raise_fence` sets the fence counter to the minimum (can lower it).
    RaiseFenceSets,
    /// `raise_fence` reads the counter, waits, then writes the larger of
    /// what it read and its minimum: racing raises lose updates.
    RaiseFenceReadThenWrite,
    /// Tokens are compared by their first 8 characters.
    TokenPrefixCompare,
    /// Tokens are compared ignoring ASCII case.
    TokenCaseInsensitive,
    /// Keys are compared ignoring case (a case-insensitive collation).
    KeyCaseInsensitive,
    /// Keys are truncated to 191 bytes (a `VARCHAR(191)` column).
    KeyTruncated,
    /// Keys are filed by their first 32 bytes (a fixed-width key column).
    KeyFixedWidth,
    /// Keys above 191 bytes are refused, though the declared limit is
    /// longer (a `VARCHAR(191)` column the limits do not tell of).
    LongKeysRefused,
    /// A refused `cas` names the caller as the holder.
    HeldEchoesCaller,
    /// `describe` stores the text whoever asks.
    DescribeIgnoresOwner,
    /// Descriptions live in a table of their own that nothing clears: a
    /// new hold reports the old hold's.
    DescriptionOutlivesHold,
    /// A request whose caller went away lands 5.3 s later (a client that
    /// re-sends queued requests after the caller is gone), past the few
    /// seconds the manager keeps cleaning up after a cancelled acquisition.
    LateLandingAfterCancel,
    /// Renewal answers yes but leaves the old expiry: holds die one TTL
    /// after they were taken.
    RenewalIgnored,
    /// `delete` looks the key up under another name than `cas` files it
    /// under: it never finds a hold, so nothing is ever released.
    DeleteMissesKey,
    /// `cas_multi(All)` takes keys until it meets a held one, and leaves
    /// what it took.
    MultiLeavesPartial,
    /// `cas_multi(All)` takes one key at a time, pausing in between, and
    /// gives them back when it meets a held one: others see a part of the
    /// set held meanwhile.
    MultiTakesInTurn,
    /// `cas_multi(Any)` takes every free key, not only the first.
    MultiAnyTakesSeveral,
}

impl Flaw {
    /// Whether the flaw is one of `cas_multi`'s (a store with another flaw
    /// has no `cas_multi`, so multi-key cases go through its flawed `cas`).
    pub fn in_cas_multi(self) -> bool {
        matches!(
            self,
            Flaw::None
                | Flaw::MultiLeavesPartial
                | Flaw::MultiTakesInTurn
                | Flaw::MultiAnyTakesSeveral
        )
    }

    /// Every flaw but [`Flaw::None`].
    pub const ALL: &'static [Flaw] = &[
        Flaw::UnconditionalDelete,
        Flaw::ReadThenWrite,
        Flaw::IgnoresTtl,
        Flaw::TakesHeldKey,
        Flaw::CasIgnoresExpected,
        Flaw::RepeatingFence,
        Flaw::FenceRestartsAfterExpiry,
        Flaw::RenewsForeignToken,
        Flaw::ExpiredTakeoverReadThenWrite,
        Flaw::WholeSecondTtl,
        Flaw::CoarseClock,
        Flaw::EndsEarly,
        Flaw::SharedLeaseWrongBound,
        Flaw::RenewsExpiredHold,
        Flaw::RenewalAddsTtl,
        Flaw::TakeoverKeepsOldToken,
        Flaw::HandOverKeepsFence,
        Flaw::HandOverKeepsExpiry,
        Flaw::DeleteLandsLate,
        Flaw::DeleteIgnoresExpiry,
        Flaw::DeleteAlwaysTrue,
        Flaw::PerClientFenceBlocks,
        Flaw::FenceDrawnBeforeConflict,
        Flaw::BatchAnswersFirstForAll,
        Flaw::BatchUsesFirstTtl,
        Flaw::BatchRecreatesDeleted,
        Flaw::WatchSubscribesLazily,
        Flaw::ReleaseNotAnnounced,
        Flaw::WatchFiresOnce,
        Flaw::InspectReportsFullTtl,
        Flaw::InspectShowsExpired,
        Flaw::ListIgnoresPrefix,
        Flaw::ListPrefixAsPattern,
        Flaw::InspectReportsLatestFence,
        Flaw::InspectReportsFirstHolder,
        Flaw::FairBarges,
        Flaw::FairServesNewestFirst,
        Flaw::FairKeepsDroppedPlace,
        Flaw::FairKeepsFrozenPlace,
        Flaw::FairPassesAhead,
        Flaw::FairWaitsOnOwnHold,
        Flaw::FairFenceSeparate,
        Flaw::RaiseFenceSets,
        Flaw::RaiseFenceReadThenWrite,
        Flaw::TokenPrefixCompare,
        Flaw::TokenCaseInsensitive,
        Flaw::KeyCaseInsensitive,
        Flaw::KeyTruncated,
        Flaw::KeyFixedWidth,
        Flaw::LongKeysRefused,
        Flaw::HeldEchoesCaller,
        Flaw::DescribeIgnoresOwner,
        Flaw::DescriptionOutlivesHold,
        Flaw::LateLandingAfterCancel,
        Flaw::RenewalIgnored,
        Flaw::DeleteMissesKey,
        Flaw::MultiLeavesPartial,
        Flaw::MultiTakesInTurn,
        Flaw::MultiAnyTakesSeveral,
    ];
}
