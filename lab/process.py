"""Ports, child processes, waiting and logs: what every gateway and upstream of the lab is run with."""
from __future__ import annotations

import collections
import os
import pathlib
import signal
import socket
import subprocess
import time

from .paths import ROOT


# Ports this process handed out lately (free_port).
_handed_out: collections.deque[int] = collections.deque(maxlen=4096)


def free_port() -> int:
    """A 127.0.0.1 port nothing is bound to now and that this process has not handed out among
    its last 4096: once a probe socket is closed the kernel may give the same ephemeral port to the
    next probe, and two servers started on it collide (Redis and the rate limit service did)."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.append(port)
            return port
    raise RuntimeError("no port this process has not handed out lately, in 64 probes")


def wait_for_port(port: int, proc: subprocess.Popen | None, timeout: float, log: pathlib.Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening after {timeout}s: {tail(log)}")


def wait_until(predicate, timeout: float, step: float = 0.25) -> float:
    """Polls `predicate` every `step` seconds until it is true; the seconds that took, or
    AssertionError after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


def tail(log: pathlib.Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


class Process:
    """A child process in its own session, logged to a file, always stopped."""

    def __init__(self, argv: list[str], log: pathlib.Path, cwd: pathlib.Path = ROOT):
        self.log = log
        self._file = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._file, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._file.close()

