#!/usr/bin/env bash
# Builds and runs the coverage-guided fuzz targets of fuzz/ (libFuzzer through libfuzzer-sys).
#
# The targets are built as cargo-fuzz builds them (release, debug assertions and overflow checks
# on, --cfg fuzzing, LLVM's SanitizerCoverage: inline 8-bit counters, PC table, comparison
# tracing, stack depth) but without AddressSanitizer: the filters are safe Rust
# (`unsafe_code = "deny"`), so a memory error cannot happen in them, and without ASan every flag
# is a stable `-C` codegen option, so the stable toolchain builds the targets: no nightly and no
# RUSTC_BOOTSTRAP. libfuzzer-sys compiles libFuzzer itself (needs a C++ compiler: g++).
# `cargo fuzz run TARGET` (cargo-fuzz, nightly, with ASan) works on the same crate too.
#
# Usage: scripts/fuzz.sh build
#        scripts/fuzz.sh smoke [SECONDS]        every target for SECONDS (default 5) from its seeds, two at a time
#        scripts/fuzz.sh run TARGET [libFuzzer options...]   e.g. -runs=10000000
#        scripts/fuzz.sh list
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
FUZZ_TARGET_DIR="$ROOT/target/fuzz"
TRIPLE=x86_64-unknown-linux-gnu
BIN="$FUZZ_TARGET_DIR/$TRIPLE/release"

targets() { ls "$ROOT/fuzz/fuzz_targets" | sed 's/\.rs$//'; }

build() {
  "$ROOT/scripts/apt.sh" g++
  # --target keeps the flags away from build scripts and proc macros, as cargo-fuzz does.
  RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth \
-Cdebug-assertions -Coverflow-checks" \
    cargo build -q --release --manifest-path fuzz/Cargo.toml --target "$TRIPLE" \
      --target-dir "$FUZZ_TARGET_DIR" --bins
}

# run TARGET [options]: new inputs go to target/fuzz/corpus/TARGET (the checked-in seeds in
# fuzz/corpus/TARGET are only read), crashes to target/fuzz/artifacts/TARGET/.
run() {
  local t=$1; shift
  local corpus="$FUZZ_TARGET_DIR/corpus/$t" artifacts="$FUZZ_TARGET_DIR/artifacts/$t"
  mkdir -p "$corpus" "$artifacts" "$ROOT/fuzz/corpus/$t"
  "$BIN/$t" -artifact_prefix="$artifacts/" -rss_limit_mb=2048 -timeout=10 "$@" "$corpus" "$ROOT/fuzz/corpus/$t"
}

smoke_one() {
  local t=$1 seconds=$2 out
  out=$(run "$t" -max_total_time="$seconds" -print_final_stats=1 2>&1 | grep -E '^(stat::number_of_executed_units|#[0-9]+ +DONE)' || true)
  log "fuzzed $t for ${seconds}s: ${out//$'\n'/; }"
  if ls "$FUZZ_TARGET_DIR/artifacts/$t/" | grep -qE '^(crash|timeout|oom|leak)-'; then
    log "fuzz target $t failed: $(ls "$FUZZ_TARGET_DIR/artifacts/$t/")"
    log "reproduce: $BIN/$t $FUZZ_TARGET_DIR/artifacts/$t/<file>"
    return 1
  fi
}

case "${1:-}" in
  build) build ;;
  list) targets ;;
  smoke)
    seconds=${2:-5}
    build
    # Two targets at a time (a libFuzzer run uses one core; this machine has two), each for
    # SECONDS; a failure (panic, timeout, out of memory) leaves its input in artifacts/ and
    # fails the smoke run once every target has run.
    failed=0 running=()
    for t in $(targets); do
      smoke_one "$t" "$seconds" &
      running+=("$!")
      if [ "${#running[@]}" -ge 2 ]; then
        wait "${running[0]}" || failed=1
        running=("${running[@]:1}")
      fi
    done
    for p in "${running[@]}"; do wait "$p" || failed=1; done
    exit "$failed" ;;
  run) shift; t=${1:?usage: scripts/fuzz.sh run TARGET [options]}; shift; build; run "$t" "$@" ;;
  *) echo "usage: scripts/fuzz.sh build|list|smoke [SECONDS]|run TARGET [options]" >&2; exit 2 ;;
esac
