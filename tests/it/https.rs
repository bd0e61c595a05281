//! TLS on the pool's HTTP ports (`--tls-cert-path`, `--tls-key-path`), with a real master and
//! store: the master's metrics/admin port and metadata server and the store's metrics port
//! answer HTTPS to a client trusting the CA, refuse plain HTTP, and the store publishes its
//! descriptor to an `https://` metadata server it trusts through `--ca-cert-paths`.

use crate::common;

use common::{loopback_master, test_pki, wait_until, Cluster, Opts};
use rbgctl::client::ReplicateConfig;
use rbgctl::master::config::MasterConfig;
use std::path::Path;
use std::time::Duration;

fn trusting(ca: Option<&Path>) -> reqwest::blocking::Client {
    let mut b = reqwest::blocking::Client::builder().timeout(Duration::from_secs(3));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

fn get(client: &reqwest::blocking::Client, url: &str) -> Result<(u16, String), String> {
    let r = client.get(url).send().map_err(|e| format!("{e:?}"))?;
    let code = r.status().as_u16();
    Ok((code, r.text().unwrap_or_default()))
}

#[test]
fn the_pools_http_ports_serve_https_with_a_certificate_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key, _, _] = test_pki(dir.path());
    let master = MasterConfig {
        tls_cert_path: Some(cert.clone()),
        tls_key_path: Some(key.clone()),
        ..loopback_master(MasterConfig::default())
    };
    let mut c = Cluster::start(Opts {
        stores: 0,
        master,
        ..Opts::default()
    });
    let metadata = format!("https://localhost:{}/metadata", c.metadata_port);
    let store = c.add_store_with(32 << 20, |s| {
        s.metadata_server = metadata.clone();
        s.ca_cert_paths = vec![ca.clone()];
        s.tls_cert_path = Some(cert.clone());
        s.tls_key_path = Some(key.clone());
    });
    let https = trusting(Some(&ca));
    let admin = format!("https://localhost:{}", c.metrics_port);

    // The store mounted (seen through the master's admin API over HTTPS) and published its
    // descriptor to the metadata server over HTTPS.
    let segments = || get(&https, &format!("{admin}/api/v1/segments")).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(15), || segments()
            .1
            .contains("\"live\"")),
        "the store did not mount: {:?}",
        segments()
    );
    let descriptor = format!(
        "{metadata}?key={}",
        rbgctl::url::encode("mooncake/ram/store-0")
    );
    assert!(
        wait_until(Duration::from_secs(10), || get(&https, &descriptor)
            .is_ok_and(|(code, _)| code == 200)),
        "the store did not publish its descriptor over HTTPS: {:?}",
        get(&https, &descriptor)
    );
    let (code, body) = get(&https, &format!("{admin}/metrics")).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("rbgctl_master_"), "{body}");
    assert_eq!(get(&https, &format!("{admin}/health")).unwrap().0, 200);
    let store_metrics = format!("https://localhost:{}", c.store_metrics[store]);
    let (code, body) = get(&https, &format!("{store_metrics}/metrics")).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("rbgctl_store_"), "{body}");

    // Plain HTTP to a TLS port gets no HTTP answer, and a client that does not trust the CA
    // refuses the certificate.
    let plain = trusting(None);
    for port in [c.metrics_port, c.metadata_port, c.store_metrics[store]] {
        let e = get(&plain, &format!("http://localhost:{port}/health"));
        assert!(e.is_err(), "plain HTTP answered on {port}: {e:?}");
        let e = get(&plain, &format!("https://localhost:{port}/health")).unwrap_err();
        assert!(e.to_lowercase().contains("certificate"), "{e}");
    }

    // The pool itself works as before.
    let client = c.client();
    client
        .put("k", b"over https", &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get("k").unwrap(), b"over https");
    c.stores[store].kill();
}

#[test]
fn a_certificate_without_its_key_is_refused_naming_the_missing_setting() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rbgctl"))
        .args(["master", "--tls-cert-path", "/nonexistent/cert.pem"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("master.tls_key_path"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rbgctl"))
        .args(["store", "--tls-cert-path"])
        .arg(&missing)
        .arg("--tls-key-path")
        .arg(&missing)
        .args([
            "--master",
            "127.0.0.1:1",
            "--metrics-port",
            "0",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("missing.pem"), "{e}");
}
