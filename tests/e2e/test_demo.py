"""The README's first command: scripts/demo.sh runs the default gateway on real requests."""
import socket
import subprocess

import pytest

from harness import ROOT


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_readme_demo_runs_the_default_gateway():
    if not all(port_free(p) for p in (8080, 9901, 10000)):
        pytest.skip("the demo's fixed ports 8080/9901/10000 are in use")
    r = subprocess.run([str(ROOT / "scripts/demo.sh"), "--check"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "HTTP/1.1 401" in r.stdout and "HTTP/1.1 200" in r.stdout
    assert "demo OK" in r.stderr
