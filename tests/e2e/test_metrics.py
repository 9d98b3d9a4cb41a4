"""metrics end to end: real Envoy (--concurrency 2) with the chain metrics -> jwt-auth -> rate-limit
in front of the demo upstream, scraped by a real Prometheus (Debian's package, started here on
loopback with a temporary configuration and storage).

After a known mix of requests (routes, tenants beyond the cap, statuses, jwt and rate-limit
rejections), Prometheus' query API must return the exact counters and histogram counts; the
exposition must pass `promtool check metrics` (nginx: no finding at all; Envoy: only the two it
cannot avoid, no # HELP and the microsecond unit, see plugins/metrics/README.md); the labels Envoy
extracts must be exactly those the stats_tags rules give when applied (here, in Python) to the raw
names the filter defined. The LLM families (tokens by kind, model and tenant; spend; time to first
token) are checked exactly after a few priced calls through metrics -> cost.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import pathlib

import jwt as pyjwt
import pytest
import requests

from lab import ROOT, FilterSpec, GatewaySpec, Process, free_port, kong_differs, wait_for_port

WORKERS = 2
SECRET = "metrics-e2e-secret-0123456789abcdef0123456789"
ISSUER = "https://issuer.metrics.e2e"
RULES = json.loads((ROOT / "plugins/metrics/stats_tags.json").read_text())
BUCKETS_US = [1000, 5000, 25000, 100000, 1000000, 10000000]
STATS_CONFIG = {
    "stats_tags": RULES,
    "histogram_bucket_settings": [{"match": {"prefix": f"wasmcustom.{h}"}, "buckets": BUCKETS_US}
                                  for h in ("tollgate_request_duration_microseconds", "tollgate_llm_time_to_first_token_microseconds")],
}
METRICS = {
    "routes": [{"name": "chat", "prefix": "/chat"}, {"name": "status", "prefix": "/status"}, {"name": "limited", "prefix": "/limited"}],
    "tenant": {"unverified_header": "x-tenant", "max_tenants": 3, "registry": "e2e"},
}
JWT = {
    "providers": {"main": {"issuer": ISSUER, "audiences": ["api"], "hmac_secrets": [{"alg": "HS256", "kid": "k1", "secret": SECRET}]}},
    "rules": [{"match": {"prefix": "/status"}, "bypass": True}, {"match": {"prefix": "/limited"}, "bypass": True}],
}
RATE_LIMIT = {
    "namespace": "metrics-e2e",
    "rules": [{"name": "lim", "match": {"prefix": "/limited"}, "key": [{"unverified_header": "x-tenant"}],
               "limits": [{"algorithm": "fixed_window", "requests": 2, "per": "day"}]}],
}
OUR_FAMILIES = ("tollgate_requests_total", "tollgate_request_duration_", "tollgate_request_body_bytes_total",
                "tollgate_response_body_bytes_total", "tollgate_auth_total", "tollgate_rate_limit_total", "tollgate_llm_",
                "tollgate_refusals_total")
# What promtool may report on our families on Envoy, which writes no # HELP and cannot rescale a
# Wasm histogram to seconds (plugins/metrics/README.md, "Seconds"). nginx: nothing at all.
ENVOY_FINDINGS = re.compile(r'^tollgate_\w+ (no help text|use base unit "seconds" instead of "microseconds")$')


def duration_family(host, base: str) -> tuple[str, str]:
    """The name of a histogram recorded in microseconds as `host` exposes it, and its bound
    of 10 s: Envoy keeps microseconds, nginx writes seconds."""
    if host.name == "envoy":
        return f"{base}_microseconds", "10000000"
    return f"{base}_seconds", "10"


def promtool(text: str) -> tuple[int, list[str]]:
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    return res.returncode, [l for l in (res.stdout + res.stderr).splitlines() if l.strip()]


def check_exposition(host, exposition: str) -> None:
    """promtool on the whole exposition: nothing on nginx; on Envoy no parse error (exit 0 or 3,
    lint findings only) and, on our families, only ENVOY_FINDINGS."""
    rc, findings = promtool(exposition)
    if host.name == "envoy":
        assert rc in (0, 3), findings[:50]
        ours = [l for l in findings if l.startswith("tollgate_")]
        assert ours and all(ENVOY_FINDINGS.match(l) for l in ours), ours
    else:
        assert (rc, findings) == (0, []), findings


def token() -> str:
    now = int(time.time())
    return pyjwt.encode({"iss": ISSUER, "aud": "api", "sub": "user", "iat": now, "exp": now + 600}, SECRET,
                        algorithm="HS256", headers={"kid": "k1"})


# (path, tenant, token, expected status), sent in this order: acme, beta, gamma take the 3 slots.
MIX = (
    [("/chat/a", "acme", "valid", 200)] * 3
    + [("/status/404", "beta", None, 404)] * 2
    + [("/status/503", "gamma", None, 503)]
    + [("/limited", "acme", None, 200)] * 2 + [("/limited", "acme", None, 429)]
    + [("/chat/b", "delta", "valid", 200)]          # beyond the cap: tenant="other"
    + [("/chat/c", "acme", None, 401)]              # jwt: missing_token
    + [("/elsewhere", None, "abc", 401)]            # jwt: malformed; route other, tenant none
)

EXPECTED_BY_ROUTE_CLASS = {("chat", "2xx"): 4, ("chat", "4xx"): 1, ("status", "4xx"): 2, ("status", "5xx"): 1,
                           ("limited", "2xx"): 2, ("limited", "4xx"): 1, ("other", "4xx"): 1}
EXPECTED_BY_TENANT = {"acme": 7, "beta": 2, "gamma": 1, "other": 1, "none": 1}
EXPECTED_AUTH = {"ok": 4, "bypass": 6, "missing_token": 1, "malformed": 1}
EXPECTED_RATE_LIMIT = {("lim", "allowed"): 2, ("lim", "limited"): 1}
EXPECTED_REFUSALS = {("jwt_auth", "missing_token"): 1, ("jwt_auth", "malformed"): 1, ("rate_limit", "limited"): 1}
EXPECTED_DURATION_COUNT = {"chat": 5, "status": 3, "limited": 3, "other": 1}


def envoy_extract(name: str) -> tuple[str, dict[str, str]]:
    """Envoy's TagSpecifier semantics, applied in order: the first group is removed from the
    name, the second is the value."""
    tags = {}
    for rule in RULES:
        m = re.search(rule["regex"], name)
        if m:
            tags[rule["tag_name"]] = m.group(2)
            name = name[: m.start(1)] + name[m.end(1):]
    return name, tags


def test_stats_tags_round_trip_on_encoded_names():
    cases = {
        "wasmcustom.tollgate_requests_total.method.get.status_class.2xx.route.chat.tenant.acme":
            ("wasmcustom.tollgate_requests_total", {"method": "get", "status_class": "2xx", "route": "chat", "tenant": "acme"}),
        # A value equal to a label name does not confuse the pairing.
        "wasmcustom.tollgate_requests_total.route.tenant.tenant.route":
            ("wasmcustom.tollgate_requests_total", {"route": "tenant", "tenant": "route"}),
        "wasmcustom.tollgate_llm_tokens_total.model.gpt-4o.type.input":
            ("wasmcustom.tollgate_llm_tokens_total", {"model": "gpt-4o", "type": "input"}),
        "wasmcustom.tollgate_rate_limit_total.rule.per_user.outcome.contention_allowed":
            ("wasmcustom.tollgate_rate_limit_total", {"rule": "per_user", "outcome": "contention_allowed"}),
        "wasmcustom.tollgate_llm_requests_total.outcome.budget_exceeded":
            ("wasmcustom.tollgate_llm_requests_total", {"outcome": "budget_exceeded"}),
        "wasmcustom.tollgate_refusals_total.filter.cost.reason.budget_exceeded":
            ("wasmcustom.tollgate_refusals_total", {"filter": "cost", "reason": "budget_exceeded"}),
        "cluster.x.upstream_rq_total": ("cluster.x.upstream_rq_total", {}),
    }
    for name, want in cases.items():
        assert envoy_extract(name) == want, name


def test_shipped_config_has_the_same_rules_and_validates(host):
    shipped = (ROOT / "envoy/metrics.yaml").read_text()
    for r in RULES:
        assert f"tag_name: {r['tag_name']}\n    regex: '{r['regex']}'" in shipped
    if host.name != "envoy":
        pytest.skip("envoy/metrics.yaml is an Envoy configuration (nginx-compat/conf/ is checked by test_nginx_conf.py)")
    res = host.validate(ROOT / "envoy/metrics.yaml")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture(scope="module")
def prometheus_bin():
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.fail("prometheus and promtool are required: scripts/apt.sh prometheus")
    return shutil.which("prometheus")


class Prometheus:
    """A Prometheus server scraping one target every second, on loopback, in a temporary dir."""

    def __init__(self, binary: str, target: str, workdir: pathlib.Path):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="prometheus-", dir=workdir))
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "envoy", "metrics_path": "/stats/prometheus", "static_configs": [{"targets": [target]}]}],
        }))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process([binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir / 'data'}",
                                f"--web.listen-address=127.0.0.1:{self.port}"], self.dir / "prometheus.log")
        wait_for_port(self.port, self.process.proc, 30, self.process.log)
        # The port opens before the TSDB is up; until /-/ready says so, the API answers 503.
        deadline = time.monotonic() + 30
        while requests.get(self.url + "/-/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "prometheus not ready after 30 s"
            time.sleep(0.2)

    def query(self, q: str) -> list[dict]:
        r = requests.get(self.url + "/api/v1/query", params={"query": q}, timeout=10).json()
        assert r["status"] == "success", r
        return r["data"]["result"]

    def vector(self, q: str, labels: tuple[str, ...]) -> dict:
        out = {}
        for s in self.query(q):
            key = tuple(s["metric"].get(l, "") for l in labels)
            out[key[0] if len(labels) == 1 else key] = round(float(s["value"][1]))
        return out

    def stop(self) -> None:
        self.process.stop()


def test_prometheus_scrapes_exact_counts(host, upstream, gateways, prometheus_bin, workdir):
    spec = GatewaySpec([FilterSpec("metrics", METRICS), FilterSpec("jwt-auth", JWT), FilterSpec("rate-limit", RATE_LIMIT)],
                       {"upstream": upstream.port}, workers=WORKERS, stats_config=STATS_CONFIG)
    g = gateways(host, spec)
    good = token()
    for path, tenant, tok, want in MIX:
        headers = {}
        if tenant:
            headers["x-tenant"] = tenant
        if tok:
            headers["authorization"] = "Bearer " + (good if tok == "valid" else tok)
        # A new connection per request, so that both workers serve some.
        r = requests.get(g.url + path, headers=headers, timeout=10)
        assert r.status_code == want, (path, tenant, r.status_code, r.text)
    if kong_differs(host, "no-stats"):
        return  # the statuses are what Kong shows: the families stay in its Lua-only metrics

    # Histograms reach /stats/prometheus at Envoy's stats flush (5 s by default), counters at
    # each worker's next flush (`flush_interval_ms`, 1 s): wait for both.
    duration, ten_s = duration_family(host, "tollgate_request_duration")
    exposition = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        exposition = requests.get(g.admin + "/stats/prometheus", timeout=5).text
        counts = re.findall(rf'^{duration}_count\{{[^}}]*\}} (\d+)', exposition, re.M)
        if sum(map(int, counts)) == len(MIX) and sum(map(float, re.findall(r'^tollgate_requests_total\{[^}]*\} (\S+)$', exposition, re.M))) == len(MIX):
            break
        time.sleep(0.5)

    ours = [l for l in exposition.splitlines() if l.removeprefix("# TYPE ").startswith(OUR_FAMILIES)]
    assert ours, exposition[:2000]
    assert not [l for l in ours if "envoy_" in l or "wasmcustom" in l]
    assert f"# TYPE {duration} histogram" in ours
    assert '# TYPE tollgate_requests_total counter' in ours
    assert any('_bucket{route="chat",le="+Inf"} 5' in l for l in ours), ours
    # Bounds in the family's unit: 10 s is le="10000000" on Envoy, le="10" on nginx.
    assert any(l.startswith(f'{duration}_bucket{{route="chat",le="{ten_s}"}} 5') for l in ours), ours
    assert 'tollgate_requests_total{method="get",status_class="2xx",route="chat",tenant="acme"} 3' in ours

    # promtool exits 1 on a parse error and 3 on lint findings only.
    check_exposition(host, exposition)

    # The labels Envoy extracted are those the rules give on the raw names the filter defined.
    raw = requests.get(g.admin + "/stats", params={"filter": r"^wasmcustom\.tollgate_(requests|auth|rate_limit)_total"}, timeout=5).text
    for line in raw.splitlines():
        name, _, value = line.partition(": ")
        family, tags = envoy_extract(name)
        family = family.removeprefix("wasmcustom.")
        label_text = ",".join(f'{k}="{v}"' for k, v in tags.items())
        assert any(l.startswith(family + "{") and all(f'{k}="{v}"' in l for k, v in tags.items()) and l.endswith(" " + value)
                   for l in ours), (name, label_text)

    prom = Prometheus(prometheus_bin, g.admin.removeprefix("http://"), workdir)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = prom.query("sum(tollgate_requests_total)") and prom.query(f"sum({duration}_count)")
            if done and all(round(float(prom.query(f"sum({family})")[0]["value"][1])) == len(MIX)
                            for family in (f"{duration}_count", "tollgate_requests_total")):
                break
            time.sleep(1)
        assert prom.vector("sum by (route, status_class) (tollgate_requests_total)", ("route", "status_class")) == EXPECTED_BY_ROUTE_CLASS
        assert prom.vector("sum by (tenant) (tollgate_requests_total)", ("tenant",)) == EXPECTED_BY_TENANT
        assert prom.vector("sum by (method) (tollgate_requests_total)", ("method",)) == {"get": len(MIX)}
        assert prom.vector("sum by (outcome) (tollgate_auth_total)", ("outcome",)) == EXPECTED_AUTH
        assert prom.vector("sum by (rule, outcome) (tollgate_rate_limit_total)", ("rule", "outcome")) == EXPECTED_RATE_LIMIT
        assert prom.vector("sum by (filter, reason) (tollgate_refusals_total)", ("filter", "reason")) == EXPECTED_REFUSALS
        assert prom.vector(f"sum by (route) ({duration}_count)", ("route",)) == EXPECTED_DURATION_COUNT
        # Cumulative buckets: +Inf equals the count; every request took less than 10 s.
        assert prom.vector(f'sum by (route) ({duration}_bucket{{le="+Inf"}})', ("route",)) == EXPECTED_DURATION_COUNT
        assert prom.vector(f'sum by (route) ({duration}_bucket{{le="{ten_s}"}})', ("route",)) == EXPECTED_DURATION_COUNT
        sums = {r["metric"]["route"]: float(r["value"][1]) for r in prom.query(f"sum by (route) ({duration}_sum)")}
        assert set(sums) == set(EXPECTED_DURATION_COUNT) and all(v > 0 for v in sums.values()), sums
        # Body bytes: GETs carry no body; the demo upstream answers every request with a body.
        assert prom.query("sum(tollgate_request_body_bytes_total)") == []
        assert set(prom.vector("sum by (route) (tollgate_response_body_bytes_total)", ("route",))) == set(EXPECTED_DURATION_COUNT)
        # Both workers served requests and their VMs added to the same series.
        used = {k: v for k, v in g.stats("downstream_cx_total").items() if re.search(r"\.worker_\d+\.downstream_cx_total$", k) and v > 0}
        assert len(used) == WORKERS, used
    finally:
        prom.stop()


LLM_COST = {
    "ledger": "metrics-e2e",
    "prices": {
        "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 7.5e-08},
        "claude-x": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "cache_read_input_token_cost": 3e-07,
                     "cache_creation_input_token_cost": 3.75e-06},
    },
    "tenant": {"unverified_header": "x-tenant"},
}
LLM_METRICS = {"tenant": {"unverified_header": "x-tenant", "max_tenants": 3, "registry": "llm"}, "models": ["gpt-4o-mini", "claude-x"]}
# (path, model, tenant, mock usage headers), all answered 200 by the demo upstream.
LLM_CALLS = [
    ("/v1/chat/completions", "gpt-4o-mini", "acme", {"prompt": 100, "completion": 20, "cached": 30, "reasoning": 8}),
    ("/v1/messages", "claude-x", "acme", {"prompt": 100, "completion": 10, "cached": 10, "cache-creation": 5}),
    ("/v1/chat/completions", "gpt-4o-mini", "beta", {"prompt": 7, "completion": 3}),
]
# OpenAI's prompt_tokens includes cached ones; Anthropic's input_tokens excludes cache reads and
# creations, which the cost filter adds (plugins/cost/README.md).
EXPECTED_TOKENS = {
    ("gpt-4o-mini", "input", "acme"): 100, ("gpt-4o-mini", "output", "acme"): 20,
    ("gpt-4o-mini", "cached_input", "acme"): 30, ("gpt-4o-mini", "reasoning", "acme"): 8,
    ("claude-x", "input", "acme"): 115, ("claude-x", "output", "acme"): 10,
    ("claude-x", "cached_input", "acme"): 10, ("claude-x", "cache_creation", "acme"): 5,
    ("gpt-4o-mini", "input", "beta"): 7, ("gpt-4o-mini", "output", "beta"): 3,
}
# nano-USD: 70 x 150 + 30 x 75 + 20 x 600; 100 x 3000 + 10 x 300 + 5 x 3750 + 10 x 15000; 7 x 150 + 3 x 600.
EXPECTED_SPEND = {("gpt-4o-mini", "acme"): 24750, ("claude-x", "acme"): 471750, ("gpt-4o-mini", "beta"): 2850}


def series(exposition: str, family: str, labels: tuple[str, ...]) -> dict:
    """{label values: value} of one family's samples (labels in the order given)."""
    out = {}
    for m in re.finditer(rf'^{family}\{{([^}}]*)\}} (\S+)$', exposition, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = tuple(got.get(l, "") for l in labels)
        out[key[0] if len(labels) == 1 else key] = float(m.group(2))
    return out


def test_llm_tokens_spend_and_time_to_first_token(host, upstream, gateways):
    spec = GatewaySpec([FilterSpec("metrics", LLM_METRICS), FilterSpec("cost", LLM_COST)], {"upstream": upstream.port},
                       workers=WORKERS, stats_config=STATS_CONFIG)
    g = gateways(host, spec)
    for path, model, tenant, usage in LLM_CALLS:
        headers = {"content-type": "application/json", "x-tenant": tenant} | {f"x-mock-{k}-tokens": str(v) for k, v in usage.items()}
        body = {"model": model, "max_tokens": 10} if path == "/v1/messages" else {"model": model}
        r = requests.post(g.url + path, data=json.dumps(body), headers=headers, timeout=10)
        assert r.status_code == 200, r.text
    if kong_differs(host, "no-stats"):
        return
    ttft, _ = duration_family(host, "tollgate_llm_time_to_first_token")
    exposition = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        exposition = requests.get(g.admin + "/stats/prometheus", timeout=5).text
        # The last request's log phase may still be running when its answer arrives, and each
        # worker hands its counters over at its next flush (`flush_interval_ms`): wait for the
        # histogram samples and the counters' values.
        if (sum(series(exposition, f"{ttft}_count", ("model",)).values()) == len(LLM_CALLS)
                and series(exposition, "tollgate_llm_tokens_total", ("model", "type", "tenant")) == EXPECTED_TOKENS
                and series(exposition, "tollgate_llm_cost_nano_usd_total", ("model", "tenant")) == EXPECTED_SPEND):
            break
        time.sleep(0.5)
    tokens = series(exposition, "tollgate_llm_tokens_total", ("model", "type", "tenant"))
    assert tokens == EXPECTED_TOKENS, tokens
    assert series(exposition, "tollgate_llm_cost_nano_usd_total", ("model", "tenant")) == EXPECTED_SPEND
    assert series(exposition, f"{ttft}_count", ("model",)) == {"gpt-4o-mini": 2, "claude-x": 1}, exposition[-3000:]
    # Each first byte came before the stream's end (Envoy's sums keep about two significant
    # digits: a margin).
    duration, _ = duration_family(host, "tollgate_request_duration")
    first = sum(series(exposition, f"{ttft}_sum", ("model",)).values())
    total = sum(series(exposition, f"{duration}_sum", ("route",)).values())
    assert 0 < first <= total * 1.1, (first, total)
    check_exposition(host, exposition)
