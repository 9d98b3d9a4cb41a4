"""The benchmarks' smoke mode (a second per cell): the scripts and the runner cannot rot."""
import json
import subprocess
import sys

import pytest

from harness import ROOT

BENCHES = ["jwt_auth", "rate_limit", "sticky_upstream", "cost", "metrics"]


@pytest.mark.parametrize("name", BENCHES)
def test_benchmark_smoke(name):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke"], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((ROOT / "bench" / "results" / f"{name}.smoke.json").read_text())
    assert results["raw"] and results["ratios"]
    bad = [row for row in results["raw"] if row.get("unexpected_status")]
    assert not bad, bad
    assert all(row["requests"] > 0 and row["cpu_us_per_request"] > 0 for row in results["raw"])
