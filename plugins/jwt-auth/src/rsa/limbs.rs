//! Numbers as limbs: `k` little-endian limbs of 27 bits, each in a u32, padded with `PAD` zero
//! limbs; conversions from and to big-endian byte strings, and the few limb operations outside
//! the Montgomery code (compare, subtract, the Montgomery constant).

pub(super) const LIMB_BITS: usize = 27;
pub(super) const LIMB_MASK: u32 = (1 << LIMB_BITS) - 1;

pub(super) fn strip_leading_zeros(b: &[u8]) -> &[u8] {
    let z = b.iter().take_while(|&&x| x == 0).count();
    b.get(z..).unwrap_or_default()
}

/// Bit length of a big-endian byte string without leading zero bytes.
pub(super) fn bit_length_be(b: &[u8]) -> usize {
    match b.first() {
        None => 0,
        Some(&top) => (b.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
    }
}

/// Big-endian bytes to `k` little-endian limbs; `None` if the value does not fit.
pub(super) fn be_bytes_to_limbs(bytes: &[u8], k: usize) -> Option<Vec<u32>> {
    let bytes = strip_leading_zeros(bytes);
    if bit_length_be(bytes) > k.checked_mul(LIMB_BITS)? {
        return None;
    }
    let mut limbs = vec![0u32; k];
    let mut out = limbs.iter_mut();
    let (mut buf, mut nbits) = (0u64, 0usize);
    for &b in bytes.iter().rev() {
        buf |= u64::from(b) << nbits;
        nbits += 8;
        if nbits >= LIMB_BITS {
            *out.next()? = (buf as u32) & LIMB_MASK;
            buf >>= LIMB_BITS;
            nbits -= LIMB_BITS;
        }
    }
    if nbits > 0 {
        if let Some(l) = out.next() {
            *l = buf as u32;
        }
    }
    Some(limbs)
}

/// Limbs to exactly `len` big-endian bytes; `None` if the value does not fit.
pub(super) fn limbs_to_be_bytes(limbs: &[u32], len: usize) -> Option<Vec<u8>> {
    let mut le = Vec::with_capacity(len);
    let (mut buf, mut nbits) = (0u64, 0usize);
    for &l in limbs {
        buf |= u64::from(l & LIMB_MASK) << nbits;
        nbits += LIMB_BITS;
        while nbits >= 8 {
            le.push(buf as u8);
            buf >>= 8;
            nbits -= 8;
        }
    }
    le.push(buf as u8);
    if le
        .get(len..)
        .is_some_and(|extra| extra.iter().any(|&b| b != 0))
    {
        return None;
    }
    le.resize(len, 0);
    le.reverse();
    Some(le)
}

/// `-x^-1 mod 2^27` for odd x (Newton iteration; each step doubles the
/// number of correct low bits, starting from 3).
pub(super) fn neg_inv(x: u32) -> u32 {
    let mut inv = x;
    for _ in 0..4 {
        inv = inv.wrapping_mul(2u32.wrapping_sub(x.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & LIMB_MASK
}

/// `a < b` for equal-length limb slices.
pub(super) fn less_than(a: &[u32], b: &[u32]) -> bool {
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            return x < y;
        }
    }
    false
}

/// `a -= b` (mod R).
pub(super) fn sub_in_place(a: &mut [u32], b: &[u32]) {
    let mut borrow = 0u32;
    for (x, &y) in a.iter_mut().zip(b) {
        let d = x.wrapping_sub(y).wrapping_sub(borrow);
        *x = d & LIMB_MASK;
        borrow = d >> 31;
    }
}

/// Every number in the Montgomery code is `k` limbs followed by `PAD` zero
/// limbs, so that all dot products can be rounded up to a multiple of 4
/// limbs: the extra products always have a zero factor.
pub(super) const PAD: usize = 3;

pub(super) fn round4(x: usize) -> usize {
    (x + 3) & !3
}

/// The limbs of `v` in reverse order followed by `PAD` zeros.
pub(super) fn reversed_padded(v: &[u32]) -> Vec<u32> {
    let mut r: Vec<u32> = v.iter().rev().copied().collect();
    r.resize(v.len() + PAD, 0);
    r
}
