import http.server
import os
import pathlib
import sys
import threading

import pytest

# The gateway lab (lab/ at the repository root), which every suite here imports.
ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lab import HOSTS, DemoUpstream, RawNginx, selected_hosts, selected_nginx_hosts  # noqa: E402


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("e2e")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "serial: measures time or load, so it runs alone: scripts/test.sh runs the other tests two at "
        "a time (pytest-xdist, -m 'not serial'), then these one at a time (-m serial)")


def pytest_collection_modifyitems(config, items):
    """TOLLGATE_HOST_TESTS_ONLY=1: only the tests that run once per host (those taking the `host`
    fixture), e.g. the kong host's pass in scripts/test.sh; the others ran with the main hosts."""
    if os.environ.get("TOLLGATE_HOST_TESTS_ONLY") != "1":
        return
    keep = [item for item in items if "host" in getattr(item, "fixturenames", ())]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_runtest_logreport(report):
    """TOLLGATE_REPORT_EARLY=1 (scripts/test.sh): a failed test's report is printed when it fails,
    not only in the summary at the end, so that a run stopped at CI's time limit still says
    which test failed and why."""
    if report.failed and os.environ.get("TOLLGATE_REPORT_EARLY") == "1":
        print(f"\n[FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)]\n"
              f"{report.longreprtext[-6000:]}\n", file=sys.stderr, flush=True)


@pytest.fixture(scope="session", params=selected_hosts())
def host(request, workdir):
    return HOSTS[request.param](workdir)


@pytest.fixture(params=selected_nginx_hosts())
def raw_nginx(request, tmp_path):
    """`start(wasm, http, workers=1, **kw)`: a RawNginx (lab/nginx.py) on this parameter's nginx
    build, each in a directory of its own under tmp_path; all stopped after the test."""
    started = []

    def start(wasm: str, http: str, workers: int = 1, **kw) -> RawNginx:
        d = tmp_path / f"n{len(started)}"
        d.mkdir()
        n = RawNginx(d, wasm, http, workers, host=request.param, **kw)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


@pytest.fixture(scope="session")
def upstream(workdir):
    u = DemoUpstream("upstream-a", workdir)
    yield u
    u.stop()


@pytest.fixture
def gateways():
    """Starts gateways for one test and stops them after it: `gateways(host, spec)`."""
    started = []

    def start(host, spec, **kw):
        g = host.start(spec, **kw)
        started.append(g)
        return g

    yield start
    for g in started:
        g.stop()


class _AnswerHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request 200 `answer` (a call target for filters' dispatch_http_call)."""

    def do_GET(self) -> None:
        body = b"answer"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def answer_server():
    """A loopback HTTP server answering 200 `answer` to everything: its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswerHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
