//! The Python client and SGLang HiCache backend (`python/`): their unittest suite, run with
//! `$RBGCTL_PYTHON` (default `python3`) against masters and stores of this build.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rbgctl");
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
    match status {
        Some(st) => assert!(st.success(), "python tests failed ({st}); output above"),
        None => panic!("python tests did not finish within 600 s; output above"),
    }
    assert!(
        log.contains("Ran ") && !log.contains("Ran 0 tests"),
        "the python suite ran no tests"
    );
}
