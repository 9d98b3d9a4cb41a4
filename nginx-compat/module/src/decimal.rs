//! Decimal digits of an integer without an allocation ([`Decimal`], written by `itoa`);
//! nginx-free (unit-tested by `tests/pure.rs`).

/// An unsigned integer's decimal digits, held inline: a header value nginx keeps as a number
/// (`:status`, `content-length`) read without an allocation.
#[derive(Debug, Clone, Copy)]
pub struct Decimal {
    digits: [u8; 20],
    /// Where the digits start in `digits` (they end at its end).
    start: usize,
}

impl Decimal {
    /// The digits of `v` (`u64::MAX` has 20), as `itoa` writes them.
    pub fn new(v: u64) -> Decimal {
        let mut text = itoa::Buffer::new();
        let text = text.format(v).as_bytes();
        let mut d = Decimal {
            digits: [b'0'; 20],
            start: 20usize.saturating_sub(text.len()),
        };
        if let Some(slot) = d.digits.get_mut(d.start..) {
            for (to, from) in slot.iter_mut().zip(text) {
                *to = *from;
            }
        }
        d
    }

    /// The digits.
    pub fn as_bytes(&self) -> &[u8] {
        self.digits.get(self.start..).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn digits_agree_with_to_string() {
        for v in [
            0u64,
            7,
            10,
            200,
            404,
            65_535,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(Decimal::new(v).as_bytes(), v.to_string().as_bytes(), "{v}");
        }
    }
}
