//! Tests against vectors made by Python `cryptography` and the `openssl` CLI
//! (testdata/gen_rsa_vectors.py), never by this crate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)] // test code

use serde_json::Value;
use std::collections::HashMap;
use tollgate_jwt_auth::rsa::{RsaError, RsaHash, RsaPublicKey};

const VECTORS: &str = include_str!("../testdata/rsa_vectors.json");

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn b64url(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut nbits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("bad base64url"),
        };
        acc = (acc << 6) | u32::from(v);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((acc >> nbits) as u8);
        }
    }
    out
}

struct Vectors {
    keys: HashMap<String, Value>,
    sigs: Vec<Value>,
    jwts: Vec<Value>,
}

fn load() -> Vectors {
    let v: Value = serde_json::from_str(VECTORS).unwrap();
    let keys = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["id"].as_str().unwrap().to_string(), k.clone()))
        .collect();
    Vectors {
        keys,
        sigs: v["signatures"].as_array().unwrap().clone(),
        jwts: v["jwts"].as_array().unwrap().clone(),
    }
}

fn key_from_hex(k: &Value) -> RsaPublicKey {
    RsaPublicKey::from_components(
        &hex(k["n"].as_str().unwrap()),
        &hex(k["e"].as_str().unwrap()),
    )
    .unwrap()
}

fn hash_of(name: &str) -> RsaHash {
    match name {
        "sha256" => RsaHash::Sha256,
        "sha384" => RsaHash::Sha384,
        "sha512" => RsaHash::Sha512,
        _ => panic!("hash {name}"),
    }
}

fn other_hashes(h: RsaHash) -> Vec<RsaHash> {
    [RsaHash::Sha256, RsaHash::Sha384, RsaHash::Sha512]
        .into_iter()
        .filter(|&x| x != h)
        .collect()
}

fn verify(
    key: &RsaPublicKey,
    scheme: &str,
    h: RsaHash,
    msg: &[u8],
    sig: &[u8],
) -> Result<(), RsaError> {
    match scheme {
        "pkcs1v15" => key.verify_pkcs1v15(h, msg, sig),
        "pss" => key.verify_pss(h, msg, sig),
        _ => panic!("scheme {scheme}"),
    }
}

#[test]
fn keys_from_jwk_pem_and_hex_agree() {
    let v = load();
    assert_eq!(v.keys.len(), 5);
    for k in v.keys.values() {
        let from_hex = key_from_hex(k);
        let jwk = &k["jwk"];
        let from_jwk = RsaPublicKey::from_components(
            &b64url(jwk["n"].as_str().unwrap()),
            &b64url(jwk["e"].as_str().unwrap()),
        )
        .unwrap();
        // PEM documents are parsed by jwt-simple, whose key policy takes e = 65537 only.
        let pem = jwt_simple::prelude::RS256PublicKey::from_pem(k["spki_pem"].as_str().unwrap());
        if from_hex.exponent() == 65537 {
            let c = pem.unwrap().to_components();
            assert_eq!(from_hex, RsaPublicKey::from_components(&c.n, &c.e).unwrap());
        } else {
            assert!(
                pem.is_err(),
                "jwt-simple refuses e = {}",
                from_hex.exponent()
            );
        }
        assert_eq!(from_hex, from_jwk);
        assert_eq!(from_hex.modulus_bits() as u64, k["bits"].as_u64().unwrap());
        assert_eq!(from_hex.size() * 8, from_hex.modulus_bits());
    }
}

#[test]
fn all_vectors() {
    let v = load();
    let mut counts = HashMap::new();
    for s in &v.sigs {
        let key = key_from_hex(&v.keys[s["key"].as_str().unwrap()]);
        let scheme = s["scheme"].as_str().unwrap();
        let h = hash_of(s["hash"].as_str().unwrap());
        let msg = hex(s["msg"].as_str().unwrap());
        let sig = hex(s["sig"].as_str().unwrap());
        let expect = s["expect"].as_str().unwrap();
        let res = verify(&key, scheme, h, &msg, &sig);
        match expect {
            "valid" => assert_eq!(res, Ok(()), "{s}"),
            "reject" => assert_eq!(res, Err(RsaError::VerificationFailed), "{s}"),
            _ => panic!(),
        }
        *counts
            .entry((s["tool"].as_str().unwrap().to_string(), expect.to_string()))
            .or_insert(0) += 1;
        if expect != "valid" {
            continue;
        }
        // Flip every 7th bit of the message / one bit per byte position class of the signature.
        for bit in (0..msg.len() * 8)
            .step_by(97)
            .chain(msg.len().checked_sub(1).map(|l| l * 8 + 7))
        {
            let mut m2 = msg.clone();
            m2[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                verify(&key, scheme, h, &m2, &sig),
                Err(RsaError::VerificationFailed)
            );
        }
        let mut m2 = msg.clone();
        m2.push(0);
        assert_eq!(
            verify(&key, scheme, h, &m2, &sig),
            Err(RsaError::VerificationFailed)
        );
        for bit in [
            0usize,
            1,
            7,
            8,
            100,
            1000,
            sig.len() * 8 - 1,
            sig.len() * 8 / 2 + 3,
        ] {
            let mut s2 = sig.clone();
            s2[bit / 8] ^= 1 << (7 - bit % 8);
            let r = verify(&key, scheme, h, &msg, &s2);
            assert!(
                r == Err(RsaError::VerificationFailed) || r == Err(RsaError::SignatureOutOfRange),
                "flipped sig bit {bit}: {r:?}"
            );
        }
        // Wrong hash.
        for h2 in other_hashes(h) {
            assert_eq!(
                verify(&key, scheme, h2, &msg, &sig),
                Err(RsaError::VerificationFailed)
            );
        }
        // Wrong scheme.
        let other = if scheme == "pss" { "pkcs1v15" } else { "pss" };
        assert_eq!(
            verify(&key, other, h, &msg, &sig),
            Err(RsaError::VerificationFailed)
        );
        // Wrong key.
        for (id, k2) in &v.keys {
            if id != s["key"].as_str().unwrap() {
                let k2 = key_from_hex(k2);
                assert!(verify(&k2, scheme, h, &msg, &sig).is_err());
            }
        }
    }
    eprintln!("{counts:?}");
    assert!(counts[&("openssl-cli".to_string(), "valid".to_string())] >= 24);
    assert!(counts[&("python-cryptography".to_string(), "valid".to_string())] >= 96);
    assert!(counts[&("python-cryptography".to_string(), "reject".to_string())] >= 48);
}

#[test]
fn jwts_verify() {
    let v = load();
    assert!(!v.jwts.is_empty());
    for j in &v.jwts {
        let key = key_from_hex(&v.keys[j["key"].as_str().unwrap()]);
        let token = j["token"].as_str().unwrap();
        let dot = token.rfind('.').unwrap();
        let (input, sig) = (&token.as_bytes()[..dot], b64url(&token[dot + 1..]));
        let alg = j["alg"].as_str().unwrap();
        let h = hash_of(&format!("sha{}", &alg[2..]));
        let scheme = if alg.starts_with("RS") {
            "pkcs1v15"
        } else {
            "pss"
        };
        assert_eq!(verify(&key, scheme, h, input, &sig), Ok(()), "{alg}");
    }
}

#[test]
fn malformed_signatures_are_errors() {
    let v = load();
    for k in v.keys.values() {
        let key = key_from_hex(k);
        let len = key.size();
        let n = hex(k["n"].as_str().unwrap());
        for scheme in ["pkcs1v15", "pss"] {
            for h in [RsaHash::Sha256, RsaHash::Sha384, RsaHash::Sha512] {
                let e = |sig: &[u8]| verify(&key, scheme, h, b"msg", sig);
                assert_eq!(e(&[]), Err(RsaError::InvalidSignatureLength));
                assert_eq!(
                    e(&vec![0u8; len - 1]),
                    Err(RsaError::InvalidSignatureLength)
                );
                assert_eq!(
                    e(&vec![0u8; len + 1]),
                    Err(RsaError::InvalidSignatureLength)
                );
                assert_eq!(
                    e(&vec![0xffu8; 4 * len]),
                    Err(RsaError::InvalidSignatureLength)
                );
                // s = n, s = n + 1, s = 2^(8 len) - 1: out of range.
                assert_eq!(e(&n), Err(RsaError::SignatureOutOfRange));
                let mut n1 = n.clone();
                *n1.last_mut().unwrap() += 1; // n is odd, no carry
                assert_eq!(e(&n1), Err(RsaError::SignatureOutOfRange));
                assert_eq!(e(&vec![0xffu8; len]), Err(RsaError::SignatureOutOfRange));
                // s = n - 1, 0, 1, 2 and garbage: in range but invalid.
                let mut nm1 = n.clone();
                *nm1.last_mut().unwrap() -= 1;
                assert_eq!(e(&nm1), Err(RsaError::VerificationFailed));
                let mut small = vec![0u8; len];
                assert_eq!(e(&small), Err(RsaError::VerificationFailed));
                small[len - 1] = 1;
                assert_eq!(e(&small), Err(RsaError::VerificationFailed));
                small[len - 1] = 2;
                assert_eq!(e(&small), Err(RsaError::VerificationFailed));
                let mut x = 0x12345678u32;
                let garbage: Vec<u8> = (0..len)
                    .map(|i| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        if i == 0 {
                            0x01
                        } else {
                            x as u8
                        }
                    })
                    .collect();
                assert_eq!(e(&garbage), Err(RsaError::VerificationFailed));
            }
        }
    }
}

#[test]
fn rsavp1_matches_num_bigint_modpow() {
    // The Montgomery core against an independent big-number library.
    use num_bigint::BigUint;
    let v = load();
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ids: Vec<_> = v.keys.keys().cloned().collect();
    ids.sort();
    for id in ids {
        let k = &v.keys[&id];
        let n = hex(k["n"].as_str().unwrap());
        let nb = BigUint::from_bytes_be(&n);
        for e in [
            hex(k["e"].as_str().unwrap()),
            vec![3],
            vec![0xff; 8],
            vec![0x80, 0, 0, 0, 0, 0, 0, 1],
        ] {
            let key = RsaPublicKey::from_components(&n, &e).unwrap();
            let eb = BigUint::from_bytes_be(&e);
            let len = key.size();
            let mut inputs: Vec<BigUint> = vec![
                BigUint::from(0u8),
                BigUint::from(1u8),
                BigUint::from(2u8),
                &nb - 1u8,
                &nb - 2u8,
                &nb >> 1,
                (BigUint::from(1u8) << (8 * len - 9)) - 1u8,
            ];
            for _ in 0..20 {
                let bytes: Vec<u8> = (0..len).map(|_| (rnd() >> 11) as u8).collect();
                inputs.push(BigUint::from_bytes_be(&bytes) % &nb);
            }
            for s in inputs {
                let mut sig = vec![0u8; len];
                let sb = s.to_bytes_be();
                sig[len - sb.len()..].copy_from_slice(&sb);
                let want = s.modpow(&eb, &nb).to_bytes_be();
                let mut want_padded = vec![0u8; len];
                want_padded[len - want.len()..].copy_from_slice(&want);
                assert_eq!(
                    key.rsavp1(&sig).unwrap(),
                    want_padded,
                    "key {id} e {e:?} s {s:x}"
                );
            }
        }
    }
}

#[test]
fn bad_keys_are_rejected() {
    let v = load();
    let k = &v.keys["py-rsa2048-e65537"];
    let n = hex(k["n"].as_str().unwrap());
    let e = hex(k["e"].as_str().unwrap());
    assert!(RsaPublicKey::from_components(&n, &e).is_ok());
    // Leading zeros are fine.
    let mut n0 = vec![0u8, 0];
    n0.extend_from_slice(&n);
    assert!(RsaPublicKey::from_components(&n0, &[0, 1, 0, 1]).is_ok());
    // Even n, even e, e < 3, empty, too long e.
    let mut ne = n.clone();
    *ne.last_mut().unwrap() &= 0xfe;
    assert_eq!(
        RsaPublicKey::from_components(&ne, &e),
        Err(RsaError::InvalidKey)
    );
    for bad_e in [
        &[][..],
        &[0],
        &[1],
        &[2],
        &[0, 3 - 1],
        &[1, 0],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9],
    ] {
        assert_eq!(
            RsaPublicKey::from_components(&n, bad_e),
            Err(RsaError::InvalidKey),
            "{bad_e:?}"
        );
    }
    assert!(RsaPublicKey::from_components(&n, &[3]).is_ok());
    assert!(RsaPublicKey::from_components(&n, &[0xff; 8]).is_ok());
    // Too small (2047 bits), too large (8193 bits), empty n.
    let mut small = n.clone();
    small[0] = 0x7f;
    assert_eq!(
        RsaPublicKey::from_components(&small, &e),
        Err(RsaError::InvalidKey)
    );
    assert_eq!(
        RsaPublicKey::from_components(&n[1..], &e),
        Err(RsaError::InvalidKey)
    );
    let mut big = vec![1u8];
    big.extend(std::iter::repeat_n(0xffu8, 1024));
    assert_eq!(
        RsaPublicKey::from_components(&big, &e),
        Err(RsaError::InvalidKey)
    );
    assert!(RsaPublicKey::from_components(&big[1..], &e).is_ok()); // exactly 8192 bits
    assert_eq!(
        RsaPublicKey::from_components(&[], &e),
        Err(RsaError::InvalidKey)
    );
    // 3000-bit modulus (not a multiple of 32 bits) is accepted.
    assert!(RsaPublicKey::from_components(&big[1..376], &e).is_ok());
}

#[test]
fn extreme_moduli_match_num_bigint() {
    // All-ones moduli give maximal limbs and so the largest column sums in
    // the Montgomery loops; sizes that are not multiples of 8, 27 or 32 bits
    // exercise the limb/byte conversions. These are not RSA moduli, which
    // does not matter for the modular exponentiation itself.
    use num_bigint::BigUint;
    let mut x = 0x2545f4914f6cdd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for bits in [
        2048usize, 2049, 2111, 3000, 3072, 4096, 4097, 6000, 8191, 8192,
    ] {
        let one = BigUint::from(1u8);
        let all_ones = (&one << bits) - 1u8;
        let random_odd = {
            let bytes: Vec<u8> = (0..bits.div_ceil(8)).map(|_| rnd() as u8).collect();
            let v = BigUint::from_bytes_be(&bytes) % (&one << (bits - 1));
            v | (&one << (bits - 1)) | &one
        };
        for n in [all_ones, random_odd] {
            let nb = n.to_bytes_be();
            for e in [vec![3u8], vec![1, 0, 1], vec![0xff; 8]] {
                let key = RsaPublicKey::from_components(&nb, &e).unwrap();
                assert_eq!(key.modulus_bits(), bits);
                assert_eq!(key.size(), bits.div_ceil(8));
                let eb = BigUint::from_bytes_be(&e);
                for s in [
                    &n - 1u8,
                    &n - 2u8,
                    &n >> 1,
                    BigUint::from(2u8),
                    BigUint::from(rnd()) * BigUint::from(rnd()) % &n,
                ] {
                    let mut sig = vec![0u8; key.size()];
                    let sb = s.to_bytes_be();
                    sig[key.size() - sb.len()..].copy_from_slice(&sb);
                    let want = s.modpow(&eb, &n).to_bytes_be();
                    let mut want_padded = vec![0u8; key.size()];
                    want_padded[key.size() - want.len()..].copy_from_slice(&want);
                    assert_eq!(
                        key.rsavp1(&sig).unwrap(),
                        want_padded,
                        "bits {bits} e {e:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn random_inputs_never_panic() {
    let v = load();
    let mut x = 0x853c49e6748fea9bu64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let good = key_from_hex(&v.keys["py-rsa2048-e65537"]);
    for round in 0..300 {
        let len = (rnd() % 1100) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        let elen = (rnd() % 10) as usize;
        let e: Vec<u8> = (0..elen).map(|_| rnd() as u8).collect();
        if let Ok(k) = RsaPublicKey::from_components(&bytes, &e) {
            let sig: Vec<u8> = (0..k.size()).map(|_| rnd() as u8).collect();
            let _ = k.verify_pkcs1v15(RsaHash::Sha384, &bytes, &sig);
            let _ = k.verify_pss(RsaHash::Sha512, &bytes, &sig);
        }
        // Random-length signatures against a real key.
        let slen = if round % 3 == 0 {
            good.size()
        } else {
            (rnd() % 600) as usize
        };
        let sig: Vec<u8> = (0..slen).map(|_| rnd() as u8).collect();
        assert!(good.verify_pkcs1v15(RsaHash::Sha256, &bytes, &sig).is_err());
        assert!(good.verify_pss(RsaHash::Sha256, &bytes, &sig).is_err());
    }
}
