"""jwt-auth vs Envoy's native jwt_authn vs proxy-only, in one interleaved run on one Envoy binary.

Variant "wasm-floor" is bench/wasm-floor (`runner.wasm_floor`), a proxy-wasm filter that does
nothing and exports one stream callback: the fixed cost of any Wasm filter in Envoy, which bounds
what filter logic can reach against a native filter. "wasm-floor-all-callbacks" is the same module
exporting every stream callback, as the proxy-wasm Rust SDK does before scripts/build.sh trims it.

Scenarios: a valid HS256 token, a valid RS256 token (2048-bit key), an HS256 token signed with a
wrong secret (every answer 401). Both filters check the same claims and copy `sub` to a header;
each with its verified-token cache off and on (native: `jwt_cache_config`).

    scripts/bench.sh jwt_auth                 # 3 rounds x 5 s per cell, 1 worker, 1 and 8 connections
    scripts/bench.sh jwt_auth --smoke         # seconds, for the test suite
"""
from __future__ import annotations

import base64
import dataclasses
import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

import runner
from lab import EnvoyNativeFilter, FilterSpec, GatewaySpec

ISSUER = "https://bench.tollgate"
SECRET = b"bench-hs256-secret-0123456789abcdef"


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


@dataclasses.dataclass
class Keys:
    """The benchmark's signing keys and tokens (a fresh 2048-bit RSA key per run)."""

    rsa_jwk: dict
    hs256: str  # valid, HS256
    rs256: str  # valid, RS256
    wrong_secret: str  # HS256 signed with a wrong secret: every answer 401


def make_keys(ttl: int = 7200) -> Keys:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    rsa_jwk.update({"kid": "rsa", "alg": "RS256"})
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "bench", "sub": "bench-user", "iat": now, "exp": now + ttl}
    return Keys(
        rsa_jwk=rsa_jwk,
        hs256=jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "hs"}),
        rs256=jwt.encode(claims, key, algorithm="RS256", headers={"kid": "rsa"}),
        wrong_secret=jwt.encode(claims, b"wrong-secret-0123456789abcdef-0000", algorithm="HS256", headers={"kid": "hs"}),
    )


def native(keys: Keys, cache: bool) -> EnvoyNativeFilter:
    """Envoy's jwt_authn with the same provider (both keys inline), `sub` copied to x-jwt-sub."""
    provider = {
        "issuer": ISSUER, "audiences": ["bench"],
        "local_jwks": {"inline_string": json.dumps({"keys": [keys.rsa_jwk, {"kty": "oct", "kid": "hs", "alg": "HS256", "k": b64u(SECRET)}]})},
        "claim_to_headers": [{"header_name": "x-jwt-sub", "claim_name": "sub"}],
    }
    if cache:
        provider["jwt_cache_config"] = {"jwt_cache_size": 1024}
    return EnvoyNativeFilter("envoy.filters.http.jwt_authn", {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
        "providers": {"bench": provider},
        "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "bench"}}],
    })


def tollgate(keys: Keys, cache: bool) -> FilterSpec:
    """The jwt-auth filter with the same provider; `cache`: its verified-token cache on."""
    return FilterSpec("jwt-auth", {
        "providers": {"bench": {
            "issuer": ISSUER, "audiences": ["bench"],
            "local_jwks": {"keys": [keys.rsa_jwk]},
            "hmac_secrets": [{"alg": "HS256", "kid": "hs", "secret": SECRET.decode()}],
            "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}],
        }},
        "cache": {"max_entries": 1024 if cache else 0},
    })


def main() -> None:
    opts = runner.options(connections="1,8", workers="1")
    keys = make_keys()
    hs, rs, wrong = keys.hs256, keys.rs256, keys.wrong_secret

    valid = {"valid-hs256", "valid-rs256"}
    variants = [
        runner.Variant("proxy-only", lambda up: GatewaySpec([], up), scenarios=valid),
        runner.Variant("native-jwt_authn", lambda up: GatewaySpec([native(keys, False)], up)),
        runner.Variant("tollgate-jwt-auth", lambda up: GatewaySpec([tollgate(keys, False)], up)),
        runner.Variant("native-jwt_authn+cache", lambda up: GatewaySpec([native(keys, True)], up), scenarios=valid),
        runner.Variant("tollgate-jwt-auth+cache", lambda up: GatewaySpec([tollgate(keys, True)], up), scenarios=valid),
        runner.Variant("wasm-floor", lambda up: GatewaySpec([runner.wasm_floor()], up), scenarios=valid),
        runner.Variant("wasm-floor-all-callbacks", lambda up: GatewaySpec([runner.wasm_floor(True)], up), scenarios=valid),
    ]
    scenarios = [
        runner.Scenario("valid-hs256", headers={"authorization": f"Bearer {hs}"}),
        runner.Scenario("valid-rs256", headers={"authorization": f"Bearer {rs}"}),
        runner.Scenario("reject-wrong-secret", headers={"authorization": f"Bearer {wrong}"}, expect_non_2xx=True),
    ]
    comparisons = [
        runner.Comparison("tollgate-jwt-auth", "native-jwt_authn", label="tollgate / native (caches off)"),
        runner.Comparison("tollgate-jwt-auth+cache", "native-jwt_authn+cache", label="tollgate / native (caches on)"),
        runner.Comparison("tollgate-jwt-auth", "proxy-only", label="tollgate (cache off) / proxy-only"),
        runner.Comparison("native-jwt_authn", "proxy-only", label="native (cache off) / proxy-only"),
        runner.Comparison("wasm-floor", "native-jwt_authn", label="Wasm floor / native (cache off)"),
        runner.Comparison("wasm-floor", "native-jwt_authn+cache", label="Wasm floor / native (cache on)"),
        runner.Comparison("tollgate-jwt-auth+cache", "wasm-floor", label="tollgate (cache on) / Wasm floor"),
        runner.Comparison("wasm-floor", "wasm-floor-all-callbacks", label="Wasm floor / the same exporting every callback"),
        runner.Comparison("wasm-floor", "proxy-only", label="Wasm floor / proxy-only"),
    ]
    runner.run("jwt_auth", variants, scenarios, comparisons=comparisons, **opts)


if __name__ == "__main__":
    main()
