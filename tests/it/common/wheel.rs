//! Mooncake's wheel (its PyPI package, unchanged) as a test's process: a script run by the
//! interpreter `RBGCTL_MOONCAKE_PYTHON` names, driven a line at a time, killed (SIGKILL) and
//! reaped when dropped so that a failing test leaves none behind.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The wheel's interpreter, or `None` after the skip line when none is given.
pub fn python() -> Option<OsString> {
    let python = std::env::var_os("RBGCTL_MOONCAKE_PYTHON");
    if python.is_none() {
        super::skip("RBGCTL_MOONCAKE_PYTHON (the Mooncake wheel's interpreter) is not set");
    }
    python
}

/// A wheel process with a 32 MiB global segment, set up against `master` (it prints
/// `setup 0`), that for each line `KEY SEGMENT` it is sent puts `KEY` repeated 100 times,
/// preferring that segment, reads it back and prints `put KEY <code> <read back whole>`.
pub fn putter(python: &OsString, master: &str) -> Wheel {
    let script = format!(
        "import sys\n\
         from mooncake.store import MooncakeDistributedStore as S, ReplicateConfig\n\
         s = S()\n\
         print('setup', s.setup('127.0.0.1', 'P2PHANDSHAKE', 32 << 20, 16 << 20, 'tcp', '', \
         '{master}'), flush=True)\n\
         c = ReplicateConfig()\n\
         for line in sys.stdin:\n\
         \x20   key, where = line.split()\n\
         \x20   c.preferred_segment = where\n\
         \x20   r = s.put(key, key.encode() * 100, c)\n\
         \x20   print('put', key, r, s.get(key) == key.encode() * 100, flush=True)\n"
    );
    Wheel::start(python, &script)
}

pub struct Wheel {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Wheel {
    /// Runs `script` (Python source) with `python`, its Transfer Engine on loopback.
    pub fn start(python: &OsString, script: &str) -> Wheel {
        Wheel::start_with(python, script, &[], Stdio::null())
    }

    /// As `start`, with more of the environment (`PYTHONPATH`, Mooncake's `MC_*`) and where
    /// its standard error goes.
    pub fn start_with(
        python: &OsString,
        script: &str,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Wheel {
        let mut child = Command::new(python)
            .args(["-c", script])
            .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("the wheel's interpreter runs");
        let input = child.stdin.take();
        let output = BufReader::new(child.stdout.take().expect("piped"));
        Wheel {
            child,
            input,
            output,
        }
    }

    /// The next line the script printed, trimmed (empty once it ended).
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        let _ = self.output.read_line(&mut l);
        l.trim().to_string()
    }

    /// Sends the script one line.
    pub fn send(&mut self, line: &str) {
        let input = self.input.as_mut().expect("the script's input is open");
        writeln!(input, "{line}").expect("the script reads its input");
    }

    /// Closes the script's input, so that it ends as it does (the scripts here close their
    /// store), and reaps it; killed if it has not ended within 30 s.
    pub fn finish(&mut self) {
        drop(self.input.take());
        let ended = super::wait_until(std::time::Duration::from_secs(30), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !ended {
            self.kill();
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Wheel {
    fn drop(&mut self) {
        drop(self.input.take());
        self.kill();
    }
}
