# Stand-in for the official Rust image (rust:1.95.0-slim-*, docker-library/rust), for machines
# that reach no image registry: scripts/images.sh builds it on a Debian base bootstrapped with
# mmdebstrap and passes it to docker/*.Dockerfile as RUST_IMAGE. Same recipe and layout as the
# official image: gcc and libc6-dev from Debian, rustup's minimal profile installed by rustup-init
# into RUSTUP_HOME=/usr/local/rustup and CARGO_HOME=/usr/local/cargo (on PATH), world-writable.
# rustup-init is the only file of the build context: scripts/images.sh copies the host's own
# rustup there (one binary is both; it installs when called rustup-init) instead of downloading
# it; rustup-init then fetches the toolchain from rustup's distribution server, as
# `rustup target add` does on the host (../shared/notes/environment.md).
# BUILD_CA_FILE (optional): a CA bundle mounted into every RUN step by the builder (buildah build
# -v), for networks whose TLS is re-signed by a CA of their own: rustup trusts it (SSL_CERT_FILE,
# in the stages built FROM this image: `rustup target add`), and so does cargo in every stage
# that uses this toolchain (http.cainfo in CARGO_HOME/config.toml, which the nginx images'
# module stages copy with the toolchain). No final image is built FROM this one.
#   buildah build -f docker/bases/rust.Dockerfile --build-arg DEBIAN_IMAGE=... CONTEXT

ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ARG DEBIAN_IMAGE
LABEL org.opencontainers.image.title="tollgate-rust-builder" \
      org.opencontainers.image.description="Stand-in for the official Rust image: Debian, gcc, rustup's minimal profile (scripts/images.sh)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${DEBIAN_IMAGE}" \
      tollgate.ports="none" \
      tollgate.mounts="none"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG RUST_VERSION=1.95.0
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH \
    RUST_VERSION=${RUST_VERSION}
# DL3008 (pin versions): as in the official image, the C toolchain is the release's current one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY rustup-init /tmp/rustup-init
ARG BUILD_CA_FILE=""
ENV SSL_CERT_FILE=${BUILD_CA_FILE:-/etc/ssl/certs/ca-certificates.crt}
RUN /tmp/rustup-init -y --no-modify-path --profile minimal \
       --default-toolchain "$RUST_VERSION" --default-host x86_64-unknown-linux-gnu \
    && rm /tmp/rustup-init \
    && if [ -n "$BUILD_CA_FILE" ]; then printf '[http]\ncainfo = "%s"\n' "$BUILD_CA_FILE" > "$CARGO_HOME/config.toml"; fi \
    && chmod -R a+w "$RUSTUP_HOME" "$CARGO_HOME" \
    && rustup --version && cargo --version && rustc --version
