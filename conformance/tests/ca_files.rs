//! The CA's files and flags, each checked on the real binaries: `weft ca init` creates the key 0600 whatever the
//! umask and never overwrites a CA, `weft run` in local-CA mode refuses a CA key others can read (and starts, with
//! a warning, once it is fixed), and `weft-ca` refuses a malformed `--trusted-node-accounts`. (The Istio CA
//! protocol end to end is `ca.rs`.) Every wait is for an event with a generous overall bound.
//!
//! Needs `cargo build -p weft -p weft-control` first (the binaries are found next to each other).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use weft_conformance::{Addrs, mesh_yaml};
use weft_devmesh::{NodeOptions, NodeProcess};

/// The overall bound of every wait for an event: generous, since a loaded machine is slow, and never reached
/// when things work.
const PATIENCE: Duration = Duration::from_secs(60);

/// A malformed `--trusted-node-accounts` stops `weft-ca` with an error naming the entry and the expected form.
#[test]
fn weft_ca_refuses_a_malformed_trusted_node_accounts_flag() {
    for (value, want) in [
        ("weft-system", "is not namespace/name"),
        ("weft-system/weft,", "empty entry"),
        ("Weft/x", "namespace \"Weft\""),
    ] {
        let out = Command::new(weft_conformance::weft_ca_binary())
            .args([
                "--ca-dir",
                "/nonexistent",
                "--mesh-config",
                "/nonexistent",
                "--tokens",
                "/nonexistent",
                "--trusted-node-accounts",
                value,
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}: {stderr}");
        assert!(
            stderr.contains("--trusted-node-accounts"),
            "{value}: {stderr}"
        );
        assert!(stderr.contains(want), "{value}: {stderr}");
    }
}

fn file_mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `weft ca init` under umask 0 (so nothing but the open call's own mode protects the key): the key is 0600 and
/// the certificate 0644; a second `ca init` into the same directory refuses to overwrite the CA.
#[test]
fn ca_init_creates_the_key_owner_only_whatever_the_umask_and_never_overwrites_it() {
    let weft = weft_devmesh::weft_binary().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("ca");
    let init = || {
        Command::new("sh")
            .args(["-c", "umask 000 && exec \"$0\" ca init --out \"$1\""])
            .arg(&weft)
            .arg(&out_dir)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = init();
    assert!(out.status.success(), "{out:?}");
    let key = out_dir.join("root-key.pem");
    assert_eq!(file_mode(&key), 0o600);
    assert_eq!(file_mode(&out_dir.join("root-cert.pem")), 0o644);
    let before = std::fs::read(&key).unwrap();
    let again = init();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "{again:?}");
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(
        std::fs::read(&key).unwrap(),
        before,
        "the CA key was replaced"
    );
}

/// `weft run` in local-CA mode refuses a CA key that group or others can read, naming the file, its mode and the
/// fix; with the key fixed it starts, and warns that local-CA mode is for one machine or development.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_run_refuses_a_ca_key_readable_by_others() {
    use std::os::unix::fs::PermissionsExt;
    let a = Addrs { n: 82 };
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    weft_identity::ca::write_root(&ca_dir, "cluster.local", Duration::from_secs(3600)).unwrap();
    let key = ca_dir.join("root-key.pem");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.path().join("a.yaml");
    std::fs::write(&config, mesh_yaml(a, "echo")).unwrap();
    let opts = NodeOptions::loopback("node-a", a.node_a(), &config, &ca_dir, dir.path());
    let weft = weft_devmesh::weft_binary().unwrap();
    let mut node = NodeProcess::spawn(&weft, &opts).unwrap();
    let err = node
        .wait_ready(PATIENCE)
        .await
        .expect_err("weft started with a world-readable CA key");
    assert!(err.contains("exited (exit status: 1)"), "{err}");
    let stderr = std::fs::read_to_string(&node.log_path).unwrap();
    for want in [
        format!("{} has mode 0644", key.display()),
        format!("chmod 600 {}", key.display()),
    ] {
        assert!(stderr.contains(&want), "{want:?} not in: {stderr}");
    }
    // Fixed, the node starts, with the warning.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut node = NodeProcess::spawn(&weft, &opts).unwrap();
    node.wait_ready(PATIENCE).await.unwrap();
    let warned = node.log_lines().into_iter().find(|l| {
        l["level"] == "warn"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("local CA mode"))
    });
    let warned = warned.unwrap_or_else(|| panic!("no local-CA warning:\n{}", node.log_tail(20)));
    assert_eq!(warned["ca_dir"], ca_dir.display().to_string(), "{warned}");
}
