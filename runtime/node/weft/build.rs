//! Builds the default plugins (`plugins/istio-authz`, `plugins/istio-telemetry`) for wasm32-wasip2 and embeds them
//! in the weft binary, so a node enforces Istio's L4 policy and exports Istio's metrics with no plugin files on
//! disk. `plugins/port-allowlist` is embedded too, for `weft demo` only (the plugin it pushes over xDS; a node
//! never loads it unless a control plane sends it). They build in `<repo>/target-wasm` (shared with the tests' plugin builds, under the same lock).

use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_PLUGINS: [&str; 3] = ["istio-authz", "istio-telemetry", "port-allowlist"];

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let repo = manifest.join("../../..");
    let plugins = repo.join("plugins");
    for p in [
        "plugins/Cargo.toml",
        "plugins/Cargo.lock",
        "sdk/src",
        "sdk/wit",
        "sdk/Cargo.toml",
        "sdk/build.rs",
    ] {
        println!("cargo:rerun-if-changed={}", repo.join(p).display());
    }
    for p in DEFAULT_PLUGINS {
        println!("cargo:rerun-if-changed={}", plugins.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=WEFT_WASM_TARGET_DIR");
    let target = std::env::var_os("WEFT_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target-wasm"));
    std::fs::create_dir_all(&target).expect("creating the wasm target dir");
    let lock = std::fs::File::create(target.join(".weft-build.lock")).expect("lock file");
    lock.lock().expect("locking the wasm target dir");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--locked",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(plugins.join("Cargo.toml"));
    for p in DEFAULT_PLUGINS {
        cmd.args(["-p", p]);
    }
    let out = cmd
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("CARGO_PRIMARY_PACKAGE")
        .output()
        .expect("running cargo for the default plugins");
    let _ = lock.unlock();
    if !out.status.success() {
        panic!(
            "building the default plugins for wasm32-wasip2 failed (is the target installed? `rustup target add \
             wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for p in DEFAULT_PLUGINS {
        let file = format!("{}.wasm", p.replace('-', "_"));
        let built: &Path = &target.join("wasm32-wasip2/release").join(&file);
        std::fs::copy(built, out_dir.join(&file))
            .unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
    }
}
