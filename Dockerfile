# syntax=docker/dockerfile:1
# weft's image: `weft` (the node proxy, `weft run`), `weft-control` (the plugin control plane) and `weft-ca` (the
# reference Istio-protocol CA). Built with the toolchain rust-toolchain.toml pins; run on distroless (glibc,
# libgcc, the CA bundle, no shell, no package manager) as the non-root user. The node proxy's DaemonSet overrides
# the user with uid 0 and exactly the capabilities it needs (charts/weft explains each one); `weft-control` and
# `weft-ca` keep the image's non-root user.
#
#   docker build -t weft:dev .

# Keep in step with rust-toolchain.toml (conformance/packaging checks it).
ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# The toolchain file first, so this layer (the wasm32-wasip2 target the embedded plugins are built for) is cached
# across source changes.
COPY rust-toolchain.toml ./
RUN rustup toolchain install && rustup target list --installed | grep -qx wasm32-wasip2
COPY . .
# The release profile strips debuginfo (symbols stay, so backtraces name functions).
RUN --mount=type=cache,id=weft-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=weft-target,target=/src/target \
    --mount=type=cache,id=weft-target-wasm,target=/src/target-wasm \
    cargo build --release --locked -p weft -p weft-control \
    && install -D -m 0755 target/release/weft /out/weft \
    && install -D -m 0755 target/release/weft-control /out/weft-control \
    && install -D -m 0755 target/release/weft-ca /out/weft-ca

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
# The Istio release weft reports itself as to istiod (node metadata ISTIO_VERSION), as Istio's ztunnel image does.
ARG ISTIO_VERSION=1.32.0
ENV ISTIO_META_ISTIO_VERSION=${ISTIO_VERSION}
COPY --from=build /out/weft /out/weft-control /out/weft-ca /usr/local/bin/
# distroless's nonroot user (65532:65532).
USER 65532:65532
# HBONE, metrics, readiness (admin 15000 is loopback-only and not exposed).
EXPOSE 15008 15020 15021
ENTRYPOINT ["/usr/local/bin/weft"]
CMD ["--help"]
