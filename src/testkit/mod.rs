//! Test infrastructure, compiled only into tests and into builds with the `testkit` feature
//! (which `cargo test` turns on for the integration tests and the benches that need it); the
//! release binary carries none of it.
//!
//! - `apiserver`: an in-process stand-in for kube-apiserver, with a SIMULATED kubelet.
//! - `browser`: a headless Chromium driven over the DevTools protocol, for the pictures' tests.
//! - `fake_worker`: a FAKE SGLang-compatible worker (`rbgctl bench fake-worker`).
//! - `history`: the checker of recorded put/get/remove histories (`docs/consistency.md`).
//! - `load`: a put/get/remove load that records its history (`rbgctl bench history-load`).
//! - `netns`: hosts of their own (network namespaces on a bridge) whose links fail on demand.
//! - `proxy`: a TCP link that delays what it forwards.
//! - `scratch`: files the unit tests write, each in a temporary directory of its own.

pub mod apiserver;
pub mod browser;
pub mod fake_worker;
pub mod history;
pub mod load;
pub mod netns;
pub mod proxy;
#[cfg(test)]
pub mod scratch;
pub mod tokenizer;

/// Polls `f` every 20 ms until it is true or `timeout` passes; whether it came true.
pub fn wait_until(timeout: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    f()
}
