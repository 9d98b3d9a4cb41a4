//! The host a request is for, in one canonical form, so that a rule written for a host matches
//! every spelling that the proxy, DNS or the upstream read as that host.
//!
//! The source is `:authority`: the authority the proxy routes on and forwards. Envoy sets it from
//! an absolute-form target (`GET http://h/x HTTP/1.1`) or the Host header; the nginx host gives
//! the absolute-form target's authority before the Host header, as nginx selects the server with
//! it and forwards it as `$host` (RFC 9112 section 3.2.2: a server MUST ignore the Host header of
//! an absolute-form request and use the target's authority).
//!
//! The canonical form of `host[:port]` (RFC 3986 section 3.2.2, with the narrower rules of DNS
//! names, RFC 1035 section 2.3.4, and of the URL Standard's host parser for numbers):
//! - the port is dropped (a rule's host matches on every port); it must be 0 to 65535 in decimal
//!   digits, or empty (`h:`);
//! - ASCII letters are lower-cased (DNS names are case-insensitive, RFC 4343);
//! - one trailing dot is dropped (`api.example.com.` is the fully qualified spelling of the same
//!   name; nginx drops it too);
//! - a name is dot-separated labels of 1 to 63 bytes of letters, digits, `-` and `_`, at most 253
//!   bytes in all; internationalised names arrive in their A-label (`xn--`) form, as HTTP sends
//!   them;
//! - a name whose last label is a number (all digits, or `0x` and hex digits) is an IPv4 address
//!   to the URL Standard's host parser ("ends in a number"), which reads `127.1`, `0x7f.0.0.1`
//!   and `2130706433` as 127.0.0.1: it must be written in dotted decimal, four parts of 0 to 255
//!   without leading zeros;
//! - an IPv6 literal (`[::1]`) is written as RFC 5952 section 4 says (lower case, the longest run
//!   of zero groups compressed), in brackets; zone identifiers and IPvFuture are refused.
//!
//! Anything else is refused: empty, user information (`user@host`), percent-encoding, bytes
//! outside the above, empty labels (`a..b`, `.a`), a bad port. A filter that reads the host
//! answers such a request 400 (`invalid_authority`).

use std::borrow::Cow;
use std::fmt;
use std::net::Ipv6Addr;

/// Longest DNS name without its trailing dot (RFC 1035 section 2.3.4: 255 octets on the wire).
pub const MAX_NAME_BYTES: usize = 253;
/// Longest label (RFC 1035 section 2.3.4).
pub const MAX_LABEL_BYTES: usize = 63;

/// Why an authority has no canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityError {
    /// No authority at all (HTTP/1.0 without Host), or an empty host.
    Empty,
    /// A byte that no host spelling carries (`@`, `%`, space, controls, non-ASCII, ...).
    Character,
    /// An empty label, a label over 63 bytes or a name over 253 bytes.
    Label,
    /// A numeric last label that is not a dotted-decimal IPv4 address in canonical form.
    Number,
    /// A bracketed literal that is not a plain IPv6 address.
    Ipv6,
    /// A port that is not 0 to 65535 in decimal digits.
    Port,
}

impl AuthorityError {
    /// A description for error bodies and logs.
    pub fn description(self) -> &'static str {
        match self {
            Self::Empty => "the request names no host",
            Self::Character => "the host contains a character no host name may contain",
            Self::Label => "the host has an empty or overlong label",
            Self::Number => {
                "a numeric host must be an IPv4 address in dotted decimal without leading zeros"
            }
            Self::Ipv6 => "the bracketed host is not an IPv6 address",
            Self::Port => "the port is not a number from 0 to 65535",
        }
    }
}

impl fmt::Display for AuthorityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// The canonical host of an `:authority` value (see the module documentation): borrowed when the
/// value is already canonical and has no port, the common case.
///
/// # Errors
/// [`AuthorityError`] when the value has no canonical form.
pub fn canonical_host(authority: &[u8]) -> Result<Cow<'_, str>, AuthorityError> {
    let (host, port) = split_port(authority)?;
    if let Some(port) = port {
        check_port(port)?;
    }
    if host.first() == Some(&b'[') {
        return ipv6_literal(host).map(Cow::Owned);
    }
    let name = host.strip_suffix(b".").unwrap_or(host);
    check_name(name)?;
    let lower = !name.iter().any(u8::is_ascii_uppercase);
    // Checked above: ASCII only.
    let text = crate::bytes::utf8(name).map_err(|_| AuthorityError::Character)?;
    if lower && name.len() == authority.len() {
        Ok(Cow::Borrowed(text))
    } else {
        Ok(Cow::Owned(text.to_ascii_lowercase()))
    }
}

/// `host` and the port's digits (`None` without a port). A bracketed literal ends at `]`.
fn split_port(authority: &[u8]) -> Result<(&[u8], Option<&[u8]>), AuthorityError> {
    if authority.is_empty() {
        return Err(AuthorityError::Empty);
    }
    if authority.first() == Some(&b'[') {
        let end = authority
            .iter()
            .position(|&b| b == b']')
            .ok_or(AuthorityError::Ipv6)?;
        let (host, rest) = authority.split_at(end.saturating_add(1));
        return match rest.split_first() {
            None => Ok((host, None)),
            Some((b':', port)) => Ok((host, Some(port))),
            Some(_) => Err(AuthorityError::Ipv6),
        };
    }
    match authority.iter().rposition(|&b| b == b':') {
        Some(at) => {
            let (host, rest) = authority.split_at(at);
            Ok((host, rest.get(1..)))
        }
        None => Ok((authority, None)),
    }
}

/// An empty port is allowed (RFC 3986 section 3.2.3: `port = *DIGIT`), otherwise 0 to 65535.
fn check_port(port: &[u8]) -> Result<(), AuthorityError> {
    if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
        return Err(AuthorityError::Port);
    }
    let value = port.iter().fold(0u32, |n, &d| {
        n.saturating_mul(10)
            .saturating_add(u32::from(d.wrapping_sub(b'0')))
    });
    if value > 65_535 {
        return Err(AuthorityError::Port);
    }
    Ok(())
}

/// A DNS name or a dotted-decimal IPv4 address (without the trailing dot).
fn check_name(name: &[u8]) -> Result<(), AuthorityError> {
    if name.is_empty() {
        return Err(AuthorityError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(AuthorityError::Label);
    }
    let mut last: &[u8] = &[];
    for label in name.split(|&b| b == b'.') {
        if label.is_empty() || label.len() > MAX_LABEL_BYTES {
            return Err(AuthorityError::Label);
        }
        if !label
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(AuthorityError::Character);
        }
        last = label;
    }
    if is_number(last) && !is_dotted_quad(name) {
        return Err(AuthorityError::Number);
    }
    Ok(())
}

/// The URL Standard's "ends in a number" test on the last label: decimal digits, or `0x`/`0X`
/// and hex digits (possibly none).
fn is_number(label: &[u8]) -> bool {
    if label.iter().all(u8::is_ascii_digit) {
        return true;
    }
    match label {
        [b'0', b'x' | b'X', hex @ ..] => hex.iter().all(u8::is_ascii_hexdigit),
        _ => false,
    }
}

/// Four decimal parts of 0 to 255, none with a leading zero.
fn is_dotted_quad(name: &[u8]) -> bool {
    let mut parts = 0usize;
    for part in name.split(|&b| b == b'.') {
        parts = parts.saturating_add(1);
        let canonical = match part {
            [b'0'] => true,
            [b'1'..=b'9', rest @ ..] => rest.len() <= 2 && rest.iter().all(u8::is_ascii_digit),
            _ => false,
        };
        let value = part.iter().fold(0u32, |n, &d| {
            n.saturating_mul(10)
                .saturating_add(u32::from(d.wrapping_sub(b'0')))
        });
        if !canonical || value > 255 {
            return false;
        }
    }
    parts == 4
}

/// `[IPv6address]` in RFC 5952's text form (Rust's `Ipv6Addr` display follows it).
fn ipv6_literal(host: &[u8]) -> Result<String, AuthorityError> {
    let inner = host
        .strip_prefix(b"[")
        .and_then(|h| h.strip_suffix(b"]"))
        .ok_or(AuthorityError::Ipv6)?;
    let text = std::str::from_utf8(inner).map_err(|_| AuthorityError::Ipv6)?;
    let address: Ipv6Addr = text.parse().map_err(|_| AuthorityError::Ipv6)?;
    Ok(format!("[{address}]"))
}

/// A configured host (a rule's `hosts` entry) in canonical form; the error names what is wrong.
///
/// # Errors
/// The [`AuthorityError`] of a host that has no canonical form; a configured host with a port
/// is refused too (rules match every port).
pub fn canonical_config_host(host: &str) -> Result<String, AuthorityError> {
    let (_, port) = split_port(host.as_bytes())?;
    if port.is_some() {
        return Err(AuthorityError::Port);
    }
    canonical_host(host.as_bytes()).map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(a: &str) -> Result<String, AuthorityError> {
        canonical_host(a.as_bytes()).map(Cow::into_owned)
    }

    #[test]
    fn folds_the_spellings_of_one_host() {
        for spelling in [
            "api.example.com",
            "API.Example.COM",
            "api.example.com.",
            "api.example.com:80",
            "api.example.com:443",
            "api.example.com:",
            "Api.Example.Com.:8443",
        ] {
            assert_eq!(
                canon(spelling).as_deref(),
                Ok("api.example.com"),
                "{spelling}"
            );
        }
        assert!(matches!(
            canonical_host(b"api.example.com"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(
            canon("xn--bcher-kva.example").as_deref(),
            Ok("xn--bcher-kva.example")
        );
        assert_eq!(canon("my_host.internal").as_deref(), Ok("my_host.internal"));
        assert_eq!(canon("localhost").as_deref(), Ok("localhost"));
    }

    #[test]
    fn addresses() {
        assert_eq!(canon("127.0.0.1:8080").as_deref(), Ok("127.0.0.1"));
        assert_eq!(canon("10.0.0.255").as_deref(), Ok("10.0.0.255"));
        for numeric in [
            "127.1",
            "0x7f.0.0.1",
            "0x7F.1",
            "2130706433",
            "127.000.0.1",
            "127.0.0.01",
            "256.0.0.1",
            "1.2.3.4.5",
            "017700000001",
            "a.0x",
            "example.123",
        ] {
            assert_eq!(canon(numeric), Err(AuthorityError::Number), "{numeric}");
        }
        // A numeric label that is not the last one makes no number.
        assert_eq!(canon("1.example").as_deref(), Ok("1.example"));
        assert_eq!(canon("[::1]").as_deref(), Ok("[::1]"));
        assert_eq!(canon("[0:0:0:0:0:0:0:1]:443").as_deref(), Ok("[::1]"));
        assert_eq!(canon("[2001:DB8::A]").as_deref(), Ok("[2001:db8::a]"));
        assert_eq!(
            canon("[2001:db8:0:0:1:0:0:1]").as_deref(),
            Ok("[2001:db8::1:0:0:1]")
        );
        assert_eq!(
            canon("[::ffff:192.0.2.1]").as_deref(),
            Ok("[::ffff:192.0.2.1]")
        );
        for bad in [
            "[::1",
            "[fe80::1%25eth0]",
            "[v1.x]",
            "[::1]x",
            "[::1]:99999",
            "[]",
        ] {
            assert!(canon(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_what_names_no_host() {
        let cases: &[(&str, AuthorityError)] = &[
            ("", AuthorityError::Empty),
            (":80", AuthorityError::Empty),
            (".", AuthorityError::Empty),
            ("user@api.example.com", AuthorityError::Character),
            ("api%2eexample.com", AuthorityError::Character),
            ("api.example.com%00", AuthorityError::Character),
            ("api example.com", AuthorityError::Character),
            ("api.exämple.com", AuthorityError::Character),
            ("api\\example.com", AuthorityError::Character),
            ("api.example.com/x", AuthorityError::Character),
            ("a..b", AuthorityError::Label),
            (".a", AuthorityError::Label),
            ("a.com..", AuthorityError::Label),
            ("api.example.com:8o", AuthorityError::Port),
            ("api.example.com:65536", AuthorityError::Port),
            ("api.example.com:000080", AuthorityError::Port),
            ("a:b:c", AuthorityError::Port),
        ];
        for (value, error) in cases {
            assert_eq!(canon(value), Err(*error), "{value:?}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert_eq!(canon(&long_label), Err(AuthorityError::Label));
        let long_name = ["abcdefghi"; 26].join(".");
        assert_eq!(long_name.len(), 259);
        assert_eq!(canon(&long_name), Err(AuthorityError::Label));
        assert!(canon(&"a.".repeat(126)).is_ok());
    }

    #[test]
    fn configured_hosts() {
        assert_eq!(
            canonical_config_host("API.example.com.").as_deref(),
            Ok("api.example.com")
        );
        assert_eq!(
            canonical_config_host("api.example.com:443"),
            Err(AuthorityError::Port)
        );
        assert_eq!(
            canonical_config_host("*.example.com"),
            Err(AuthorityError::Character)
        );
    }
}
