//! Products of u64s without wasm32's 128-bit multiply. wasm32 has no instruction for a
//! product's high half, so `u64::saturating_mul`, `checked_mul` and any u128 product call the
//! compiler's `__multi3` (a 128 × 128-bit product, about 70 instructions with its call in
//! wasmtime). A u64 product is four 32 × 32-bit products, each one `i64.mul`, added in place;
//! when both factors fit in 32 bits (the request path's token counts, weights and milliseconds),
//! one.

const LOW: u64 = 0xffff_ffff;

/// `a · b` in full (a product of two u64s never overflows a u128).
#[inline]
pub fn mul_wide(a: u64, b: u64) -> u128 {
    if (a | b) >> 32 == 0 {
        return u128::from(a.wrapping_mul(b));
    }
    let (a0, a1) = (a & LOW, a >> 32);
    let (b0, b1) = (b & LOW, b >> 32);
    // Each partial product is below 2^64; `mid` below 3 · 2^32.
    let p00 = a0.wrapping_mul(b0);
    let p01 = a0.wrapping_mul(b1);
    let p10 = a1.wrapping_mul(b0);
    let p11 = a1.wrapping_mul(b1);
    let mid = (p00 >> 32).wrapping_add(p01 & LOW).wrapping_add(p10 & LOW);
    let low = (p00 & LOW) | (mid << 32);
    let high = p11
        .wrapping_add(p01 >> 32)
        .wrapping_add(p10 >> 32)
        .wrapping_add(mid >> 32);
    (u128::from(high) << 64) | u128::from(low)
}

/// `a · b`, saturated at `u64::MAX` (as `u64::saturating_mul`).
#[inline]
pub fn mul_saturating(a: u64, b: u64) -> u64 {
    u64::try_from(mul_wide(a, b)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::{mul_saturating, mul_wide};

    /// Against the standard library's u128 figures, around the 32-bit fast path's edges.
    #[test]
    fn products_match_the_wide_arithmetic() {
        let edges = [
            0x1234_5678_9abc_def0,
            0xffff_ffff_0000_0001,
            150_000_000_000,
            0u64,
            1,
            2,
            1_000,
            u64::from(u32::MAX) - 1,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            1 << 40,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &a in &edges {
            for &b in &edges {
                let want = u128::from(a) * u128::from(b);
                assert_eq!(mul_wide(a, b), want, "{a} * {b}");
                assert_eq!(
                    mul_saturating(a, b),
                    u64::try_from(want).unwrap_or(u64::MAX),
                    "{a} * {b}"
                );
            }
        }
    }
}
