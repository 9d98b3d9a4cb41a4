#!/usr/bin/env python3
"""Generate RSA signature test vectors with tools independent of the crate under test.

Keys and signatures come from Python's `cryptography` (OpenSSL backend) and from
the `openssl` command-line tool. Output: vectors.json beside this script.

    python3 -m venv venv && venv/bin/pip install cryptography
    venv/bin/python testdata/gen_vectors.py

Signature entries carry "expect": "valid" or "reject". "reject" entries are
genuine RSASSA-PSS signatures whose salt length is not the hash length, which
JWA (RFC 7518 section 3.5) and so this verifier require.
"""
import base64, json, os, subprocess, tempfile, time
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa, padding

HERE = os.path.dirname(os.path.abspath(__file__))
HASHES = {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}
HLEN = {"sha256": 32, "sha384": 48, "sha512": 64}


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def int_bytes(i):
    return i.to_bytes((i.bit_length() + 7) // 8, "big")


def key_entry(kid, pub, tool):
    nums = pub.public_numbers()
    spki = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    pkcs1 = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1).decode()
    return {
        "id": kid, "tool": tool, "bits": pub.key_size,
        "n": int_bytes(nums.n).hex(), "e": int_bytes(nums.e).hex(),
        "jwk": {"kty": "RSA", "n": b64u(int_bytes(nums.n)), "e": b64u(int_bytes(nums.e))},
        "spki_pem": spki, "pkcs1_pem": pkcs1,
    }


def main():
    rng = os.urandom
    messages = [b"", b"abc", rng(300), b"The quick brown fox jumps over the lazy dog"]
    keys, sigs, jwts = [], [], []
    privs = {}
    for bits, e in [(2048, 65537), (3072, 65537), (4096, 65537), (2048, 3)]:
        kid = f"py-rsa{bits}-e{e}"
        priv = rsa.generate_private_key(public_exponent=e, key_size=bits)
        privs[kid] = priv
        keys.append(key_entry(kid, priv.public_key(), "python-cryptography"))
        for hname, H in HASHES.items():
            for msg in messages:
                sigs.append({"key": kid, "tool": "python-cryptography", "scheme": "pkcs1v15", "hash": hname,
                             "msg": msg.hex(), "sig": priv.sign(msg, padding.PKCS1v15(), H()).hex(), "expect": "valid"})
                pss = padding.PSS(mgf=padding.MGF1(H()), salt_length=padding.PSS.DIGEST_LENGTH)
                sigs.append({"key": kid, "tool": "python-cryptography", "scheme": "pss", "hash": hname,
                             "msg": msg.hex(), "sig": priv.sign(msg, pss, H()).hex(), "expect": "valid"})
            # PSS with salt lengths other than hLen: valid RSASSA-PSS, but not JWA PS*.
            for slen in (0, HLEN[hname] - 1, HLEN[hname] + 1, padding.PSS.MAX_LENGTH):
                pss = padding.PSS(mgf=padding.MGF1(H()), salt_length=slen)
                sigs.append({"key": kid, "tool": "python-cryptography", "scheme": "pss", "hash": hname,
                             "msg": messages[1].hex(), "sig": priv.sign(messages[1], pss, H()).hex(),
                             "expect": "reject", "note": f"pss salt length {'max' if slen is padding.PSS.MAX_LENGTH else slen}"})

    # Key generated and signatures made by the openssl CLI.
    with tempfile.TemporaryDirectory() as d:
        kp = os.path.join(d, "key.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", kp],
                       check=True, capture_output=True)
        spki = subprocess.run(["openssl", "pkey", "-in", kp, "-pubout"], check=True, capture_output=True).stdout
        pkcs1 = subprocess.run(["openssl", "rsa", "-in", kp, "-RSAPublicKey_out"], check=True, capture_output=True).stdout
        pub = serialization.load_pem_public_key(spki)
        ent = key_entry("openssl-rsa2048", pub, "openssl-cli")
        ent["spki_pem"], ent["pkcs1_pem"] = spki.decode(), pkcs1.decode()
        keys.append(ent)
        mp = os.path.join(d, "msg")
        for msg in messages:
            with open(mp, "wb") as f:
                f.write(msg)
            for hname in HASHES:
                for scheme, opts in [("pkcs1v15", []),
                                     ("pss", ["-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:digest"])]:
                    sig = subprocess.run(["openssl", "dgst", "-" + hname, "-sign", kp, *opts, mp],
                                         check=True, capture_output=True).stdout
                    sigs.append({"key": "openssl-rsa2048", "tool": "openssl-cli", "scheme": scheme, "hash": hname,
                                 "msg": msg.hex(), "sig": sig.hex(), "expect": "valid"})

    # JWTs (compact JWS) for the benchmarks.
    claims = {"sub": "1234567890", "name": "bench", "iss": "test", "iat": int(time.time()), "exp": 4102444800}
    for kid in ["py-rsa2048-e65537", "py-rsa4096-e65537"]:
        priv = privs[kid]
        for alg in ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]:
            hname = "sha" + alg[2:]
            H = HASHES[hname]
            hdr = {"alg": alg, "typ": "JWT"}
            si = (b64u(json.dumps(hdr, separators=(",", ":")).encode()) + "." +
                  b64u(json.dumps(claims, separators=(",", ":")).encode())).encode()
            pad = padding.PKCS1v15() if alg[0] == "R" else padding.PSS(mgf=padding.MGF1(H()), salt_length=padding.PSS.DIGEST_LENGTH)
            sig = priv.sign(si, pad, H())
            jwts.append({"key": kid, "alg": alg, "token": si.decode() + "." + b64u(sig)})

    out = {"generated_by": "testdata/gen_vectors.py", "keys": keys, "signatures": sigs, "jwts": jwts}
    with open(os.path.join(HERE, "vectors.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{len(keys)} keys, {len(sigs)} signatures, {len(jwts)} jwts")


if __name__ == "__main__":
    main()
