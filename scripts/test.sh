#!/usr/bin/env bash
# Runs every test: formatting and clippy (native and wasm32), the filters' unit tests, the demo
# upstream's tests, the end-to-end suites against real gateways, and the benchmarks' smoke mode.
# Installs what it needs first (scripts/setup.sh, idempotent).
# Usage: scripts/test.sh            (everything)
#        TOLLGATE_HOSTS=envoy scripts/test.sh   (default: envoy,nginx,nginx-musl; then kong, below)
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
TOLLGATE_T0="${TOLLGATE_T0:-$(date +%s)}"
export TOLLGATE_T0
# The disk, before and after: a clean run writes about NEED_GB (target/, nginx-compat/target/,
# buildah's storage), and a full disk shows up only as a linker's SIGBUS or an I/O error.
NEED_GB=15
disk_report() {
  log "disk: $(df -BG --output=avail "$ROOT" | tail -n1 | tr -d ' ') free;" \
    "build dirs $(du -xsch "$ROOT/target" "$ROOT/nginx-compat/target" 2>/dev/null | tail -n1 | cut -f1)"
}
disk_report
trap disk_report EXIT
free_gb=$(df -BG --output=avail "$ROOT" | tail -n1 | tr -dc '0-9')
if [ "${free_gb:-0}" -lt "$NEED_GB" ]; then
  log "warning: ${free_gb} GB free here, a clean run needs about ${NEED_GB} GB; builds may fail with SIGBUS or ENOSPC"
fi
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"

log "cargo fmt --check, clippy (native and wasm32-wasip1, warnings are errors)"
cargo fmt --all --check
cargo clippy -q --workspace --all-targets -- -D warnings
pkgs=(); for c in $(plugin_crates); do pkgs+=(-p "tollgate-$c"); done
cargo clippy -q --target wasm32-wasip1 "${pkgs[@]}" -- -D warnings

log "unit tests (native)"
cargo test -q --workspace

log "fuzz targets (fuzz/, its own workspace): fmt, clippy, then a short run of each from its seeds"
# Checked without libFuzzer (no C++ build) and in the workspace's target dir (its dependencies
# are already checked there).
(cd fuzz && cargo fmt --check && cargo clippy -q --target-dir "$ROOT/target" --no-default-features --bins -- -D warnings)
"$ROOT/scripts/fuzz.sh" smoke "${TOLLGATE_FUZZ_SECONDS:-5}"

log "nginx-compat: the module for Debian's nginx (glibc) and for nginx on musl"
"$ROOT/scripts/build-nginx-module.sh"
"$ROOT/scripts/build-nginx-musl.sh"
log "nginx-compat: fmt, clippy, unit tests of the host, the services and the module's nginx-free files"
(cd nginx-compat && cargo fmt --all --check && cargo clippy -q --workspace --all-targets -- -D warnings)
# The tests of the three crates in one `cargo test --workspace`, and the ABI fuzzer below with
# the same arguments: tests build with panic=unwind, so wasmtime is compiled once more than for
# the module (panic=abort), and one set of packages is one set of features, so that compile is
# not repeated (each `-p` subset compiled wasmtime again: about 3 min a time here, three times).
# Profile release-test (nginx-compat/Cargo.toml): release without LTO. The module's
# nginx-free files are tested by module/tests/pure.rs (its library needs nginx's symbols at load
# time), with the NGINX_* values of build-nginx-module.sh (nginx-sys rebuilds when they change).
ngx_env=(NGINX_SOURCE_DIR="$ROOT/target/nginx-build/nginx-src" NGINX_BUILD_DIR="$ROOT/target/nginx-build/nginx-src/objs")
(cd nginx-compat && env "${ngx_env[@]}" cargo test -q --profile release-test --workspace)
# gRPC calls through a real nginx (a WAT guest, a grpcio server behind an upstream {}: replies,
# statuses, the deadline, one HTTP/2 connection for many calls, the eventfd wake-up; about 2 min),
# and a tick period that takes effect at once, as in Envoy.
log "nginx-compat: gRPC calls, HTTP calls and the tick through a real nginx"
"$VENV/bin/python" nginx-compat/tests/calls/grpc_e2e.py
"$VENV/bin/python" nginx-compat/tests/calls/tick_rearm.py
# HTTP calls through a real nginx reuse their connections (200 calls, at most 4 connections).
"$VENV/bin/python" nginx-compat/tests/calls/http_latency.py --check
# No import cycle between the modules of nginx-compat's crates and of the filters, no function over 150 lines
# without a reason beside it.
python3 scripts/check-module-cycles.py
python3 scripts/check-file-sizes.py
python3 scripts/long-functions.py >/dev/null
# The hostile-guest ABI fuzzer (tests/filters/abi-fuzz against the host core, in-process): a
# fixed seed, 200,000 host calls (about 10-40 s). The long run: nginx-compat/README.md.
log "nginx-compat: the hostile-guest ABI fuzzer"
(cd nginx-compat && env "${ngx_env[@]}" ABI_FUZZ_SEED=2 ABI_FUZZ_CALLS=200000 \
  cargo test -q --profile release-test --workspace --test abi_fuzz -- --ignored hostile_guest_long_run)

log "demo upstream tests"
(cd demo-upstream && go vet ./... && go test -count=1 ./...)

log "tools of the end-to-end tests: wrk, k6, the rate limit service, Prometheus, wabt"
"$ROOT/scripts/apt.sh" wrk   # the benchmarks' smoke mode
"$ROOT/scripts/k6.sh" >/dev/null   # the gateway report's smoke mode (k6 v1.8.1 from the Go module proxy; minutes when cold)
"$ROOT/scripts/ratelimit.sh" >/dev/null   # the global limits' engine: Redis (Debian) and envoyproxy/ratelimit (pinned, go install)
"$ROOT/scripts/apt.sh" prometheus   # test_metrics.py: a real Prometheus and promtool
"$ROOT/scripts/apt.sh" wabt   # test_nginx_module.py: wat2wasm for the trap and pause test modules
# Every suite runs against each host: Envoy, Debian's nginx with the module, nginx on musl.
export TOLLGATE_HOSTS="${TOLLGATE_HOSTS:-envoy,nginx,nginx-musl}"
cd "$ROOT/tests/e2e"
if [ $# -eq 0 ] && [[ ",$TOLLGATE_HOSTS," == *,nginx,* ]]; then
  # The nginx module's own suites once more with `error_log debug`: nginx's debug log reads the
  # data of every timer event (a NULL one crashed workers), and logs far more per request.
  log "end-to-end tests of the nginx module with error_log debug (Debian's nginx)"
  TOLLGATE_HOSTS=nginx TOLLGATE_NGINX_LOG_LEVEL=debug "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    test_nginx_module.py test_nginx_guest_limits.py test_nginx_fail_closed.py test_nginx_redirects.py \
    test_nginx_metrics_overflow.py test_abi_compat.py test_shared_queues.py
fi
# The gateways of the runs below keep compiled code in one directory (lab/nginx.py,
# TOLLGATE_E2E_COMPILED_CACHE): each distinct .wasm is compiled once per run, not at each of
# the hundreds of nginx starts (a start with the likely chain compiles for 2-4 s here). Emptied
# first, so that every run begins cold; the debug run above and the tests of the cache itself
# compile as a start without one does.
export TOLLGATE_E2E_COMPILED_CACHE="$ROOT/target/e2e-compiled-cache"
rm -rf "$TOLLGATE_E2E_COMPILED_CACHE"
# Failures reported as they happen, the tracebacks of a test still running after 10 min, and
# the slowest tests (where the suite's time goes) at the end.
e2e() { TOLLGATE_REPORT_EARLY=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=600 --durations=15 "$@"; }
if [ $# -eq 0 ]; then
  # Most tests wait on processes more than they compute: two at a time (pytest-xdist), then
  # those that measure time or load (marked `serial`) alone.
  log "end-to-end tests, two at a time (all but those marked serial)"
  e2e -n 2 -m "not serial"
  log "end-to-end tests marked serial (time or load measured), one at a time"
  e2e -m serial
else
  log "end-to-end tests: $*"
  e2e "$@"
fi

# The images of docker/ built from their Dockerfiles with buildah (installed by the script; it
# needs root), each run on its default configuration as its own user and checked on the demo
# requests and its health check; sizes printed. Warm: layer and cargo caches kept by buildah
# (about 1 min). Cold, the nginx image's module stage builds wasmtime: 10-15 min on an idle
# 2-core machine, so it runs last and only while the run has time left inside CI's 90 minutes
# (TOLLGATE_IMAGES: auto, the default, when fewer than 60 min have passed; always; never).
if [ $# -eq 0 ]; then
  cd "$ROOT"
  images="${TOLLGATE_IMAGES:-auto}"
  if [ "$(id -u)" -ne 0 ]; then
    log "images: skipped, scripts/images.sh needs root (buildah's chroot isolation, unshare --net)"
  elif [ "$images" = never ] || { [ "$images" = auto ] && [ "$SECONDS" -ge 3600 ]; }; then
    log "images: skipped (TOLLGATE_IMAGES=$images, $((SECONDS / 60)) min so far); run scripts/images.sh"
  else
    log "images: scripts/images.sh (Envoy and Debian nginx, buildah), $((SECONDS / 60)) min so far"
    # Never past 80 minutes in all, 10 minutes inside CI's 90: a cold build that would run over
    # is stopped (with its process group) and reported, so that the time limit, not the images,
    # decides nothing about the rest of the run.
    rc=0
    timeout $((80 * 60 - SECONDS)) "$ROOT/scripts/images.sh" || rc=$?
    if [ "$rc" -eq 124 ]; then
      log "images: stopped at 80 min in all (cold caches on a slow machine); run scripts/images.sh"
    elif [ "$rc" -ne 0 ]; then
      exit "$rc"
    fi
  fi
fi

# Kong's ngx_wasm_module as a fourth host (scripts/build-kong-module.sh, from ../shared/vendor):
# every test that runs once per host, on it, each passing or expecting one of Kong's differences
# by name (KONG_DIFFERENCES in lab/kong.py, the table in nginx-compat/README.md). About
# 4 min with the module in the machine's cache (190 s of tests); cold, Wasmtime 26's build adds 10-15 min, so it
# runs last and only while the run has time left inside CI's 90 minutes (TOLLGATE_KONG: auto, the
# default, when fewer than 65 min have passed; always; never), stopped at 85 min in all.
if [ $# -eq 0 ]; then
  cd "$ROOT"
  kong="${TOLLGATE_KONG:-auto}"
  kong_src="${KONG_SRC:-$ROOT/../shared/vendor/ngx_wasm_module}"
  if [ ! -f "$kong_src/config" ]; then
    log "kong host: skipped, no source of Kong's module at $kong_src (../shared/vendor beside the clone, or KONG_SRC=DIR)"
  elif [ "$kong" = never ] || { [ "$kong" = auto ] && [ "$SECONDS" -ge $((65 * 60)) ]; }; then
    log "kong host: skipped (TOLLGATE_KONG=$kong, $((SECONDS / 60)) min so far); run scripts/build-kong-module.sh," \
      "then TOLLGATE_HOSTS=kong TOLLGATE_HOST_TESTS_ONLY=1 pytest in tests/e2e"
  else
    log "kong host: Kong's ngx_wasm_module and the per-host e2e tests on it, $((SECONDS / 60)) min so far"
    rc=0
    timeout $((85 * 60 - SECONDS)) bash -c '"$1/scripts/build-kong-module.sh" && cd "$1/tests/e2e" &&
      TOLLGATE_HOSTS=kong TOLLGATE_HOST_TESTS_ONLY=1 "$2/bin/python" -m pytest -q -p no:cacheprovider' _ "$ROOT" "$VENV" || rc=$?
    if [ "$rc" -eq 124 ]; then
      log "kong host: stopped at 85 min in all (a cold Wasmtime build on a slow machine); run it alone"
    elif [ "$rc" -ne 0 ]; then
      exit "$rc"
    fi
  fi
fi
