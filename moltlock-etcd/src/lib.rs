//! MoltLock backend for etcd (work in progress).
