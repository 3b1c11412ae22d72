//! Builds the default plugins (`plugins/istio-authz`, `plugins/istio-telemetry`) for wasm32-wasip2 and embeds them
//! in the weft binary, so a node enforces Istio's L4 policy and exports Istio's metrics with no plugin files on
//! disk. They build in `<repo>/target-wasm`, shared with the tests' plugin builds under the same lock.

fn main() {
    weft_plugin_build::embed(&["istio-authz", "istio-telemetry"]);
    // Relative relocations packed (DT_RELR, glibc 2.36+): the weft executable is position-independent, and its
    // ~28,800 relative relocations in RELA form are 670 KiB that the dynamic loader reads, all of it resident for
    // the process's life; packed they are a few KiB. GNU ld leaves them unpacked where the C library it links
    // against lacks DT_RELR support, so an older glibc still gets a working binary.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
