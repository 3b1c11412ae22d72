//! Tells the targets how the crate is optimised (`WEFT_FUZZ_OPT_LEVEL`): `tls_records` bounds the CPU time of the
//! code it runs, which is ten times slower unoptimised (the CI smoke, the stable replay). cargo-fuzz turns debug
//! assertions on in every build, so `cfg!(debug_assertions)` cannot tell.

fn main() {
    let level = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "0".to_string());
    println!("cargo::rustc-env=WEFT_FUZZ_OPT_LEVEL={level}");
    println!("cargo::rerun-if-changed=build.rs");
}
