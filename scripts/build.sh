#!/usr/bin/env bash
# Builds every filter in plugins/ (and bench/wasm-floor) for wasm32-wasip1 (release) and the
# demo upstream.
#   target/wasm32-wasip1/release/tollgate_<filter>.wasm, target/demo-upstream
# cargo builds in its own target dir (target/wasm-build, or target/build-std), never in the
# modules' directory: cargo re-links its artifacts into its output directory on every build,
# even one with nothing to compile, so a build there swapped the trimmed modules for cargo's
# untrimmed ones until trim-callbacks rewrote them, and a gateway or test starting meanwhile
# (the demo runs this script while the suites run) loaded other bytes. Each module here is
# replaced only when its bytes change, by a rename, so a reader sees the old or the new one.
# With .cache/wasm-build-std present (set by setup.sh when rustup cannot add the target), or
# TOLLGATE_WASM_FALLBACK=1, the filters are built with Debian's rustc-web and build-std instead
# (recipe: ../shared/notes/environment.md).
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
pkgs=()
for c in $(plugin_crates); do pkgs+=(-p "tollgate-$c"); done
pkgs+=(-p tollgate-wasm-floor)   # bench/wasm-floor: the empty filter the benchmarks compare with
pkgs+=(-p tollgate-test-probe)   # tests/filters/probe: test-only, a third-party-style filter (never shipped)
pkgs+=(-p tollgate-test-abi-fuzz)   # tests/filters/abi-fuzz: test-only, a hostile guest for the nginx host's fuzz tests
if [ -e .cache/wasm-build-std ] || [ "${TOLLGATE_WASM_FALLBACK:-0}" = 1 ]; then
  "$ROOT/scripts/apt.sh" rustc-web cargo-web rust-web-src lld-22 wasi-libc
  RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
  CARGO_TARGET_WASM32_WASIP1_LINKER=/usr/lib/llvm-22/bin/wasm-ld \
  RUSTFLAGS="-C link-self-contained=no -L /usr/lib/wasm32-wasi" \
    /usr/bin/cargo build -q --release --target wasm32-wasip1 -Zbuild-std=std,panic_abort \
      --target-dir target/build-std "${pkgs[@]}"
  SRC=target/build-std/wasm32-wasip1/release
  touch .cache/wasm-from-build-std
else
  rm -f .cache/wasm-from-build-std
  cargo build -q --release --target wasm32-wasip1 --target-dir target/wasm-build "${pkgs[@]}"
  SRC=target/wasm-build/wasm32-wasip1/release
fi
mkdir -p "$WASM_DIR"
# install_module FROM TO: TO gets FROM's bytes, by a rename, unless it already has them.
install_module() {
  cmp -s "$1" "$2" || { cp "$1" "$2.new" && mv -f "$2.new" "$2"; }
}
# Point each module's exports of the proxy-wasm stream callbacks its filter does not implement
# (the SDK exports them all) at constant stubs answering the SDK's default, as listed in the
# crate's [package.metadata.tollgate] http-callbacks: Kong's ngx_wasm_module calls every stream
# callback, nginx-compat's host skips the stubs (tools/trim-callbacks). $SRC holds cargo's
# untrimmed modules; a module in $WASM_DIR is rewritten only when its bytes differ. The untrimmed
# floor is kept as tollgate_wasm_floor_all_callbacks.wasm, for the benchmarks.
cargo run -q -p tollgate-trim-callbacks -- "$SRC" "$WASM_DIR"
install_module "$SRC/tollgate_wasm_floor.wasm" "$WASM_DIR/tollgate_wasm_floor_all_callbacks.wasm"
(cd demo-upstream && go build -o "$ROOT/target/demo-upstream" .)
log "built: $(cd "$WASM_DIR" && ls tollgate_*.wasm | tr '\n' ' ')and target/demo-upstream"
