"""The global rate limit engine's facts that issue 19's design relies on, each asserted against the
real engine: envoyproxy/ratelimit (the pinned build of scripts/ratelimit.sh) on a real Redis, a
domain-only configuration, called with the direct gRPC client of ratelimit_engine.py.

Host-independent (no `host` fixture): runs once. Sources cited as file (function) of
envoyproxy/ratelimit at 3fb702589d36, the pinned pseudo-version. Measured times are printed
(`pytest -s`) and bounded loosely, for a loaded 2-core machine.
"""
from __future__ import annotations

import calendar
import concurrent.futures
import datetime
import signal
import time
import uuid

import grpc
import pytest

from ratelimit_engine import (Code, DOMAIN, RatelimitEngine, RlsClient, Unit, descriptor)

# The engine's timings (a frozen Redis, deadlines): run alone, in the serial pass of scripts/test.sh (conftest.py).
pytestmark = pytest.mark.serial

# utils.UnitToDivider (src/utils/utilities.go): the window length of each unit, in seconds.
DIVIDERS = {
    Unit.SECOND: 1,
    Unit.MINUTE: 60,
    Unit.HOUR: 3600,
    Unit.DAY: 86400,
    Unit.WEEK: 7 * 86400,
    Unit.MONTH: 30 * 86400,
    Unit.YEAR: 365 * 86400,
}


def fresh() -> str:
    """A descriptor value no other test (or earlier run against the same Redis) used."""
    return uuid.uuid4().hex


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def counter(engine: RatelimitEngine, pattern: str) -> tuple[str, int]:
    """The one Redis key matching `pattern` and its value (the engine's counter)."""
    keys = [k.decode() for k in engine.redis_command("KEYS", pattern)]
    assert len(keys) == 1, f"keys matching {pattern}: {keys}"
    return keys[0], int(engine.redis_command("GET", keys[0]))


def window_far_from_end(client: RlsClient, unit: int, margin: float) -> None:
    """Waits, if needed, until the current window of `unit` has more than `margin` seconds left,
    so that a test's calls all fall in one window."""
    probe = [descriptor({"tollgate_engine": "window"}, 1, unit, hits_addend=0)]
    left = client.should_rate_limit(probe).statuses[0].duration_until_reset.seconds
    if left <= margin:
        time.sleep(left + 0.2)


@pytest.fixture
def engine(request):
    """A fresh engine per test (about 1.5 s): drills kill and freeze its parts. Logs printed
    when the test failed."""
    failed_before = request.session.testsfailed
    e = RatelimitEngine().start()
    yield e
    e.stop(failed=request.session.testsfailed > failed_before)


@pytest.fixture
def client(engine):
    with RlsClient(engine.grpc_address) as c:
        yield c


def test_domain_only_engine_applies_the_limit_override(engine, client):
    """config_impl.go (rateLimitConfigImpl.GetLimit): for a configured domain, a descriptor's
    `limit` override is the limit, whatever the configuration's descriptors (here: none)."""
    v = fresh()
    remaining = []
    for _ in range(3):
        status, overall = client.charge({"tenant": v}, 3, Unit.MINUTE)
        assert overall == Code.OK and status.code == Code.OK
        assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (3, Unit.MINUTE)
        remaining.append(status.limit_remaining)
    assert remaining == [2, 1, 0]
    status, overall = client.charge({"tenant": v}, 3, Unit.MINUTE)
    assert (overall, status.code, status.limit_remaining) == (Code.OVER_LIMIT, Code.OVER_LIMIT, 0)

    # Without an override, the domain-only engine has no limit for the descriptor: OK, and no
    # current_limit. Neither has a domain it was not configured with, override or not
    # (GetLimit returns nil for an unknown domain). A client must read a status without
    # current_limit as "no limit applied", never as an admission by a limit.
    r = client.should_rate_limit([descriptor({"tenant": v})])
    assert r.overall_code == Code.OK and not r.statuses[0].HasField("current_limit")
    r = client.should_rate_limit([descriptor({"tenant": v}, 0, Unit.MINUTE, 1)], domain="not-" + DOMAIN)
    assert r.overall_code == Code.OK and not r.statuses[0].HasField("current_limit")


def test_hits_addend_zero_is_a_pure_check(engine, client):
    """utils.GetHitsAddends: a descriptor's hits_addend, when present, wins and may be 0;
    fixed_cache_impl.go DoLimit sends INCRBY key 0, so a check counts nothing."""
    v = fresh()
    status, _ = client.charge({"budget": v}, 10, Unit.HOUR, hits=4)
    assert status.limit_remaining == 6
    for _ in range(5):
        status, overall = client.charge({"budget": v}, 10, Unit.HOUR, hits=0)
        assert (overall, status.limit_remaining) == (Code.OK, 6)
    key, value = counter(engine, f"{DOMAIN}_budget_{v}_*")
    assert value == 4
    # Exactly at the limit, a check is still OK with limit_remaining 0 (over means
    # counter > limit: base_limiter.go GetResponseDescriptorStatus); a caller that must refuse
    # an exhausted budget reads limit_remaining, not only the code.
    status, overall = client.charge({"budget": v}, 10, Unit.HOUR, hits=6)
    assert (overall, status.limit_remaining) == (Code.OK, 0)
    status, overall = client.charge({"budget": v}, 10, Unit.HOUR, hits=0)
    assert (overall, status.limit_remaining) == (Code.OK, 0)
    status, overall = client.charge({"budget": v}, 10, Unit.HOUR, hits=1)
    assert overall == Code.OVER_LIMIT
    status, overall = client.charge({"budget": v}, 10, Unit.HOUR, hits=0)
    assert (overall, status.limit_remaining) == (Code.OVER_LIMIT, 0)
    assert counter(engine, f"{DOMAIN}_budget_{v}_*")[1] == 11


def test_hits_addend_charges_n_and_reports_remaining_and_reset(engine, client):
    """A charge of N adds N, also when it crosses or is over the limit
    (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false: fixed_cache_impl.go getHitsAddend);
    limit_remaining = limit - counter when OK, 0 when over; duration_until_reset = the
    window's length - now % length (utils.CalculateReset)."""
    v = fresh()
    before = time.time()
    status, overall = client.charge({"spend": v}, 100, Unit.HOUR, hits=30)
    after = time.time()
    assert (overall, status.limit_remaining) == (Code.OK, 70)
    assert status.duration_until_reset.seconds in {3600 - int(t) % 3600 for t in (before, after)}
    status, overall = client.charge({"spend": v}, 100, Unit.HOUR, hits=70)
    assert (overall, status.limit_remaining) == (Code.OK, 0)
    status, overall = client.charge({"spend": v}, 100, Unit.HOUR, hits=5)
    assert (overall, status.limit_remaining) == (Code.OVER_LIMIT, 0)
    assert status.duration_until_reset.seconds > 0
    assert counter(engine, f"{DOMAIN}_spend_{v}_*")[1] == 105

    # A charge that crosses the limit is refused and counted in full.
    w = fresh()
    client.charge({"spend": w}, 10, Unit.HOUR, hits=8)
    status, overall = client.charge({"spend": w}, 10, Unit.HOUR, hits=5)
    assert overall == Code.OVER_LIMIT
    assert counter(engine, f"{DOMAIN}_spend_{w}_*")[1] == 13

    # The request-level hits_addend (uint32): 0 (unset) counts 1, N counts N; a descriptor's own
    # hits_addend wins over it.
    x = fresh()
    r = client.should_rate_limit([descriptor({"req": x}, 10, Unit.HOUR)], hits_addend=0)
    assert r.statuses[0].limit_remaining == 9
    r = client.should_rate_limit([descriptor({"req": x}, 10, Unit.HOUR)], hits_addend=3)
    assert r.statuses[0].limit_remaining == 6
    r = client.should_rate_limit([descriptor({"req": x}, 10, Unit.HOUR, hits_addend=0)], hits_addend=3)
    assert r.statuses[0].limit_remaining == 6


def test_every_descriptor_of_a_request_is_charged_even_when_one_is_over(engine, client):
    """One request with several descriptors (a budget's day and month, a rule's several limits):
    each gets its own status, the overall code is OVER_LIMIT if any is, and every descriptor is
    charged all the same (fixed_cache_impl.go DoLimit pipelines an INCRBY per descriptor before
    any is judged). A request refused by one limit still spends the others."""
    v = fresh()
    client.charge({"day": v}, 1, Unit.DAY, hits=1)
    r = client.should_rate_limit([descriptor({"day": v}, 1, Unit.DAY, 1), descriptor({"month": v}, 10, Unit.MONTH, 1)])
    assert r.overall_code == Code.OVER_LIMIT
    assert [s.code for s in r.statuses] == [Code.OVER_LIMIT, Code.OK]
    assert r.statuses[1].limit_remaining == 9
    assert counter(engine, f"{DOMAIN}_month_{v}_*")[1] == 1
    assert counter(engine, f"{DOMAIN}_day_{v}_*")[1] == 2


def test_exactly_n_of_many_concurrent_requests_are_admitted(engine):
    """With LOCAL_CACHE_SIZE_IN_BYTES=0 and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false every
    call is one INCRBY in Redis (atomic): of 10N concurrent 1-hit calls from 64 threads over 8
    connections, exactly N are OK, and their limit_remaining values are N-1..0, each once."""
    n, threads, calls = 100, 64, 1000
    v = fresh()
    clients = [RlsClient(engine.grpc_address) for _ in range(8)]
    try:
        window_far_from_end(clients[0], Unit.HOUR, 30)

        def one(i: int):
            r = clients[i % len(clients)].should_rate_limit([descriptor({"exact": v}, n, Unit.HOUR, 1)], timeout=20)
            return r.overall_code, r.statuses[0].limit_remaining

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, range(calls)))
        elapsed = time.monotonic() - t0
    finally:
        for c in clients:
            c.close()
    ok = sorted(rem for code, rem in results if code == Code.OK)
    over = [rem for code, rem in results if code == Code.OVER_LIMIT]
    print(f"\nexactness: {calls} calls, {threads} threads: {len(ok)} OK (limit {n}), "
          f"over-admission {len(ok) - n}, {elapsed:.2f} s")
    assert len(ok) == n and len(over) == calls - n
    assert ok == list(range(n))
    assert set(over) == {0}
    assert counter(engine, f"{DOMAIN}_exact_{v}_*")[1] == calls


def test_units_and_window_alignment(engine, client):
    """utils.UnitToDivider and limiter/cache_key.go GenerateCacheKey: a window is
    [now - now % length, + length) on the Unix epoch, for SECOND..YEAR and WEEK (7). So DAY is a
    UTC day; WEEK starts Thursday 00:00 UTC (1970-01-01 was a Thursday); MONTH is 30 days and
    YEAR 365 days counted from the epoch, not calendar months or years."""
    v = fresh()
    ends = {}
    for unit, length in DIVIDERS.items():
        before = time.time()
        status, overall = client.charge({"unit": f"{v}-{unit}"}, 5, unit, hits=1)
        after = time.time()
        assert overall == Code.OK and status.current_limit.unit == unit
        reset = status.duration_until_reset.seconds
        assert reset in {length - int(t) % length for t in (before, after)}, (Unit.Name(unit), reset)
        end = int(after) + reset
        if end % length:  # the second ticked between the call and `after`
            end = int(before) + reset
        assert end % length == 0
        ends[unit] = end
        # The counter's key ends with the window's start.
        key, _ = counter(engine, f"{DOMAIN}_unit_{v}-{unit}_*")
        assert key.endswith(f"_{end - length}")
    day_end = datetime.datetime.fromtimestamp(ends[Unit.DAY], datetime.timezone.utc)
    assert (day_end.hour, day_end.minute, day_end.second) == (0, 0, 0)
    week_end = datetime.datetime.fromtimestamp(ends[Unit.WEEK], datetime.timezone.utc)
    assert week_end.strftime("%A %H:%M:%S") == "Thursday 00:00:00"
    month_end = datetime.datetime.fromtimestamp(ends[Unit.MONTH], datetime.timezone.utc)
    today = datetime.datetime.now(datetime.timezone.utc)
    calendar_end = datetime.datetime(today.year, today.month, calendar.monthrange(today.year, today.month)[1],
                                     tzinfo=datetime.timezone.utc) + datetime.timedelta(days=1)
    print(f"\nwindows now: MONTH ends {month_end:%Y-%m-%d %H:%M} UTC (the calendar month: "
          f"{calendar_end:%Y-%m-%d}), WEEK ends {week_end:%a %Y-%m-%d}, "
          f"YEAR ends {datetime.datetime.fromtimestamp(ends[Unit.YEAR], datetime.timezone.utc):%Y-%m-%d}")
    assert ends[Unit.MONTH] % (30 * 86400) == 0


def test_an_undefined_unit_crashes_the_engine(engine, client):
    """Abuse: an override with unit UNKNOWN (0) or a number the engine does not define panics in
    utils.UnitToDivider ("should not get here"); ShouldRateLimit's recover re-panics anything but
    Redis and service errors (src/service/ratelimit.go), and no gRPC interceptor recovers: the
    whole service exits. The filters must refuse such units when their configuration loads."""
    for crashes, unit in enumerate((0, 8), start=1):
        assert client.charge({"unit": fresh()}, 5, Unit.MINUTE, wait_for_ready=True)[1] == Code.OK
        t0 = time.monotonic()
        err = rpc_error(lambda: client.charge({"unit": fresh()}, 5, unit, timeout=5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        engine.service.proc.wait(timeout=5)
        assert engine.service.proc.returncode == 2
        assert (engine.dir / "ratelimit.log").read_text().count("panic: should not get here") == crashes
        print(f"\nunit {unit}: the service exited {time.monotonic() - t0:.3f} s after the call")
        engine.restart_service()


def test_descriptor_keys_collide(engine, client):
    """Abuse: the counter's key is prefix + domain + "_" + key + "_" + value + "_" per entry +
    the window start (limiter/cache_key.go GenerateCacheKey), with no escaping and neither the
    limit nor the unit in it. So entries ("a_b", "c") and ("a", "b_c") share one counter, and
    so do two limits on the same entries. Filters must escape `_` in what they put in entries
    (or use values that cannot hold it) and name the rule and its unit in the entries."""
    v = fresh()
    client.charge([("a_b", f"c{v}")], 10, Unit.HOUR, hits=3)
    status, _ = client.charge([("a", f"b_c{v}")], 10, Unit.HOUR, hits=0)
    assert status.limit_remaining == 7
    status, _ = client.charge([("a", f"b_c{v}")], 100, Unit.HOUR, hits=0)
    assert status.limit_remaining == 97


def test_hits_addend_beyond_int64_refunds_or_poisons(engine, client):
    """Abuse: a descriptor's hits_addend is a uint64 (UInt64Value) but reaches Redis as a signed
    INCRBY argument (fixed_cache_impl.go pipelineAppend, radix's FlatCmd): 2^64 - k refunds k,
    and a counter pushed below 0 no longer parses, so every call on that key fails until the
    window's key expires. The filters must bound what they send (e.g. to the uint32 range)."""
    v = fresh()
    client.charge({"big": v}, 10, Unit.HOUR, hits=5)
    status, overall = client.charge({"big": v}, 10, Unit.HOUR, hits=2**64 - 3)
    assert (overall, status.limit_remaining) == (Code.OK, 8)
    assert counter(engine, f"{DOMAIN}_big_{v}_*")[1] == 2
    err = rpc_error(lambda: client.charge({"big": v}, 10, Unit.HOUR, hits=2**63))
    assert err.code() == grpc.StatusCode.UNKNOWN and "INCRBY" in err.details()
    err = rpc_error(lambda: client.charge({"big": v}, 10, Unit.HOUR, hits=0))
    assert err.code() == grpc.StatusCode.UNKNOWN


def test_bad_requests_are_refused_with_unknown(engine, client):
    """src/service/ratelimit.go shouldRateLimitWorker: an empty domain or descriptor list is a
    service error, returned as a plain Go error: gRPC status UNKNOWN with the message."""
    err = rpc_error(lambda: client.should_rate_limit([], timeout=2))
    assert err.code() == grpc.StatusCode.UNKNOWN and "descriptor list must not be empty" in err.details()
    err = rpc_error(lambda: client.should_rate_limit([descriptor({"a": fresh()}, 1)], domain="", timeout=2))
    assert err.code() == grpc.StatusCode.UNKNOWN and "domain must not be empty" in err.details()


@pytest.mark.parametrize("redis_timeout", ["1s"])
def test_redis_frozen_hangs_calls_and_their_charges_land_later(request, redis_timeout):
    """Redis stopped (SIGSTOP): a call hangs until the client's deadline. The engine's Redis
    commands run with context.Background() (src/redis/driver_impl.go PipeDo) and REDIS_TIMEOUT
    sets only the dial timeout (createDialer: net.Dialer.Timeout), so even REDIS_TIMEOUT=1s
    does not end a call in 3 s. The abandoned calls' INCRBYs stay queued on their connections:
    when Redis resumes they are counted."""
    failed_before = request.session.testsfailed
    engine = RatelimitEngine(settings={"REDIS_TIMEOUT": redis_timeout}).start()
    try:
        with RlsClient(engine.grpc_address) as client:
            v = fresh()
            client.charge({"frozen": v}, 100, Unit.HOUR, hits=1)
            engine.freeze_redis()
            for deadline in (1.0, 3.0):
                t0 = time.monotonic()
                err = rpc_error(lambda: client.charge({"frozen": v}, 100, Unit.HOUR, hits=5, timeout=deadline))
                waited = time.monotonic() - t0
                print(f"\nRedis frozen: {err.code().name} after {waited:.3f} s (client deadline {deadline} s)")
                # At the deadline: DEADLINE_EXCEEDED, or CANCELLED when the server's copy of the
                # deadline (grpc-timeout) fires first and resets the stream (RST_STREAM 8).
                assert err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
                assert deadline - 0.05 <= waited < deadline + 1.0
            engine.thaw_redis()
            t0 = time.monotonic()
            status, overall = client.charge({"frozen": v}, 100, Unit.HOUR, hits=0)
            print(f"Redis thawed: answered in {time.monotonic() - t0:.3f} s, limit_remaining {status.limit_remaining}")
            assert (overall, status.limit_remaining) == (Code.OK, 100 - 1 - 5 - 5)
    finally:
        engine.stop(failed=request.session.testsfailed > failed_before)


def test_redis_killed_errors_fast_then_hangs_and_restarts_empty(engine, client):
    """Redis killed: a call fails at once with UNKNOWN (the engine's RedisError, "EOF"), one per
    pooled connection (REDIS_POOL_SIZE, default 10); once the pool has none left, calls wait for
    a connection with no deadline of the engine's (radix v4 blocks when the pool is empty:
    src/redis/driver_impl.go NewClientImpl, and PipeDo uses context.Background()), so they hang
    to the client's deadline. Redis back on the same port: the pool redials with a backoff of
    125 ms to 4 s (radix v4 pool.go, MinReconnectInterval/MaxReconnectInterval defaults), and
    the counters are gone (no persistence: a restart resets every window)."""
    v = fresh()
    client.charge({"killed": v}, 100, Unit.HOUR, hits=40)
    engine.kill_redis()
    outcomes = []
    for _ in range(15):
        t0 = time.monotonic()
        err = rpc_error(lambda: client.charge({"killed": v}, 100, Unit.HOUR, hits=1, timeout=0.5))
        outcomes.append((err.code(), time.monotonic() - t0))
    codes = [f"{c.name} {t:.3f}s" for c, t in outcomes]
    print(f"\nRedis killed, calls with a 0.5 s deadline: {codes}")
    assert outcomes[0][0] == grpc.StatusCode.UNKNOWN and outcomes[0][1] < 0.25
    # Hung to the deadline: DEADLINE_EXCEEDED, or CANCELLED when the server's copy of the
    # deadline fires first (grpc-go resets the stream with CANCEL).
    hung = [t >= 0.45 and c in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED) for c, t in outcomes]
    fast = hung.index(True)
    assert 1 <= fast <= 11, codes  # the pool's 10 connections, each failing once
    assert all(c == grpc.StatusCode.UNKNOWN and t < 0.25 for c, t in outcomes[:fast]), codes
    assert all(hung[fast:]), codes

    engine.start_redis()
    t0 = time.monotonic()
    errors = 0
    while True:
        try:
            status, overall = client.charge({"killed": v}, 100, Unit.HOUR, hits=0, timeout=0.5)
            break
        except grpc.RpcError:
            errors += 1
            assert time.monotonic() - t0 < 10, "no answer 10 s after Redis restarted"
    recovery = time.monotonic() - t0
    print(f"Redis restarted: first OK {recovery:.3f} s after it answered PING ({errors} failed calls before); "
          f"limit_remaining {status.limit_remaining} of 100 ({len(outcomes) - fast} calls had hung)")
    # The 40 hits from before the kill are gone. Some of the calls that hung waiting for a
    # pooled connection may have been run once Redis was back, though their callers had given up
    # (the engine does not watch the caller's cancellation): a caller cannot know whether a call
    # that timed out was counted.
    assert overall == Code.OK
    assert 100 - (len(outcomes) - fast) - errors <= status.limit_remaining <= 100
    for _ in range(20):
        assert client.charge({"killed": v}, 100, Unit.HOUR, hits=0, timeout=2)[1] == Code.OK


def test_service_killed_then_restarted_keeps_the_counts(engine, client):
    """The service killed (SIGKILL): calls fail at once with UNAVAILABLE; frozen (SIGSTOP): they
    hang to the deadline. Restarted on the same port: ready (a real round trip) in the measured
    time, and the counts, which live in Redis, are still there; the client's channel
    reconnects by itself."""
    v = fresh()
    client.charge({"svc": v}, 100, Unit.HOUR, hits=7)
    engine.freeze_service()
    err = rpc_error(lambda: client.charge({"svc": v}, 100, Unit.HOUR, hits=0, timeout=0.5))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    engine.thaw_service()
    engine.kill_service(signal.SIGKILL)
    t0 = time.monotonic()
    err = rpc_error(lambda: client.charge({"svc": v}, 100, Unit.HOUR, hits=1, timeout=5))
    failed_in = time.monotonic() - t0
    print(f"\nservice killed: {err.code().name} in {failed_in * 1000:.1f} ms")
    assert err.code() == grpc.StatusCode.UNAVAILABLE and failed_in < 1.0
    recovery = engine.start_service()
    print(f"service restarted: first OK round trip {recovery:.3f} s after its start")
    assert recovery < 15
    status, overall = client.charge({"svc": v}, 100, Unit.HOUR, hits=0, timeout=5, wait_for_ready=True)
    assert (overall, status.limit_remaining) == (Code.OK, 93)
