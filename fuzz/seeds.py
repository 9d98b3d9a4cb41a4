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
