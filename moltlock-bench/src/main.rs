//! Benchmark harness (work in progress).
fn main() {}
