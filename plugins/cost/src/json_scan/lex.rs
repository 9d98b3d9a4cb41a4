//! The scanner's byte-level helpers: the number grammar (RFC 8259 section 6) one byte at a time
//! ([`Num`]), and the runs of plain string bytes and of whitespace read in tight loops.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    /// The state after a number's first byte `b`, or `None` when no number starts with it.
    pub(crate) fn start(b: u8) -> Option<Num> {
        match b {
            b'-' => Some(Num::Minus),
            b'0' => Some(Num::Zero),
            b'1'..=b'9' => Some(Num::Int),
            _ => None,
        }
    }

    /// The state after `b`, or `None` when `b` is not part of the number.
    pub(crate) fn next(self, b: u8) -> Option<Num> {
        let digit = b.is_ascii_digit();
        match (self, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus | Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, _) if digit => Some(Num::ExpDigits),
            _ => None,
        }
    }

    /// Whether a number can end in this state.
    pub(crate) fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes that end a run of plain string bytes: the quote, the backslash, control characters.
fn string_stop(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// The length of the run of plain string bytes `bytes` starts with: [`string_run`] with any
/// byte from 0x20 up.
pub(crate) fn plain_run(bytes: &[u8]) -> usize {
    string_run::<false>(bytes)
}

/// The length of the run of plain ASCII string bytes (0x20 to 0x7f, not `"` or `\`) `bytes`
/// starts with: [`string_run`] stopping at bytes from 0x80 up too.
pub(crate) fn ascii_run(bytes: &[u8]) -> usize {
    string_run::<true>(bytes)
}

/// The length of the run of string bytes `bytes` starts with that need no escape, up to a `"`, a
/// `\`, a control character (or, `ASCII`, a byte from 0x80 up). Eight bytes at a time: in each
/// 64-bit word, a byte that is `"`, `\` or below 0x20 sets its top bit in the mask (the usual
/// zero-byte test on the word XOR the quote or the backslash, and on the word minus 0x20 in
/// every byte), as does a byte whose own top bit is set when `ASCII`; the first such byte is
/// the lowest bit set, exact (a borrow only disturbs the bytes above a true match).
fn string_run<const ASCII: bool>(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = bytes.chunks_exact(8);
    let mut run = 0usize;
    for word in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES.wrapping_mul(u64::from(b'"')));
        let backslash = w ^ (ONES.wrapping_mul(u64::from(b'\\')));
        let mut stops = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES.wrapping_mul(0x20)) & !w);
        if ASCII {
            stops |= w;
        }
        let stops = stops & HIGH;
        if stops != 0 {
            return run.saturating_add((stops.trailing_zeros() / 8) as usize);
        }
        run = run.saturating_add(8);
    }
    let tail = words.remainder();
    run.saturating_add(
        tail.iter()
            .position(|&c| string_stop(c) || (ASCII && c >= 0x80))
            .unwrap_or(tail.len()),
    )
}

/// The length of the run of whitespace `bytes` starts with.
pub(crate) fn ws_run(bytes: &[u8]) -> usize {
    bytes.iter().position(|&c| !is_ws(c)).unwrap_or(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both runs against a byte-at-a-time reading, on every stop byte at every offset of
    /// strings from 0 to 24 bytes (across the words and the tail).
    #[test]
    fn runs_stop_where_a_byte_at_a_time_reading_stops() {
        let stops = [b'"', b'\\', 0x00, 0x1f, 0x80, 0xc3, 0xff];
        let plain = [b'a', b' ', 0x7f, b'~', b'!', 0x21];
        for len in 0..25usize {
            for at in 0..=len {
                for &stop in &stops {
                    let mut bytes: Vec<u8> = (0..len).map(|i| plain[i % plain.len()]).collect();
                    if at < len {
                        bytes[at] = stop;
                    }
                    let want = |ascii: bool| {
                        bytes
                            .iter()
                            .position(|&c| string_stop(c) || (ascii && c >= 0x80))
                            .unwrap_or(len)
                    };
                    assert_eq!(plain_run(&bytes), want(false), "{bytes:?}");
                    assert_eq!(ascii_run(&bytes), want(true), "{bytes:?}");
                }
            }
        }
    }
}
