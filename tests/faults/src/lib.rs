//! Fault-injection harness (work in progress).
