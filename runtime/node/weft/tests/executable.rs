//! The weft executable's layout: relative relocations packed (DT_RELR, see `build.rs`), so the dynamic loader does
//! not read (and keep resident) hundreds of KiB of RELA entries. Checked with binutils' `readelf`, which the C
//! toolchain that links weft brings.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::process::Command;

#[test]
fn relative_relocations_are_packed() {
    let bin = env!("CARGO_BIN_EXE_weft");
    let out = Command::new("readelf")
        .args(["--wide", "--section-headers", bin])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sections = String::from_utf8_lossy(&out.stdout);
    let size_of = |name: &str| {
        sections.lines().find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let i = cols.iter().position(|c| *c == name)?;
            u64::from_str_radix(cols.get(i + 4)?, 16).ok()
        })
    };
    assert!(
        size_of(".relr.dyn").is_some(),
        "no .relr.dyn section: relative relocations are not packed\n{sections}"
    );
    let rela = size_of(".rela.dyn").unwrap_or(0);
    assert!(
        rela < 64 << 10,
        ".rela.dyn is {rela} bytes: relative relocations were left in RELA form"
    );
}
