"""The global rate limit engine for the tests (issue 19): Redis and envoyproxy/ratelimit started on
127.0.0.1 free ports, and a direct gRPC client of Envoy's rate limit service protocol
(`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`).

    with RatelimitEngine() as engine:                       # Redis, then the service; ready
        with RlsClient(engine.grpc_address) as client:
            r = client.should_rate_limit([descriptor({"tenant": "a"}, 10, Unit.MINUTE)])
            assert r.overall_code == Code.OK and r.statuses[0].limit_remaining == 9
        engine.freeze_redis(); ...; engine.thaw_redis()      # failure drills

Both binaries come from `scripts/ratelimit.sh` (Debian's redis-server; service_cmd at a pinned
pseudo-version in target/tools/bin). The service's runtime configuration holds only the domain
(`domain: tollgate`, no descriptors): every limit arrives with its descriptor as the `limit`
override, which the engine applies to any descriptor of a configured domain
(src/config/config_impl.go, rateLimitConfigImpl.GetLimit; for a domain it does not know it
applies no limit and answers OK). The settings that make counting exact are in SETTINGS, with
their sources. Everything started is stopped by `stop()` / the context manager, also when a test
fails; then the logs' tails are printed (stderr, which pytest shows for a failed test) and the
temporary directory is kept.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Mapping, Sequence

import grpc

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The lab (free ports) at the repository root, also for the benchmarks that import this file.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from lab import free_port  # noqa: E402
# The proto files live under tests/e2e/rls_proto/ (see rls.proto's header); compiled at import by
# grpcio-tools, found through sys.path.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
rls_pb2, rls_pb2_grpc = grpc.protos_and_services("rls_proto/rls.proto")

RateLimitRequest = rls_pb2.RateLimitRequest
RateLimitResponse = rls_pb2.RateLimitResponse
RateLimitDescriptor = grpc.protos("rls_proto/ratelimit.proto").RateLimitDescriptor
Code = RateLimitResponse.Code
# The service's unit enum (rls.proto RateLimitResponse.RateLimit.Unit): SECOND=1, MINUTE=2,
# HOUR=3, DAY=4, MONTH=5, YEAR=6, WEEK=7. The override's type.v3.RateLimitUnit has the same numbers
# without WEEK; the engine reads the number as the service's enum.
Unit = RateLimitResponse.RateLimit.Unit

DOMAIN = "tollgate"
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

RATELIMIT_BIN = pathlib.Path(os.environ.get("TOLLGATE_RATELIMIT_BIN") or ROOT / "target" / "tools" / "bin" / "service_cmd")
REDIS_BIN = os.environ.get("TOLLGATE_REDIS_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"

# The service's settings (environment variables, src/settings/settings.go at the pinned commit)
# that the design relies on, beside the addresses and the runtime directory set in start_service.
SETTINGS = {
    # No over-limit cache in the service's memory (freecache): with one, a key found over the
    # limit is answered OVER_LIMIT from memory without touching Redis until the window ends, so
    # a hits_addend sent then is never counted (src/redis/fixed_cache_impl.go, DoLimit: keys in
    # the local cache are skipped in the INCRBY pipeline). 0 is the default; set for clarity.
    "LOCAL_CACHE_SIZE_IN_BYTES": "0",
    # Always INCRBY the whole hits_addend, also over the limit (fixed_cache_impl.go,
    # getHitsAddend): the counter is the true sum of charges, which a booking needs.
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false",
    # Neither turns OVER_LIMIT into OK (src/service/ratelimit.go, shouldRateLimitWorker).
    "SHADOW_MODE": "false",
    "QUOTA_MODE": "false",
    # No statsd sink to send to (the default is true, to localhost:8125; runner.go, NewRunner).
    "USE_STATSD": "false",
    # Nor the default stdout sink, which logs every counter every 10 s: no stats at all.
    "DISABLE_STATS": "true",
    "BACKEND_TYPE": "redis",
    "REDIS_SOCKET_TYPE": "tcp",
    "REDIS_TYPE": "SINGLE",
    "CONFIG_TYPE": "FILE",
    "LOG_LEVEL": "info",
}


def descriptor(entries: Mapping[str, str] | Sequence[tuple[str, str]], requests_per_unit: int | None = None,
               unit: int | None = None, hits_addend: int | None = None):
    """A RateLimitDescriptor: `entries` in order (a dict or (key, value) pairs); the `limit`
    override when `requests_per_unit` is given (`unit` a Unit value, default MINUTE; any int is
    sent as is); the descriptor's own `hits_addend` (UInt64Value) when given, 0 included."""
    d = RateLimitDescriptor()
    for key, value in (entries.items() if isinstance(entries, Mapping) else entries):
        d.entries.add(key=key, value=value)
    if requests_per_unit is not None:
        d.limit.requests_per_unit = requests_per_unit
        d.limit.unit = Unit.MINUTE if unit is None else unit
    if hits_addend is not None:
        d.hits_addend.value = hits_addend
    return d


class RlsClient:
    """A direct gRPC client of ShouldRateLimit (one HTTP/2 connection per instance, reused)."""

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def should_rate_limit(self, descriptors: Iterable, domain: str = DOMAIN, hits_addend: int = 0,
                          timeout: float = 5.0, wait_for_ready: bool = False):
        """One call; the RateLimitResponse, or grpc.RpcError (its .code(): DEADLINE_EXCEEDED
        after `timeout` seconds, UNKNOWN for the engine's Redis and request errors, UNAVAILABLE
        when nothing listens). `wait_for_ready`: wait (within `timeout`) for the channel to
        (re)connect instead of failing at once while it is down."""
        request = RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits_addend)
        return self.stub.ShouldRateLimit(request, timeout=timeout, wait_for_ready=wait_for_ready)

    def charge(self, entries, requests_per_unit: int, unit: int = Unit.MINUTE, hits: int = 1,
               timeout: float = 5.0, wait_for_ready: bool = False):
        """One descriptor with the limit override and `hits` as its hits_addend (0: a pure
        check): its DescriptorStatus and the overall code."""
        r = self.should_rate_limit([descriptor(entries, requests_per_unit, unit, hits)], timeout=timeout,
                                   wait_for_ready=wait_for_ready)
        return r.statuses[0], r.overall_code

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "RlsClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Child:
    """A child process in its own session, output to a log file."""

    def __init__(self, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None):
        self.argv, self.log = argv, log
        self._file = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._file, stderr=subprocess.STDOUT, env=env,
                                     cwd=log.parent, start_new_session=True)
        self.frozen = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        """Ends it (its process group), SIGKILL after `timeout`; a frozen one is thawed first,
        or SIGTERM would wait."""
        if self.alive():
            try:
                if self.frozen:
                    os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=timeout)
        self.frozen = False
        self._file.close()


def _read_resp(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise RuntimeError(f"truncated Redis reply: {line!r}")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(f"Redis error: {rest.decode(errors='replace')}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_resp(f) for _ in range(n)]
    raise RuntimeError(f"unexpected Redis reply: {line!r}")


def _tail(path: pathlib.Path, lines: int = 40) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class RatelimitEngine:
    """Redis (no persistence) and the ratelimit service on 127.0.0.1 free ports; the service's
    runtime configuration holds only `domain`. Ports are fixed for the engine's life, so a
    restarted Redis or service is found where the old one was.

    `settings` adds or replaces service settings (environment variables, e.g. REDIS_TIMEOUT).
    Timeouts are in seconds. Methods that restart return the seconds until a real
    ShouldRateLimit round trip succeeded."""

    def __init__(self, domain: str = DOMAIN, settings: Mapping[str, str] | None = None,
                 workdir: pathlib.Path | None = None, start_timeout: float = 30):
        for binary in (str(RATELIMIT_BIN), REDIS_BIN):
            if not os.access(binary, os.X_OK):
                raise FileNotFoundError(f"{binary} is missing: run scripts/ratelimit.sh")
        self.domain = domain
        self.start_timeout = start_timeout
        self._own_dir = workdir is None
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-engine-")) if workdir is None else workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis_port = free_port()
        self.grpc_port, self.http_port, self.debug_port = free_port(), free_port(), free_port()
        self.settings = dict(SETTINGS)
        self.settings.update(settings or {})
        self.redis: _Child | None = None
        self.service: _Child | None = None
        # The runtime layout the file provider reads with RUNTIME_WATCH_ROOT=false:
        # RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml (src/provider/file_provider.go,
        # setupRuntime; keys "config.<file>").
        self.runtime_root = self.dir / "runtime"
        config_dir = self.runtime_root / "ratelimit" / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "tollgate.yaml").write_text(f"domain: {domain}\n")

    @property
    def grpc_address(self) -> str:
        """host:port of the gRPC listener (what an Envoy cluster or nginx upstream points at)."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def redis_address(self) -> str:
        return f"127.0.0.1:{self.redis_port}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "RatelimitEngine":
        try:
            self.start_redis()
            self.start_service()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def stop(self, failed: bool = False) -> None:
        """Stops the service, then Redis (thawed first if frozen); idempotent. `failed`: print
        the logs' tails and keep the directory."""
        errors = []
        for child in (self.service, self.redis):
            if child is not None:
                try:
                    child.stop()
                except Exception as e:  # stop the other one all the same
                    errors.append(e)
                    failed = True
        self.service = self.redis = None
        if failed:
            print(self.logs(), file=sys.stderr)
        elif self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> "RatelimitEngine":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(failed=exc_type is not None)

    def logs(self) -> str:
        parts = [f"== engine logs in {self.dir}"]
        for name in ("redis.log", "ratelimit.log"):
            parts.append(f"-- {name} (tail)\n{_tail(self.dir / name)}")
        return "\n".join(parts)

    # -- Redis -----------------------------------------------------------------------------

    def start_redis(self, timeout: float = 10) -> float:
        """Starts redis-server on redis_port: no RDB snapshots, no AOF (a restart starts empty),
        bound to 127.0.0.1, protected mode off (loopback only anyway). Seconds until PONG."""
        assert self.redis is None or not self.redis.alive(), "Redis already running"
        t0 = time.monotonic()
        argv = [REDIS_BIN, "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
                "--dir", str(self.dir), "--logfile", "", "--databases", "1"]
        self.redis = _Child(argv, self.dir / "redis.log")
        deadline = t0 + timeout
        while True:
            if not self.redis.alive():
                raise RuntimeError(f"redis-server exited with {self.redis.proc.returncode}:\n{_tail(self.redis.log)}")
            if self.redis_ping(0.5):
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server not answering PING after {timeout}s:\n{_tail(self.redis.log)}")
            time.sleep(0.02)

    def redis_ping(self, timeout: float = 0.5) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=timeout) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def redis_command(self, *args: str, timeout: float = 2.0):
        """One Redis command (RESP2) on a new connection: the reply as bytes, int, None or a
        list of those; RuntimeError for an error reply (enough for GET, KEYS, TTL in tests)."""
        payload = f"*{len(args)}\r\n".encode() + b"".join(
            f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.redis_port), timeout=timeout) as s:
            s.sendall(payload)
            return _read_resp(s.makefile("rb"))

    def kill_redis(self, sig: int = signal.SIGKILL) -> None:
        """Kills redis-server (default SIGKILL: no shutdown, connections reset)."""
        assert self.redis is not None
        self.redis.stop(sig=sig)

    def restart_redis(self) -> float:
        """Starts Redis again on the same port (empty: no persistence); the seconds until the
        service's first successful ShouldRateLimit (other pooled connections may still fail
        once each after it: test_global_engine.py)."""
        if self.redis is not None and self.redis.alive():
            self.redis.stop()
        t0 = time.monotonic()
        self.start_redis()
        self.wait_ready(self.start_timeout)
        return time.monotonic() - t0

    def freeze_redis(self) -> None:
        """SIGSTOP: connections stay open and the kernel accepts bytes, nothing answers."""
        assert self.redis is not None and self.redis.alive()
        self.redis.send(signal.SIGSTOP)
        self.redis.frozen = True

    def thaw_redis(self) -> None:
        assert self.redis is not None
        self.redis.send(signal.SIGCONT)
        self.redis.frozen = False

    # -- the rate limit service ------------------------------------------------------------

    def service_env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        env.update({
            "HOST": "127.0.0.1", "PORT": str(self.http_port),
            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(self.grpc_port),
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(self.debug_port),
            "REDIS_URL": self.redis_address,
            "RUNTIME_ROOT": str(self.runtime_root), "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_APPDIRECTORY": "config", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
        })
        env.update(self.settings)
        return env

    def start_service(self, timeout: float | None = None) -> float:
        """Starts service_cmd; the seconds until a real ShouldRateLimit round trip succeeded
        (the domain's configuration loaded, Redis reached)."""
        assert self.service is None or not self.service.alive(), "service already running"
        t0 = time.monotonic()
        self.service = _Child([str(RATELIMIT_BIN)], self.dir / "ratelimit.log", env=self.service_env())
        self.wait_ready(self.start_timeout if timeout is None else timeout)
        return time.monotonic() - t0

    def kill_service(self, sig: int = signal.SIGKILL) -> None:
        """Ends the service (default SIGKILL, a crash) and waits until it is gone: its
        listeners use SO_REUSEPORT (src/server/server_impl.go), so a live old one would share
        the port with a new one."""
        assert self.service is not None
        self.service.stop(sig=sig)

    def restart_service(self, sig: int = signal.SIGKILL) -> float:
        """Kills (if alive) and starts the service again on the same ports; seconds from the
        start until the first successful round trip."""
        if self.service is not None and self.service.alive():
            self.kill_service(sig)
        return self.start_service()

    def freeze_service(self) -> None:
        assert self.service is not None and self.service.alive()
        self.service.send(signal.SIGSTOP)
        self.service.frozen = True

    def thaw_service(self) -> None:
        assert self.service is not None
        self.service.send(signal.SIGCONT)
        self.service.frozen = False

    def wait_ready(self, timeout: float) -> float:
        """Polls a real ShouldRateLimit (a pure check, hits_addend 0, on a readiness descriptor
        with a limit override) until it answers OK with that override as current_limit: the
        domain is loaded (an unknown domain answers OK without a current_limit) and Redis
        answered. Seconds it took; TimeoutError with the logs otherwise."""
        t0 = time.monotonic()
        probe = descriptor({"tollgate_engine": "readiness"}, 1_000_000, Unit.SECOND, hits_addend=0)
        last = None
        with RlsClient(self.grpc_address) as client:
            while True:
                if self.service is not None and not self.service.alive():
                    raise RuntimeError(f"ratelimit service exited with {self.service.proc.returncode}:\n{self.logs()}")
                try:
                    r = client.should_rate_limit([probe], domain=self.domain, timeout=0.5)
                    s = r.statuses[0] if r.statuses else None
                    if r.overall_code == Code.OK and s is not None and s.current_limit.requests_per_unit == 1_000_000:
                        return time.monotonic() - t0
                    last = f"answer without the override: {r}"
                except grpc.RpcError as e:
                    last = f"{e.code().name}: {e.details()}"
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"ratelimit service not ready after {timeout}s (last: {last}):\n{self.logs()}")
                time.sleep(0.05)
