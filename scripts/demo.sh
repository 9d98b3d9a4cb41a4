#!/usr/bin/env bash
# Installs what is needed, builds the filters, starts the demo upstream (127.0.0.1:8080) and the
# gateway on its default configuration, 127.0.0.1:10000: Envoy on envoy/gateway.yaml (admin
# :9901), or with --host nginx Debian's nginx with the module on nginx-compat/conf/gateway.conf
# (the same jwt-auth filter). Shows it on real requests. Stays up until Ctrl-C; with --check it
# stops after the requests.
# Usage: scripts/demo.sh [--check] [--host envoy|nginx]
. "$(dirname "$0")/lib.sh"
check=; host=envoy
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1 ;;
    --host) host=${2:-}; shift ;;
    --host=*) host=${1#--host=} ;;
    *) echo "usage: scripts/demo.sh [--check] [--host envoy|nginx]" >&2; exit 2 ;;
  esac
  shift
done
case "$host" in envoy|nginx) ;; *) echo "--host: envoy or nginx, not '$host'" >&2; exit 2 ;; esac
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"
if [ "$host" = nginx ]; then "$ROOT/scripts/build-nginx-module.sh"; fi
mkdir -p .cache/demo target/nginx/run
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

target/demo-upstream -listen 127.0.0.1:8080 -name demo-upstream 2> .cache/demo/upstream.log & pids+=($!)
if [ "$host" = nginx ]; then
  log=.cache/demo/nginx.log
  nginx -p "$ROOT" -c nginx-compat/conf/gateway.conf -e "$ROOT/$log" > .cache/demo/nginx.out 2>&1 & pids+=($!)
  ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10000/healthz)" = 200 ]; }
else
  log=.cache/demo/envoy.log
  "$(envoy_bin)" -c envoy/gateway.yaml --concurrency 2 --use-dynamic-base-id -l info > "$log" 2>&1 & pids+=($!)
  ready() { curl -fs -o /dev/null http://127.0.0.1:9901/ready; }
fi
for _ in $(seq 100); do ready && break; sleep 0.2; done
ready || { tail -n 30 "$log" .cache/demo/*.out 2>/dev/null; exit 1; }

token=$(demo_token)   # scripts/lib.sh
show() { echo; echo "\$ $*"; "$@"; echo; }
show curl -s -i http://127.0.0.1:10000/hello
show curl -s -i http://127.0.0.1:10000/hello -H "authorization: Bearer $token"
show curl -s -i http://127.0.0.1:10000/hello -H "authorization: Bearer ${token%?????}"
show curl -s -i http://127.0.0.1:10000/healthz
status=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10000/hello)
ok=$(curl -s http://127.0.0.1:10000/hello -H "authorization: Bearer $token" | grep -c '"x-jwt-sub":\["alice"\]' || true)
if [ "$status" != 401 ] || [ "$ok" != 1 ]; then log "demo FAILED (no token: $status, claims forwarded: $ok)"; exit 1; fi
log "demo OK ($host): no token -> 401, valid token -> upstream with x-jwt-sub: alice"
if [ -n "$check" ]; then exit 0; fi
if [ "$host" = nginx ]; then
  log "gateway (nginx) on http://127.0.0.1:10000, log $log, token: $token"
else
  log "gateway (Envoy) on http://127.0.0.1:10000 (admin http://127.0.0.1:9901), token: $token"
fi
log "Ctrl-C to stop"
wait
