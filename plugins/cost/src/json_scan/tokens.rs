//! Reading the tokens of the document, one step each: strings and member names (a name's colon
//! with it), numbers, escapes and `\u` digits, `true`/`false`/`null`, where a value or a member
//! name is expected, and what follows a value.

use super::lex::{is_ws, plain_run, ws_run, Num};
use super::{JsonScan, St};

impl JsonScan {
    /// Inside a string (`key`: a member name) at `at`: its plain bytes in one run, then what
    /// ends the run. A name's colon right after it is read in the same step.
    pub(super) fn string(&mut self, chunk: &[u8], at: usize, key: bool) -> usize {
        let rest = chunk.get(at..).unwrap_or_default();
        let run = plain_run(rest);
        let plain = rest.get(..run).unwrap_or_default();
        let next = at.saturating_add(run).saturating_add(1);
        match rest.get(run) {
            Some(b'"') if key => {
                if !self.key_live {
                    self.member_named(None);
                } else if self.key_len == 0 {
                    // The whole name is in this chunk, without escapes: compared where it is.
                    self.member_named(Some(plain));
                } else {
                    self.key_bytes(plain);
                    let key = self.key;
                    self.member_named(key.get(..self.key_len).filter(|_| self.key_live));
                }
                if chunk.get(next) == Some(&b':') {
                    self.st = St::Value;
                    return next.saturating_add(1);
                }
                self.st = St::Colon;
                next
            }
            Some(b'"') => {
                self.value_end(chunk, next);
                next
            }
            Some(b'\\') => {
                if key && self.key_live {
                    self.key_bytes(plain);
                }
                self.in_key = key;
                self.st = St::Escape;
                next
            }
            Some(_) => self.fail(chunk),
            None => {
                if key && self.key_live {
                    self.key_bytes(plain);
                }
                chunk.len()
            }
        }
    }

    /// Inside a number, at `at`: its bytes in one run; a byte that is not part of it ends it
    /// (if it can end there) and is read in the next state.
    pub(super) fn number(&mut self, chunk: &[u8], mut at: usize) -> usize {
        let mut n = self.num;
        while let Some(&b) = chunk.get(at) {
            match n.next(b) {
                Some(next) => {
                    n = next;
                    at = at.saturating_add(1);
                }
                None if n.complete() => {
                    self.num = n;
                    self.value_end(chunk, at);
                    return at;
                }
                None => return self.fail(chunk),
            }
        }
        self.num = n;
        self.st = St::Number;
        at
    }

    /// A byte of an escape or a literal.
    pub(super) fn in_token(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        let key = self.in_key;
        match self.st {
            St::Escape => {
                let plain = match b {
                    b'"' | b'\\' | b'/' => b,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.st = St::Hex;
                        self.hex_left = 4;
                        self.hex_code = 0;
                        return next;
                    }
                    _ => return self.fail(chunk),
                };
                if key && self.key_live {
                    self.key_bytes(&[plain]);
                }
                self.st = if key { St::Key } else { St::Str };
            }
            St::Hex => {
                let Some(digit) = (b as char).to_digit(16) else {
                    return self.fail(chunk);
                };
                self.hex_code = self.hex_code.wrapping_shl(4) | digit as u16;
                self.hex_left = self.hex_left.saturating_sub(1);
                if self.hex_left > 0 {
                    return next;
                }
                if key {
                    // Names compared are ASCII; any other code point matches nothing.
                    match u8::try_from(self.hex_code) {
                        Ok(c) if c.is_ascii() && self.key_live => self.key_bytes(&[c]),
                        _ => self.key_live = false,
                    }
                }
                self.st = if key { St::Key } else { St::Str };
            }
            St::Literal => {
                if self.literal.get(self.literal_at) != Some(&b) {
                    return self.fail(chunk);
                }
                self.literal_at = self.literal_at.saturating_add(1);
                if self.literal_at == self.literal.len() {
                    self.value_end(chunk, next);
                }
            }
            _ => return self.fail(chunk),
        }
        next
    }

    /// Where a value (or, after `[`, the `]`) is expected.
    pub(super) fn value(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b'"' => {
                self.value_start(at);
                self.st = St::Str;
                next
            }
            b'0'..=b'9' | b'-' => {
                self.value_start(at);
                self.num = Num::start(b).unwrap_or(Num::Int);
                self.number(chunk, next)
            }
            b'{' | b'[' => {
                self.value_start(at);
                self.open(chunk, b == b'{', next)
            }
            b't' | b'f' | b'n' => {
                self.value_start(at);
                self.literal = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.literal_at = 1;
                self.st = St::Literal;
                next
            }
            b']' if self.st == St::ArrFirst => self.close(chunk, false, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    /// After a value: `,`, or the bracket that closes its container.
    pub(super) fn after(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b',' => match self.in_object() {
                Some(true) => {
                    if self.depth == 1 {
                        self.top = None;
                    }
                    self.st = St::ObjKey;
                    // The next member's name right after the comma: read in the same step.
                    match chunk.get(next) {
                        Some(b'"') => self.name(chunk, b'"', next),
                        _ => next,
                    }
                }
                Some(false) => {
                    self.st = St::Value;
                    next
                }
                None => self.fail(chunk),
            },
            b'}' => self.close(chunk, true, next),
            b']' => self.close(chunk, false, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    /// Where a member name (or, after `{`, the `}`) is expected.
    pub(super) fn name(&mut self, chunk: &[u8], b: u8, at: usize) -> usize {
        let next = at.saturating_add(1);
        match b {
            b'"' => {
                self.key_len = 0;
                // Names are compared at the top level and inside `message` / `response`.
                self.key_live = self.depth == 1 || (self.depth == 2 && self.inner_parent.is_some());
                self.st = St::Key;
                self.string(chunk, next, true)
            }
            b'}' if self.st == St::ObjFirst => self.close(chunk, true, next),
            _ if is_ws(b) => at.saturating_add(ws_run(chunk.get(at..).unwrap_or_default())),
            _ => self.fail(chunk),
        }
    }

    fn key_bytes(&mut self, bytes: &[u8]) {
        let end = self.key_len.saturating_add(bytes.len());
        match self.key.get_mut(self.key_len..end) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.key_len = end;
            }
            None => self.key_live = false,
        }
    }
}
