# Shared by the scripts: repository root, logging, and the tool locations set up by setup.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export ROOT
VENV="$ROOT/.venv"
WASM_DIR="$ROOT/target/wasm32-wasip1/release"
# With TOLLGATE_T0 (epoch seconds, exported by test.sh) each line also says the minutes and seconds
# since the run began, so that a CI log shows where the time went.
log() {
  if [ -n "${TOLLGATE_T0:-}" ]; then
    local t=$(($(date +%s) - TOLLGATE_T0))
    printf '[%s +%dm%02ds] %s\n' "$(basename "$0")" $((t / 60)) $((t % 60)) "$*" >&2
  else
    printf '[%s] %s\n' "$(basename "$0")" "$*" >&2
  fi
}
# Fails (exit 1, logged) when nginx module $1 imports a proxy-wasm ABI function: the proxy-wasm
# SDK's `#[no_mangle]` exports come with any native use of its crate, even of its types alone,
# and import the ABI's `proxy_*` functions, which no nginx has (the module would not load:
# dlopen's "undefined symbol"). Named at the build instead.
no_abi_imports() {
  local imports
  imports=$(nm -D --undefined-only "$1" | awk '$2 ~ /^proxy_/ {print $2}')
  if [ -n "$imports" ]; then
    log "$1 imports proxy-wasm ABI functions (a native use of the proxy-wasm crate, e.g. of tollgate-common's wasm-only code): $(echo "$imports" | head -3 | tr '\n' ' ')"
    exit 1
  fi
}
envoy_bin() { ls "$VENV"/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n1; }
# The wasm filters (crate directories under plugins/ that build a cdylib).
plugin_crates() { grep -l 'cdylib' "$ROOT"/plugins/*/Cargo.toml | xargs -n1 dirname | xargs -n1 basename; }
# A demo token (HS256, 1 hour) for the provider of the shipped configurations (envoy/gateway.yaml,
# nginx-compat/conf/gateway.conf), signed by PyJWT from the venv, not by the gateway.
demo_token() {
  "$VENV/bin/python" - <<'PY'
import time, jwt
now = int(time.time())
claims = {"iss": "https://demo.tollgate.local", "aud": "demo-api", "sub": "alice", "role": "reader", "iat": now, "exp": now + 3600}
print(jwt.encode(claims, "tollgate-demo-secret-change-me-0123456789", algorithm="HS256", headers={"kid": "demo"}))
PY
}
