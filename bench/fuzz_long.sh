#!/usr/bin/env bash
# Long runs of the fuzz targets (scripts/fuzz.sh builds and runs them): each target for a number
# of executions (default 10 000 000, the issue's bar) from its seeds and the corpus grown by
# earlier runs, one after the other, then a table of executions, wall time, executions per
# second and corpus size, written to bench/results/fuzz_long.md. A failure stops the run and
# leaves the input in target/fuzz/artifacts/<target>/ (scripts/fuzz.sh prints how to replay it).
#
# Usage: bench/fuzz_long.sh [TARGET...]          (default: every target in fuzz/fuzz_targets)
#        RUNS=1000000 bench/fuzz_long.sh usage_json sse_stream
. "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"
RUNS=${RUNS:-10000000}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <("$ROOT/scripts/fuzz.sh" list)
"$ROOT/scripts/fuzz.sh" build
out="$ROOT/bench/results/fuzz_long.md"
rows=()
for t in "${targets[@]}"; do
  log "fuzz $t for $RUNS executions"
  start=$(date +%s.%N)
  if ! stats=$("$ROOT/scripts/fuzz.sh" run "$t" -runs="$RUNS" -print_final_stats=1 2>&1); then
    printf '%s\n' "$stats" | tail -40 >&2
    log "fuzz target $t failed: see target/fuzz/artifacts/$t/"; exit 1
  fi
  end=$(date +%s.%N)
  execs=$(printf '%s\n' "$stats" | sed -n 's/^stat::number_of_executed_units: *//p' | tail -1)
  corpus=$(ls "$ROOT/target/fuzz/corpus/$t" | wc -l)
  rows+=("$(awk -v t="$t" -v n="$execs" -v a="$start" -v b="$end" -v c="$corpus" \
    'BEGIN { s = b - a; printf "| %s | %d | %.0f | %.0f | %d |", t, n, s, n / s, c }')")
  log "${rows[-1]}"
done
{
  echo "# Fuzz runs ($(date -u +%Y-%m-%d), $(nproc) cores, one target at a time)"
  echo
  echo "Command: RUNS=$RUNS bench/fuzz_long.sh ${targets[*]}"
  echo
  echo "| target | executions | seconds | executions/s | corpus files |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} > "$out"
cat "$out"
