//! MoltLock backend for redis (work in progress).
