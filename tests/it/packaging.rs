//! What ships beside the binary: the Dockerfile's program links, the systemd units and the
//! kustomization. Each is checked by the tool that consumes it where that tool is installed
//! (`systemd-analyze verify`, `kubectl kustomize`); CI has both and fails without them.

use crate::common;

use common::BIN;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `tool` or says why not; in CI a missing tool is a failure.
fn tool(name: &str) -> Option<Command> {
    let found = Command::new(name).arg("--version").output().is_ok();
    if !found {
        common::skip(&format!("{name} is not installed"));
        return None;
    }
    Some(Command::new(name))
}

#[test]
fn the_image_links_every_program_name_the_binary_answers_to() {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let links: Vec<&str> = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG LINKS="))
        .expect("the Dockerfile declares its links")
        .trim_matches('"')
        .split_whitespace()
        .collect();
    let mut want: Vec<&str> = rbgctl::cli::ROLES
        .iter()
        .flat_map(|r| r.links.iter().copied())
        .collect();
    want.sort_unstable();
    let mut got = links.clone();
    got.sort_unstable();
    assert_eq!(got, want, "Dockerfile LINKS and the roles' argv[0] names");
    for must in [
        "FROM ${RUNTIME} AS base",
        "AS prebuilt",
        "tini",
        "rbgctl-entrypoint",
        "USER 10001",
    ] {
        assert!(dockerfile.contains(must), "Dockerfile: {must}");
    }
    // Docker's legacy builder builds every stage before the target: none may need a registry
    // or a toolchain, and the default (last) stage is the one that copies the host's binary.
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(
        stages
            .iter()
            .all(|s| s.starts_with("FROM ${RUNTIME}") || s.starts_with("FROM base")),
        "{stages:?}"
    );
    assert!(
        stages.last().is_some_and(|s| s.ends_with("AS prebuilt")),
        "{stages:?}"
    );
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.starts_with("RUN") && l.contains("cargo")),
        "no stage compiles"
    );
}

/// Issue 40, item 20: the install script lays out a tree the units run from: the binary, the
/// units, the user, environment files the units read (no config file is required), examples.
#[test]
fn the_install_script_lays_out_what_the_units_need() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let out = Command::new(Path::new(ROOT).join("scripts/install-systemd.sh"))
        .args(["--destdir"])
        .arg(&root)
        .args(["--bin", BIN, "--secret"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("usr/local/bin/rbgctl"), 0o755);
    assert_eq!(mode("etc/rbgctl/token"), 0o600, "the secret is private");
    assert_eq!(mode("etc/rbgctl/store.env"), 0o640);
    assert!(root.join("usr/lib/sysusers.d/rbgctl.conf").exists());
    assert!(root.join("etc/rbgctl/examples/store.toml").exists());
    for role in ["master", "store", "router", "operator"] {
        let unit =
            std::fs::read_to_string(root.join(format!("etc/systemd/system/rbgctl-{role}.service")))
                .unwrap();
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        assert!(
            !exec.contains("/etc/rbgctl/") || exec.contains("EnvironmentFile"),
            "{role}: the unit needs no file the install does not write: {exec}"
        );
        let env = std::fs::read_to_string(root.join(format!("etc/rbgctl/{role}.env"))).unwrap();
        // The operator needs the cluster's kubeconfig, which only its administrator has.
        let provided = |path: &str| role == "operator" && path == "kubeconfig";
        for line in env.lines().filter(|l| !l.starts_with('#')) {
            if let Some((_, path)) = line.split_once("=/etc/rbgctl/") {
                assert!(
                    provided(path) || root.join("etc/rbgctl").join(path).exists(),
                    "{role}.env names /etc/rbgctl/{path}, which the install does not write"
                );
            }
        }
    }
    // Issue 62, item B3: --secret means authenticated: the roles holding the secret name it.
    for role in ["master", "store", "router"] {
        let env = std::fs::read_to_string(root.join(format!("etc/rbgctl/{role}.env"))).unwrap();
        assert!(
            env.lines()
                .any(|l| l == "RBGCTL_AUTH_TOKEN_FILE=/etc/rbgctl/token"),
            "{role}.env does not name the secret"
        );
    }
    // Run again: the environment files and the secret an operator edited are kept.
    std::fs::write(root.join("etc/rbgctl/store.env"), "RBGCTL_LOG=debug\n").unwrap();
    let out = Command::new(Path::new(ROOT).join("scripts/install-systemd.sh"))
        .arg("--destdir")
        .arg(&root)
        .args(["--bin", BIN, "--secret"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/rbgctl/store.env")).unwrap(),
        "RBGCTL_LOG=debug\n"
    );
    // ... and said not to name the secret.
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("store.env was kept and does not name the secret"),
        "{out:?}"
    );
    // A disk tier outside the state directory: the store's unit may write it.
    let fresh = dir.path().join("fresh");
    let out = Command::new(Path::new(ROOT).join("scripts/install-systemd.sh"))
        .arg("--destdir")
        .arg(&fresh)
        .args(["--bin", BIN, "--disk-tier", "/data/rbgctl-tier"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dropin = std::fs::read_to_string(
        fresh.join("etc/systemd/system/rbgctl-store.service.d/disk-tier.conf"),
    )
    .unwrap();
    assert!(
        dropin.contains("ReadWritePaths=/data/rbgctl-tier"),
        "{dropin}"
    );
    let env = std::fs::read_to_string(fresh.join("etc/rbgctl/store.env")).unwrap();
    assert!(
        env.contains("\nRBGCTL_STORE_DISK_TIER=/data/rbgctl-tier\n"),
        "{env}"
    );
    assert!(fresh.join("data/rbgctl-tier").is_dir());
    // The documented token setup gives the unit's user the file.
    let security = std::fs::read_to_string(Path::new(ROOT).join("docs/security.md")).unwrap();
    assert!(security.contains("chown rbgctl"), "docs/security.md: chown");
}

#[test]
fn systemd_units_verify_and_use_the_shared_env_files() {
    let Some(_) = tool("systemd-analyze") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let units = Path::new(ROOT).join("manifests/systemd");
    let mut checked = Vec::new();
    for role in ["master", "store", "router", "operator"] {
        let name = format!("rbgctl-{role}.service");
        let text = std::fs::read_to_string(units.join(&name)).unwrap();
        for key in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "CapabilityBoundingSet=",
        ] {
            assert!(text.contains(key), "{name}: {key}");
        }
        let env = format!("EnvironmentFile=-/etc/rbgctl/{role}.env");
        assert!(text.contains(&env), "{name}: {env}");
        assert!(
            Path::new(ROOT)
                .join(format!("config/env/{role}.env"))
                .exists(),
            "config/env/{role}.env"
        );
        // verify checks that ExecStart's program exists: point it at this build.
        std::fs::write(
            dir.path().join(&name),
            text.replace("/usr/local/bin/rbgctl", BIN),
        )
        .unwrap();
        checked.push(dir.path().join(&name));
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&checked)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

#[test]
fn one_kustomization_installs_the_crds_rbac_and_the_operator() {
    let Some(mut kubectl) = tool("kubectl") else {
        return;
    };
    let out = kubectl
        .args(["kustomize", &format!("{ROOT}/manifests")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_yaml_ng::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
    let kinds = |k: &str| docs.iter().filter(|d| d["kind"] == k).count();
    assert_eq!(kinds("CustomResourceDefinition"), 4);
    assert_eq!(kinds("Deployment"), 1);
    assert!(kinds("ClusterRole") >= 1 && kinds("ClusterRoleBinding") == 1);
    let deploy = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "rbgctl:0.1.0");
    assert_eq!(
        c["args"][0], "rbgctl",
        "the image's entrypoint is tini; the role is the command"
    );
}
