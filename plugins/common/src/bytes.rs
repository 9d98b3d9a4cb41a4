//! Byte-string equality for the filters' hot paths.
//!
//! In wasm, `==` on slices and strings calls wasi-libc's `memcmp`, which compares one byte per
//! iteration (about 20 instructions a byte under wasmtime): 5,000 instructions per request for
//! jwt-auth's verified-token cache comparing one ~240-byte token
//! (bench/results/instructions_filters.md). [`same_bytes`] compares 8 bytes a step.

/// Whether `a` and `b` hold the same bytes (the same result as `a == b`), compared 8 bytes a
/// step: lengths first, then the last 8 bytes (which cover a tail shorter than a word), then the
/// whole words from the start. From 4 to 7 bytes, the first and the last 4 (overlapping); under
/// 4, byte by byte (no `memcmp` call for a 2-byte label value).
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

#[cfg(test)]
mod tests {
    use super::same_bytes;

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
