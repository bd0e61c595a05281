//! What ships beside the binary: the Dockerfile's program links, the systemd units and the
//! kustomization. Each is checked by the tool that consumes it where that tool is installed
//! (`systemd-analyze verify`, `kubectl kustomize`); CI has both and fails without them.

mod common;

use common::BIN;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `tool` or says why not; in CI a missing tool is a failure.
fn tool(name: &str) -> Option<Command> {
    let found = Command::new(name).arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs {name} to check what ships"
        );
        eprintln!("SKIPPED: {name} is not installed");
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
        "AS runtime",
        "tini",
        "USER 10001",
    ] {
        assert!(dockerfile.contains(must), "Dockerfile: {must}");
    }
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
