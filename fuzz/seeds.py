"""Writes the fuzz targets' seed corpora, fuzz/corpus/<target>/, from the repository's own
vectors and configurations (run from anywhere: python3 fuzz/seeds.py). Each seed is named by the
SHA-1 of its bytes, as libFuzzer names corpus files."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import pathlib
import re
import sys

FUZZ = pathlib.Path(__file__).resolve().parent
ROOT = FUZZ.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT))  # the gateway lab (lab/), which test_paths imports
import test_paths  # noqa: E402  (the tricky paths table)


def write(target: str, seeds: list[bytes]) -> None:
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    for s in seeds:
        (d / hashlib.sha1(s).hexdigest()).write_bytes(s)


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


paths = [t for t, _ in test_paths.TABLE] + [b"/", b"/v1/chat?x=1", b"/a;b=1/c", b"/a%2Fb/../c", b"/a%5c%5cb"]
write("path_normalize", [bytes([flags]) + p for p in paths for flags in (0, 1, 2, 4)])

matches = [b'{"prefix": "/healthz"}', b'{"prefix": "/v1/"}', b'{"path": "/healthz"}',
           b'{"prefix": "/api", "methods": ["GET"], "hosts": ["API.example.com"]}', b"{}"]
write("route_match", [m + b"\xff" + p for m in matches for p in paths[:12]])

vectors = json.loads((ROOT / "plugins/jwt-auth/testdata/vectors.json").read_text())
tokens = [b"\x00" + t["token"].encode() for t in vectors["tokens"]]
header = json.dumps({"alg": "HS256", "kid": "hmac-HS256", "typ": "JWT"}).encode()
claims = json.dumps({"iss": vectors["issuer"], "aud": "api", "sub": "alice", "iat": vectors["now"],
                     "exp": vectors["now"] + 600}).encode()
signed = [bytes([1, 0, i, 0x20]) + header + b"\xff" + claims for i in (3, 40, 90, 140)]
write("jwt_compact", tokens + signed)

write("jwt_token_extract", [
    b"Bearer a.b.c\xffx=1&access_token=d.e.f\xffa=1; session=g.h.i",
    b"bearer  a.b.c \xff\xff",
    b"Basic abc\xffaccess_token=%61.b.c\xff",
    b"\xff\xffsession=\"x.y.z\"; other=2",
    b"Bearer \xffaccess_token=\xffsession=",
])

secret = b"fuzz-sticky-secret-0123456789abcdef0123456789"
sticky = []
for up, expiry in (("blue", 1_800_001_000), ("green.v2", 1_800_003_000), ("red", 1_799_999_000)):
    msg = b"tollgate-sticky-upstream/v1\x00tollgate_sticky\x00" + up.encode() + b"\x00" + str(expiry).encode()
    value = f"{up}.{expiry}.{b64u(hmac.new(secret, msg, hashlib.sha256).digest())}"
    sticky.append(b"\x00a=1; tollgate_sticky=" + value.encode() + b"; b=2")
sticky += [b"\x01" + bytes([i, 1, 2, 3, 4, 10 * i, 7]) for i in range(3)]
write("sticky_cookie", sticky)


def plugin_configs(plugin: str) -> list[bytes]:
    """The configurations of `plugin` in envoy/*.yaml, nginx-compat/conf/*.conf and the README."""
    out = []
    root_id = plugin.replace("-", "_")
    for f in sorted((ROOT / "envoy").glob("*.yaml")):
        # `root_id: NAME` ... `value: |` followed by the JSON, indented deeper.
        for m in re.finditer(r"root_id: (\w+)\n.*?value: \|\n((?:( +)\S.*\n)(?:\3.*\n|\s*\n)*)", f.read_text(), re.S):
            if m.group(1) == root_id:
                out.append(m.group(2).encode())
    for f in sorted((ROOT / "nginx-compat" / "conf").glob("*.conf")):
        for m in re.finditer(r"proxy_wasm (\w+) '(.*?)';", f.read_text(), re.S):
            if m.group(1) == root_id:
                out.append(m.group(2).encode())
    readme = (ROOT / "plugins" / plugin / "README.md").read_text()
    for m in re.finditer(r"```json\n(.*?)```", readme, re.S):
        out.append(m.group(1).encode())
    return out


for plugin in ("jwt-auth", "metrics", "sticky-upstream"):
    seeds = plugin_configs(plugin) + [b"{}", b"", b"[]"]
    write("config_" + plugin.replace("-", "_"), seeds)
print({d.name: len(list(d.iterdir())) for d in sorted((FUZZ / "corpus").iterdir())})

# Cost and rate-limit targets.
testdata = ROOT / "plugins/cost/testdata"
streams = [(testdata / n).read_bytes() for n in ("openai_chat_stream.sse", "anthropic_messages_stream.sse")]
streams += [s.replace(b"\n", b"\r\n") for s in streams] + [b"\xef\xbb\xbf" + streams[0]]
streams += [b'event: response.completed\ndata: {"type":"response.completed","response":{"model":"m","usage":'
            b'{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}}\n\n',
            b": comment\nid: 1\nretry: 5\ndata: a\ndata: b\n\ndata\n\n\r\r"]
# metrics_series: signal values as published (and not), 0xff-separated.
words = [b"ok", b"allowed", b"per-user", b"priced", b"Bad.Signature", b"", b"x" * 40, b"caf\xc3\xa9", b"\xfe",
         b"120", b" 40 ", b"18446744073709551616", b"other", b"none"]
write("metrics_series", [b"\xff".join(words[i:] + words[:i]) for i in range(0, len(words), 3)]
      + [b"\xff".join(b"w%d" % i for i in range(24))])

write("sse_stream", [bytes([seed]) + s for s in streams for seed in (0, 0x5a, 0xc3)])

bodies = [
    b'{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"Hi"}}],"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,'
    b'"prompt_tokens_details":{"cached_tokens":40},"completion_tokens_details":{"reasoning_tokens":10}}}',
    b'{"id":"r","object":"response","model":"o1","output":[],"usage":{"input_tokens":9,"output_tokens":3,'
    b'"input_tokens_details":{"cached_tokens":2},"output_tokens_details":{"reasoning_tokens":1}}}',
    b'{"object":"list","data":[{"embedding":[0.1,-2e-3,1E+2]}],"model":"e","usage":{"prompt_tokens":7,"total_tokens":7}}',
    b'{"type":"message","model":"claude","content":[{"type":"text","text":"a\\"b\\u00e9"}],"usage":{"input_tokens":10,'
    b'"cache_creation_input_tokens":5,"cache_read_input_tokens":7,"output_tokens":3}}',
    b'{"usage":null,"message":{"model":"x","usage":{"input_tokens":1}},"response":{"usage":{"output_tokens":2}}}',
]
write("usage_json", [bytes([seed]) + b for b in bodies for seed in (0, 0x93)])

write("request_body", [
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"stream":true}',
    b'{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":false,"x":[1,{"y":null}]}}',
    b'{"model":"a","model":"b","stream":true,"stream_options":null,"temperature":0.10000000000000001}',
    b'{"mod\\u0065l":"m","stream_options":{"include_usage":true},"stream_options":{}}',
] + [base64.b64decode(v["body"])  # read, or refused for each reason (plugins/cost/README.md)
     for v in json.loads((ROOT / "plugins/cost/testdata/request_bodies/vectors.json").read_text())])

fields = [
    b"\x1f" + b"\xff".join([b"tenant-1", b"203.0.113.7\xfe10.0.0.1, 192.0.2.1", b"[2001:db8:1:2::5]:443", b"/v1/chat?x=1", b"POST", b"API.example.com:8443"]),
    b"\x03" + b"\xff".join([b"  k  ", b"", b"192.0.2.9:5", b"/", b"GET", b"h"]),
    b"\x80" + b"\xff".join([b"x" * 200, b"unknown, [2001:db8::1]:80", b"::ffff:192.0.2.1", b"/a", b"", b""]),
]
write("rate_limit_key", fields)

confs = [(ROOT / "nginx-compat/conf/full-chain.conf").read_text(), (ROOT / "envoy/llm-gateway.yaml").read_text()]


def configs(plugin: str) -> list[bytes]:
    found = []
    for text in confs:
        found += re.findall(rf"proxy_wasm {plugin} '(.*?)';", text, re.S)
        found += [m for m in re.findall(r"value: \|\n((?:\s{20}.*\n)+)", text) if (plugin == "cost") == ('"prices"' in m)
                  and (plugin == "rate_limit") == ('"rules"' in m and '"limits"' in m)]
    return [json.dumps(json.loads(c)).encode() for c in found]


cost = configs("cost") + [json.dumps({
    "ledger": "e2e", "prices": {"m": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 7.5e-08,
                                      "litellm_provider": "openai", "max_tokens": 16384}},
    "tenant": {"api_key_header": "x-api-key", "default": "anon"}, "budgets": {"default": {"day_nano_usd": 1},
    "tenants": {"t": {"month_nano_usd": 5}}}, "over_budget_status": 429, "unknown_model": {"action": "refuse",
    "default_price": {"input_cost_per_token": 1e-18, "output_cost_per_token": 0}}, "unpriced_charge": "none",
    "store_full": {"action": "pool", "status": 507}, "max_request_body_bytes": 0, "max_decoded_bytes": 1024}).encode()]
write("config_cost", cost)
excerpt = (ROOT / "plugins/cost/testdata/litellm_excerpt.json").read_bytes()
tables = [excerpt, b"{}", b'{"m": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2.5e-18, "x": "a,}{\\"\\\\"}}',
          b'{"m": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "input_cost_per_token_above_200k_tokens": 6e-06}}',
          b'{"m": {"input_cost_per_token": -1}, "n": {}}', b'{"m": [[[[]]]]}', b'{"m": {"tiered_pricing": []}} x']
write("price_table", [bytes([s]) + t for t in tables for s in (0, 1, 7, 200)])
rate = configs("rate_limit") + [json.dumps({
    "zone": "z", "rules": [{"name": "r", "match": {"prefix": "/api", "methods": ["GET"], "hosts": ["a.example"]},
                            "key": [{"header": "x-jwt-sub"}, {"client_address": {"trusted_hops": 1, "ipv6_prefix": 48}}, "path", "method", "host"],
                            "limits": [{"algorithm": "token_bucket", "capacity": 20, "requests": 10, "per": "second"},
                                       {"name": "daily", "algorithm": "fixed_window", "requests": 1000, "per": "day"}],
                            "missing_key": "shared", "weight_header": "x-cost", "max_weight": 20, "max_keys": 10}],
    "status": 503, "headers_on_allowed": False, "cas_retries": 0, "on_contention": "deny", "max_keys": 5,
    "store_full": {"action": "overflow", "status": 429}}).encode()]
write("config_rate_limit", rate)
