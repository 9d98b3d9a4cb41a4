#!/usr/bin/env bash
# Builds nginx from Debian's source with musl-gcc, dynamically linked to musl (so that it can
# dlopen a module), and the nginx-compat module for x86_64-unknown-linux-musl against that very
# build tree: the musl variant of the images (docker/nginx-alpine.Dockerfile), proven without
# Docker.
#   target/nginx-musl/install/sbin/nginx                       nginx 1.22.1 on musl
#   target/nginx-musl/ngx_http_tollgate_wasm_module.so         the module, a musl .so
#   target/nginx-musl/src/nginx-1.22.1                         nginx's source (Debian's, patched)
#   target/nginx-musl/source-tree/nginx/{,objs}                NGINX_SOURCE_DIR, NGINX_BUILD_DIR
#                                                              (docker/nginx-source-tree.sh)
#
# Steps, each skipped when its stamp says it is done (idempotent; quick once built):
#   1. Debian's musl-tools (musl-gcc; the musl package provides the loader
#      /lib/ld-musl-x86_64.so.1), dpkg-dev (apt-get source), libclang-dev (bindgen), and the
#      x86_64-unknown-linux-musl Rust target (rustup).
#   2. deb-src entries mirroring the configured Debian sources (a file of its own in
#      /etc/apt/sources.list.d), then `apt-get source` of nginx, pcre2 and zlib at the versions
#      pinned below, into target/nginx-musl/src.
#   3. ./configure with CC=musl-gcc, PCRE2 and zlib compiled in from those sources (rewrite,
#      regex locations and gzip work as in Debian's nginx), no TLS (no OpenSSL for musl here;
#      the tests speak plain HTTP); `make -j1` (the machine is shared) and `make install`.
#   4. A self-check of the binary: `nginx -V`, `nginx -t`, then a request served (return,
#      a regex location, proxy_pass through the upstream module, gzip).
#   5. The module, the way docker/nginx-alpine.Dockerfile builds it: docker/nginx-source-tree.sh
#      configures a build tree from this nginx binary's own `nginx -v`/`nginx -V` (as on Alpine,
#      which has no nginx-dev), from a tarball of the very source the binary was built from
#      (Debian's, patched: nginx.org is not reachable here, and Debian's patches change
#      structures, e.g. a bit added to ngx_connection_s); then
#      cargo build --target x86_64-unknown-linux-musl with `-crt-static` (a dynamic
#      .so against musl's libc.so; with crt-static rustc would refuse the cdylib), linked by
#      musl-gcc (Rust's unwinder from rustup's libunwind.a: Debian has no libgcc_s for musl),
#      bindgen reading musl's headers, in its own target directory (target/nginx-musl/cargo);
#      checks that the .so exports ngx_modules and needs nothing but musl's libc.so, then
#      `nginx -t` with `load_module` on the musl nginx. Skipped with --nginx-only.
# Two shims, both generated under target/nginx-musl: an empty <crypt.h> (Debian's musl has no
# crypt(); nginx is built without auth_basic) and a libgcc_s.so linker script (step 5).
# Usage: scripts/build-nginx-musl.sh [--nginx-only]
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

NGINX_DEB=1.22.1-9+deb12u9      # the main suite's version (the security suite's .dsc is not served)
PCRE2_DEB=10.42-1
ZLIB_DEB=1:1.2.13.dfsg-1
TRIPLE=x86_64-unknown-linux-musl
MUSL="$ROOT/target/nginx-musl"
SRC_ROOT="$MUSL/src"
NGX_SRC="$SRC_ROOT/nginx-1.22.1"
PREFIX="$MUSL/install"
MODULE_OUT="$MUSL/ngx_http_tollgate_wasm_module.so"
nginx_only=0
[ "${1:-}" = "--nginx-only" ] && nginx_only=1

# 1. Tools.
"$ROOT/scripts/apt.sh" musl musl-dev musl-tools dpkg-dev libclang-dev
[ -e /lib/ld-musl-x86_64.so.1 ] || { log "musl's loader /lib/ld-musl-x86_64.so.1 is missing (package musl)"; exit 1; }
if [ "$nginx_only" = 0 ] && ! rustup target list --installed | grep -x "$TRIPLE" >/dev/null; then
  rustup target add "$TRIPLE"
fi

# 2. Sources.
have_source() { apt-cache showsrc "$1" 2>/dev/null | grep -x "Version: $2" >/dev/null; }  # no -q: pipefail
enable_deb_src() {
  # Mirror every enabled Debian source as deb-src (deb822 .sources and one-line .list alike).
  local SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  local out=/etc/apt/sources.list.d/tollgate-deb-src.sources f
  local tmp; tmp=$(mktemp)
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && [ "$f" != "$out" ] || continue
    grep -q '^Types:.*\bdeb\b' "$f" || continue
    sed -E 's/^Types:.*/Types: deb-src/' "$f" >> "$tmp"; echo >> "$tmp"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] || continue
    grep -E '^deb\s' "$f" | sed -E 's/^deb(\s)/deb-src\1/' >> "${tmp}.list" || true
  done
  if [ -s "$tmp" ]; then $SUDO cp "$tmp" "$out"; fi
  if [ -s "${tmp}.list" ]; then $SUDO cp "${tmp}.list" /etc/apt/sources.list.d/tollgate-deb-src.list; fi
  rm -f "$tmp" "${tmp}.list"
  log "deb-src enabled; apt-get update"
  $SUDO apt-get update -qq
}
fetched="nginx=$NGINX_DEB pcre2=$PCRE2_DEB zlib=$ZLIB_DEB"
if [ "$(cat "$SRC_ROOT/.fetched" 2>/dev/null)" != "$fetched" ]; then
  have_source nginx "$NGINX_DEB" || enable_deb_src
  for p in "nginx=$NGINX_DEB" "pcre2=$PCRE2_DEB" "zlib=$ZLIB_DEB"; do
    have_source "${p%%=*}" "${p#*=}" || { log "apt has no source package $p (deb-src configured?)"; exit 1; }
  done
  log "fetching Debian's sources: $fetched"
  rm -rf "$SRC_ROOT" && mkdir -p "$SRC_ROOT"
  (cd "$SRC_ROOT" && apt-get source -qq "nginx=$NGINX_DEB" "pcre2=$PCRE2_DEB" "zlib=$ZLIB_DEB" >"$SRC_ROOT/fetch.log" 2>&1) \
    || { log "apt-get source failed: see $SRC_ROOT/fetch.log"; exit 1; }
  echo "$fetched" > "$SRC_ROOT/.fetched"
fi
dirs=("$SRC_ROOT"/pcre2-*/); PCRE2_SRC=${dirs[0]%/}
dirs=("$SRC_ROOT"/zlib-*/); ZLIB_SRC=${dirs[0]%/}

# 3. nginx for musl. Debian's compiler flags and the modules Debian builds in, less TLS (and so
# less mail/stream TLS, which Debian builds as separate modules anyway) and less auth_basic:
# Debian's musl dropped crypt() and <crypt.h> (#947193), which ngx_linux_config.h includes
# unconditionally and only auth_basic calls, so an empty <crypt.h> stands in for it. It is
# given with -I (not -isystem) so that nginx-sys's bindgen, which reads the -I flags of
# objs/Makefile, finds it too.
SHIM="$MUSL/include-shim"
mkdir -p "$SHIM"
echo "/* Debian's musl has no crypt(); nginx is built without auth_basic, its only user. */" > "$SHIM/crypt.h"
conf_args=(
  --with-cc=musl-gcc
  --with-cc-opt="$(dpkg-buildflags --get CFLAGS) -fPIC $(dpkg-buildflags --get CPPFLAGS) -I$SHIM"
  --with-ld-opt="$(dpkg-buildflags --get LDFLAGS) -fPIC"
  --prefix="$PREFIX" --error-log-path=stderr
  --with-compat --with-debug --with-threads
  --with-pcre="$PCRE2_SRC" --with-pcre-jit --with-zlib="$ZLIB_SRC"
  --with-http_stub_status_module --with-http_realip_module --with-http_auth_request_module
  --with-http_v2_module --with-http_dav_module --with-http_slice_module
  --without-http_auth_basic_module
  --builddir=objs
)
want="$fetched ${conf_args[*]}"
if [ "$(cat "$PREFIX/.built" 2>/dev/null)" != "$want" ] || [ ! -x "$PREFIX/sbin/nginx" ]; then
  log "configuring nginx for musl (musl-gcc)"
  (cd "$NGX_SRC" && ./configure "${conf_args[@]}" >"$MUSL/configure.log" 2>&1) \
    || { log "configure failed: see $MUSL/configure.log"; exit 1; }
  log "building nginx for musl (make -j1, a few minutes)"
  (cd "$NGX_SRC" && nice -n 10 make -j1 >"$MUSL/make.log" 2>&1 && make install >>"$MUSL/make.log" 2>&1) \
    || { log "make failed: see $MUSL/make.log"; tail -n 20 "$MUSL/make.log" >&2; exit 1; }
  echo "$want" > "$PREFIX/.built"
fi
NGINX="$PREFIX/sbin/nginx"

# 4. Self-check: the binary runs on musl's loader, parses a configuration and serves requests.
interp=$(readelf -l "$NGINX" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ "$interp" = /lib/ld-musl-x86_64.so.1 ] || { log "nginx's interpreter is '$interp', not musl's"; exit 1; }
check="$MUSL/check"
rm -rf "$check" && mkdir -p "$check/conf" "$check/logs"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$check/conf/nginx.conf" <<EOF
daemon off;
worker_processes 2;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 64; }
http {
  access_log off;
  gzip on; gzip_min_length 1; gzip_types text/plain;
  server {
    listen 127.0.0.1:$port;
    location = /ok { return 200 "ok\n"; }
    location ~ ^/re/(?<word>[a-z]+)\$ { return 200 "regex \$word\n"; }
    location /up/ { proxy_pass http://127.0.0.1:$port/; }
  }
}
EOF
"$NGINX" -t -q -p "$check/" -c conf/nginx.conf
"$NGINX" -p "$check/" -c conf/nginx.conf & npid=$!
stop_nginx() { kill -QUIT "$npid" 2>/dev/null || true; wait "$npid" 2>/dev/null || true; }
trap stop_nginx EXIT
for _ in $(seq 50); do curl -fs -o /dev/null "http://127.0.0.1:$port/ok" && break; sleep 0.1; done
got="$(curl -fsS "http://127.0.0.1:$port/ok")|$(curl -fsS "http://127.0.0.1:$port/re/musl")|$(curl -fsS "http://127.0.0.1:$port/up/ok")"
enc=$(curl -fsS -H 'accept-encoding: gzip' -D - -o /dev/null "http://127.0.0.1:$port/ok" | tr -d '\r' | sed -n 's/^content-encoding: //Ip')
stop_nginx; trap - EXIT
if [ "$got" != "ok|regex musl|ok" ] || [ "$enc" != gzip ]; then
  log "musl nginx self-check FAILED: got '$got', content-encoding '$enc'; log: $(tail -n 5 "$check/logs/error.log")"
  exit 1
fi
log "musl nginx OK: $("$NGINX" -v 2>&1), interpreter $interp; served return, regex, proxy_pass, gzip"
[ "$nginx_only" = 1 ] && exit 0

# 5. The nginx-compat module for musl, against a build tree made by docker/nginx-source-tree.sh
# from this binary (its version, its `nginx -V` arguments) as the Alpine image makes it. The
# script's download is given a tarball of the source this binary was built from (checked
# against its own sha256: the script's checksum path runs too). Redone when the binary changes.
TREE="$MUSL/source-tree"
tree_for="$(sha256sum < "$NGINX") $(sha256sum < "$ROOT/docker/nginx-source-tree.sh")"
if [ "$(cat "$TREE/.made" 2>/dev/null)" != "$tree_for" ] || [ ! -f "$TREE/nginx/objs/ngx_auto_config.h" ]; then
  log "configuring the module's build tree with docker/nginx-source-tree.sh (as in the Alpine image)"
  rm -rf "$TREE" && mkdir -p "$TREE"
  tarball="$MUSL/nginx-source.tar.gz"
  tar -C "$SRC_ROOT" --exclude=nginx-1.22.1/objs --exclude=nginx-1.22.1/Makefile --exclude=nginx-1.22.1/debian --exclude=nginx-1.22.1/.pc \
    -czf "$tarball" nginx-1.22.1
  sum=$(sha256sum "$tarball" | cut -d' ' -f1)
  # The script runs `nginx`: this binary, first on PATH.
  (export PATH="$PREFIX/sbin:$PATH" NGINX_SOURCE_URL="file://$tarball" NGINX_SOURCE_SHA256="$sum"
   sh "$ROOT/docker/nginx-source-tree.sh" "$TREE" > "$MUSL/source-tree.log" 2>&1) \
    || { log "docker/nginx-source-tree.sh failed: see $MUSL/source-tree.log"; tail -n 20 "$MUSL/source-tree.log" >&2; exit 1; }
  rm -f "$tarball" "$TREE"/nginx-*.tar.gz
  # The script's tree must be configured as the binary was: the same ngx_auto_config.h as the
  # binary's own build tree, but for the NGX_CONFIGURE string (the arguments as re-quoted).
  if ! diff <(grep -v '^#define NGX_CONFIGURE ' "$NGX_SRC/objs/ngx_auto_config.h") \
            <(grep -v '^#define NGX_CONFIGURE ' "$TREE/nginx/objs/ngx_auto_config.h") >&2; then
    log "docker/nginx-source-tree.sh configured nginx unlike the binary (ngx_auto_config.h differs)"; exit 1
  fi
  echo "$tree_for" > "$TREE/.made"
fi
# Its own target directory, so it neither waits for nor invalidates the glibc build in
# nginx-compat/target.
export NGINX_SOURCE_DIR="$TREE/nginx" NGINX_BUILD_DIR="$TREE/nginx/objs"
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=musl-gcc
# Without crt-static, Rust's std links its unwinder as -lgcc_s, and Debian has no libgcc_s
# built for musl (its libgcc_s.so.1 needs glibc): a linker script named libgcc_s.so sends the
# linker to the LLVM libunwind.a that rustup ships for this target instead, so the .so needs
# nothing but musl's libc.so. (On Alpine, apk's libgcc is musl's: no such shim there.)
LINK_SHIM="$MUSL/link-shim"
mkdir -p "$LINK_SHIM"
echo "INPUT($(rustc --print sysroot)/lib/rustlib/$TRIPLE/lib/self-contained/libunwind.a)" > "$LINK_SHIM/libgcc_s.so"
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C target-feature=-crt-static -L native=$LINK_SHIM"
export CC_x86_64_unknown_linux_musl=musl-gcc AR_x86_64_unknown_linux_musl=ar
# bindgen parses nginx's headers as musl-gcc does: musl's headers only, not glibc's.
export BINDGEN_EXTRA_CLANG_ARGS_x86_64_unknown_linux_musl="-nostdinc -isystem /usr/include/x86_64-linux-musl"
log "building the nginx-compat module for $TRIPLE"
(cd "$ROOT/nginx-compat" && nice -n 10 cargo build -q --release --target "$TRIPLE" --target-dir "$MUSL/cargo" -p tollgate-module)
so="$MUSL/cargo/$TRIPLE/release/libtollgate_module.so"
if ! nm -D --defined-only "$so" | grep -w ngx_modules >/dev/null; then
  log "$so exports no ngx_modules: the module crate (nginx-compat/module) has no nginx module yet"
  exit 1
fi
no_abi_imports "$so"
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
if [ "$needed" != "libc.so " ]; then
  log "$so needs '$needed': only musl's libc.so is expected"; exit 1
fi
if ! cmp -s "$so" "$MODULE_OUT"; then cp "$so" "$MODULE_OUT.tmp" && mv "$MODULE_OUT.tmp" "$MODULE_OUT"; fi
printf 'load_module %s;\n%s' "$MODULE_OUT" "$(cat "$check/conf/nginx.conf")" > "$check/conf/module.conf"
"$NGINX" -t -q -p "$check/" -c conf/module.conf || { log "the musl nginx does not load $MODULE_OUT"; exit 1; }
log "module OK: $MODULE_OUT, built against docker/nginx-source-tree.sh's tree, loads into the musl nginx (nginx -t)"
