#!/usr/bin/env bash
# Installs the global rate limit engine for issue 19, pinned, and prints the two binaries' paths:
#   - Redis from Debian (`redis-server`, 7.0 on Debian 12) through scripts/apt.sh;
#   - envoyproxy/ratelimit (the reference server of Envoy's rate limit service protocol,
#     envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) into target/tools/bin with
#     `go install` from the Go module proxy. The module has no release tags, so it is pinned by
#     the pseudo-version of one commit of its main branch (RATELIMIT_VERSION, below; change it here
#     only); the binary is `service_cmd`, checked by its embedded module version (`go version -m`).
# Idempotent: quick when both are there (about 0.1 s). Debian's package starts its own
# redis-server on 127.0.0.1:6379 as a system service where an init system runs; nothing in
# Tollgate uses that one (the tests start their own on free ports, tests/e2e/ratelimit_engine.py),
# and so that it neither collides nor is depended upon by mistake, this script stops and disables
# it right after installing the package. A cold `go install` takes about a minute on 2 cores.
# Usage: scripts/ratelimit.sh     -> /usr/bin/redis-server
#                                    /path/to/target/tools/bin/service_cmd
. "$(dirname "$0")/lib.sh"
RATELIMIT_MODULE=github.com/envoyproxy/ratelimit
RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36
bin_dir="$ROOT/target/tools/bin"
service="$bin_dir/service_cmd"

if ! command -v redis-server >/dev/null; then
  "$ROOT/scripts/apt.sh" redis-server
  # Debian's postinst enables and starts redis-server.service (127.0.0.1:6379) where an init
  # system runs; in a container policy-rc.d usually keeps it from starting. Stopped and disabled
  # here, right after the install only: a Redis someone runs on purpose is left alone.
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    $SUDO systemctl disable --now redis-server.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/redis-server ]; then
    $SUDO /etc/init.d/redis-server stop >/dev/null 2>&1 || true
  fi
  if pgrep -x redis-server >/dev/null; then
    log "warning: a redis-server still runs after the install ($(pgrep -a -x redis-server | head -n1)); Tollgate does not use it"
  fi
fi

installed() {
  [ -x "$service" ] && go version -m "$service" 2>/dev/null |
    grep -Eq "^[[:space:]]+mod[[:space:]]+${RATELIMIT_MODULE}[[:space:]]+${RATELIMIT_VERSION}\b"
}
if ! installed; then
  command -v go >/dev/null || { log "Go is required to install envoyproxy/ratelimit"; exit 1; }
  log "installing envoyproxy/ratelimit $RATELIMIT_VERSION (untagged: a pinned pseudo-version) into $bin_dir"
  mkdir -p "$bin_dir"
  GOBIN="$bin_dir" GOFLAGS="${GOFLAGS:-} -trimpath" go install "$RATELIMIT_MODULE/src/service_cmd@$RATELIMIT_VERSION"
  installed || { log "$service does not report $RATELIMIT_MODULE $RATELIMIT_VERSION: $(go version -m "$service" 2>&1 | head -n3 || true)"; exit 1; }
  log "installed $service ($RATELIMIT_MODULE $RATELIMIT_VERSION)"
fi
command -v redis-server
echo "$service"
