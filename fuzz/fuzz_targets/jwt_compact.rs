//! The JWT compact serialization and JOSE header through jwt-auth's `verify`, with a provider
//! holding every kind of key of `plugins/jwt-auth/testdata/vectors.json` (RSA, P-256, P-384,
//! Ed25519 JWKs and HS256/384/512 secrets, made by PyJWT and `cryptography`).
//!
//! The first input byte picks the mode:
//! - raw: the rest is the token. No panic; a token that verifies has three base64url parts and,
//!   when it is HS*, a tag equal to an independent HMAC (the `hmac` crate) of its signing input.
//!   For RS*/PS* tokens, jwt-auth's own RSA code (`tollgate_jwt_auth::rsa`) and the `rsa` crate
//!   must agree on the signature, accept or refuse (the seeds are valid tokens, so mutations
//!   exercise both sides).
//! - signed: the rest is split into a JOSE header and a payload, signed with the HS256 secret,
//!   then one byte of the compact form is changed. A changed token never verifies unless it
//!   decodes to the same header, payload and signature bytes as the original (a refused token
//!   never verifies, whatever the alteration).
#![no_main]

use std::sync::OnceLock;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use rsa::pkcs1v15::Pkcs1v15Sign;
use rsa::pss::Pss;
use rsa::{BigUint, RsaPublicKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256, Sha384, Sha512};
use tollgate_jwt_auth::config::{Config, KeySource};
use tollgate_jwt_auth::keys::KeySet;
use tollgate_jwt_auth::rsa::{RsaHash, RsaPublicKey as OurRsaKey};
use tollgate_jwt_auth::verify::verify;

struct Fixture {
    config: Config,
    now: u64,
    secrets: Value,
    ours: OurRsaKey,
    reference: RsaPublicKey,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let v: Value = serde_json::from_str(include_str!("../../plugins/jwt-auth/testdata/vectors.json")).unwrap();
        let secrets = v["hmac_secrets"].clone();
        let hmac: Vec<Value> = secrets
            .as_object()
            .unwrap()
            .iter()
            .map(|(alg, s)| json!({"alg": alg, "kid": format!("hmac-{alg}"), "secret": s}))
            .collect();
        let doc = json!({"providers": {"main": {
            "issuer": v["issuer"], "audiences": ["api"], "local_jwks": v["jwks"], "hmac_secrets": hmac,
            "claim_to_headers": [{"claim": "sub", "header": "x-jwt-sub"}], "forward_payload_header": "x-jwt-payload"
        }}});
        let config = Config::parse(doc.to_string().as_bytes()).unwrap();
        let rsa = v["jwks"]["keys"].as_array().unwrap().iter().find(|k| k["kty"] == "RSA").unwrap();
        let b64 = |f: &str| URL_SAFE_NO_PAD.decode(rsa[f].as_str().unwrap()).unwrap();
        let (n, e) = (b64("n"), b64("e"));
        Fixture {
            ours: OurRsaKey::from_components(&n, &e).unwrap(),
            reference: RsaPublicKey::new(BigUint::from_bytes_be(&n), BigUint::from_bytes_be(&e)).unwrap(),
            now: v["now"].as_u64().unwrap(),
            secrets,
            config,
        }
    })
}

fn keys(config: &Config, i: usize) -> Option<&KeySet> {
    match &config.providers.get(i)?.keys {
        KeySource::Static(s) => Some(s),
        KeySource::Remote(_) => None,
    }
}

/// base64url that tolerates padding and non-canonical trailing bits: what "the same bytes"
/// means when comparing two spellings of a token.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn parts(token: &str) -> Option<Vec<Vec<u8>>> {
    let p: Vec<&str> = token.split('.').collect();
    if p.len() != 3 {
        return None;
    }
    p.iter().map(|s| LENIENT.decode(s).ok()).collect()
}

fn alg_of(token: &str) -> Option<String> {
    let header = LENIENT.decode(token.split('.').next()?).ok()?;
    let v: Value = serde_json::from_slice(&header).ok()?;
    v["alg"].as_str().map(str::to_owned)
}

fn hmac_tag(alg: &str, secret: &[u8], input: &[u8]) -> Option<Vec<u8>> {
    Some(match alg {
        "HS256" => Hmac::<Sha256>::new_from_slice(secret)
            .ok()?
            .chain_update(input)
            .finalize()
            .into_bytes()
            .to_vec(),
        "HS384" => Hmac::<Sha384>::new_from_slice(secret)
            .ok()?
            .chain_update(input)
            .finalize()
            .into_bytes()
            .to_vec(),
        "HS512" => Hmac::<Sha512>::new_from_slice(secret)
            .ok()?
            .chain_update(input)
            .finalize()
            .into_bytes()
            .to_vec(),
        _ => return None,
    })
}

/// Our RSA and the `rsa` crate on the same signing input and signature.
fn rsa_agree(f: &Fixture, alg: &str, token: &str) {
    let Some((input, sig)) = token.rsplit_once('.') else {
        return;
    };
    let Ok(sig) = URL_SAFE_NO_PAD.decode(sig) else {
        return;
    };
    let input = input.as_bytes();
    let (ours, reference) = match alg {
        "RS256" => (
            f.ours.verify_pkcs1v15(RsaHash::Sha256, input, &sig),
            f.reference
                .verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(input), &sig),
        ),
        "RS384" => (
            f.ours.verify_pkcs1v15(RsaHash::Sha384, input, &sig),
            f.reference
                .verify(Pkcs1v15Sign::new::<Sha384>(), &Sha384::digest(input), &sig),
        ),
        "RS512" => (
            f.ours.verify_pkcs1v15(RsaHash::Sha512, input, &sig),
            f.reference
                .verify(Pkcs1v15Sign::new::<Sha512>(), &Sha512::digest(input), &sig),
        ),
        "PS256" => (
            f.ours.verify_pss(RsaHash::Sha256, input, &sig),
            f.reference.verify(
                Pss::new_with_salt::<Sha256>(32),
                &Sha256::digest(input),
                &sig,
            ),
        ),
        "PS384" => (
            f.ours.verify_pss(RsaHash::Sha384, input, &sig),
            f.reference.verify(
                Pss::new_with_salt::<Sha384>(48),
                &Sha384::digest(input),
                &sig,
            ),
        ),
        "PS512" => (
            f.ours.verify_pss(RsaHash::Sha512, input, &sig),
            f.reference.verify(
                Pss::new_with_salt::<Sha512>(64),
                &Sha512::digest(input),
                &sig,
            ),
        ),
        _ => return,
    };
    assert_eq!(
        ours.is_ok(),
        reference.is_ok(),
        "{alg} {token:?}: ours {ours:?}, rsa crate {reference:?}"
    );
}

fn check_verified(f: &Fixture, token: &str) {
    let Ok(_) = verify(&f.config, |i| keys(&f.config, i), token, f.now) else {
        return;
    };
    let decoded = parts(token).expect("a verified token has three base64url parts");
    assert!(token.split('.').all(|p| !p.is_empty()));
    let alg = alg_of(token).expect("a verified token has an alg");
    if let Some(secret) = f.secrets.get(&alg).and_then(Value::as_str) {
        let (input, _) = token.rsplit_once('.').unwrap();
        let want = hmac_tag(&alg, secret.as_bytes(), input.as_bytes()).unwrap();
        assert_eq!(
            decoded[2], want,
            "an HMAC token verified without the right tag"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let token = String::from_utf8_lossy(rest);
        check_verified(f, &token);
        if let Some(alg) = alg_of(&token) {
            rsa_agree(f, &alg, &token);
        }
        return;
    }
    // Signed: `<position> <xor> <header> 0xff <payload>`.
    let [pos_hi, pos_lo, xor, body @ ..] = rest else {
        return;
    };
    let split = body.iter().position(|&b| b == 0xff).unwrap_or(body.len());
    let (header, payload) = (&body[..split], body.get(split + 1..).unwrap_or_default());
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let secret = f.secrets["HS256"].as_str().unwrap();
    let tag = hmac_tag("HS256", secret.as_bytes(), signing_input.as_bytes()).unwrap();
    let token = format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag));
    let original = verify(&f.config, |i| keys(&f.config, i), &token, f.now);
    check_verified(f, &token);
    let mut changed = token.clone().into_bytes();
    let at = (usize::from(*pos_hi) << 8 | usize::from(*pos_lo)) % changed.len();
    changed[at] ^= xor | 1;
    let Ok(changed) = String::from_utf8(changed) else {
        return;
    };
    if verify(&f.config, |i| keys(&f.config, i), &changed, f.now).is_ok() {
        assert!(
            original.is_ok(),
            "a changed token verified where the original did not: {changed:?}"
        );
        assert_eq!(
            parts(&changed),
            parts(&token),
            "a changed token verified: {changed:?}"
        );
    }
});
