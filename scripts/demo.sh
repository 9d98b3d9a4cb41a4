#!/usr/bin/env bash
# Installs what is needed, builds the filters, starts the demo upstream (127.0.0.1:8080) and
# Envoy on the default configuration (envoy/gateway.yaml, 127.0.0.1:10000, admin :9901), and
# shows it on real requests. Stays up until Ctrl-C; with --check it stops after the requests.
# Usage: scripts/demo.sh [--check]
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/build.sh"
mkdir -p .cache/demo
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

target/demo-upstream -listen 127.0.0.1:8080 -name demo-upstream 2> .cache/demo/upstream.log & pids+=($!)
"$(envoy_bin)" -c envoy/gateway.yaml --concurrency 2 --use-dynamic-base-id -l info > .cache/demo/envoy.log 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -fs -o /dev/null http://127.0.0.1:9901/ready && break; sleep 0.2; done
curl -fs -o /dev/null http://127.0.0.1:9901/ready || { tail -n 30 .cache/demo/envoy.log; exit 1; }

token=$(demo_token)   # scripts/lib.sh
show() { echo; echo "\$ $*"; "$@"; echo; }
show curl -s -i http://127.0.0.1:10000/hello
show curl -s -i http://127.0.0.1:10000/hello -H "authorization: Bearer $token"
show curl -s -i http://127.0.0.1:10000/hello -H "authorization: Bearer ${token%?????}"
show curl -s -i http://127.0.0.1:10000/healthz
status=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10000/hello)
ok=$(curl -s http://127.0.0.1:10000/hello -H "authorization: Bearer $token" | grep -c '"x-jwt-sub":\["alice"\]' || true)
if [ "$status" != 401 ] || [ "$ok" != 1 ]; then log "demo FAILED (no token: $status, claims forwarded: $ok)"; exit 1; fi
log "demo OK: no token -> 401, valid token -> upstream with x-jwt-sub: alice"
if [ "${1:-}" = "--check" ]; then exit 0; fi
log "gateway on http://127.0.0.1:10000 (admin http://127.0.0.1:9901), token: $token"
log "Ctrl-C to stop"
wait
