//! Builds the repository's plugin crates (`plugins/`, or any crate dir) for `wasm32-wasip2` in release mode.
//!
//! One place for what three callers did each their own way: the node's build script (the default plugins it
//! embeds), the demo's build script (the plugin it pushes) and the tests (any plugin crate, built once per
//! process). Builds go to one target directory (`$WEFT_WASM_TARGET_DIR`, else `<repo>/target-wasm`) under a file
//! lock, so parallel test binaries and build scripts never run two cargos on it at once; the caller's
//! `RUSTFLAGS` and target settings, meant for the host, are not passed on.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target the plugins are built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Why a plugin could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Cargo could not be run, or the lock file could not be taken.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Cargo failed.
    #[error(
        "cargo build for {TARGET} of {what} failed (is the target installed? `rustup target add {TARGET}`):\n{stderr}"
    )]
    Cargo {
        /// What was built.
        what: String,
        /// Cargo's output.
        stderr: String,
    },
    /// Cargo succeeded but produced no `.wasm`.
    #[error("cargo built {0} but produced no .wasm (is it a cdylib?)")]
    NoArtifact(String),
}

/// The weft repository root, from this crate's location at build time.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// `plugins/`, the plugin workspace.
pub fn plugins_dir() -> PathBuf {
    repo_root().join("plugins")
}

/// Where the builds go: `$WEFT_WASM_TARGET_DIR`, else `target-wasm/` at the repository root.
pub fn wasm_target_dir() -> PathBuf {
    std::env::var_os("WEFT_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target-wasm"))
}

/// The lock every build (and every reader that must not see a half-written artifact) holds.
pub fn lock() -> Result<std::fs::File, std::io::Error> {
    let target = wasm_target_dir();
    std::fs::create_dir_all(&target)?;
    let lock = std::fs::File::create(target.join(".weft-build.lock"))?;
    lock.lock()?;
    Ok(lock)
}

/// Build the named packages of the plugin workspace (`--locked`: the workspace's Cargo.lock is the one CI uses)
/// and return their components, in the order of `packages`.
pub fn build_packages(packages: &[&str]) -> Result<Vec<PathBuf>, BuildError> {
    let manifest = plugins_dir().join("Cargo.toml");
    let mut args = vec![
        "--locked".to_owned(),
        "--manifest-path".to_owned(),
        manifest.display().to_string(),
    ];
    for p in packages {
        args.extend(["-p".to_owned(), (*p).to_owned()]);
    }
    let built = cargo_build(&plugins_dir(), &args)?;
    packages
        .iter()
        .map(|p| {
            let file = format!("{}.wasm", p.replace('-', "_"));
            built
                .iter()
                .find(|w| w.file_name().is_some_and(|n| n == file.as_str()))
                .cloned()
                .ok_or_else(|| BuildError::NoArtifact((*p).to_owned()))
        })
        .collect()
}

/// Build the crate at `dir` (its own manifest) and return its components.
pub fn build_crate(dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let manifest = dir.join("Cargo.toml").display().to_string();
    cargo_build(dir, &["--manifest-path".to_owned(), manifest])
}

/// Build every crate of the plugin workspace (what CI runs) and return the components.
pub fn build_workspace() -> Result<Vec<PathBuf>, BuildError> {
    let dir = plugins_dir();
    let manifest = dir.join("Cargo.toml").display().to_string();
    cargo_build(
        &dir,
        &[
            "--manifest-path".to_owned(),
            manifest,
            "--workspace".to_owned(),
        ],
    )
}

/// For a build script that embeds `packages`: tell cargo what to watch, build them, and copy each into
/// `OUT_DIR` as `<package_with_underscores>.wasm` (for `include_bytes!`). Panics with the build's output, as a
/// build script must.
pub fn embed(packages: &[&str]) {
    let repo = repo_root();
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
    for p in packages {
        println!("cargo:rerun-if-changed={}", plugins_dir().join(p).display());
    }
    println!("cargo:rerun-if-env-changed=WEFT_WASM_TARGET_DIR");
    let built = build_packages(packages).unwrap_or_else(|e| panic!("{e}"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let _lock = lock().unwrap_or_else(|e| panic!("taking the wasm build lock: {e}"));
    for w in built {
        let name = w.file_name().map(PathBuf::from).unwrap_or_default();
        std::fs::copy(&w, out_dir.join(&name))
            .unwrap_or_else(|e| panic!("copying {}: {e}", w.display()));
    }
}

fn cargo_build(dir: &Path, args: &[String]) -> Result<Vec<PathBuf>, BuildError> {
    let lock = lock()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .args(args)
        .env("CARGO_TARGET_DIR", wasm_target_dir())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("CARGO_PRIMARY_PACKAGE")
        .current_dir(dir)
        .output()?;
    drop(lock);
    if !out.status.success() {
        return Err(BuildError::Cargo {
            what: dir.display().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut wasm = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        for f in msg["filenames"].as_array().into_iter().flatten() {
            if let Some(f) = f.as_str().filter(|f| f.ends_with(".wasm")) {
                wasm.push(PathBuf::from(f));
            }
        }
    }
    Ok(wasm)
}
