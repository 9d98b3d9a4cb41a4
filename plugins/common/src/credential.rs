//! A credential (an API key, an `Authorization` value) in the one form that every spelling the
//! upstream accepts as that credential shares, so that a tenant, a rate-limit key or a cache key
//! derived from it is one key per credential, not one per spelling.
//!
//! Rules, for a header's value with its optional whitespace (SP, HTAB) trimmed (RFC 9110
//! section 5.5):
//! - `Authorization` and `Proxy-Authorization` hold `auth-scheme 1*SP token68` (RFC 9110 section
//!   11.4; section 11.2 for `token68`). The scheme is case-insensitive (section 11.1): it is
//!   written as registered in IANA's HTTP Authentication Scheme Registry (`Basic`, `Bearer`,
//!   `Digest`, `DPoP`, `HOBA`, `Mutual`, `Negotiate`, `OAuth`, `PrivateToken`, `SCRAM-SHA-1`,
//!   `SCRAM-SHA-256`, `vapid`) or in lower case when unregistered; the spaces after it are one.
//!   A `Basic` credential is the base64 of `user-id:password` (RFC 7617 section 2): it is decoded
//!   and written again in canonical base64 (padded, no stray trailing bits), since lenient
//!   decoders accept it without padding or with other trailing bits. Any other `token68` is kept
//!   byte for byte (a bearer token is case-sensitive). The `#auth-param` form (`Digest a=b`),
//!   a scheme without credentials and anything else are refused: a key cannot be told from its
//!   spellings there.
//! - Any other header (`x-api-key`, `api-key`) holds the key itself: visible ASCII without
//!   spaces or commas (a comma makes it a list, RFC 9110 section 5.3).
//! - The header must appear once, counting the spellings that CGI-style upstreams read as its name
//!   (`x_api_key` for `x-api-key`, [`crate::http::cgi_fold`]): with two, the filter and the
//!   upstream may each take another one (Go's `Header.Get` the first, PHP's `$_SERVER` the last,
//!   a WSGI server both joined by a comma).

use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

/// Why a header's value is not one credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialError {
    /// The header appears more than once (under any of its CGI spellings).
    Repeated,
    /// Empty after trimming.
    Empty,
    /// Not `scheme token68` (an `Authorization` header), or not a plain key.
    Syntax,
    /// A `Basic` credential that is not base64.
    Base64,
    /// The host could not list the request's headers.
    Unreadable,
}

impl CredentialError {
    /// A description for error bodies and logs (names no part of the value).
    pub fn description(self) -> &'static str {
        match self {
            Self::Repeated => "the credential header is sent more than once",
            Self::Empty => "the credential header is empty",
            Self::Syntax => {
                "the credential header is not one credential in a form this gateway reads"
            }
            Self::Base64 => "the Basic credential is not base64",
            Self::Unreadable => "the request's headers cannot be read",
        }
    }
}

impl fmt::Display for CredentialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// Schemes of IANA's HTTP Authentication Scheme Registry, as registered.
const REGISTERED_SCHEMES: &[&str] = &[
    "Basic",
    "Bearer",
    "Digest",
    "DPoP",
    "HOBA",
    "Mutual",
    "Negotiate",
    "OAuth",
    "PrivateToken",
    "SCRAM-SHA-1",
    "SCRAM-SHA-256",
    "vapid",
];

/// Whether `name` (lower case) holds `auth-scheme token68` rather than a bare key.
pub fn is_authorization_header(name: &str) -> bool {
    name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case("proxy-authorization")
}

/// The canonical form of `values`, every value of header `name` (lower case) and of its CGI
/// spellings in the request (see the module documentation). `Ok(None)`: the header is absent.
///
/// # Errors
/// [`CredentialError`] when the header is repeated or its value is not one credential.
pub fn canonical_credential(
    name: &str,
    values: &[Vec<u8>],
) -> Result<Option<Vec<u8>>, CredentialError> {
    let value = match values {
        [] => return Ok(None),
        [one] => trim_ows(one),
        _ => return Err(CredentialError::Repeated),
    };
    if value.is_empty() {
        return Err(CredentialError::Empty);
    }
    if is_authorization_header(name) {
        authorization(value).map(Some)
    } else if value.iter().all(|&b| b.is_ascii_graphic() && b != b',') {
        Ok(Some(value.to_vec()))
    } else {
        Err(CredentialError::Syntax)
    }
}

fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !ows(b))
        .map_or(start, |e| e.saturating_add(1));
    value.get(start..end).unwrap_or_default()
}

/// `auth-scheme 1*SP token68`, canonical.
fn authorization(value: &[u8]) -> Result<Vec<u8>, CredentialError> {
    let split = value
        .iter()
        .position(|&b| b == b' ')
        .ok_or(CredentialError::Syntax)?;
    let (scheme, rest) = value.split_at(split);
    let token = trim_ows(rest);
    if scheme.is_empty() || !scheme.iter().copied().all(is_tchar) || !is_token68(token) {
        return Err(CredentialError::Syntax);
    }
    let scheme = crate::bytes::utf8(scheme).map_err(|_| CredentialError::Syntax)?;
    let registered = REGISTERED_SCHEMES
        .iter()
        .find(|s| s.eq_ignore_ascii_case(scheme));
    let mut out = Vec::with_capacity(value.len());
    match registered {
        Some(s) => out.extend_from_slice(s.as_bytes()),
        None => out.extend_from_slice(scheme.to_ascii_lowercase().as_bytes()),
    }
    out.push(b' ');
    if registered == Some(&"Basic") {
        out.extend_from_slice(STANDARD.encode(basic_user_pass(token)?).as_bytes());
    } else {
        out.extend_from_slice(token);
    }
    Ok(out)
}

/// Base64 as lenient decoders read it: padding optional, trailing bits ignored.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

fn basic_user_pass(token: &[u8]) -> Result<Vec<u8>, CredentialError> {
    LENIENT.decode(token).map_err(|_| CredentialError::Base64)
}

/// RFC 9110 section 5.6.2's `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 9110 section 11.2: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_token68(token: &[u8]) -> bool {
    let body_end = token
        .iter()
        .rposition(|&b| b != b'=')
        .map_or(0, |e| e.saturating_add(1));
    let (body, _) = token.split_at(body_end);
    !body.is_empty()
        && body
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(name: &str, value: &str) -> Result<Option<String>, CredentialError> {
        canonical_credential(name, &[value.as_bytes().to_vec()])
            .map(|c| c.map(|c| String::from_utf8(c).unwrap()))
    }

    #[test]
    fn one_credential_many_spellings() {
        for spelling in [
            "Bearer sk-abc.DEF_123",
            "bearer sk-abc.DEF_123",
            "BEARER sk-abc.DEF_123",
            "BeArEr   sk-abc.DEF_123",
            " \tBearer sk-abc.DEF_123\t ",
        ] {
            assert_eq!(
                canon("authorization", spelling).unwrap().as_deref(),
                Some("Bearer sk-abc.DEF_123"),
                "{spelling:?}"
            );
        }
        // The token itself is case-sensitive.
        assert_eq!(
            canon("authorization", "Bearer SK-ABC.def_123")
                .unwrap()
                .as_deref(),
            Some("Bearer SK-ABC.def_123")
        );
        assert_eq!(
            canon("proxy-authorization", "NEGOTIATE abc==")
                .unwrap()
                .as_deref(),
            Some("Negotiate abc==")
        );
        assert_eq!(
            canon("authorization", "MyScheme Tok").unwrap().as_deref(),
            Some("myscheme Tok")
        );
    }

    #[test]
    fn basic_is_compared_decoded() {
        // `printf 'alice:s3cret' | base64` gives YWxpY2U6czNjcmV0 (coreutils); Python's lenient
        // base64.b64decode reads the same bytes without padding and with other trailing bits.
        for spelling in ["Basic YWxpY2U6czNjcmV0", "basic YWxpY2U6czNjcmV0"] {
            assert_eq!(
                canon("authorization", spelling).unwrap().as_deref(),
                Some("Basic YWxpY2U6czNjcmV0")
            );
        }
        // `printf a | base64` is YQ==; Python's base64.b64decode also reads YR== (the unused bits
        // of R set) as a, and Node's Buffer.from(.., 'base64') reads YQ, unpadded, as a.
        assert_eq!(
            canon("authorization", "Basic YQ").unwrap().as_deref(),
            Some("Basic YQ==")
        );
        assert_eq!(
            canon("authorization", "Basic YR==").unwrap().as_deref(),
            Some("Basic YQ==")
        );
        assert_eq!(
            canon("authorization", "Basic Ym9i-OnB3"),
            Err(CredentialError::Base64)
        );
    }

    #[test]
    fn api_keys_are_plain_values() {
        assert_eq!(
            canon("x-api-key", "  sk-ant-api03-xyz \t")
                .unwrap()
                .as_deref(),
            Some("sk-ant-api03-xyz")
        );
        for bad in ["a b", "a,b", "k\u{e9}y", "a\x01"] {
            assert_eq!(
                canon("x-api-key", bad),
                Err(CredentialError::Syntax),
                "{bad:?}"
            );
        }
        assert_eq!(canon("x-api-key", " \t "), Err(CredentialError::Empty));
    }

    #[test]
    fn refuses_what_is_not_one_credential() {
        for bad in [
            "Bearer",
            "Bearer ",
            "Bearer a b",
            "Bearer a,Bearer b",
            "Bearer a=b=c",
            "Digest username=\"a\", realm=\"b\"",
            "Be@rer tok",
            "tok",
            "Bearer tok\u{e9}",
        ] {
            assert_eq!(
                canon("authorization", bad),
                Err(CredentialError::Syntax),
                "{bad:?}"
            );
        }
        let two = [b"k1".to_vec(), b"k1".to_vec()];
        assert_eq!(
            canonical_credential("x-api-key", &two),
            Err(CredentialError::Repeated)
        );
        assert_eq!(canonical_credential("x-api-key", &[]), Ok(None));
    }
}
