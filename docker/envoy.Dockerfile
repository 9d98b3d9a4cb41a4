# syntax=docker/dockerfile:1
# Tollgate on Envoy (glibc): the official Envoy image, Tollgate's filters built from this
# repository for wasm32-wasip1, and the configurations of envoy/.
#   docker build -f docker/envoy.Dockerfile -t tollgate-envoy .      (from the repository root)
#   docker run --rm --network host tollgate-envoy                    (see docker/README.md)
# The image mirrors the repository's layout under /opt/tollgate (envoy/*.yaml and
# target/wasm32-wasip1/release/*.wasm), so the configurations run unchanged from there.

ARG RUST_IMAGE=rust:1.95.0-slim-trixie
ARG ENVOY_IMAGE=envoyproxy/envoy:v1.40.0

# ---- The filters: the same .wasm bytes in every image, whatever the host's libc.
FROM ${RUST_IMAGE} AS plugins
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN rustup target add wasm32-wasip1
WORKDIR /src
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY plugins plugins
COPY bench/wasm-floor bench/wasm-floor
COPY tools tools
# Members of the root workspace too (test filters): cargo loads every member's manifest.
COPY tests/filters tests/filters
COPY scripts/lib.sh scripts/lib.sh
# plugin_crates (scripts/lib.sh): every crate of plugins/ that builds a cdylib.
# tools/trim-callbacks then writes each module to /out without the stream callbacks its filter
# does not implement, as scripts/build.sh does.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    pkgs=(); for c in $(. scripts/lib.sh && plugin_crates); do pkgs+=(-p "tollgate-$c"); done; \
    cargo build --locked --release --target wasm32-wasip1 "${pkgs[@]}" \
    && mkdir -p /out \
    && cargo run --locked -q -p tollgate-trim-callbacks -- target/wasm32-wasip1/release/deps /out

# ---- The image.
FROM ${ENVOY_IMAGE}
ARG ENVOY_IMAGE
LABEL org.opencontainers.image.title="tollgate-envoy" \
      org.opencontainers.image.description="Tollgate's proxy-wasm filters in Envoy (V8), with the envoy/ configurations" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${ENVOY_IMAGE}" \
      tollgate.ports="10000/tcp gateway listener; 9901/tcp admin (bound to 127.0.0.1 by the shipped configurations)" \
      tollgate.mounts="/opt/tollgate/envoy (configurations, read-only), /opt/tollgate/target/wasm32-wasip1/release (filters, read-only)"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tollgate
COPY --from=plugins /out/ /opt/tollgate/target/wasm32-wasip1/release/
COPY envoy/ /opt/tollgate/envoy/
COPY --chmod=0755 docker/healthcheck.sh /usr/local/bin/tollgate-healthcheck
WORKDIR /opt/tollgate
USER 10001:10001
# Gateway listener and admin interface of the shipped configurations (both on 127.0.0.1 there:
# run with --network host, or mount configurations that listen on 0.0.0.0; see docker/README.md).
EXPOSE 10000/tcp 9901/tcp
# Mount points (all read-only; nothing in the image needs to persist):
#   /opt/tollgate/envoy                            your Envoy configurations (replace envoy/)
#   /opt/tollgate/target/wasm32-wasip1/release     other builds of the filters
ENV TOLLGATE_HEALTHCHECK_URL=http://127.0.0.1:9901/ready
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 CMD ["/usr/local/bin/tollgate-healthcheck"]
ENTRYPOINT ["/usr/local/bin/envoy"]
CMD ["-c", "envoy/gateway.yaml", "--concurrency", "2", "--log-level", "info"]
