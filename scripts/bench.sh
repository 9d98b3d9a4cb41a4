#!/usr/bin/env bash
# Runs one benchmark of bench/ (interleaved variants, ratios) and writes bench/results/NAME.{json,md}.
# Usage: scripts/bench.sh NAME [--smoke] [--rounds N] [--seconds S] [--connections 1,8] [--workers N]
#   e.g. scripts/bench.sh jwt_auth
. "$(dirname "$0")/lib.sh"
name=${1:?usage: scripts/bench.sh NAME [options]}; shift
"$ROOT/scripts/setup.sh"
"$ROOT/scripts/apt.sh" wrk
"$ROOT/scripts/build.sh"
cd "$ROOT/bench"
exec "$VENV/bin/python" "$name.py" "$@"
