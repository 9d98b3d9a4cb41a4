"""Keys and tokens made with PyJWT and Python's `cryptography`: tooling independent of the
filter's jwt-simple."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://issuer.e2e"
ALGS = ["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"]
_JWK_ALG = {"rsa": "RS256", "p256": "ES256", "p384": "ES384", "ed": "EdDSA"}


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_rsa():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key, kid: str, family: str) -> dict:
    jwk = json.loads(jwt.algorithms.get_default_algorithms()[_JWK_ALG[family]].to_jwk(key.public_key()))
    jwk["kid"] = kid
    return jwk


def public_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class Keys:
    """One key per family, HMAC secrets per size, and their JWKS."""

    def __init__(self):
        self.rsa = new_rsa()
        self.p256 = ec.generate_private_key(ec.SECP256R1())
        self.p384 = ec.generate_private_key(ec.SECP384R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()
        self.secrets = {"HS256": b"e2e-secret-" + b"a" * 21, "HS384": b"b" * 48, "HS512": b"c" * 64}

    def signing_key(self, alg: str):
        if alg.startswith("HS"):
            return self.secrets[alg]
        if alg[:2] in ("RS", "PS"):
            return self.rsa
        return {"ES256": self.p256, "ES384": self.p384, "EdDSA": self.ed}[alg]

    def kid(self, alg: str) -> str:
        if alg.startswith("HS"):
            return f"hmac-{alg}"
        if alg[:2] in ("RS", "PS"):
            return "rsa-1"
        return {"ES256": "p256-1", "ES384": "p384-1", "EdDSA": "ed-1"}[alg]

    def jwks(self) -> dict:
        return {"keys": [public_jwk(self.rsa, "rsa-1", "rsa"), public_jwk(self.p256, "p256-1", "p256"),
                         public_jwk(self.p384, "p384-1", "p384"), public_jwk(self.ed, "ed-1", "ed")]}

    def hmac_secrets(self) -> list[dict]:
        return [{"alg": a, "kid": f"hmac-{a}", "secret": s.decode()} for a, s in self.secrets.items()]

    def token(self, alg: str = "RS256", kid: str | None = "default", key=None, **claims) -> str:
        return mint(key if key is not None else self.signing_key(alg), alg, self.kid(alg) if kid == "default" else kid, **claims)


def claims(**over) -> dict:
    now = int(time.time())
    c = {"iss": ISSUER, "aud": "api", "sub": "alice", "iat": now, "nbf": now, "exp": now + 600}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def mint(key, alg: str, kid: str | None, **over) -> str:
    headers = {"kid": kid} if kid else {}
    return jwt.encode(claims(**over), key, algorithm=alg, headers=headers)


def unsigned(header: dict, payload: dict, signature: bytes = b"") -> str:
    return f"{b64u(json.dumps(header).encode())}.{b64u(json.dumps(payload).encode())}.{b64u(signature)}"


def hs256_with_key_bytes(key_bytes: bytes, kid: str, **over) -> str:
    """An HS256 token whose HMAC key is arbitrary bytes (e.g. an RSA public key's PEM): the
    classic algorithm-confusion attack, which PyJWT refuses to produce."""
    header = b64u(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = b64u(json.dumps(claims(**over)).encode())
    mac = hmac.new(key_bytes, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64u(mac)}"
