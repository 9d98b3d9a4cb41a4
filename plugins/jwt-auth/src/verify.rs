//! Token verification: provider choice by `iss`, key choice by `alg` and `kid`, the signature
//! (jwt-simple), and the claims (RFC 7519 section 4.1) against the host's clock; then what a
//! route allows. Host-free: time and keys are passed in.

use std::collections::HashSet;

use base64::Engine as _;
use jwt_simple::prelude::Audiences;
use serde::Deserialize;
use serde_json::Value;
use tollgate_common::http::is_safe_header_value;

use crate::config::{Action, Config, Provider};
use crate::keys::{Alg, Claims, KeySet};

/// Why a request was refused. [`Reason::as_str`] is the value logged and used as metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    MissingToken,
    TokenTooLarge,
    Malformed,
    UnsupportedAlg,
    UnknownIssuer,
    KeysUnavailable,
    UnknownKid,
    BadSignature,
    Expired,
    NotYetValid,
    MissingExpiration,
    LifetimeTooLong,
    AudienceMismatch,
    MissingClaim,
    BadClaimValue,
    IssuerNotAllowed,
    RouteAudience,
}

impl Reason {
    /// Every reason, for defining one counter each.
    pub const ALL: [Reason; 17] = [
        Reason::MissingToken,
        Reason::TokenTooLarge,
        Reason::Malformed,
        Reason::UnsupportedAlg,
        Reason::UnknownIssuer,
        Reason::KeysUnavailable,
        Reason::UnknownKid,
        Reason::BadSignature,
        Reason::Expired,
        Reason::NotYetValid,
        Reason::MissingExpiration,
        Reason::LifetimeTooLong,
        Reason::AudienceMismatch,
        Reason::MissingClaim,
        Reason::BadClaimValue,
        Reason::IssuerNotAllowed,
        Reason::RouteAudience,
    ];

    /// Snake-case name (log field and metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MissingToken => "missing_token",
            Reason::TokenTooLarge => "token_too_large",
            Reason::Malformed => "malformed",
            Reason::UnsupportedAlg => "unsupported_alg",
            Reason::UnknownIssuer => "unknown_issuer",
            Reason::KeysUnavailable => "keys_unavailable",
            Reason::UnknownKid => "unknown_kid",
            Reason::BadSignature => "bad_signature",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::MissingExpiration => "missing_expiration",
            Reason::LifetimeTooLong => "lifetime_too_long",
            Reason::AudienceMismatch => "audience_mismatch",
            Reason::MissingClaim => "missing_claim",
            Reason::BadClaimValue => "bad_claim_value",
            Reason::IssuerNotAllowed => "issuer_not_allowed",
            Reason::RouteAudience => "route_audience",
        }
    }

    /// HTTP status: 403 where the token is valid but not allowed on the route, 401 otherwise.
    pub fn status(self) -> u32 {
        match self {
            Reason::IssuerNotAllowed | Reason::RouteAudience => 403,
            _ => 401,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 section 3): no error code when the request
    /// has no token (section 3.1), `insufficient_scope` for 403, `invalid_token` otherwise.
    /// Descriptions contain no `"` or `\`, as section 3 requires.
    pub fn challenge(self) -> String {
        match self {
            Reason::MissingToken => "Bearer realm=\"tollgate\"".to_string(),
            _ => {
                let error = if self.status() == 403 {
                    "insufficient_scope"
                } else {
                    "invalid_token"
                };
                format!(
                    "Bearer realm=\"tollgate\", error=\"{error}\", error_description=\"{}\"",
                    self.description()
                )
            }
        }
    }

    /// A short human-readable description.
    pub fn description(self) -> &'static str {
        match self {
            Reason::MissingToken => "Jwt is missing",
            Reason::TokenTooLarge => "Jwt is too large",
            Reason::Malformed => "Jwt is not in the form of Header.Payload.Signature",
            Reason::UnsupportedAlg => "Jwt algorithm is not supported",
            Reason::UnknownIssuer => "Jwt issuer is not configured",
            Reason::KeysUnavailable => "Jwks is not available yet",
            Reason::UnknownKid => "Jwt has no matching key",
            Reason::BadSignature => "Jwt verification fails",
            Reason::Expired => "Jwt is expired",
            Reason::NotYetValid => "Jwt not yet valid",
            Reason::MissingExpiration => "Jwt has no exp claim",
            Reason::LifetimeTooLong => "Jwt lifetime is longer than allowed",
            Reason::AudienceMismatch => "Audiences in Jwt are not allowed",
            Reason::MissingClaim => "Jwt lacks a required claim",
            Reason::BadClaimValue => "Jwt claim has characters not allowed in a header",
            Reason::IssuerNotAllowed => "Jwt issuer is not allowed on this route",
            Reason::RouteAudience => "Jwt audience is not allowed on this route",
        }
    }
}

/// A verified token: what the route check and the request rewrite need. Cached per VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Provider index.
    pub provider: usize,
    /// `exp` (Unix seconds), if any.
    pub expires_at: Option<u64>,
    /// `aud` values.
    pub audiences: Vec<String>,
    /// Headers to set on the request: claims and the payload, per the provider's configuration.
    pub headers: Vec<(String, String)>,
}

/// The JOSE header fields this filter reads (RFC 7515 section 4.1); others are ignored.
#[derive(Deserialize)]
struct JwsHeader {
    alg: String,
    kid: Option<String>,
    crit: Option<Vec<String>>,
    typ: Option<String>,
}

/// Largest accepted encoded JOSE header (bytes), as jwt-simple's limit.
const MAX_HEADER_B64: usize = 8192;

/// Parses the JOSE header once: UTF-8 JSON (RFC 7515 section 4) whose `typ`, when present, is
/// `JWT` or ends in `+JWT` (RFC 7519 section 5.1, RFC 8725 section 3.11), as jwt-simple requires.
fn parse_header(token: &str) -> Result<JwsHeader, Reason> {
    let encoded = token.split('.').next().ok_or(Reason::Malformed)?;
    if encoded.len() > MAX_HEADER_B64 {
        return Err(Reason::Malformed);
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| Reason::Malformed)?;
    // UTF-8 as a whole (RFC 7519 section 7.2 step 4): serde_json does not check the strings of
    // the members it skips. Found by fuzz/fuzz_targets/jwt_compact.rs.
    let text = tollgate_common::bytes::utf8(&bytes).map_err(|_| Reason::Malformed)?;
    let header: JwsHeader = serde_json::from_str(text).map_err(|_| Reason::Malformed)?;
    if header.typ.as_deref().is_some_and(|typ| !is_jwt_type(typ)) {
        return Err(Reason::Malformed);
    }
    Ok(header)
}

/// Whether a `typ` is `JWT` or ends in `+JWT`, ASCII case-insensitively (media types are,
/// RFC 2045 section 5.1), without an upper-cased copy.
fn is_jwt_type(typ: &str) -> bool {
    let bytes = typ.as_bytes();
    let suffix = bytes
        .len()
        .checked_sub(4)
        .and_then(|start| bytes.get(start..));
    typ.eq_ignore_ascii_case("JWT") || suffix.is_some_and(|s| s.eq_ignore_ascii_case(b"+JWT"))
}

#[derive(Deserialize)]
struct IssuerOnly {
    iss: Option<String>,
}

/// Reads `iss` from the payload without verifying it, to choose the provider.
fn peek_issuer(token: &str) -> Result<Option<String>, Reason> {
    let payload = token.split('.').nth(1).ok_or(Reason::Malformed)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| Reason::Malformed)?;
    let claims: IssuerOnly = serde_json::from_slice(&bytes).map_err(|_| Reason::Malformed)?;
    Ok(claims.iss)
}

/// Checks the compact serialization's shape (RFC 7515 section 7.1): three non-empty parts of
/// the base64url alphabet (RFC 4648 section 5, no padding) joined by two dots. One pass over the
/// bytes: this runs on every request that carries a token.
fn well_formed(token: &str) -> bool {
    let (mut dots, mut part_empty) = (0u8, true);
    for &b in token.as_bytes() {
        match b {
            b'.' if part_empty || dots == 2 => return false,
            b'.' => (dots, part_empty) = (dots.saturating_add(1), true),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => part_empty = false,
            _ => return false,
        }
    }
    dots == 2 && !part_empty
}

/// Chooses the provider of a token by its `iss`: the provider with that issuer, else the one
/// configured without an issuer.
fn choose_provider(config: &Config, token: &str) -> Result<usize, Reason> {
    if let [only] = config.providers.as_slice() {
        let _ = only;
        return Ok(0);
    }
    let iss = peek_issuer(token)?;
    let by_issuer = iss.as_deref().and_then(|iss| {
        config
            .providers
            .iter()
            .position(|p| p.issuer.as_deref() == Some(iss))
    });
    by_issuer
        .or_else(|| config.providers.iter().position(|p| p.issuer.is_none()))
        .ok_or(Reason::UnknownIssuer)
}

/// Verifies `token` at time `now` (Unix seconds). `keys(provider)` gives a provider's current
/// keys (`None` while a remote JWKS has not been fetched yet).
pub fn verify<'k>(
    config: &Config,
    keys: impl Fn(usize) -> Option<&'k KeySet>,
    token: &str,
    now: u64,
) -> Result<Verified, Reason> {
    if token.len() > config.max_token_bytes {
        return Err(Reason::TokenTooLarge);
    }
    if !well_formed(token) {
        return Err(Reason::Malformed);
    }
    let header = parse_header(token)?;
    let alg = Alg::from_name(&header.alg).ok_or(Reason::UnsupportedAlg)?;
    // No `crit` extension is understood, so a token that lists any is refused (RFC 7515 4.1.11).
    if header.crit.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(Reason::Malformed);
    }
    let provider_id = choose_provider(config, token)?;
    let provider = config
        .providers
        .get(provider_id)
        .ok_or(Reason::UnknownIssuer)?;
    let set = keys(provider_id).ok_or(Reason::KeysUnavailable)?;
    let mut tried = false;
    let mut claims = None;
    for key in set.candidates(alg, header.kid.as_deref()) {
        tried = true;
        if let Ok(c) = key.verify(token) {
            claims = Some(c);
            break;
        }
    }
    let claims = match (tried, claims) {
        (false, _) => return Err(Reason::UnknownKid),
        (true, None) => return Err(Reason::BadSignature),
        (true, Some(c)) => c,
    };
    validate_claims(provider, &claims, now)?;
    let headers = output_headers(provider, &claims, token)?;
    Ok(Verified {
        provider: provider_id,
        expires_at: claims.expires_at.map(|t| t.as_secs()),
        audiences: claims.audiences.map(audience_list).unwrap_or_default(),
        headers,
    })
}

/// The `aud` values as a list: jwt-simple's `Audiences::into_set` (a string is one audience, an
/// empty string none) without building a `HashSet` for the usual single string.
fn audience_list(audiences: Audiences) -> Vec<String> {
    match audiences {
        Audiences::AsString(one) if one.is_empty() => Vec::new(),
        Audiences::AsString(one) => vec![one],
        Audiences::AsSet(set) => set.into_iter().collect(),
    }
}

/// RFC 7519 section 4.1 checks against `now` (Unix seconds), with the provider's clock skew.
pub fn validate_claims(provider: &Provider, claims: &Claims, now: u64) -> Result<(), Reason> {
    let skew = provider.clock_skew_seconds;
    if let Some(iss) = &provider.issuer {
        if claims.issuer.as_ref() != Some(iss) {
            return Err(Reason::UnknownIssuer);
        }
    }
    let exp = claims.expires_at.map(|t| t.as_secs());
    match exp {
        Some(exp) if now > exp.saturating_add(skew) => return Err(Reason::Expired),
        None if provider.require_expiration || provider.max_lifetime_seconds.is_some() => {
            return Err(Reason::MissingExpiration)
        }
        _ => {}
    }
    if let Some(nbf) = claims.invalid_before.map(|t| t.as_secs()) {
        if now.saturating_add(skew) < nbf {
            return Err(Reason::NotYetValid);
        }
    }
    if let (Some(max), Some(exp)) = (provider.max_lifetime_seconds, exp) {
        let start = claims.issued_at.map_or(now, |t| t.as_secs());
        if exp.saturating_sub(start) > max {
            return Err(Reason::LifetimeTooLong);
        }
    }
    if !provider.audiences.is_empty()
        && !claims
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&provider.audiences))
    {
        return Err(Reason::AudienceMismatch);
    }
    for name in &provider.required_claims {
        if claim(claims, name).is_none_or(|v| v.is_null()) {
            return Err(Reason::MissingClaim);
        }
    }
    Ok(())
}

/// A claim's value by name; `a.b` walks into objects of non-registered claims.
pub fn claim(claims: &Claims, name: &str) -> Option<Value> {
    let secs = |t: Option<jwt_simple::prelude::UnixTimeStamp>| t.map(|t| Value::from(t.as_secs()));
    match name {
        "iss" => claims.issuer.clone().map(Value::from),
        "sub" => claims.subject.clone().map(Value::from),
        "jti" => claims.jwt_id.clone().map(Value::from),
        "nonce" => claims.nonce.clone().map(Value::from),
        "exp" => secs(claims.expires_at),
        "iat" => secs(claims.issued_at),
        "nbf" => secs(claims.invalid_before),
        "aud" => claims.audiences.clone().map(|a| match a {
            Audiences::AsString(s) => Value::from(s),
            Audiences::AsSet(set) => Value::from(set.into_iter().collect::<Vec<_>>()),
        }),
        _ => {
            let mut parts = name.split('.');
            let first = parts.next()?;
            let mut v = claims.custom.get(first)?;
            for p in parts {
                v = v.get(p)?;
            }
            Some(v.clone())
        }
    }
}

fn output_headers(
    provider: &Provider,
    claims: &Claims,
    token: &str,
) -> Result<Vec<(String, String)>, Reason> {
    let mut headers = Vec::new();
    for c in &provider.claim_to_headers {
        let value = match claim(claims, &c.claim) {
            Some(Value::String(s)) => s,
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::Bool(b)) => b.to_string(),
            _ => continue, // absent, null, arrays and objects are not forwarded
        };
        if !is_safe_header_value(&value) {
            return Err(Reason::BadClaimValue);
        }
        headers.push((c.header.clone(), value));
    }
    if let Some(h) = &provider.forward_payload_header {
        if let Some(payload) = token.split('.').nth(1) {
            headers.push((h.clone(), payload.to_string()));
        }
    }
    Ok(headers)
}

/// Whether a verified token is allowed by a `Require` action at `now` (Unix seconds): its
/// provider must be one of the action's and, if the action lists audiences, the token must
/// carry one of them. Re-checks `exp` so that cached entries never outlive their token.
pub fn authorize(
    config: &Config,
    action: &Action,
    verified: &Verified,
    now: u64,
) -> Result<(), Reason> {
    let Action::Require {
        providers,
        audiences,
        ..
    } = action
    else {
        return Ok(());
    };
    if let (Some(exp), Some(p)) = (verified.expires_at, config.providers.get(verified.provider)) {
        if now > exp.saturating_add(p.clock_skew_seconds) {
            return Err(Reason::Expired);
        }
    }
    if !providers.contains(&verified.provider) {
        return Err(Reason::IssuerNotAllowed);
    }
    if !audiences.is_empty() && !verified.audiences.iter().any(|a| audiences.contains(a)) {
        return Err(Reason::RouteAudience);
    }
    Ok(())
}

/// The audiences set type used by actions, re-exported for tests.
pub type AudienceSet = HashSet<String>;

#[cfg(test)]
mod tests {
    use super::{audience_list, is_jwt_type, well_formed};
    use jwt_simple::prelude::Audiences;
    use std::collections::HashSet;

    #[test]
    fn jwt_types_as_upper_casing_would_accept() {
        // The test before this check existed: upper-case, then `JWT` or a `+JWT` suffix.
        let reference = |typ: &str| {
            let upper = typ.to_ascii_uppercase();
            upper == "JWT" || upper.ends_with("+JWT")
        };
        let parts = [
            "", "j", "J", "w", "t", "+", "jwt", "JWT", "jWt", "+jwt", "at+JWT", "é", "ǰ", "x",
        ];
        for a in parts {
            for b in parts {
                for c in parts {
                    let typ = format!("{a}{b}{c}");
                    assert_eq!(is_jwt_type(&typ), reference(&typ), "{typ:?}");
                }
            }
        }
    }

    #[test]
    fn audience_list_is_into_set() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        for a in [
            Audiences::AsString(String::new()),
            Audiences::AsString("bench".into()),
            Audiences::AsSet(set(&[])),
            Audiences::AsSet(set(&["a", "b", ""])),
        ] {
            let list: HashSet<String> = audience_list(a.clone()).into_iter().collect();
            assert_eq!(list, a.into_set());
        }
    }

    /// RFC 7515 section 7.1 read literally: split at dots, three parts, each non-empty base64url.
    fn by_split(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
    }

    #[test]
    fn well_formed_agrees_with_splitting_on_every_short_string() {
        // Every string of up to 7 bytes over dots, both alphabets' extra bytes, padding,
        // whitespace and a non-ASCII letter.
        let alphabet = ["a", "Z", "9", "-", "_", ".", "=", "+", " ", "é"];
        let mut strings = vec![String::new()];
        for _ in 0..7 {
            let mut longer = Vec::new();
            for s in &strings {
                for c in alphabet {
                    let t = format!("{s}{c}");
                    assert_eq!(well_formed(&t), by_split(&t), "{t:?}");
                    longer.push(t);
                }
            }
            // Keep the dotted ones and a sample of the rest, so the set stays small.
            strings = longer
                .into_iter()
                .enumerate()
                .filter(|(i, s)| s.contains('.') || i % 7 == 0)
                .map(|(_, s)| s)
                .collect();
        }
        assert!(well_formed("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"));
        assert!(!well_formed("a.b.c.d") && !well_formed("a..c") && !well_formed(".b.c"));
    }
}
