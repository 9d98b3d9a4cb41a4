# syntax=docker/dockerfile:1
# Tollgate on nginx, Debian (glibc): Debian trixie's stock nginx, the nginx-compat module built
# in this build against that very nginx (nginx-dev's headers and Debian's configure flags, with
# scripts/build-nginx-module.sh), Tollgate's filters, and the configurations of nginx-compat/conf.
#   docker build -f docker/nginx-debian.Dockerfile -t tollgate-nginx-debian .   (repository root)
#   docker run --rm --network host tollgate-nginx-debian                       (docker/README.md)
# The image mirrors the repository's layout under /opt/tollgate (nginx-compat/conf,
# target/nginx/ngx_http_tollgate_wasm_module.so, target/wasm32-wasip1/release/*.wasm), and nginx
# runs with that prefix (-p /opt/tollgate/), so the configurations run unchanged from there.

ARG DEBIAN_IMAGE=debian:trixie-slim
ARG RUST_IMAGE=rust:1.95.0-slim-trixie

FROM ${RUST_IMAGE} AS rust

# ---- The filters: the same .wasm bytes in every image, whatever the host's libc.
FROM rust AS plugins
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

# ---- nginx as the image ships it. The module is built on top of this very layer and the
# image is this layer too, so the module always matches the nginx binary it is loaded into.
FROM ${DEBIAN_IMAGE} AS nginx-base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DL3008 (pin versions): nginx is the distribution's, at the base image's point release; what
# must match it (nginx-dev, below) is pinned to the version installed here. For reproducible
# builds pin DEBIAN_IMAGE by digest.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/*

# ---- The nginx-compat module, against the installed nginx.
FROM nginx-base AS module
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
COPY --from=rust /usr/local/rustup /usr/local/rustup
COPY --from=rust /usr/local/cargo /usr/local/cargo
# nginx-dev pinned to the installed nginx (headers and conf_flags of that exact build);
# DL3008: the rest are build tools of the stage only (any version of the release will do);
# ca-certificates because cargo fetches crates over TLS and this stage, built on nginx-base,
# has no CA bundle otherwise (the official Rust image installs it for the same reason).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       "nginx-dev=$(dpkg-query -W -f='${Version}' nginx)" ca-certificates libclang-dev dpkg-dev gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# nginx-compat's workspace uses plugins/common, a member of the root workspace.
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY plugins plugins
COPY bench/wasm-floor bench/wasm-floor
COPY tools tools
# Members of the root workspace too (test filters): cargo loads every member's manifest.
COPY tests/filters tests/filters
COPY nginx-compat nginx-compat
COPY scripts/lib.sh scripts/apt.sh scripts/build-nginx-module.sh scripts/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/nginx-compat/target \
    scripts/build-nginx-module.sh \
    && mkdir -p /out \
    && cp target/nginx/ngx_http_tollgate_wasm_module.so /out/

# ---- The image.
FROM nginx-base
ARG DEBIAN_IMAGE
LABEL org.opencontainers.image.title="tollgate-nginx-debian" \
      org.opencontainers.image.description="Tollgate's proxy-wasm filters in Debian's stock nginx (glibc) through the nginx-compat module" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${DEBIAN_IMAGE}" \
      tollgate.ports="10000/tcp gateway listener; 9901/tcp metrics of full-chain.conf (both on 127.0.0.1 in the shipped configurations)" \
      tollgate.mounts="/opt/tollgate/nginx-compat/conf (configurations, read-only), /opt/tollgate/target/wasm32-wasip1/release (filters, read-only), /opt/tollgate/target/nginx/run (pid and temporary files)"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tollgate \
    && for d in $(nginx -V 2>&1 | grep -o -- '--http-[a-z]*-temp-path=[^ ]*' | cut -d= -f2 | xargs -r -n1 dirname | sort -u) /var/log/nginx; do \
         install -d "$d" && chown -hR tollgate:tollgate "$d"; \
       done
COPY --from=plugins /out/ /opt/tollgate/target/wasm32-wasip1/release/
COPY --from=module /out/ngx_http_tollgate_wasm_module.so /opt/tollgate/target/nginx/
COPY nginx-compat/conf/ /opt/tollgate/nginx-compat/conf/
COPY --chmod=0755 docker/healthcheck.sh /usr/local/bin/tollgate-healthcheck
# target/nginx/run: what the configurations write (pid, temporary files), the one directory
# the user may write. Their error logs go to the container's stderr: `error_log stderr` (nginx
# writes fd 2 itself; a link to /dev/stderr cannot be reopened by a non-root user when the
# container's stderr belongs to root). The module is also linked where
# `load_module modules/...;` looks, for configurations of your own.
RUN install -d -o tollgate -g tollgate /opt/tollgate/target/nginx/run \
    && sed -i -E 's#^( *error_log +)target/nginx/run/[^ ;]+#\1stderr#' /opt/tollgate/nginx-compat/conf/*.conf \
    && install -d /usr/lib/nginx/modules \
    && ln -s /opt/tollgate/target/nginx/ngx_http_tollgate_wasm_module.so /usr/lib/nginx/modules/ \
    && ln -s /usr/lib/nginx/modules /opt/tollgate/modules
WORKDIR /opt/tollgate
USER 10001:10001
# The build fails here if the module does not load into this nginx, or if any configuration of
# nginx-compat/conf is invalid in it.
RUN for conf in nginx-compat/conf/*.conf; do nginx -e stderr -t -q -p /opt/tollgate/ -c "$conf" || exit 1; done
# The gateway listener of the configurations, and full-chain.conf's metrics endpoint (127.0.0.1
# there, as in envoy/: run with --network host, or mount configurations that listen on 0.0.0.0;
# see docker/README.md).
EXPOSE 10000/tcp 9901/tcp
# Mount points:
#   /opt/tollgate/nginx-compat/conf               your configurations (read-only)
#   /opt/tollgate/target/wasm32-wasip1/release    other builds of the filters (read-only)
#   /opt/tollgate/target/nginx/run                pid, temporary files (request bodies, proxy
#                                                  buffers): scratch, nothing persists
VOLUME ["/opt/tollgate/target/nginx/run"]
ENV TOLLGATE_HEALTHCHECK_URL=http://127.0.0.1:10000/healthz
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 CMD ["/usr/local/bin/tollgate-healthcheck"]
STOPSIGNAL SIGQUIT
# The configurations set `daemon off`, their pid and their logs themselves (nginx-compat/conf).
ENTRYPOINT ["nginx", "-e", "stderr", "-p", "/opt/tollgate/"]
CMD ["-c", "nginx-compat/conf/gateway.conf"]
