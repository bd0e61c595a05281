//! What another local user can do to a store on the same host (issue 40, items 3 and 4), tried
//! for real: a second user (`nobody`, through `runuser`) reads the store's files, takes its lock,
//! and maps its segment through the same-host client. Needs root (to become `nobody`) and
//! util-linux's `runuser` and `flock`; CI has them.

use crate::common;

use common::{wait_until, Cluster, Opts};
use rbgctl::client::ReplicateConfig;
use rbgctl::master::config::MasterConfig;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Root with `runuser`, `flock` and a `nobody` user, or the reason this host has none.
fn second_user() -> bool {
    let why = if !nix::unistd::Uid::effective().is_root() {
        Some("needs root to run commands as another user".to_string())
    } else {
        ["runuser", "flock"]
            .into_iter()
            .find(|t| Command::new(t).arg("--help").output().is_err())
            .map(|t| format!("no {t} program (util-linux)"))
            .or_else(|| {
                nix::unistd::User::from_name("nobody")
                    .ok()
                    .flatten()
                    .is_none()
                    .then(|| "no user named nobody".to_string())
            })
    };
    match why {
        Some(why) => {
            common::skip(&why);
            false
        }
        None => true,
    }
}

/// `sh -c script` as `nobody`.
fn as_nobody(script: &str) -> Output {
    Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("runuser runs")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A directory every user may enter, holding the cluster's (so that only the store's own
/// modes stand between `nobody` and its files).
fn open_parent() -> tempfile::TempDir {
    let parent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    parent
}

fn cluster_in(dir: &Path, change: impl FnOnce(&mut rbgctl::store::config::StoreConfig)) -> Cluster {
    let mut c = Cluster::start(Opts {
        stores: 0,
        segment: 16 << 20,
        master: MasterConfig::default(),
    });
    c.add_store_with(16 << 20, |s| {
        s.shm_dir = dir.to_path_buf();
        change(s);
    });
    assert!(wait_until(Duration::from_secs(10), || c.segment_count() == 1));
    c
}

/// Item 4: another user can read neither a tenant's bytes nor its key names, even where the
/// directory itself is open (a directory of another owner: a volume's mount point).
#[test]
fn another_user_can_read_no_byte_and_no_key_name_of_a_store() {
    if !second_user() {
        return;
    }
    let parent = open_parent();
    let dir = parent.path().join("shm");
    let c = cluster_in(&dir, |_| {});
    let cl = c.client();
    cl.put(
        "tenant-a/secret-key",
        b"secret-bytes-of-tenant-a",
        &ReplicateConfig::default(),
    )
    .unwrap();
    let stem = c.store_stem(0);
    assert_eq!(mode(&dir), 0o700, "the directory is the store's alone");
    for ext in ["seg", "token", "idx", "lock"] {
        assert_eq!(
            mode(&dir.join(format!("{stem}.{ext}"))),
            0o600,
            "{stem}.{ext}"
        );
    }
    let read = format!(
        "dd if={d}/{stem}.seg bs=64 count=1 2>&1; cat {d}/{stem}.idx 2>&1; ls {d} 2>&1",
        d = dir.display()
    );
    let out = as_nobody(&read);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Permission denied"), "{text}");
    assert!(!text.contains("secret"), "{text}");
    // Even with the directory opened to all, the files stay closed.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody(&read);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("secret"), "{text}");
    assert!(text.matches("Permission denied").count() >= 2, "{text}");
}

/// Item 3: another user cannot take the store's lock, and a reader of this user holding it
/// shared does not keep a restarted store from its files: every object is served again.
#[test]
fn no_other_user_and_no_reader_can_keep_a_restarted_store_from_its_objects() {
    if !second_user() {
        return;
    }
    let parent = open_parent();
    let dir = parent.path().join("shm");
    let mut c = cluster_in(&dir, |_| {});
    let cl = c.client();
    for i in 0..20 {
        cl.put(
            &format!("k{i}"),
            format!("v{i}").as_bytes(),
            &ReplicateConfig::default(),
        )
        .unwrap();
    }
    let lock = dir.join(format!("{}.lock", c.store_stem(0)));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody(&format!("flock -n -s {} true 2>&1", lock.display()));
    assert!(!out.status.success(), "nobody took the lock");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Permission denied"),
        "{out:?}"
    );
    // A reader of the store's own user holds the lock shared as long as it likes.
    let mut reader = Command::new("flock")
        .args(["-s"])
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let inode_before = std::fs::metadata(&lock).unwrap().ino();
    c.stores[0].kill();
    // The reader has its shared lock once the store is gone: a shared lock can be had, an
    // exclusive one cannot.
    let try_lock = |how: &str| {
        Command::new("flock")
            .args(["-n", how])
            .arg(&lock)
            .arg("true")
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        wait_until(Duration::from_secs(5), || try_lock("-s") && !try_lock("-x")),
        "the reader holds the lock"
    );
    c.restart_store(0);
    assert!(c.wait_store_mounted(0), "the restarted store serves");
    assert_ne!(
        std::fs::metadata(&lock).unwrap().ino(),
        inode_before,
        "the store replaced the lock file the reader held"
    );
    assert!(!try_lock("-s"), "the restarted store holds its lock");
    let _ = reader.kill();
    let _ = reader.wait();
    for i in 0..20 {
        assert_eq!(
            cl.get(&format!("k{i}")).unwrap(),
            format!("v{i}").as_bytes()
        );
    }
}

/// Item 4: with `shm_group`, a client of another user in that group maps the segment; without
/// it, the client says why it uses TCP, and still gets the bytes over TCP.
#[test]
fn a_same_host_client_of_another_user_maps_the_segment_only_through_the_group() {
    if !second_user() {
        return;
    }
    let group = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .gid
        .as_raw()
        .to_string();
    for shared in [false, true] {
        let parent = open_parent();
        let dir = parent.path().join("shm");
        let c = cluster_in(&dir, |s| {
            if shared {
                s.shm_group = Some(group.clone());
            }
        });
        let cl = c.client();
        cl.put("k", b"value-k", &ReplicateConfig::default())
            .unwrap();
        let get = format!(
            "RBGCTL_LOG=debug {} kv --master {} get k 2>&1",
            common::BIN,
            c.rpc
        );
        let out = as_nobody(&get);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("value-k"), "{text}");
        if shared {
            assert_eq!(mode(&dir), 0o710);
            let stem = c.store_stem(0);
            assert_eq!(mode(&dir.join(format!("{stem}.seg"))), 0o660);
            assert_eq!(mode(&dir.join(format!("{stem}.idx"))), 0o600);
            assert!(text.contains("mapped same-host segment"), "{text}");
        } else {
            assert!(
                text.contains("cannot open the same-host segment's files; using TCP"),
                "{text}"
            );
        }
    }
}
