//! Decimal digits of an integer without an allocation ([`Decimal`]); nginx-free (unit-tested
//! by `tests/pure.rs`).

/// An unsigned integer's decimal digits, held inline: a header value nginx keeps as a number
/// (`:status`, `content-length`) read without an allocation.
#[derive(Debug, Clone, Copy)]
pub struct Decimal {
    digits: [u8; 20],
    /// Where the digits start in `digits` (they end at its end).
    start: usize,
}

impl Decimal {
    /// The digits of `v` (`u64::MAX` has 20).
    pub fn new(mut v: u64) -> Decimal {
        let mut d = Decimal {
            digits: [b'0'; 20],
            start: 20,
        };
        while let Some(at) = d.start.checked_sub(1) {
            if let Some(slot) = d.digits.get_mut(at) {
                // `v % 10` is below 10.
                *slot = b'0'.saturating_add(u8::try_from(v % 10).unwrap_or(0));
            }
            d.start = at;
            v /= 10;
            if v == 0 {
                break;
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
