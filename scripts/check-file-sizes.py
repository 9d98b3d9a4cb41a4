#!/usr/bin/env python3
"""Source files a newcomer can read: no Rust source file of the repository has more than 800 lines
before its tests (the first `#[cfg(test)]` line, or the end), and no filter's `src/filter.rs` more
than 400 (a filter's glue is a thin shell over the skeleton, plugins/common/src/skeleton/).

Prints each file over its bound and exits 1 if any. Usage: scripts/check-file-sizes.py
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 800
MAX_FILTER_LINES = 400


def lines_before_tests(path: Path) -> int:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            return i
    return len(lines)


def main() -> int:
    files = subprocess.run(["git", "ls-files", "*.rs"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    over = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        bound = MAX_FILTER_LINES if name.startswith("plugins/") and name.endswith("/src/filter.rs") else MAX_LINES
        n = lines_before_tests(path)
        if n > bound:
            over.append(f"{name}: {n} lines before its tests (at most {bound})")
    for line in over:
        print(line)
    print(f"{len(files)} Rust files, {len(over)} over their bound")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
