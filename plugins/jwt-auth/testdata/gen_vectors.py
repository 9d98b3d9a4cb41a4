"""Generates vectors.json: keys and tokens made by independent tooling (Python's `cryptography`
for keys and signatures, PyJWT for encoding), not by jwt-simple. Run from the repo root:

    .venv/bin/python plugins/jwt-auth/testdata/gen_vectors.py

The unit tests verify these tokens at the fixed time NOW with the expectations recorded here.
"""
import base64
import hashlib
import hmac
import json
import pathlib

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

NOW = 1_700_000_000
ISS = "https://issuer.test"
HMAC_SECRETS = {"HS256": b"s" * 32, "HS384": b"t" * 48, "HS512": b"u" * 64}


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_pem(key) -> str:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def claims(**over):
    c = {"iss": ISS, "aud": "api", "sub": "alice", "iat": NOW - 10, "nbf": NOW - 10, "exp": NOW + 3600}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def main():
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    p256 = ec.generate_private_key(ec.SECP256R1())
    p384 = ec.generate_private_key(ec.SECP384R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    signing = {
        "RS256": rsa_key, "RS384": rsa_key, "RS512": rsa_key,
        "PS256": rsa_key, "PS384": rsa_key, "PS512": rsa_key,
        "ES256": p256, "ES384": p384, "EdDSA": ed,
    }
    signing.update(HMAC_SECRETS)
    jwks = {"keys": []}
    for kid, key in [("rsa-1", rsa_key), ("p256-1", p256), ("p384-1", p384), ("ed-1", ed)]:
        jwk = json.loads(jwt.algorithms.get_default_algorithms()[
            {"rsa-1": "RS256", "p256-1": "ES256", "p384-1": "ES384", "ed-1": "EdDSA"}[kid]
        ].to_jwk(key.public_key()))
        jwk["kid"] = kid
        jwks["keys"].append(jwk)
    kids = {a: ("rsa-1" if a[:2] in ("RS", "PS") else {"ES256": "p256-1", "ES384": "p384-1", "EdDSA": "ed-1"}.get(a, "hmac-" + a)) for a in signing}

    tokens = []

    def add(name, token, expect):
        tokens.append({"name": name, "token": token, "expect": expect})

    for alg, key in signing.items():
        add(f"valid-{alg}", jwt.encode(claims(), key, algorithm=alg, headers={"kid": kids[alg]}), "ok")
    rs = lambda c, **h: jwt.encode(c, rsa_key, algorithm="RS256", headers={"kid": "rsa-1", **h})
    add("expired", rs(claims(exp=NOW - 3600, iat=NOW - 7200, nbf=NOW - 7200)), "expired")
    add("expired-within-skew", rs(claims(exp=NOW - 30)), "ok")
    add("not-yet-valid", rs(claims(nbf=NOW + 3600)), "not_yet_valid")
    add("nbf-within-skew", rs(claims(nbf=NOW + 30)), "ok")
    add("wrong-issuer", rs(claims(iss="https://evil.test")), "unknown_issuer")
    add("wrong-audience", rs(claims(aud="other")), "audience_mismatch")
    add("audience-list", rs(claims(aud=["other", "api"])), "ok")
    add("no-exp", rs(claims(exp=None)), "missing_expiration")
    add("long-lifetime", rs(claims(exp=NOW + 10 * 86400)), "lifetime_too_long")
    add("unknown-kid", rs(claims(), kid="rsa-2"), "unknown_kid")
    add("crit-header", rs(claims(), crit=["exp"]), "malformed")
    add("typ-at+jwt", rs(claims(), typ="at+jwt"), "ok")
    add("typ-jose", rs(claims(), typ="JOSE"), "malformed")
    add("hs256-crit", jwt.encode(claims(), HMAC_SECRETS["HS256"], algorithm="HS256", headers={"kid": "hmac-HS256", "crit": ["b64"]}), "malformed")
    add("no-kid", jwt.encode(claims(), rsa_key, algorithm="RS256"), "ok")
    add("claim-crlf", rs(claims(sub="alice\r\nx-admin: true")), "bad_claim_value")
    add("missing-required-claim", rs(claims(sub=None)), "missing_claim")
    add("wrong-secret-HS256", jwt.encode(claims(), b"w" * 32, algorithm="HS256", headers={"kid": "hmac-HS256"}), "bad_signature")
    good = rs(claims())
    h, p, s = good.split(".")
    add("tampered-payload", f"{h}.{b64u(json.dumps(claims(sub='mallory')).encode())}.{s}", "bad_signature")
    add("truncated-in-payload", good[: len(h) + 1 + len(p) // 2], "malformed")
    add("truncated-in-signature", good[: len(good) - 20], "bad_signature")
    add("garbage", "not-a-jwt", "malformed")
    add("two-parts", f"{h}.{p}", "malformed")
    none_header = b64u(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    add("alg-none", f"{none_header}.{p}.", "malformed")
    add("alg-none-with-sig", f"{none_header}.{p}.{s}", "unsupported_alg")
    # Algorithm confusion: an HS256 token whose HMAC key is the RSA public key (PEM bytes).
    conf_header = b64u(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
    signing_input = f"{conf_header}.{p}".encode()
    mac = hmac.new(public_pem(rsa_key).encode(), signing_input, hashlib.sha256).digest()
    add("alg-confusion-hs256-with-rsa-pem", f"{conf_header}.{p}.{b64u(mac)}", "unknown_kid")
    # ES256 signature claimed as RS256 with the EC key's kid.
    es = jwt.encode(claims(), p256, algorithm="ES256", headers={"kid": "p256-1"})
    eh, ep, esig = es.split(".")
    swapped = b64u(json.dumps({"alg": "RS256", "kid": "p256-1"}).encode())
    add("alg-confusion-es-as-rs", f"{swapped}.{ep}.{esig}", "unknown_kid")

    out = {
        "now": NOW,
        "issuer": ISS,
        "jwks": jwks,
        "pem": {"RS256": public_pem(rsa_key), "ES256": public_pem(p256), "ES384": public_pem(p384), "EdDSA": public_pem(ed)},
        "hmac_secrets": {a: s.decode() for a, s in HMAC_SECRETS.items()},
        "tokens": tokens,
        "generator": f"PyJWT {jwt.__version__}, cryptography",
    }
    path = pathlib.Path(__file__).with_name("vectors.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(tokens)} tokens to {path}")


if __name__ == "__main__":
    main()
