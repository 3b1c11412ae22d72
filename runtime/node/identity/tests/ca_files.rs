//! The local CA's key files (#8, hole 3): `write_root` creates the key readable by its owner only from the start,
//! never writes through a symlink or into an existing file, and `LocalCa::from_dir` refuses a CA key that group or
//! others may read, with a message naming the file, its mode and the fix.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;

use std::path::Path;
use std::time::Duration;

use weft_identity::LocalCa;
use weft_identity::ca::write_root;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_ca_key_readable_by_group_or_others_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    write_root(dir.path(), "cluster.local", DAY).unwrap();
    let key = dir.path().join("root-key.pem");
    assert_eq!(mode(&key), 0o600);
    LocalCa::from_dir(dir.path()).unwrap();
    for bad in [0o644, 0o640, 0o604, 0o660] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(bad)).unwrap();
        let err = LocalCa::from_dir(dir.path()).unwrap_err().to_string();
        let want_mode = format!("mode {bad:04o}");
        let want_fix = format!("chmod 600 {}", key.display());
        assert!(err.contains(&key.display().to_string()), "{err}");
        assert!(err.contains(&want_mode), "{err}");
        assert!(err.contains(&want_fix), "{err}");
    }
    // Owner-only modes are accepted.
    for good in [0o600, 0o400] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(good)).unwrap();
        LocalCa::from_dir(dir.path()).unwrap();
    }
}

#[test]
fn an_intermediate_key_is_checked_too() {
    let root = tempfile::tempdir().unwrap();
    write_root(root.path(), "cluster.local", DAY).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for f in ["root-cert.pem", "root-key.pem"] {
        std::fs::copy(root.path().join(f), dir.path().join(f)).unwrap();
    }
    // Lay the root out as an intermediate (ca-cert.pem + ca-key.pem); only the key's mode matters here.
    std::fs::copy(
        root.path().join("root-cert.pem"),
        dir.path().join("ca-cert.pem"),
    )
    .unwrap();
    let key = dir.path().join("ca-key.pem");
    std::fs::copy(root.path().join("root-key.pem"), &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = LocalCa::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("ca-key.pem has mode 0644"), "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    LocalCa::from_dir(dir.path()).unwrap();
}

#[test]
fn write_root_does_not_write_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("world-readable.txt");
    std::fs::write(&elsewhere, "").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).unwrap();
    let ca = dir.path().join("ca");
    std::fs::create_dir(&ca).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ca.join("root-key.pem")).unwrap();
    let err = write_root(&ca, "cluster.local", DAY)
        .unwrap_err()
        .to_string();
    assert!(err.contains("root-key.pem already exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "");
    assert_eq!(mode(&elsewhere), 0o644);
}

/// A key file that already exists (here opened by someone while it was readable) is never reused: with
/// write-then-chmod, the holder of that open descriptor could read the new key.
#[test]
fn write_root_never_reuses_an_existing_key_file() {
    let ca = tempfile::tempdir().unwrap();
    let key = ca.path().join("root-key.pem");
    std::fs::write(&key, "").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut reader = std::fs::File::open(&key).unwrap();
    let err = write_root(ca.path(), "cluster.local", DAY)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already exists"), "{err}");
    let mut leaked = String::new();
    reader.read_to_string(&mut leaked).unwrap();
    assert!(
        !leaked.contains("PRIVATE KEY"),
        "the open descriptor read the key"
    );
    // Nothing was written next to it either.
    assert!(!ca.path().join("root-cert.pem").exists());
}
