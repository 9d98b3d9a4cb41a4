# syntax=docker/dockerfile:1
# Tollgate on nginx, Alpine (musl): Alpine's stock nginx (apk), the nginx-compat module built in
# this build for musl against that very nginx, Tollgate's filters, and the configurations of
# nginx-compat/conf. Alpine has no nginx-dev: docker/nginx-source-tree.sh configures nginx's
# source of the installed version with the installed binary's own configure arguments.
#   docker build -f docker/nginx-alpine.Dockerfile -t tollgate-nginx-alpine .   (repository root)
#   docker run --rm --network host tollgate-nginx-alpine                       (docker/README.md)
# Layout as in the Debian image: the repository's layout under /opt/tollgate, nginx run with
# that prefix (-p /opt/tollgate/). The same musl build is proven without Docker by
# scripts/build-nginx-musl.sh (nginx from Debian's source with musl-gcc, and this module).

ARG ALPINE_IMAGE=alpine:3.22
ARG RUST_IMAGE=rust:1.95.0-slim-trixie

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

# ---- nginx as the image ships it. The module is built on top of this very layer and the
# image is this layer too, so the module always matches the nginx binary it is loaded into.
FROM ${ALPINE_IMAGE} AS nginx-base
SHELL ["/bin/ash", "-eo", "pipefail", "-c"]
# DL3018 (pin versions): nginx is the distribution's, at the base image's release; the module
# stage below is built on this very layer, against this installation. libgcc: the module's
# unwinder (a Rust cdylib on musl links libgcc_s dynamically). For reproducible builds pin
# ALPINE_IMAGE by digest.
# hadolint ignore=DL3018
RUN apk add --no-cache nginx libgcc

# ---- The nginx-compat module for musl, against the installed nginx.
FROM nginx-base AS module
# The Rust toolchain of the official musl image (the same Rust as RUST_IMAGE; a musl host
# toolchain runs on any Alpine with libgcc).
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
COPY --from=rust:1.95.0-alpine3.22 /usr/local/rustup /usr/local/rustup
COPY --from=rust:1.95.0-alpine3.22 /usr/local/cargo /usr/local/cargo
# DL3018: build tools of this stage only (any version of the release will do): a C toolchain
# and the libraries nginx's configure checks for, libclang for bindgen, curl for the source.
# hadolint ignore=DL3018
RUN apk add --no-cache build-base linux-headers clang-dev curl openssl-dev pcre2-dev zlib-dev
WORKDIR /src
COPY docker/nginx-source-tree.sh docker/
ARG NGINX_SOURCE_SHA256=""
RUN sh docker/nginx-source-tree.sh /build
# nginx-compat's workspace uses plugins/common, a member of the root workspace.
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY plugins plugins
COPY bench/wasm-floor bench/wasm-floor
COPY tools tools
# Members of the root workspace too (test filters): cargo loads every member's manifest.
COPY tests/filters tests/filters
COPY nginx-compat nginx-compat
# A cdylib on musl needs crt-static off (with it, rustc refuses the cdylib crate type).
ENV NGINX_SOURCE_DIR=/build/nginx NGINX_BUILD_DIR=/build/nginx/objs \
    RUSTFLAGS="-C target-feature=-crt-static"
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/nginx-compat/target \
    cargo build --locked --release --manifest-path nginx-compat/Cargo.toml -p tollgate-module \
    && mkdir -p /out \
    && cp nginx-compat/target/release/libtollgate_module.so /out/ngx_http_tollgate_wasm_module.so

# ---- The image.
FROM nginx-base
ARG ALPINE_IMAGE
LABEL org.opencontainers.image.title="tollgate-nginx-alpine" \
      org.opencontainers.image.description="Tollgate's proxy-wasm filters in Alpine's stock nginx (musl) through the nginx-compat module" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${ALPINE_IMAGE}" \
      tollgate.ports="10000/tcp gateway listener; 9901/tcp metrics of full-chain.conf (both on 127.0.0.1 in the shipped configurations)" \
      tollgate.mounts="/opt/tollgate/nginx-compat/conf (configurations, read-only), /opt/tollgate/target/wasm32-wasip1/release (filters, read-only), /opt/tollgate/target/nginx/run (pid and temporary files)"
SHELL ["/bin/ash", "-eo", "pipefail", "-c"]
RUN addgroup -S -g 10001 tollgate \
    && adduser -S -D -H -h /nonexistent -s /sbin/nologin -u 10001 -G tollgate tollgate \
    && for d in $(nginx -V 2>&1 | grep -o -- '--http-[a-z]*-temp-path=[^ ]*' | cut -d= -f2 | xargs -r -n1 dirname | sort -u) /var/lib/nginx /var/log/nginx; do \
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
