//! The sticky cookie's value: which upstream, until when, and an HMAC-SHA256 tag over both.
//!
//! Format (every part in RFC 6265 section 4.1.1 `cookie-octet`s, so the value needs no quoting):
//!
//! ```text
//! <upstream>.<expiry>.<tag>
//! blue.1767225600.Xw3a…(43 characters)
//! ```
//!
//! - `upstream`: the upstream's name as configured (1 to 128 cookie-octets; it may itself contain
//!   `.`, the value is split from the right).
//! - `expiry`: Unix time in seconds after which the cookie is no longer honoured; canonical
//!   decimal (no sign, no leading zero), at most 20 digits.
//! - `tag`: HMAC-SHA256 (RFC 2104, FIPS 180-4) under the configured secret, untruncated (32 bytes),
//!   base64url without padding (RFC 4648 section 5), 43 characters, over the domain-separated
//!   message
//!
//!   ```text
//!   "tollgate-sticky-upstream/v1" 0x00 <cookie name> 0x00 <upstream> 0x00 <expiry>
//!   ```
//!
//!   None of the parts can contain 0x00 (the configuration only admits cookie-octets and token
//!   characters), so the message is unambiguous. The cookie name is in it so that a cookie minted
//!   for one sticky filter cannot be replayed into another that shares the secret.
//!
//! Verification recomputes the tag and compares it in constant time (`Mac::verify_slice`, which
//! uses the `subtle` crate). Because the tag covers the upstream name, a client cannot move its
//! cookie to another upstream without the secret: changing any byte of the name or the expiry
//! makes verification fail, and the filter then chooses for it as if it had no cookie.
//!
//! Work per verification: no heap allocation; one HMAC over about 60 bytes (the key's inner and
//! outer pads and the domain prefix are absorbed once, at configuration time).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256.
type HmacSha256 = Hmac<Sha256>;

/// Domain-separation prefix of every signed message; a future format changes the version.
const DOMAIN: &[u8] = b"tollgate-sticky-upstream/v1";
/// Length of the tag (bytes): the whole SHA-256 output.
pub const TAG_BYTES: usize = 32;
/// Length of the tag in the cookie (characters of unpadded base64url).
pub const TAG_CHARS: usize = 43;
/// Longest upstream name accepted (bytes), in the configuration and in cookies.
pub const MAX_UPSTREAM_NAME_BYTES: usize = 128;
/// Longest cookie value looked at (bytes); longer ones are malformed without further work.
pub const MAX_VALUE_BYTES: usize = MAX_UPSTREAM_NAME_BYTES + 1 + 20 + 1 + TAG_CHARS;
/// Shortest secret accepted (bytes): the hash output size, as RFC 2104 section 3 recommends.
pub const MIN_SECRET_BYTES: usize = 32;

/// Whether `b` is an RFC 6265 section 4.1.1 `cookie-octet`: visible US-ASCII except DQUOTE,
/// comma, semicolon and backslash. Such bytes are also valid in an HTTP field value
/// (RFC 9110 section 5.5).
pub fn is_cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// Whether `name` can be an upstream name: 1 to [`MAX_UPSTREAM_NAME_BYTES`] cookie-octets.
pub fn is_valid_upstream_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_UPSTREAM_NAME_BYTES && name.bytes().all(is_cookie_octet)
}

/// Why a cookie value is not honoured (before looking at the clock or the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Too long, missing parts, bad characters, bad number or bad base64.
    Syntax,
    /// Well-formed, but the tag does not match: tampered, or signed with another secret or for
    /// another cookie name.
    BadTag,
}

/// A cookie value whose tag verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signed<'v> {
    /// The upstream name, borrowed from the cookie value.
    pub upstream: &'v str,
    /// Unix time (seconds) after which the cookie is no longer honoured.
    pub expiry: u64,
}

/// Signs and verifies cookie values for one cookie name under one secret.
#[derive(Clone)]
pub struct Signer {
    /// The keyed HMAC with `DOMAIN 0x00 <cookie name> 0x00` already absorbed; cloned per use.
    prefixed: HmacSha256,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)") // never print key material
    }
}

impl Signer {
    /// A signer for cookies named `cookie_name` under `secret`. `None` if the secret is shorter
    /// than [`MIN_SECRET_BYTES`].
    pub fn new(secret: &[u8], cookie_name: &str) -> Option<Signer> {
        if secret.len() < MIN_SECRET_BYTES {
            return None;
        }
        // HMAC accepts keys of any length (RFC 2104 section 2); this cannot fail.
        let mut mac = HmacSha256::new_from_slice(secret).ok()?;
        mac.update(DOMAIN);
        mac.update(&[0]);
        mac.update(cookie_name.as_bytes());
        mac.update(&[0]);
        Some(Signer { prefixed: mac })
    }

    fn mac(&self, upstream: &str, expiry_digits: &[u8]) -> HmacSha256 {
        let mut mac = self.prefixed.clone();
        mac.update(upstream.as_bytes());
        mac.update(&[0]);
        mac.update(expiry_digits);
        mac
    }

    /// The cookie value pinning `upstream` until `expiry` (Unix seconds).
    pub fn sign(&self, upstream: &str, expiry: u64) -> String {
        let digits = expiry.to_string();
        let tag = self
            .mac(upstream, digits.as_bytes())
            .finalize()
            .into_bytes();
        let mut out = String::with_capacity(
            upstream
                .len()
                .saturating_add(digits.len())
                .saturating_add(2 + TAG_CHARS),
        );
        out.push_str(upstream);
        out.push('.');
        out.push_str(&digits);
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(tag, &mut out);
        out
    }

    /// Parses `value` and checks its tag. Never panics, whatever the input.
    pub fn verify<'v>(&self, value: &'v str) -> Result<Signed<'v>, Malformed> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(Malformed::Syntax);
        }
        let (rest, tag_b64) = value.rsplit_once('.').ok_or(Malformed::Syntax)?;
        let (upstream, digits) = rest.rsplit_once('.').ok_or(Malformed::Syntax)?;
        let expiry = parse_canonical_u64(digits).ok_or(Malformed::Syntax)?;
        if !is_valid_upstream_name(upstream) || tag_b64.len() != TAG_CHARS {
            return Err(Malformed::Syntax);
        }
        // 43 characters decode to exactly 32 bytes; the slack only satisfies the decoder's
        // conservative size estimate. Non-canonical trailing bits are refused by the engine.
        let mut tag = [0u8; TAG_BYTES + 3];
        let n = URL_SAFE_NO_PAD
            .decode_slice(tag_b64, &mut tag)
            .map_err(|_| Malformed::Syntax)?;
        let tag = tag.get(..n).ok_or(Malformed::Syntax)?;
        if n != TAG_BYTES {
            return Err(Malformed::Syntax);
        }
        self.mac(upstream, digits.as_bytes())
            .verify_slice(tag)
            .map_err(|_| Malformed::BadTag)?;
        Ok(Signed { upstream, expiry })
    }
}

/// A canonical decimal `u64`: 1 to 20 ASCII digits, no sign, no leading zero (except `0`).
fn parse_canonical_u64(s: &str) -> Option<u64> {
    let bytes = s.as_bytes();
    let canonical = !bytes.is_empty()
        && bytes.len() <= 20
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes.len() == 1 || bytes.first() != Some(&b'0'));
    if !canonical {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn round_trip_and_shape() {
        let s = Signer::new(SECRET, "sticky").unwrap();
        let v = s.sign("blue.v2", 1_767_225_600);
        assert!(v.starts_with("blue.v2.1767225600."), "{v}");
        assert_eq!(v.len(), "blue.v2.1767225600.".len() + TAG_CHARS);
        assert!(v.bytes().all(is_cookie_octet), "{v}");
        assert_eq!(
            s.verify(&v),
            Ok(Signed {
                upstream: "blue.v2",
                expiry: 1_767_225_600
            })
        );
    }

    #[test]
    fn the_cookie_name_and_the_secret_are_bound() {
        let a = Signer::new(SECRET, "sticky").unwrap();
        let v = a.sign("blue", 10);
        let other_name = Signer::new(SECRET, "sticky2").unwrap();
        assert_eq!(other_name.verify(&v), Err(Malformed::BadTag));
        let other_secret = Signer::new(b"0123456789abcdef0123456789abcdeX", "sticky").unwrap();
        assert_eq!(other_secret.verify(&v), Err(Malformed::BadTag));
        assert!(Signer::new(&SECRET[..31], "sticky").is_none());
    }

    #[test]
    fn canonical_numbers_only() {
        assert_eq!(parse_canonical_u64("0"), Some(0));
        assert_eq!(parse_canonical_u64("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "01",
            "+1",
            "-1",
            "1e3",
            " 1",
            "18446744073709551616",
            "١",
        ] {
            assert_eq!(parse_canonical_u64(bad), None, "{bad:?}");
        }
    }
}
