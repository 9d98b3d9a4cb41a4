"""Where the lab finds what the build made: the repository, target/, the filters' .wasm files.

`WASM_DIR` is read when a FilterSpec's module is resolved (FilterSpec.wasm), so a program that
points the lab at other builds of the filters rebinds `lab.paths.WASM_DIR` (bench/instructions.py
does); `lab.WASM_DIR` is the value at import, for reading.
"""
from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# TOLLGATE_WASM_DIR runs the suites against other builds of the filters (e.g. main's, to show
# that a new test fails there).
WASM_DIR = pathlib.Path(os.environ.get("TOLLGATE_WASM_DIR") or ROOT / "target" / "wasm32-wasip1" / "release")
TARGET = ROOT / "target"

# tests/filters/probe: a test-only filter that uses the ABI as other people's filters do.
PROBE_WASM = WASM_DIR / "test_probe.wasm"
# tests/filters/abi-fuzz: a test-only hostile guest (seeded calls of every import).
ABI_FUZZ_WASM = WASM_DIR / "test_abi_fuzz.wasm"
