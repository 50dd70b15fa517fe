//! The written-token cache: the token this session last wrote to each lock
//! key, for keys whose last write by this session is known to have landed.
//!
//! A key still attached to the session's lease holds exactly that token
//! (nobody else writes on our lease, and any other write detaches the key),
//! so a renewal round checks its holds with one lease query instead of
//! reading every key. An entry is dropped before each write of its key and
//! restored only when etcd confirms the write.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use moltlock_core::Token;

/// Full lock key → the token last written to it, confirmed.
#[derive(Default)]
pub(crate) struct Written(Mutex<HashMap<Vec<u8>, Token>>);

impl Written {
    fn map(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Token>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key is about to be written (or deleted): its outcome is unknown
    /// until etcd answers.
    pub(crate) fn forget(&self, full_key: &[u8]) {
        self.map().remove(full_key);
    }

    /// etcd confirmed the write of `token` to the key.
    pub(crate) fn record(&self, full_key: Vec<u8>, token: &Token) {
        self.map().insert(full_key, token.clone());
    }

    /// Whether the last confirmed write of the key is `token`'s.
    pub(crate) fn is(&self, full_key: &[u8], token: &Token) -> bool {
        self.map().get(full_key) == Some(token)
    }
}
