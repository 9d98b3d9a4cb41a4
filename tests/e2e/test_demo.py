"""The README's first command: scripts/demo.sh runs the default gateway on real requests, on Envoy
or on nginx."""
import socket
import subprocess

import pytest

from lab import ROOT


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_readme_demo_runs_the_default_gateway_on_either_host():
    # One after the other in one test: both use the demo's fixed ports.
    for host in ("envoy", "nginx"):
        if not all(port_free(p) for p in (8080, 9901, 10000)):
            pytest.skip("the demo's fixed ports 8080/9901/10000 are in use")
        r = subprocess.run([str(ROOT / "scripts/demo.sh"), "--check", "--host", host], capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "HTTP/1.1 401" in r.stdout and "HTTP/1.1 200" in r.stdout
        assert f"demo OK ({host})" in r.stderr


def test_the_demo_refuses_an_unknown_host():
    r = subprocess.run([str(ROOT / "scripts/demo.sh"), "--host", "apache"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "envoy or nginx" in r.stderr
