"""The demo upstream (demo-upstream/, Go, built into target/demo-upstream), on a free port."""
from __future__ import annotations

import pathlib

from .paths import TARGET
from .process import Process, free_port, wait_for_port


class DemoUpstream:
    """The demo upstream (demo-upstream/, Go): echoes what it received, LLM-shaped endpoints."""

    def __init__(self, name: str, workdir: pathlib.Path, cpus: str | None = None):
        self.name = name
        self.port = free_port()
        argv = [str(TARGET / "demo-upstream"), "-listen", f"127.0.0.1:{self.port}", "-name", name]
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self.process = Process(argv, workdir / f"upstream-{name}.log")
        wait_for_port(self.port, self.process.proc, 10, self.process.log)

    def stop(self) -> None:
        self.process.stop()
