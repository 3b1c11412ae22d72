//! Compiles `proto/**/*.proto` with protox (pure Rust, no protoc) and generates prost messages and tonic stubs.

use std::path::PathBuf;

/// Every .proto file weft compiles, relative to `proto/`.
const FILES: &[&str] = &[
    "istio/ca.proto",
    "istio/workload.proto",
    "istio/authorization.proto",
    "google/rpc/status.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/config/core/v3/extension.proto",
    "envoy/service/discovery/v3/discovery.proto",
    "envoy/extensions/wasm/v3/wasm.proto",
    "envoy/extensions/filters/network/wasm/v3/wasm.proto",
    "weft/plugin/v1/plugin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("proto");
    let files: Vec<PathBuf> = FILES.iter().map(|f| root.join(f)).collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    // The descriptor set, for the wire-contract test (proto/tests/wire_contract.rs).
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("weft_descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
