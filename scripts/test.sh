#!/usr/bin/env bash
# Runs every test: formatting and clippy (native and wasm32), the filters' unit tests, the demo
# upstream's tests, the end-to-end suites against real gateways, and the benchmarks' smoke mode.
# Installs what it needs first (scripts/setup.sh, idempotent).
# Usage: scripts/test.sh            (everything)
#        TOLLGATE_HOSTS=envoy scripts/test.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"

log "cargo fmt --check, clippy (native and wasm32-wasip1, warnings are errors)"
cargo fmt --all --check
cargo clippy -q --workspace --all-targets -- -D warnings
pkgs=(); for c in $(plugin_crates); do pkgs+=(-p "tollgate-$c"); done
cargo clippy -q --target wasm32-wasip1 "${pkgs[@]}" -- -D warnings

log "unit tests (native)"
cargo test -q --workspace

log "demo upstream tests"
(cd demo-upstream && go vet ./... && go test -count=1 ./...)

"$ROOT/scripts/apt.sh" wrk   # the benchmarks' smoke mode
"$ROOT/scripts/k6.sh" >/dev/null   # the gateway report's smoke mode (k6 v1.8.1 from the Go module proxy; minutes when cold)
"$ROOT/scripts/apt.sh" prometheus   # test_metrics.py: a real Prometheus and promtool
log "end-to-end tests"
cd "$ROOT/tests/e2e"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
