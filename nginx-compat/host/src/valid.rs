//! What a guest may write into a header map, a local response or an HTTP call, and how much
//! host memory one stream's maps and properties, and one instance's pending calls, may take.
//!
//! Names: an RFC 9110 §5.1 field name is a `token` (§5.6.2: `!#$%&'*+-.^_`|~`, digits,
//! letters); HTTP/2-style pseudo-headers (`:path`, `:status`...) are a `:` and a token. Values:
//! RFC 9110 §5.5 forbids CR, LF and NUL in field values (a CR or LF would end the field and let a
//! filter inject another one). Envoy refuses both the same way (`HeaderUtility`'s
//! `headerNameIsValid` / `headerValueIsValid`); the host functions answer `BadArgument`.

use crate::header_map::HeaderMap;

/// Most bytes (names and values) of one header or trailer map, and of the properties a stream's
/// filters set: a guest looping on `proxy_add_header_map_value` or `proxy_set_property` within
/// its deadline cannot make the host allocate more (`BadArgument` beyond).
pub const MAX_MAP_BYTES: usize = 1 << 20;

/// Most HTTP calls one instance may have pending (`InternalFailure` beyond, which the SDKs
/// report as an error): a guest dispatching in a loop cannot queue unbounded work and memory.
pub const MAX_PENDING_CALLS: usize = 1024;

/// RFC 9110 token characters, by byte: one lookup a byte (every header a guest writes is checked).
#[allow(clippy::indexing_slicing)] // b < 256, the table's length, at every step
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0usize;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// `true` for an RFC 9110 token character.
fn tchar(b: u8) -> bool {
    TCHAR.get(usize::from(b)).copied().unwrap_or(false)
}

/// A valid field name: a token, or `:` and a token (a pseudo-header).
pub fn name(n: &[u8]) -> bool {
    let token = n.strip_prefix(b":").unwrap_or(n);
    !token.is_empty() && token.iter().all(|&b| tchar(b))
}

/// A valid field value: no CR, LF or NUL.
pub fn value(v: &[u8]) -> bool {
    !v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0)
}

/// Bytes of names and values in `m`.
pub fn map_bytes(m: &HeaderMap) -> usize {
    m.iter().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.len()).saturating_add(v.len())
    })
}

#[cfg(test)]
mod tests {
    /// The table against RFC 9110 section 5.6.2's `tchar` as written there, for every byte.
    #[test]
    fn the_table_holds_exactly_the_token_characters() {
        for b in 0..=255u8 {
            let rfc = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            assert_eq!(super::tchar(b), rfc, "{b:#04x}");
        }
    }

    #[test]
    fn names_are_tokens_or_pseudo_headers() {
        for ok in [&b"x-a"[..], b"X_B", b":path", b"!#$%&'*+-.^_`|~09azAZ"] {
            assert!(super::name(ok), "{ok:?}");
        }
        for bad in [
            &b""[..],
            b":",
            b"a b",
            b"a:b",
            b"a\r\nb",
            b"a\0",
            b"x\xc3\xa9",
            b"(x)",
            b"::p",
        ] {
            assert!(!super::name(bad), "{bad:?}");
        }
    }

    #[test]
    fn values_refuse_cr_lf_nul_only() {
        assert!(super::value(b"any \t text \x7f \xc3\xa9"));
        assert!(super::value(b""));
        for bad in [&b"a\r\nx-injected: yes"[..], b"\r", b"\n", b"a\0b"] {
            assert!(!super::value(bad), "{bad:?}");
        }
    }
}
