//! What a person typing commands meets: argument handling, and error messages that name what
//! to fix (once, without repeating themselves).

use crate::common;

use common::*;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output, Stdio};

fn rbgctl(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("MOONCAKE_MASTER")
        .stdin(Stdio::null())
        .output()
        .expect("rbgctl runs")
}

fn run(args: &[&str]) -> Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    rbgctl(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn arguments_that_are_not_utf8_are_refused_without_a_panic() {
    let bad = std::ffi::OsStr::from_bytes(b"\xff");
    let o = rbgctl(&["kv".as_ref(), "put".as_ref(), bad, "v".as_ref()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("invalid UTF-8"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn kv_takes_master_anywhere_and_values_that_look_like_flags() {
    for args in [
        &["kv", "get", "k", "--master", "127.0.0.1:1"][..],
        &["kv", "--master", "127.0.0.1:1", "put", "k", "-1"][..],
        &["kv", "put", "-k", "-1", "--master", "127.0.0.1:1"][..],
    ] {
        let o = run(args);
        let e = stderr(&o);
        assert!(!o.status.success());
        assert!(!e.contains("unexpected argument"), "{args:?}: {e}");
        // One connection error, naming the address once.
        assert_eq!(
            e.matches("connecting to 127.0.0.1:1").count(),
            1,
            "{args:?}: {e}"
        );
    }
}

#[test]
fn kv_errors_say_what_is_wrong_once() {
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 4 << 20,
        ..Default::default()
    });
    let master = c.rpc.as_str();
    let o = run(&["kv", "--master", master, "rm", "nonexist"]);
    assert_eq!(stderr(&o).trim(), "rbgctl: key \"nonexist\" not found");
    let long = "k".repeat(100_000);
    let o = run(&["kv", "--master", master, "put", &long, "v"]);
    let e = stderr(&o);
    assert!(
        e.contains("is 100000 bytes long; the limit is 4096 bytes"),
        "{e}"
    );
    assert!(!e.contains("MALFORMED"), "{e}");
    // A value on standard input larger than any segment stops at the segment's size.
    let mut child = Command::new(BIN)
        .args(["kv", "--master", master, "put", "big", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..64 {
            if input.write_all(&chunk).is_err() {
                break; // the reader stopped early, as it should
            }
        }
    });
    let o = child.wait_with_output().unwrap();
    let _ = writer.join();
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("larger than the largest segment (4194304 bytes)"),
        "{e}"
    );
    // kv segments has a header and no repeated columns.
    let o = run(&["kv", "--master", master, "segments"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.starts_with("NAME"), "{out}");
    assert!(out.contains("store-0"), "{out}");
}

#[test]
fn size_and_address_errors_name_the_setting_and_the_address() {
    let o = run(&[
        "up",
        "--stores",
        "1",
        "--segment-size",
        "0",
        "--engines",
        "0",
    ]);
    assert!(stderr(&o).contains("pool.segment_size"), "{}", stderr(&o));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = run(&["sim-engine", "--host", "127.0.0.1", "--port", &port]);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("127.0.0.1:{port}")) && e.contains("in use"),
        "{e}"
    );
}

#[test]
fn up_on_a_taken_port_says_which_and_claims_no_endpoints() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = run(&[
        "up",
        "--stores",
        "1",
        "--segment-size",
        "8MiB",
        "--engines",
        "0",
        "--master-port",
        &port,
        "--metadata-port",
        "0",
        "--metrics-port",
        "0",
    ]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(!o.status.success());
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("in use"),
        "{err}"
    );
    assert!(!out.contains("rbgctl is up"), "it claimed endpoints: {out}");
}

/// Starts `up` with one store and no engines (plus `extra` arguments), reads its standard
/// error until a line says `done`, stops it with SIGINT, and returns the lines read.
fn up_log_lines(extra: &[&str], done: impl Fn(&str) -> bool) -> Vec<String> {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args([
            "up",
            "--stores",
            "1",
            "--segment-size",
            "8MiB",
            "--engines",
            "0",
        ])
        .args([
            "--master-port",
            "0",
            "--metadata-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .args(extra)
        .env_remove("MOONCAKE_MASTER")
        .env_remove("RBGCTL_LOG_FORMAT")
        .env("RBGCTL_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut lines = Vec::new();
    while let Ok(line) =
        rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        let found = done(&line);
        lines.push(line);
        if found {
            break;
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let stopped = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !stopped {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(stopped, "up did not stop on SIGINT within 10 s");
    lines
}

#[test]
fn up_prefixes_each_child_line_with_its_role_and_writes_no_colour_codes_to_a_pipe() {
    let lines = up_log_lines(&[], |l| {
        l.contains("store-0 | ") && l.contains("segment mounted")
    });
    let text = lines.join("\n");
    assert!(text.contains("   master | "), "{text}");
    assert!(text.contains("  store-0 | "), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text}");
}

#[test]
fn log_format_json_gives_one_json_object_per_line_from_every_role_up_starts() {
    let lines = up_log_lines(&["--log-format", "json"], |l| {
        l.contains("\"store-0\"") && l.contains("segment mounted")
    });
    let text = lines.join("\n");
    assert!(
        lines.iter().any(|l| l.contains("segment mounted")),
        "the store never said it mounted: {text}"
    );
    let mut roles = std::collections::BTreeSet::new();
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if let Some(role) = v["role"].as_str() {
            roles.insert(role.to_string());
        }
    }
    assert!(
        roles.contains("master") && roles.contains("store-0"),
        "{roles:?}: {text}"
    );
    assert!(!text.contains('\u{1b}'), "colour codes in JSON: {text}");
}

/// Issue 40, item 13: the README's "Try it" block works pasted into a shell as it is (the
/// program's path is this build's, `cargo build` is left out).
#[test]
fn the_readme_try_it_block_works_as_pasted() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## Try it\n")
        .nth(1)
        .expect("README has a Try it section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .map(|l| l.replace("./target/release/rbgctl", BIN) + "\n")
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .args(["120", "bash", "-e", "-c", &script])
        .current_dir(dir.path())
        .env_remove("MOONCAKE_MASTER")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{script}\nstdout:\n{so}\nstderr:\n{se}"
    );
    assert!(so.contains("world"), "kv get printed the value:\n{so}");
    assert!(
        so.contains("store-1"),
        "kv segments lists both stores:\n{so}"
    );
    assert!(so.contains("rbgctl_master"), "the metrics answered:\n{so}");
    assert!(
        std::net::TcpStream::connect("127.0.0.1:21051").is_err(),
        "the pool stopped"
    );
}

/// Issue 40, items 22 and 24: what a new user's mistakes get told.
#[test]
fn first_mistakes_get_an_answer_naming_what_to_fix() {
    let mut c = Cluster::start(Opts {
        stores: 0,
        ..Default::default()
    });
    let master = c.rpc.clone();
    let master = master.as_str();
    let o = run(&["kv", "--master", master, "put", "k", "v"]);
    assert!(
        stderr(&o).contains("no segment is mounted"),
        "{}",
        stderr(&o)
    );
    c.add_store(4 << 20);
    c.add_store(4 << 20);
    assert!(wait_until(std::time::Duration::from_secs(10), || c
        .segment_count()
        == 2));
    let o = run(&["kv", "--master", master, "put", "k", "v", "--replicas", "5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("5 replicas asked, 2 segments mounted"),
        "{}",
        stderr(&o)
    );
    let o = run(&["master", "--client-ttl", "-5s"]);
    assert!(stderr(&o).contains("cannot be negative"), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("up.toml");
    std::fs::write(&cfg, "[pool]\nstores = -1\n").unwrap();
    let o = run(&["up", "--config", cfg.to_str().unwrap()]);
    assert!(stderr(&o).contains("pool.stores"), "{}", stderr(&o));
    std::fs::write(&cfg, "[pool]\nsegment_size = \"-5GiB\"\n").unwrap();
    let o = run(&["up", "--config", cfg.to_str().unwrap()]);
    let e = stderr(&o);
    assert!(
        e.contains("pool.segment_size") && e.contains("cannot be negative"),
        "{e}"
    );
}

/// Issue 40, item 27: `kv get` to a terminal ends its line; to a pipe it prints the bytes as
/// they are.
#[test]
fn kv_get_to_a_terminal_ends_its_line() {
    let c = Cluster::start(Opts {
        stores: 1,
        segment: 4 << 20,
        ..Default::default()
    });
    let o = run(&["kv", "--master", &c.rpc, "put", "k", "value"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let piped = run(&["kv", "--master", &c.rpc, "get", "k"]);
    assert_eq!(piped.stdout, b"value");
    // `script` gives the command a pseudo-terminal (util-linux).
    let tty = Command::new("script")
        .args([
            "-qec",
            &format!("{BIN} kv --master {} get k", c.rpc),
            "/dev/null",
        ])
        .env_remove("MOONCAKE_MASTER")
        .stdin(Stdio::null())
        .output()
        .expect("script runs");
    let out = String::from_utf8_lossy(&tty.stdout);
    assert!(
        out.starts_with("value\r\n") || out.starts_with("value\n"),
        "{out:?}"
    );
}

/// Every flag and environment variable of every role, one per line: `role --flag`,
/// `role --flag env=NAME`, `mooncake_master --flag` (Mooncake's spellings) and `store
/// env=NAME` (Mooncake's environment, read by the store and the Python client's launcher).
fn contract_names() -> String {
    let mut lines = std::collections::BTreeSet::new();
    for role in rbgctl::cli::command().get_subcommands() {
        let mut walk = vec![(role.get_name().to_string(), role.clone())];
        while let Some((path, cmd)) = walk.pop() {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                let env = arg
                    .get_env()
                    .map(|e| format!(" env={}", e.to_string_lossy()))
                    .unwrap_or_default();
                lines.insert(format!("{path} --{long}{env}"));
            }
            for sub in cmd.get_subcommands() {
                walk.push((format!("{path} {}", sub.get_name()), sub.clone()));
            }
        }
    }
    for (flag, _) in rbgctl::master::compat::MASTER_FLAGS {
        lines.insert(format!("mooncake_master --{flag}"));
    }
    let read = std::cell::RefCell::new(Vec::new());
    let _ = rbgctl::config::mooncake::MooncakeEnv::from_lookup(|name| {
        read.borrow_mut().push(name.to_string());
        None
    });
    for name in read.into_inner() {
        lines.insert(format!("store env={name}"));
    }
    lines.into_iter().map(|l| l + "\n").collect()
}

/// sglang-router's flags, Mooncake's flags and environment, and rbgctl's own are what scripts,
/// manifests and the operator's pods are written against: a change to any of them is a change
/// of contract, made on purpose by updating `tests/contract/names.txt` (`RBGCTL_BLESS=1`
/// rewrites it outside CI).
#[test]
fn the_flag_and_environment_names_users_depend_on_are_pinned() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract/names.txt");
    let now = contract_names();
    if std::env::var_os("RBGCTL_BLESS").is_some() && std::env::var_os("CI").is_none() {
        std::fs::write(&path, &now).expect("write the pinned names");
        return;
    }
    let pinned = std::fs::read_to_string(&path).expect("tests/contract/names.txt");
    let set =
        |s: &str| -> std::collections::BTreeSet<String> { s.lines().map(str::to_string).collect() };
    let (pinned, now) = (set(&pinned), set(&now));
    let gone: Vec<_> = pinned.difference(&now).collect();
    let new: Vec<_> = now.difference(&pinned).collect();
    assert!(
        gone.is_empty() && new.is_empty(),
        "flag or environment names changed; gone: {gone:#?}\nnew: {new:#?}\nif on purpose, \
         update tests/contract/names.txt (RBGCTL_BLESS=1 cargo test --test it cli::pinned)"
    );
    for must in [
        "router --worker-urls",
        "router --policy",
        "router --cache-threshold",
        "router --pd-disaggregation",
        "router --prefill",
        "router --decode",
        "router --retry-max-retries",
        "router --cb-failure-threshold",
        "router --prometheus-port",
        "mooncake_master --rpc_port",
        "mooncake_master --enable_http_metadata_server",
        "store env=MOONCAKE_MASTER",
        "store env=MOONCAKE_GLOBAL_SEGMENT_SIZE",
        "store env=MOONCAKE_PROTOCOL",
    ] {
        assert!(pinned.contains(must), "{must} is part of the contract");
    }
}
