//! A real browser for the tests: Debian's `chromium`, headless, driven over the DevTools
//! protocol on a pipe (`--remote-debugging-pipe`: JSON messages, each ended by a NUL, read on
//! fd 3 and written on fd 4), so no port and no extra crate. It loads a page, waits for it,
//! and answers what a test asserts: console errors and exceptions, each figure's SVG text
//! (series names), the page's text, and a PNG of the whole page.

use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Why the headless browser could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("starting {program}: {source}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("talking to the browser: {0}")]
    Io(#[from] std::io::Error),
    #[error("the browser closed its pipe (it exited)")]
    Closed,
    #[error("no answer to {method} within {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    #[error("{method} failed: {error}")]
    Protocol { method: String, error: String },
    #[error("loading {url}: {error}")]
    Navigate { url: String, error: String },
}

/// One `<figure>` of a page: its id and the text of its SVG's `<text>` elements.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Figure {
    pub id: String,
    pub texts: Vec<String>,
}

/// What a test learns from one page.
#[derive(Debug)]
pub struct Loaded {
    /// Uncaught exceptions, `console.error` calls and failed loads (the browser log's errors).
    pub errors: Vec<String>,
    pub figures: Vec<Figure>,
    /// `document.body.innerText`.
    pub text: String,
    /// The whole page, as a PNG.
    pub png: Vec<u8>,
}

impl Loaded {
    /// The figure with element id `id`, if the page has it.
    pub fn figure(&self, id: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.id == id)
    }
}

/// How a page is loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub javascript: bool,
    pub width: u32,
    /// A script expression to wait for (true) after the load event, e.g. that the page's own
    /// script refreshed once.
    pub wait_for: Option<String>,
    pub timeout: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            javascript: true,
            width: 1200,
            wait_for: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A headless Chromium, closed when dropped.
pub struct Browser {
    child: Child,
    to: std::fs::File,
    from: Receiver<Value>,
    /// Events read while waiting for an answer, kept for the page that caused them.
    events: Vec<Value>,
    next_id: u64,
    profile: PathBuf,
}

/// The browser's program: `$RBGCTL_CHROMIUM`, else `chromium` on the PATH.
pub fn program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RBGCTL_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    })
}

const FIGURES_JS: &str = "JSON.stringify([...document.querySelectorAll('figure')].map(f => \
    ({id: f.id, texts: [...f.querySelectorAll('svg text')].map(t => t.textContent.trim())})))";

impl Browser {
    /// Starts `program` headless, with a profile of its own and nothing fetched from the
    /// network (no updates, no sync, no first-run pages).
    pub fn start(program: &Path) -> Result<Browser, BrowserError> {
        let profile = std::env::temp_dir().join(format!(
            "rbgctl-chromium-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let start_err = |source| BrowserError::Start {
            program: program.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&profile).map_err(start_err)?;
        let (cmd_read, cmd_write) = pipe().map_err(start_err)?;
        let (out_read, out_write) = pipe().map_err(start_err)?;
        let (r3, w4) = (cmd_read.as_raw_fd(), out_write.as_raw_fd());
        let mut command = Command::new(program);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--mute-audio",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2). Both ends
        // are first copied above fd 10, so that placing one at 3 or 4 cannot overwrite the
        // other; dup2 clears close-on-exec on the copies at 3 and 4.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let high = [r3, w4].map(|fd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10));
                for (fd, target) in high.into_iter().zip([3, 4]) {
                    if fd < 0 || libc::dup2(fd, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(start_err)?;
        drop((cmd_read, out_write));
        let (tx, from) = std::sync::mpsc::channel();
        let reader = std::fs::File::from(out_read);
        std::thread::Builder::new()
            .name("chromium-pipe".into())
            .spawn(move || {
                let mut lines = std::io::BufReader::new(reader);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match lines.read_until(0, &mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            if buf.last() == Some(&0) {
                                buf.pop();
                            }
                            if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                                if tx.send(v).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            })?;
        Ok(Browser {
            child,
            to: std::fs::File::from(cmd_write),
            from,
            events: Vec::new(),
            next_id: 0,
            profile,
        })
    }

    /// Sends one command (to the page's `session`, if any) and waits for its answer.
    fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, BrowserError> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(std::io::Error::other)?;
        bytes.push(0);
        self.to.write_all(&bytes)?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = match self.from.recv_timeout(left) {
                Ok(v) => v,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(BrowserError::Timeout {
                        method: method.into(),
                        timeout,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => return Err(BrowserError::Closed),
            };
            if v["id"].as_u64() == Some(id) {
                if let Some(e) = v.get("error") {
                    return Err(BrowserError::Protocol {
                        method: method.into(),
                        error: e.to_string(),
                    });
                }
                return Ok(v["result"].clone());
            }
            if v.get("method").is_some() {
                self.events.push(v);
            }
        }
    }

    /// Waits for an event of `method` on `session`.
    fn event(
        &mut self,
        session: &str,
        method: &str,
        timeout: Duration,
    ) -> Result<(), BrowserError> {
        let is = |v: &Value| v["method"] == method && v["sessionId"] == session;
        if self.events.iter().any(is) {
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from.recv_timeout(left) {
                Ok(v) => {
                    let found = is(&v);
                    self.events.push(v);
                    if found {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(BrowserError::Timeout {
                        method: method.into(),
                        timeout,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => return Err(BrowserError::Closed),
            }
        }
    }

    fn evaluate(&mut self, session: &str, expr: &str, t: Duration) -> Result<Value, BrowserError> {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
            t,
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(BrowserError::Protocol {
                method: format!("Runtime.evaluate({expr})"),
                error: e.to_string(),
            });
        }
        Ok(r["result"]["value"].clone())
    }

    /// Loads `url` in a new tab and reads it.
    pub fn load(&mut self, url: &str, o: &LoadOptions) -> Result<Loaded, BrowserError> {
        let t = o.timeout;
        self.events.clear();
        let target = self.call(
            None,
            "Target.createTarget",
            json!({"url": "about:blank"}),
            t,
        )?;
        let target_id = target["targetId"].as_str().unwrap_or_default().to_string();
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
            t,
        )?;
        let session = attached["sessionId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let s = Some(session.as_str());
        for method in ["Page.enable", "Runtime.enable", "Log.enable"] {
            self.call(s, method, json!({}), t)?;
        }
        if !o.javascript {
            self.call(
                s,
                "Emulation.setScriptExecutionDisabled",
                json!({"value": true}),
                t,
            )?;
        }
        let metrics = |height: u64| json!({"width": o.width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        self.call(s, "Emulation.setDeviceMetricsOverride", metrics(900), t)?;
        let nav = self.call(s, "Page.navigate", json!({"url": url}), t)?;
        if let Some(e) = nav["errorText"].as_str().filter(|e| !e.is_empty()) {
            return Err(BrowserError::Navigate {
                url: url.into(),
                error: e.into(),
            });
        }
        self.event(&session, "Page.loadEventFired", t)?;
        if let Some(expr) = &o.wait_for {
            let deadline = Instant::now() + t;
            while self.evaluate(&session, expr, t)? != json!(true) {
                if Instant::now() > deadline {
                    return Err(BrowserError::Timeout {
                        method: format!("waiting for {expr}"),
                        timeout: t,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let figures = self.evaluate(&session, FIGURES_JS, t)?;
        let figures: Vec<Figure> = serde_json::from_str(figures.as_str().unwrap_or("[]"))
            .map_err(std::io::Error::other)?;
        let text = self.evaluate(&session, "document.body.innerText", t)?;
        let layout = self.call(s, "Page.getLayoutMetrics", json!({}), t)?;
        let height = layout["cssContentSize"]["height"].as_f64().unwrap_or(900.0);
        self.call(
            s,
            "Emulation.setDeviceMetricsOverride",
            metrics((height.ceil() as u64).clamp(100, 16_000)),
            t,
        )?;
        let shot = self.call(s, "Page.captureScreenshot", json!({"format": "png"}), t)?;
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .map_err(std::io::Error::other)?;
        let errors = self.errors(&session);
        let _ = self.call(
            None,
            "Target.closeTarget",
            json!({"targetId": target_id}),
            t,
        );
        Ok(Loaded {
            errors,
            figures,
            text: text.as_str().unwrap_or_default().to_string(),
            png,
        })
    }

    /// The errors the page's session reported: exceptions, console errors, log errors.
    fn errors(&self, session: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.events.iter().filter(|e| e["sessionId"] == session) {
            let p = &e["params"];
            match e["method"].as_str() {
                Some("Runtime.exceptionThrown") => out.push(format!(
                    "exception: {}",
                    p["exceptionDetails"]["exception"]["description"]
                        .as_str()
                        .or(p["exceptionDetails"]["text"].as_str())
                        .unwrap_or("?")
                )),
                Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                    out.push(format!("console.error: {}", p["args"]))
                }
                Some("Log.entryAdded") if p["entry"]["level"] == "error" => out.push(format!(
                    "log: {} {}",
                    p["entry"]["text"].as_str().unwrap_or("?"),
                    p["entry"]["url"].as_str().unwrap_or("")
                )),
                _ => {}
            }
        }
        out
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.call(None, "Browser.close", json!({}), Duration::from_secs(5));
        let exited = super::wait_until(Duration::from_secs(2), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A pipe whose ends close on exec (the child gets its own copies at fds 3 and 4).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}
