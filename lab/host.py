"""What every host of the lab is: a `Host` renders a GatewaySpec into its proxy's own
configuration and starts a `Gateway` with it; the tests and benchmarks use the gateway (`url`,
`admin`, `log`, `stats`, `stop`) the same way on every host. The hosts are its subclasses:
EnvoyHost (lab/envoy.py), NginxHost and NginxMuslHost (lab/nginx.py), KongHost (lab/kong.py)."""
from __future__ import annotations

import os
import pathlib
import subprocess

import requests

from .process import Process
from .spec import GatewaySpec


class Gateway:
    """A running proxy: its listener (`url`), admin server (`admin`) and log, its process."""

    url: str
    admin: str
    log: pathlib.Path
    process: Process
    # `host:port` of the gateway's cleartext HTTP/2 listener (GatewaySpec.http2_listener).
    h2_address: str | None = None

    @property
    def pids(self) -> list[int]:
        """The processes whose CPU time is the gateway's."""
        return [self.process.proc.pid]

    def alive(self) -> bool:
        return self.process.proc.poll() is None and requests.get(self.admin + "/ready", timeout=5).status_code == 200

    def stats(self, prefix: str = "") -> dict[str, int]:
        """The gateway's counters and gauges by name, as Envoy's /stats names them (the filters'
        own: `wasmcustom.<name as defined>`), summed over the workers; those matching `prefix`
        when given."""
        raise NotImplementedError

    def stop(self) -> None:
        self.process.stop()


class Host:
    """One proxy the filters run in. `name` is what TOLLGATE_HOSTS and bench's --hosts select
    (lab.HOSTS); each subclass renders a spec its own way (`render`), checks a configuration
    (`validate`) and starts a gateway (`start`)."""

    name: str

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir

    @staticmethod
    def unavailable() -> str | None:
        """Why the host cannot run here (what is not built or installed), or None."""
        return None

    def validate(self, config_path: pathlib.Path) -> subprocess.CompletedProcess:
        raise NotImplementedError

    def start(self, spec: GatewaySpec, timeout: float = 60, log_level: str = "info", cpus: str | None = None) -> Gateway:
        raise NotImplementedError


def selected_hosts() -> list[str]:
    """Hosts to run the end-to-end suites against (TOLLGATE_HOSTS, comma-separated)."""
    return [h for h in os.environ.get("TOLLGATE_HOSTS", "envoy").split(",") if h]
