//! Writes the export macros with the absolute path of this crate's `wit/` folder, so that `export_policy!` and
//! `export_telemetry!` generate the export glue inside the plugin crate from the single WIT source in `sdk/wit`.

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let wit = manifest.join("wit");
    for entry in fs::read_dir(&wit).expect("sdk/wit exists") {
        let path = entry.expect("readable sdk/wit").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    let wit = wit
        .to_str()
        .expect("sdk/wit path is UTF-8")
        .replace('\\', "\\\\");
    let template = include_str!("src/export_macros.rs.in");
    let out = template.replace("@WIT_DIR@", &wit);
    let dest =
        PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("export_macros.rs");
    fs::write(dest, out).expect("write export_macros.rs");
}
