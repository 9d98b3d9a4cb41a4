#!/usr/bin/env bash
# Builds the nginx dynamic module of Tollgate (nginx-compat/module) for Debian's stock nginx:
#   target/nginx/ngx_http_tollgate_wasm_module.so   (load it with `load_module`)
# Installs nginx, nginx-dev (headers and Debian's configure flags) and libclang-dev (bindgen)
# when missing, configures an nginx build tree matching Debian's binary once under
# target/nginx-build (a stamp file records the nginx version it was made for), then builds the
# module in release. Idempotent; quick when everything is up to date.
# Recipe: ../shared/notes/environment.md ("nginx and a Rust dynamic module").
# Usage: scripts/build-nginx-module.sh
. "$(dirname "$0")/lib.sh"
"$ROOT/scripts/apt.sh" nginx nginx-dev libclang-dev

BUILD="$ROOT/target/nginx-build"
SRC="$BUILD/nginx-src"
version=$(dpkg-query -W -f='${Version}' nginx-dev)
stamp="$BUILD/configured"
if [ "$(cat "$stamp" 2>/dev/null)" != "$version" ]; then
  log "configuring an nginx $version build tree like Debian's binary (once)"
  rm -rf "$SRC" && mkdir -p "$BUILD"
  cp -a /usr/share/nginx/src "$SRC"
  (
    cd "$SRC"
    # conf_flags defines NGX_CONF_FLAGS (Debian's ./configure arguments).
    # shellcheck disable=SC1091
    . ./conf_flags
    ./configure --with-cc-opt="$(dpkg-buildflags --get CFLAGS) -fPIC $(dpkg-buildflags --get CPPFLAGS)" \
      --with-ld-opt="$(dpkg-buildflags --get LDFLAGS) -fPIC" "${NGX_CONF_FLAGS[@]}" --builddir=objs \
      >"$BUILD/configure.log" 2>&1
  ) || { log "configure failed: see $BUILD/configure.log"; exit 1; }
  echo "$version" > "$stamp"
fi

export NGINX_SOURCE_DIR="$SRC" NGINX_BUILD_DIR="$SRC/objs"
cd "$ROOT/nginx-compat"
cargo build -q --release -p tollgate-module
mkdir -p "$ROOT/target/nginx"
so="$ROOT/nginx-compat/target/release/libtollgate_module.so"
no_abi_imports "$so"
out="$ROOT/target/nginx/ngx_http_tollgate_wasm_module.so"
if ! cmp -s "$so" "$out"; then
  cp "$so" "$out.tmp" && mv "$out.tmp" "$out"   # atomic: a running nginx keeps its mapping
  log "built $out"
fi
