//! Verification keys: HMAC secrets, PEM public keys and JWKS (RFC 7517), each bound to one JWS
//! algorithm (RFC 7518 section 3.1), so that a token can only be checked with a key of its own
//! algorithm (no algorithm confusion, no `none`).

use base64::Engine as _;
use hmac::{Hmac, Mac};
use jwt_simple::prelude::*;
use serde_json::{Map, Value};
use sha2::{Sha256, Sha384, Sha512};

use crate::rsa::{RsaHash, RsaPublicKey};

/// Claims as parsed by jwt-simple: registered claims typed, every other claim in the map.
pub type Claims = JWTClaims<Map<String, Value>>;

/// A JWS algorithm this filter accepts (RFC 7518 section 3.1, RFC 8037 for EdDSA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl Alg {
    /// The six RSA algorithms: an RSA JWK without `alg` may verify any of them.
    pub const RSA: [Alg; 6] = [
        Alg::RS256,
        Alg::RS384,
        Alg::RS512,
        Alg::PS256,
        Alg::PS384,
        Alg::PS512,
    ];

    /// Parses an `alg` header value; `None` for `none` and everything unsupported.
    pub fn from_name(name: &str) -> Option<Alg> {
        Some(match name {
            "HS256" => Alg::HS256,
            "HS384" => Alg::HS384,
            "HS512" => Alg::HS512,
            "RS256" => Alg::RS256,
            "RS384" => Alg::RS384,
            "RS512" => Alg::RS512,
            "PS256" => Alg::PS256,
            "PS384" => Alg::PS384,
            "PS512" => Alg::PS512,
            "ES256" => Alg::ES256,
            "ES384" => Alg::ES384,
            "EdDSA" => Alg::EdDSA,
            _ => return None,
        })
    }

    /// Minimum HMAC key length in bytes: the hash output size (RFC 7518 section 3.2).
    fn min_hmac_key_len(self) -> Option<usize> {
        match self {
            Alg::HS256 => Some(32),
            Alg::HS384 => Some(48),
            Alg::HS512 => Some(64),
            _ => None,
        }
    }
}

enum Material {
    /// HS*: an HMAC state keyed once at configuration time (RFC 2104), cloned per token.
    Hmac(HmacKey),
    /// RS*/PS*: parsed by jwt-simple (JWK, PEM), verified by [`crate::rsa`].
    Rsa(RsaPublicKey, RsaHash, RsaPadding),
    ES256(ES256PublicKey),
    ES384(ES384PublicKey),
    EdDSA(Ed25519PublicKey),
}

enum HmacKey {
    S256(Hmac<Sha256>),
    S384(Hmac<Sha384>),
    S512(Hmac<Sha512>),
}

impl HmacKey {
    /// Constant-time comparison of the tag (`Mac::verify_slice`).
    fn verify(&self, message: &[u8], tag: &[u8]) -> Result<(), String> {
        let ok = match self {
            HmacKey::S256(m) => m.clone().chain_update(message).verify_slice(tag).is_ok(),
            HmacKey::S384(m) => m.clone().chain_update(message).verify_slice(tag).is_ok(),
            HmacKey::S512(m) => m.clone().chain_update(message).verify_slice(tag).is_ok(),
        };
        if ok {
            Ok(())
        } else {
            Err("HMAC tag mismatch".into())
        }
    }
}

#[derive(Clone, Copy)]
enum RsaPadding {
    Pkcs1v15,
    Pss,
}

impl Alg {
    fn rsa_params(self) -> Option<(RsaHash, RsaPadding)> {
        Some(match self {
            Alg::RS256 => (RsaHash::Sha256, RsaPadding::Pkcs1v15),
            Alg::RS384 => (RsaHash::Sha384, RsaPadding::Pkcs1v15),
            Alg::RS512 => (RsaHash::Sha512, RsaPadding::Pkcs1v15),
            Alg::PS256 => (RsaHash::Sha256, RsaPadding::Pss),
            Alg::PS384 => (RsaHash::Sha384, RsaPadding::Pss),
            Alg::PS512 => (RsaHash::Sha512, RsaPadding::Pss),
            _ => return None,
        })
    }
}

/// An RSA key for `alg` from the modulus and exponent jwt-simple parsed.
fn rsa_material(
    alg: Alg,
    c: &jwt_simple::algorithms::RSAPublicKeyComponents,
) -> Result<Material, String> {
    let (hash, padding) = alg
        .rsa_params()
        .ok_or_else(|| format!("{alg:?} is not an RSA algorithm"))?;
    let key =
        RsaPublicKey::from_components(&c.n, &c.e).map_err(|e| format!("unusable RSA key: {e}"))?;
    Ok(Material::Rsa(key, hash, padding))
}

/// One key, usable with exactly one algorithm.
pub struct VerifyingKey {
    /// The key's `kid`, if it has one.
    pub kid: Option<String>,
    /// The only algorithm this key verifies.
    pub alg: Alg,
    material: Material,
}

/// Why a signature check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// The signature does not match (or the JWS could not be decoded by jwt-simple).
    Invalid(String),
}

impl VerifyingKey {
    /// An HMAC secret for `alg` (HS256/384/512). Errors if `alg` is not HMAC or the secret is
    /// shorter than the hash output (RFC 7518 section 3.2).
    pub fn hmac(alg: Alg, secret: &[u8], kid: Option<String>) -> Result<Self, String> {
        let min = alg
            .min_hmac_key_len()
            .ok_or_else(|| format!("{alg:?} is not an HMAC algorithm"))?;
        if secret.len() < min {
            return Err(format!(
                "an {alg:?} secret must be at least {min} bytes (RFC 7518 section 3.2), got {}",
                secret.len()
            ));
        }
        let bad = |e: hmac::digest::InvalidLength| format!("unusable HMAC key: {e}");
        let key = match alg {
            Alg::HS256 => HmacKey::S256(Hmac::new_from_slice(secret).map_err(bad)?),
            Alg::HS384 => HmacKey::S384(Hmac::new_from_slice(secret).map_err(bad)?),
            _ => HmacKey::S512(Hmac::new_from_slice(secret).map_err(bad)?),
        };
        let material = Material::Hmac(key);
        Ok(Self { kid, alg, material })
    }

    /// A PEM public key (SubjectPublicKeyInfo) for an asymmetric `alg`.
    pub fn from_pem(alg: Alg, pem: &str, kid: Option<String>) -> Result<Self, String> {
        let e = |err: jwt_simple::Error| format!("not a valid {alg:?} public key in PEM: {err}");
        let material = match alg {
            Alg::RS256 | Alg::RS384 | Alg::RS512 | Alg::PS256 | Alg::PS384 | Alg::PS512 => {
                rsa_material(
                    alg,
                    &RS256PublicKey::from_pem(pem).map_err(e)?.to_components(),
                )?
            }
            Alg::ES256 => Material::ES256(ES256PublicKey::from_pem(pem).map_err(e)?),
            Alg::ES384 => Material::ES384(ES384PublicKey::from_pem(pem).map_err(e)?),
            Alg::EdDSA => Material::EdDSA(Ed25519PublicKey::from_pem(pem).map_err(e)?),
            Alg::HS256 | Alg::HS384 | Alg::HS512 => {
                return Err(format!("{alg:?} takes a secret, not a PEM key"))
            }
        };
        Ok(Self { kid, alg, material })
    }

    /// One public JWK (RFC 7517 section 4) for `alg`, parsed strictly by jwt-simple.
    fn from_jwk(alg: Alg, jwk: &str, kid: Option<String>) -> Result<Self, String> {
        let e = |err: jwt_simple::Error| format!("not a valid {alg:?} JWK: {err}");
        let material = match alg {
            Alg::RS256 => rsa_material(
                alg,
                &RS256PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::RS384 => rsa_material(
                alg,
                &RS384PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::RS512 => rsa_material(
                alg,
                &RS512PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::PS256 => rsa_material(
                alg,
                &PS256PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::PS384 => rsa_material(
                alg,
                &PS384PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::PS512 => rsa_material(
                alg,
                &PS512PublicKey::from_jwk(jwk).map_err(e)?.to_components(),
            )?,
            Alg::ES256 => Material::ES256(ES256PublicKey::from_jwk(jwk).map_err(e)?),
            Alg::ES384 => Material::ES384(ES384PublicKey::from_jwk(jwk).map_err(e)?),
            Alg::EdDSA => Material::EdDSA(Ed25519PublicKey::from_jwk(jwk).map_err(e)?),
            Alg::HS256 | Alg::HS384 | Alg::HS512 => {
                return Err("symmetric keys are not accepted in a JWKS".into())
            }
        };
        Ok(Self { kid, alg, material })
    }

    /// Checks the JWS signature of `token` (RFC 7515 section 5.2) and returns its claims, in
    /// jwt-simple's claims type. Time, issuer and audience are *not* checked here (see
    /// `verify::validate_claims`, which uses the host's clock). HS* and RS*/PS* are checked on
    /// the signing input directly (the header was parsed once by the caller, which matched
    /// `alg` to this key and refused `crit`); ES256/ES384/EdDSA go through jwt-simple's
    /// `verify_token`, whose own time checks are neutralised by verifying at time 0 with
    /// `accept_future`.
    pub fn verify(&self, token: &str) -> Result<Claims, SignatureError> {
        let options = VerificationOptions {
            accept_future: true,
            time_tolerance: Some(Duration::from_secs(0)),
            artificial_time: Some(UnixTimeStamp::from_secs(0)),
            max_token_length: None,
            ..Default::default()
        };
        let opts = Some(options);
        let result = match &self.material {
            Material::Hmac(k) => return verify_compact(token, |input, tag| k.verify(input, tag)),
            Material::Rsa(k, hash, padding) => {
                return verify_compact(token, |input, signature| {
                    let checked = match padding {
                        RsaPadding::Pkcs1v15 => k.verify_pkcs1v15(*hash, input, signature),
                        RsaPadding::Pss => k.verify_pss(*hash, input, signature),
                    };
                    checked.map_err(|e| e.to_string())
                })
            }
            Material::ES256(k) => k.verify_token::<Map<String, Value>>(token, opts),
            Material::ES384(k) => k.verify_token::<Map<String, Value>>(token, opts),
            Material::EdDSA(k) => k.verify_token::<Map<String, Value>>(token, opts),
        };
        result.map_err(|e| SignatureError::Invalid(e.to_string()))
    }
}

/// A compact JWS checked on its signing input (`header.payload`, RFC 7515 section 5.2) by
/// `check(signing input, decoded signature)`, then the payload parsed into jwt-simple's claims
/// type. Used for HS* (RFC 7518 section 3.2) and RS*/PS* (sections 3.3 and 3.5).
fn verify_compact(
    token: &str,
    check: impl FnOnce(&[u8], &[u8]) -> Result<(), String>,
) -> Result<Claims, SignatureError> {
    let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let invalid = |what: &str| SignatureError::Invalid(what.to_string());
    let (signing_input, signature) = token
        .rsplit_once('.')
        .ok_or_else(|| invalid("not a compact JWS"))?;
    let (_, payload) = signing_input
        .split_once('.')
        .ok_or_else(|| invalid("not a compact JWS"))?;
    let signature = b64
        .decode(signature)
        .map_err(|_| invalid("signature is not base64url"))?;
    check(signing_input.as_bytes(), &signature).map_err(SignatureError::Invalid)?;
    let payload = b64
        .decode(payload)
        .map_err(|_| invalid("payload is not base64url"))?;
    serde_json::from_slice(&payload).map_err(|e| SignatureError::Invalid(format!("claims: {e}")))
}

/// The keys of one provider.
#[derive(Default)]
pub struct KeySet {
    keys: Vec<VerifyingKey>,
}

impl KeySet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key.
    pub fn push(&mut self, key: VerifyingKey) {
        self.keys.push(key);
    }

    /// Number of keys (one per algorithm a JWK may serve).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set has no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses a JWK Set (RFC 7517 section 5): `{"keys": [ ... ]}`.
    ///
    /// Each JWK becomes one key per algorithm it may serve: its `alg` if present; otherwise by
    /// `kty`/`crv`: RSA for RS*/PS*, EC P-256 for ES256, EC P-384 for ES384, OKP Ed25519 for EdDSA.
    /// Keys whose `use` is not `sig` are skipped. With `strict`, any key that cannot be used is an
    /// error (configuration); otherwise it is skipped and reported in the returned list (remote JWKS).
    pub fn from_jwks(json: &str, strict: bool) -> Result<(Self, Vec<String>), String> {
        let doc: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        let keys = doc.get("keys").and_then(Value::as_array).ok_or_else(|| {
            "a JWKS is an object with a `keys` array (RFC 7517 section 5)".to_string()
        })?;
        let mut set = KeySet::new();
        let mut skipped = Vec::new();
        for (i, jwk) in keys.iter().enumerate() {
            match Self::keys_of_jwk(jwk) {
                Ok(found) if !found.is_empty() => set.keys.extend(found),
                Ok(_) => {}
                Err(e) if strict => return Err(format!("keys[{i}]: {e}")),
                Err(e) => skipped.push(format!("keys[{i}]: {e}")),
            }
        }
        if set.is_empty() {
            return Err("the JWKS has no usable signature key".into());
        }
        Ok((set, skipped))
    }

    fn keys_of_jwk(jwk: &Value) -> Result<Vec<VerifyingKey>, String> {
        let obj = jwk.as_object().ok_or("a JWK must be an object")?;
        let text = |name: &str| obj.get(name).and_then(Value::as_str);
        if let Some(key_use) = text("use") {
            if key_use != "sig" {
                return Ok(Vec::new());
            }
        }
        let kid = text("kid").map(str::to_string);
        let algs: Vec<Alg> = match text("alg") {
            Some(name) => {
                vec![Alg::from_name(name).ok_or_else(|| format!("unsupported alg {name:?}"))?]
            }
            None => match (text("kty"), text("crv")) {
                (Some("RSA"), _) => Alg::RSA.to_vec(),
                (Some("EC"), Some("P-256")) => vec![Alg::ES256],
                (Some("EC"), Some("P-384")) => vec![Alg::ES384],
                (Some("OKP"), Some("Ed25519")) => vec![Alg::EdDSA],
                (kty, crv) => return Err(format!("unsupported key type kty={kty:?} crv={crv:?}")),
            },
        };
        let text = jwk.to_string();
        algs.into_iter()
            .map(|alg| VerifyingKey::from_jwk(alg, &text, kid.clone()))
            .collect()
    }

    /// The keys that may verify a token with header `alg` and `kid`: keys of that algorithm whose
    /// `kid` equals the token's, or that have no `kid`; every key of the algorithm when the token
    /// has no `kid`.
    pub fn candidates<'a>(
        &'a self,
        alg: Alg,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a VerifyingKey> + 'a {
        self.keys.iter().filter(move |k| {
            k.alg == alg
                && match (kid, k.kid.as_deref()) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                }
        })
    }
}
