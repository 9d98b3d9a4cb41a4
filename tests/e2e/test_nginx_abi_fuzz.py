"""The hostile-guest ABI fuzzer (tests/filters/abi-fuzz) inside real nginx workers: every
callback of every request calls random `proxy_*` and WASI imports with hostile arguments
(pointers out of range, huge sizes, wrong contexts, re-entry from `proxy_on_memory_allocate`,
garbage allocations). The workers must answer every request (any status) and survive: no
crash, no hang, memory and file descriptors flat, other locations unaffected. The long run
against the host core is the in-process driver (nginx-compat/host/tests/abi_fuzz.rs)."""
from __future__ import annotations

import gc
import os
import re
import time

import pytest
import requests

from lab import ABI_FUZZ_WASM, RawNginx, selected_nginx_hosts

# Bounds on hangs and growth of workers under a fuzzer: run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(not selected_nginx_hosts(), reason="nginx host tests (TOLLGATE_HOSTS has no nginx build)")]

REQUESTS = int(os.environ.get("ABI_FUZZ_REQUESTS", "3000"))
WARMUP = 40


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# The worker's pool of call threads (nginx-compat/services/src/http_client.rs): at most
# MAX_CALL_THREADS (its default max_threads), started when a call finds none idle and kept for
# the worker's life, each holding its tokio runtime's epoll and wake-up descriptors and the
# socket of its call: up to FDS_PER_CALL_THREAD descriptors that are not a leak.
CALL_THREAD = "tollgate-http"
MAX_CALL_THREADS = 4
FDS_PER_CALL_THREAD = 3


def call_threads(pid: int) -> int:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return names.count(CALL_THREAD)


@pytest.fixture(params=selected_nginx_hosts())
def fuzzed(request, tmp_path):
    # Two filters of the module with different seeds and mixes; `pause=1` lets a callback that
    # dispatched a call for its own request pause (its call response resumes it).
    n = RawNginx(tmp_path, f"    module abi_fuzz {ABI_FUZZ_WASM};\n    shm_queue fuzzq 64k;", """
        location /fuzz {
            proxy_wasm abi_fuzz 'seed=11 calls=32 pause=1';
            proxy_wasm abi_fuzz 'seed=12 calls=16 depth=3 reenter=40 garbage=20';
            return 200 fuzzed;
        }
        location /ok { return 200 ok; }""", workers=2, host=request.param)
    yield n
    n.stop()


def send(n: RawNginx, count: int) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for i in range(count):
        try:
            r = requests.post(f"http://127.0.0.1:{n.port}/fuzz?i={i}", data=b"x" * (i % 300), timeout=5)
            key = str(r.status_code)
        except requests.exceptions.ConnectionError:
            key = "closed"  # a failing body callback after the headers went out closes it
        outcomes[key] = outcomes.get(key, 0) + 1
    return outcomes


def test_a_hostile_guest_never_crashes_hangs_or_leaks_in_a_worker(fuzzed):
    n = fuzzed
    workers = n.workers()
    assert len(workers) == 2
    send(n, WARMUP)
    assert n.workers() == workers, "no worker died in the warm-up"
    rss0 = {p: rss_kib(p) for p in workers}
    fds0 = {p: fds(p) for p in workers}
    threads0 = {p: call_threads(p) for p in workers}
    start = time.monotonic()
    outcomes = send(n, REQUESTS)
    elapsed = time.monotonic() - start
    assert "Timeout" not in outcomes
    assert n.workers() == workers, "no worker died"
    log = n.log.read_text(errors="replace")
    assert "exited on signal" not in log and "panicked" not in log
    # Client connections the client has not closed yet settle within seconds, and call threads
    # started after the warm-up bring their own descriptors; a leak (3,000 requests) does not.
    gc.collect()
    for p in workers:
        assert rss_kib(p) - rss0[p] < 64 * 1024, f"worker {p}: RSS {rss0[p]} KiB -> {rss_kib(p)} KiB"
        threads = call_threads(p)
        assert threads <= MAX_CALL_THREADS, f"worker {p}: {threads} call threads"
        allowed = 8 + FDS_PER_CALL_THREAD * (threads - threads0[p])
        deadline = time.monotonic() + 10
        while fds(p) - fds0[p] > allowed and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fds(p) - fds0[p] <= allowed, \
            f"worker {p}: fds {fds0[p]} -> {fds(p)}, call threads {threads0[p]} -> {threads}"
    for _ in range(10):
        assert n.get("/ok").status_code == 200
    calls = sum(int(m) for m in re.findall(r"abi-fuzz: (\d+) host calls", log))
    print(f"abi-fuzz in nginx: {WARMUP + REQUESTS} requests in {elapsed:.1f} s, {calls} host calls, outcomes {outcomes}; "
          + ", ".join(f"worker fds {fds0[p]} -> {fds(p)}, call threads {threads0[p]} -> {call_threads(p)}" for p in workers))
    assert calls >= 20 * (WARMUP + REQUESTS), "the guest made its calls"
