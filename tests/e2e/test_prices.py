"""Real-world price tables for the cost filter (issue 22), on every host:

- LiteLLM's whole price file (litellm 1.110.2 from PyPI, 3.5 MB, 4,878 entries) given as
  `prices` loads (nginx: through `tollgate_proxy_wasm_file`, lab.NGINX_INLINE_CONFIG_MAX),
  and completions are priced as its entries say: a dated snapshot with its own entry by that
  entry, an undated or prefixed name by the documented normalisation, an `alias_of` entry by
  the entry it names. Expected costs are
  computed here from the file's own numbers with fractions.Fraction.
- `remote_prices` served by the test's own loopback HTTP server: fetched once for all workers
  (2), refreshed, kept while refreshes fail, a broken table refused without replacing the good
  one; hostile answers (garbage, a huge or endless body) change nothing.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from fractions import Fraction
from math import floor

import pytest
import requests

import litellm
from document_server import DocumentServer
from lab import FilterSpec, GatewaySpec, kong_differs, wait_until

TENANT = "x-tenant"
BASE = {"ledger": "prices", "tenant": {"unverified_header": TENANT}, "spend_headers": True,
        "unknown_model": {"action": "allow"}}
# nginx: the remote table lives in shared data (the lease record and the document).
KV = {"*": "16m"}


def chat(g, model: str, p: int, c: int, response_model: str | None = None, anthropic: bool = False) -> int:
    """One completion of a fresh tenant; the nano-USD booked for it."""
    tenant = uuid.uuid4().hex
    h = {"content-type": "application/json", TENANT: tenant, "x-mock-prompt-tokens": str(p), "x-mock-completion-tokens": str(c)}
    if response_model:
        h["x-mock-model"] = response_model
    path = "/v1/messages" if anthropic else "/v1/chat/completions"
    r = requests.post(g.url + path, data=json.dumps({"model": model}), headers=h, timeout=30)
    assert r.status_code == 200, r.text
    r = requests.get(g.url + "/healthz", headers={TENANT: tenant}, timeout=10)
    return int(r.headers["x-tollgate-spend-total-nano-usd"])


def nano(entry: dict, p: int, c: int) -> int:
    """The exact cost in USD of the file's numbers (their decimal text), to nano-USD half up."""
    usd = p * Fraction(repr(entry["input_cost_per_token"])) + c * Fraction(repr(entry["output_cost_per_token"]))
    return floor(usd * 10**9 + Fraction(1, 2))


@pytest.fixture(scope="module")
def litellm_prices() -> dict:
    return json.loads(litellm.price_file().read_bytes())


def test_litellm_file_loads_whole_and_prices_as_its_entries(host, upstream, gateways, litellm_prices):
    config = {**BASE, "prices": litellm_prices}
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port}, kv_zones=KV)
    if kong_differs(host, "no-large-config"):
        # 2.5 MB as one nginx argument: no way to give it to Kong's module (refused rendering
        # the configuration; `nginx -t` would refuse it as "too long parameter").
        with pytest.raises(RuntimeError, match=r"over nginx's 4 KB argument limit"):
            gateways(host, spec)
        return
    g = gateways(host, spec)
    pattern = r"prices from the configuration: (\d+) models loaded; (\d+) entries skipped[^\n]*"
    # (Logged by each VM's on_configure; nginx's workers may still be starting.)
    wait_until(lambda: re.search(pattern, g.log.read_text(errors="replace")), 20)
    summary = re.search(pattern, g.log.read_text(errors="replace"))
    loaded, skipped = int(summary.group(1)), int(summary.group(2))
    # The host names the plugin; the filter does not name itself again (it logged `cost: cost: ...`).
    assert ": cost: prices from" not in g.log.read_text(errors="replace")
    assert loaded + skipped == litellm.ENTRIES == len(litellm_prices)
    assert loaded == litellm.LOADED
    assert "1 schema_example (e.g. sample_spec)" in summary.group(0) and "per_image (e.g. " in summary.group(0)
    f = litellm_prices
    # A dated snapshot with its own entry is priced by it (gpt-4o-2024-05-13 costs twice gpt-4o).
    assert f["gpt-4o-2024-05-13"]["input_cost_per_token"] != f["gpt-4o"]["input_cost_per_token"]
    assert chat(g, "gpt-4o-2024-05-13", 1000, 100) == nano(f["gpt-4o-2024-05-13"], 1000, 100)
    assert chat(g, "gpt-4o", 1000, 100) == nano(f["gpt-4o"], 1000, 100)
    # The response names a snapshot the file does not have: its undated entry.
    assert "gpt-4o-mini-2099-01-31" not in f
    assert chat(g, "gpt-4o-mini", 777, 333, response_model="gpt-4o-mini-2099-01-31") == nano(f["gpt-4o-mini"], 777, 333)
    # Provider prefixes, and Anthropic's dated names.
    assert chat(g, "openai/gpt-4o-mini", 10, 10, response_model="openai/gpt-4o-mini") == nano(f["gpt-4o-mini"], 10, 10)
    assert chat(g, "anthropic/claude-sonnet-4-5-20250929", 500, 50, response_model="anthropic/claude-sonnet-4-5-20250929",
                anthropic=True) == nano(f["claude-sonnet-4-5-20250929"], 500, 50)
    # Floating-point noise in the file (2.9999900000000002e-06, refused before issue 22) is
    # rounded to the nearest atto-USD: 2,999,990,000,000 atto-USD per token.
    noisy = f["databricks/databricks-claude-sonnet-4-1"]
    assert repr(noisy["input_cost_per_token"]) == "2.9999900000000002e-06"
    assert chat(g, "databricks/databricks-claude-sonnet-4-1", 10**6, 0) == 2_999_990_000
    # An alias (`"azure_ai/gpt-mini-latest": {"alias_of": "azure_ai/gpt-5.4-mini"}`) costs what
    # the entry it names costs; every alias of the file is loaded.
    assert f"; {litellm.ALIASES} of the models loaded are aliases (alias_of)" in summary.group(0)
    aliases = [(a, e["alias_of"]) for a, e in f.items() if "alias_of" in e and len(e) == 1]
    assert len(aliases) == litellm.ALIASES
    alias, target = next((a, t) for a, t in aliases if {"input_cost_per_token", "output_cost_per_token"} <= f[t].keys()
                         and not any("_above_" in k for k in f[t]))
    assert chat(g, alias, 1000, 100, response_model=alias) == nano(f[target], 1000, 100) > 0
    # Entries not priced per token are not guessed: unpriced (allowed here by unknown_model).
    assert chat(g, "dall-e-3" if "dall-e-3" in f else "tts-1", 10, 10) == 0


def table(input_usd: str) -> dict:
    """A small LiteLLM-shaped table; `m` costs `input_usd` per input token."""
    return {"sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "mode": "one of: chat"},
            "m": {"input_cost_per_token": float(input_usd), "output_cost_per_token": 0.0, "mode": "chat"},
            "img": {"output_cost_per_image": 0.04, "mode": "image_generation"}}


@pytest.fixture
def price_server():
    s = DocumentServer(table("1e-6"))
    yield s
    s.stop()


TTL = 2


def cluster(host, price_server) -> str:
    """The remote_prices cluster: the `prices` upstream (an Envoy cluster, an nginx upstream{});
    Kong's module dispatches to a host[:port] it resolves, not to an upstream{} name."""
    return f"127.0.0.1:{price_server.port}" if kong_differs(host, "dispatch-by-address") else "prices"


def remote_gateway(host, upstream, gateways, price_server, **remote):
    config = {**BASE, "prices": {"m": {"input_cost_per_token": 1e-9, "output_cost_per_token": 0}},
              "remote_prices": {"cluster": cluster(host, price_server), "path": "/prices.json", "cache_duration_seconds": TTL,
                                "retry_seconds": 1, "timeout_ms": 2000, **remote}}
    spec = GatewaySpec(filters=[FilterSpec("cost", config)], upstreams={"upstream": upstream.port, "prices": price_server.port},
                       workers=2, kv_zones=KV)
    return gateways(host, spec)


def all_priced(g, expected: int, n: int = 8) -> bool:  # expected: nano-USD
    """n completions of 1000 input tokens on new connections (so both workers) cost `expected`."""
    return all(chat(g, "m", 1000, 0) == expected for _ in range(n))


def test_remote_prices_fetched_once_refreshed_kept_and_validated(host, upstream, gateways, price_server):
    g = remote_gateway(host, upstream, gateways, price_server)
    # Until the first fetch: the inline table (1,000 nano-USD per 1000 tokens); then the remote
    # one (1e-6 USD per token: 1,000,000 nano-USD).
    wait_until(lambda: all_priced(g, 1_000_000), 15)
    # Refreshed for every worker after the cache duration.
    price_server.serve(table("2e-6"))
    waited = wait_until(lambda: all_priced(g, 2_000_000), TTL + 8)
    print(f"new table in use after {waited:.1f}s (cache_duration_seconds={TTL})")
    # Fetched once per cache duration for the gateway, not once per worker.
    start, before = time.monotonic(), price_server.fetches
    time.sleep(4 * TTL)
    elapsed, fetched = time.monotonic() - start, price_server.fetches - before
    print(f"{fetched} fetches in {elapsed:.1f}s with 2 workers (per worker: about {2 * elapsed / TTL:.0f})")
    assert 1 <= fetched <= elapsed / TTL + 2, fetched
    # A failing refresh keeps the table.
    price_server.serve(b"upstream down", status=503)
    before = price_server.fetches
    time.sleep(2 * TTL + 1)
    assert price_server.fetches > before, "refresh attempts continue"
    assert all_priced(g, 2_000_000)
    # Broken tables are refused whole and replace nothing.
    for broken in (table("-1e-6"), {"m": {"input_cost_per_token": "free", "output_cost_per_token": 0}}, {},
                   {"img": {"output_cost_per_image": 0.04}}, b'{"m": {"input_cost_per_token": 3e-6,'):
        before = price_server.fetches
        price_server.serve(broken)
        wait_until(lambda: price_server.fetches > before, 2 * TTL + 4)
        time.sleep(1)
        assert all_priced(g, 2_000_000, n=4), broken
    log = g.log.read_text(errors="replace")
    assert "remote_prices.m.input_cost_per_token" in log and "no model priced per token" in log, log[-3000:]
    # And a good table after them is taken again.
    price_server.serve(table("3e-6"))
    wait_until(lambda: all_priced(g, 3_000_000), 2 * TTL + 8)


def test_hostile_price_answers_change_nothing(host, upstream, gateways, price_server):
    """Garbage, a valid table over max_bytes, an endless body, 100,000 nested arrays: each is
    refused (for its own reason, logged) and the good table stays in use."""
    g = remote_gateway(host, upstream, gateways, price_server, max_bytes=1 << 20, timeout_ms=1000)
    wait_until(lambda: all_priced(g, 1_000_000), 15)
    answers = [
        ("refused", dict(body=bytes(range(256)) * 64)),
        # 3 MB of valid entries (none of them `m`), over max_bytes (1 MiB).
        ("over max_bytes", dict(body={f"m{i}": {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}
                                      for i in range(40_000)})),
        # Envoy: the call times out ("status \"\""); nginx: the timeout or its body bound.
        ("fetch failed: status", dict(body=b"", endless=True)),
        ("nested too deeply", dict(body=b'{"m": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
    ]
    if kong_differs(host, "dispatch-body-whole"):
        # 2^40 bytes announced: Kong's allocation fails ("parser error"), and the filter gets a
        # 200 whose body length (2^40 in 32 bits) is 0: an empty document, refused.
        answers[2] = ("the document ends early at byte 0", answers[2][1])
    for why, answer in answers:
        before, logged = price_server.fetches, g.log.read_text(errors="replace").count(why)
        price_server.serve(**answer)
        wait_until(lambda: price_server.fetches > before, 2 * TTL + 4)
        wait_until(lambda: g.log.read_text(errors="replace").count(why) > logged, 10)
        # Requests keep being served and priced by the good table.
        assert all_priced(g, 1_000_000, n=4), why


def test_the_litellm_file_as_a_remote_table(host, upstream, gateways, price_server, litellm_prices):
    """The real 3.2 MB file served as remote_prices: read a slice per callback, so no callback
    nears nginx's 100 ms guest deadline (in one go it takes 50-130 ms there), then in use by
    both workers."""
    price_server.serve(litellm.price_file().read_bytes())
    g = remote_gateway(host, upstream, gateways, price_server)
    want = nano(litellm_prices["gpt-4o-2024-05-13"], 1000, 0)
    wait_until(lambda: all(chat(g, "gpt-4o-2024-05-13", 1000, 0) == want for _ in range(8)), 30)
    log = g.log.read_text(errors="replace")
    assert "deadline" not in log and "trapped" not in log, log[-3000:]
    source = re.escape(cluster(host, price_server) + "/prices.json")
    assert re.search(source + rf"[^\n]*: {litellm.LOADED} models loaded", log), log[-3000:]
