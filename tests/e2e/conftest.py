import pathlib

import pytest

from harness import HOSTS, DemoUpstream, selected_hosts


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session", params=selected_hosts())
def host(request, workdir):
    return HOSTS[request.param](workdir)


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
