//! Test support: a deterministic generator of JSON documents, some of them damaged, for the
//! property tests that check this crate's JSON readers against `serde_json` (`json_scan`,
//! `request`).
#![allow(clippy::arithmetic_side_effects)] // tests: an overflow panics, which fails the test

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

fn ws(r: &mut Rng, out: &mut Vec<u8>) {
    if r.below(4) == 0 {
        out.extend_from_slice(r.pick(&[" ", "\n", "\t", "\r\n  ", "  "]).as_bytes());
    }
}

/// A value (an object at the top three times in four), members named from `names` (JSON string
/// contents, escapes allowed): strings with escapes and multi-byte UTF-8, numbers of every
/// form, literals, whitespace anywhere it may go.
fn value(r: &mut Rng, names: &[&str], depth: usize, out: &mut Vec<u8>) {
    ws(r, out);
    let kind = match depth {
        0 => [0, 0, 0, 2][r.below(4)],
        1..=4 => r.below(10),
        _ => 4 + r.below(6),
    };
    match kind {
        0 | 1 => {
            out.push(b'{');
            for i in 0..r.below(5) {
                if i > 0 {
                    out.push(b',');
                }
                ws(r, out);
                out.push(b'"');
                out.extend_from_slice(r.pick(names).as_bytes());
                out.push(b'"');
                ws(r, out);
                out.push(b':');
                value(r, names, depth + 1, out);
            }
            ws(r, out);
            out.push(b'}');
        }
        2 | 3 => {
            out.push(b'[');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(b',');
                }
                value(r, names, depth + 1, out);
            }
            ws(r, out);
            out.push(b']');
        }
        4 | 5 => {
            out.push(b'"');
            for _ in 0..r.below(4) {
                let piece = r.pick(&[
                    "gpt-4o",
                    "a b",
                    "\\\"",
                    "\\\\",
                    "\\n",
                    "\\u00e9",
                    "\\ud83d\\ude00",
                    "é",
                    "😀",
                    "\\/",
                    "message",
                    "xxxxxxxxxxxxxxxxxxxx",
                ]);
                out.extend_from_slice(piece.as_bytes());
            }
            out.push(b'"');
        }
        6 | 7 => {
            out.extend_from_slice(r.pick(NUMBERS).as_bytes());
        }
        _ => out.extend_from_slice(r.pick(&["true", "false", "null"]).as_bytes()),
    }
    ws(r, out);
}

/// Numbers of every form: integers, the u64 bounds, signs, fractions, exponents.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "12",
    "120",
    "-1",
    "1.0",
    "-3.5e+7",
    "1E2",
    "0.25",
    "7e-3",
    "1e1",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
];

/// A generated document, sometimes damaged (up to two bytes removed, inserted or changed, or
/// the text cut).
pub fn document(r: &mut Rng, names: &[&str]) -> Vec<u8> {
    let mut doc = Vec::new();
    value(r, names, 0, &mut doc);
    let bytes = b"{}[]\",:0123456789-+.eEtrufalsn\\ x\x01\xff";
    for _ in 0..r.below(3) {
        if doc.is_empty() {
            break;
        }
        let at = r.below(doc.len());
        match r.below(4) {
            0 => {
                doc.remove(at);
            }
            1 => doc.insert(at, bytes[r.below(bytes.len())]),
            2 => doc[at] = bytes[r.below(bytes.len())],
            _ => doc.truncate(at),
        }
    }
    doc
}
