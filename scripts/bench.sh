#!/usr/bin/env bash
# Runs one benchmark of bench/ (interleaved variants, ratios) and writes bench/results/NAME.{json,md}.
# Usage: scripts/bench.sh NAME [--smoke] [--rounds N] [--seconds S] [--connections 1,8] [--workers N]
#   e.g. scripts/bench.sh jwt_auth
#        scripts/bench.sh gateway            # the gateway report (k6): bench/results/gateway.md
#        scripts/bench.sh global_limits      # local vs global mode (k6, the rate limit service on Redis)
#        scripts/bench.sh engine_latency     # the rate limit service on its own, from a direct gRPC client
#        scripts/bench.sh instructions [--module LABEL=PATH ...]   # nginx instructions/request (callgrind)
#        scripts/bench.sh startup [--workers 8]   # nginx start and reload, with and without the compiled-code cache
. "$(dirname "$0")/lib.sh"
name=${1:?usage: scripts/bench.sh NAME [options]}; shift
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/apt.sh" wrk
if [ "$name" = gateway ] || [ "$name" = global_limits ]; then "$ROOT/scripts/k6.sh" >/dev/null; fi
if [ "$name" = global_limits ] || [ "$name" = engine_latency ]; then "$ROOT/scripts/ratelimit.sh" >/dev/null; fi
if [ "$name" = instructions ]; then "$ROOT/scripts/apt.sh" valgrind; "$ROOT/scripts/build-nginx-module.sh"; fi
if [ "$name" = startup ]; then "$ROOT/scripts/build-nginx-module.sh"; fi
"$ROOT/scripts/build.sh"
cd "$ROOT/bench"
exec "$VENV/bin/python" "$name.py" "$@"
