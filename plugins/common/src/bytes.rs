//! Byte-string equality and UTF-8 checks for the filters' hot paths.
//!
//! In wasm, `==` on slices and strings calls wasi-libc's `memcmp`, which compares one byte per
//! iteration (about 20 instructions a byte under wasmtime): 5,000 instructions per request for
//! jwt-auth's verified-token cache comparing one ~240-byte token
//! (bench/results/instructions_filters.md). [`same_bytes`] compares 16 bytes a step (8 for
//! shorter strings). The standard library's UTF-8 check steps 8 bytes at a time on wasm32 (two
//! 32-bit words) for ASCII; [`utf8`] and [`utf8_owned`] give its answers with an ASCII check of
//! 16 bytes a step first (header values, logfmt lines, paths and JSON bodies are mostly ASCII).
//! Every loop step also pays the guest deadline's check (wasmtime's epoch check), so fewer,
//! wider steps cost less.

/// Whether `a` and `b` hold the same bytes (the same result as `a == b`), compared a word a
/// step: lengths first, then the last word (which covers a tail shorter than a word), then the
/// whole words from the start; the words are 16 bytes from 16 bytes up, else 8. From 4 to 7
/// bytes, the first and the last 4 (overlapping); under 4, byte by byte (no `memcmp` call for a
/// 2-byte label value).
///
/// It returns at the first differing word, so its time depends on where two inputs differ: use
/// it where that reveals nothing (e.g. against entries a client reaches only through a keyed
/// hash), never to compare a secret or a MAC with a client's guess.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |w: &[u8; 8]| u64::from_ne_bytes(*w);
    let half = |w: &[u8; 4]| u32::from_ne_bytes(*w);
    if let (Some(a_last), Some(b_last)) = (a.last_chunk::<16>(), b.last_chunk::<16>()) {
        let wide = |w: &[u8; 16]| u128::from_ne_bytes(*w);
        return wide(a_last) == wide(b_last)
            && a.as_chunks::<16>()
                .0
                .iter()
                .zip(b.as_chunks::<16>().0)
                .all(|(x, y)| wide(x) == wide(y));
    }
    match (a.last_chunk::<8>(), b.last_chunk::<8>()) {
        (Some(a_last), Some(b_last)) => {
            word(a_last) == word(b_last)
                && a.as_chunks::<8>()
                    .0
                    .iter()
                    .zip(b.as_chunks::<8>().0)
                    .all(|(x, y)| word(x) == word(y))
        }
        _ => match (
            a.first_chunk::<4>(),
            a.last_chunk::<4>(),
            b.first_chunk::<4>(),
            b.last_chunk::<4>(),
        ) {
            (Some(a0), Some(a1), Some(b0), Some(b1)) => {
                half(a0) == half(b0) && half(a1) == half(b1)
            }
            _ => a.iter().zip(b).all(|(x, y)| x == y),
        },
    }
}

/// Whether every byte of `bytes` is ASCII, 16 bytes a step (the last 16 overlap the steps before
/// them; under 16 bytes, the first and the last 8, or 4, overlap each other).
pub fn is_ascii(bytes: &[u8]) -> bool {
    const HIGH: u128 = 0x8080_8080_8080_8080_8080_8080_8080_8080;
    if let Some(last) = bytes.last_chunk::<16>() {
        let mut seen = u128::from_ne_bytes(*last);
        for chunk in bytes.as_chunks::<16>().0 {
            seen |= u128::from_ne_bytes(*chunk);
        }
        return seen & HIGH == 0;
    }
    if let (Some(first), Some(last)) = (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        return (u64::from_ne_bytes(*first) | u64::from_ne_bytes(*last)) & 0x8080_8080_8080_8080
            == 0;
    }
    match (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        (Some(first), Some(last)) => {
            (u32::from_ne_bytes(*first) | u32::from_ne_bytes(*last)) & 0x8080_8080 == 0
        }
        _ => bytes.iter().all(u8::is_ascii),
    }
}

/// `bytes` as text: `std::str::from_utf8`'s answer, ASCII told apart first ([`is_ascii`]).
///
/// # Errors
/// As `std::str::from_utf8`: not UTF-8.
#[allow(unsafe_code)] // ASCII is UTF-8; one audited use
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if is_ascii(bytes) {
        // SAFETY: every byte is below 0x80, so `bytes` is valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes)
}

/// `bytes` as a `String`: `String::from_utf8`'s answer, ASCII told apart first ([`is_ascii`]).
///
/// # Errors
/// As `String::from_utf8`: not UTF-8 (the bytes are in the error).
#[allow(unsafe_code)] // ASCII is UTF-8; one audited use
pub fn utf8_owned(bytes: Vec<u8>) -> Result<String, std::string::FromUtf8Error> {
    if is_ascii(&bytes) {
        // SAFETY: every byte is below 0x80, so `bytes` is valid UTF-8.
        return Ok(unsafe { String::from_utf8_unchecked(bytes) });
    }
    String::from_utf8(bytes)
}

#[cfg(test)]
mod tests {
    use super::{is_ascii, same_bytes, utf8, utf8_owned};

    /// Every length from 0 to 40 with one byte at or above 0x80 (or none) at every offset:
    /// the same answers as the standard library's.
    #[test]
    fn ascii_and_utf8_agree_with_the_standard_library() {
        for len in 0..41usize {
            for at in 0..=len {
                for high in [0x80u8, 0xc3, 0xff, 0x7f] {
                    let mut bytes: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                    if at < len {
                        bytes[at] = high;
                    }
                    assert_eq!(is_ascii(&bytes), bytes.is_ascii(), "{bytes:?}");
                    assert_eq!(utf8(&bytes), std::str::from_utf8(&bytes), "{bytes:?}");
                    assert_eq!(
                        utf8_owned(bytes.clone()).map_err(|e| e.into_bytes()),
                        String::from_utf8(bytes.clone()).map_err(|e| e.into_bytes()),
                    );
                }
            }
        }
        // Multi-byte text: decoded as the standard library decodes it.
        let text = "caf\u{e9} \u{1f600} na\u{ef}ve, sixteen+ bytes long";
        assert_eq!(utf8(text.as_bytes()), Ok(text));
        assert!(
            utf8(&text.as_bytes()[..4]).is_err(),
            "cut inside a character"
        );
    }

    #[test]
    fn agrees_with_slice_equality() {
        // Every length around the 8-byte steps; a difference at every position, in every bit of
        // the byte; and every pair of lengths up to 40 (a string against its own prefixes).
        for len in 0..40usize {
            let a: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "len {len}");
            for at in 0..len {
                for bit in 0..8 {
                    let mut b = a.clone();
                    b[at] ^= 1 << bit;
                    assert_eq!(same_bytes(&a, &b), a == b, "len {len}, at {at}, bit {bit}");
                    assert!(!same_bytes(&a, &b));
                }
            }
            for shorter in 0..len {
                assert!(!same_bytes(&a, &a[..shorter]), "{len} vs {shorter}");
                assert!(!same_bytes(&a[..shorter], &a), "{shorter} vs {len}");
            }
        }
    }

    #[test]
    fn equal_lengths_and_words_that_differ_only_in_the_middle() {
        // 24 bytes: the first and the last word equal, the middle one not.
        let a = *b"aaaaaaaabbbbbbbbcccccccc";
        let mut b = a;
        b[12] = b'x';
        assert!(!same_bytes(&a, &b));
        assert!(same_bytes(&a, &a));
        assert!(same_bytes(b"", b""));
        assert!(!same_bytes(b"", b"a"));
    }
}
