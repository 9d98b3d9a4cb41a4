//! The dot products every column of the Montgomery code is made of, scalar and with wasm SIMD.
//!
//! Numbers are `k` little-endian limbs of 27 bits, each stored in a u32, with
//! R = 2^(27k) > n. A 27x27-bit product is below 2^54, so a whole column of a
//! product-scanning Montgomery multiplication (at most 2k products plus the
//! carry, k <= 304 for 8192-bit moduli: < 608 * 2^54 + 2^37 < 2^64) can be
//! summed in one u64 with no carry handling inside the loops. Each column is
//! then a plain dot product of two forward-running slices (one operand is kept
//! with its limbs reversed): 2 loads, 1 multiply and 1 add per product in
//! scalar code, and `i64x2.extmul_{low,high}_i32x4_u` (4 products per pair of
//! instructions) with the wasm `simd128` feature.

/// `x[xs..xs+len] . y[ys..ys+len]` (+ `z[zs..] . w[ws..]` for `dot2`), or 0
/// if a range is out of bounds (which the callers never ask for).
#[inline(always)]
pub(super) fn dot_at(x: &[u32], xs: usize, y: &[u32], ys: usize, len: usize) -> u64 {
    match (x.get(xs..xs + len), y.get(ys..ys + len)) {
        (Some(a), Some(b)) => dot(a, b),
        _ => 0,
    }
}

#[inline(always)]
pub(super) fn dot2_at(
    x: &[u32],
    xs: usize,
    y: &[u32],
    ys: usize,
    z: &[u32],
    w: &[u32],
    len: usize,
) -> u64 {
    match (
        x.get(xs..xs + len),
        y.get(ys..ys + len),
        z.get(xs..xs + len),
        w.get(ys..ys + len),
    ) {
        (Some(a), Some(b), Some(c), Some(d)) => dot2(a, b, c, d),
        _ => 0,
    }
}

/// Dot product of two equally long limb slices. Wrapping adds, but see the
/// bound in the module documentation: the sum never wraps.
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
#[inline(always)]
fn dot(x: &[u32], y: &[u32]) -> u64 {
    let (xc, xr) = x.as_chunks::<4>();
    let (yc, yr) = y.as_chunks::<4>();
    let (mut s0, mut s1) = (0u64, 0u64);
    for (a, b) in xc.iter().zip(yc) {
        let p0 = u64::from(a[0]) * u64::from(b[0]);
        let p1 = u64::from(a[1]) * u64::from(b[1]);
        let p2 = u64::from(a[2]) * u64::from(b[2]);
        let p3 = u64::from(a[3]) * u64::from(b[3]);
        s0 = s0.wrapping_add(p0).wrapping_add(p2);
        s1 = s1.wrapping_add(p1).wrapping_add(p3);
    }
    for (&a, &b) in xr.iter().zip(yr) {
        s0 = s0.wrapping_add(u64::from(a) * u64::from(b));
    }
    s0.wrapping_add(s1)
}

/// `x . y + z . w`, all four slices equally long, length a multiple of 4.
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
#[inline(always)]
fn dot2(x: &[u32], y: &[u32], z: &[u32], w: &[u32]) -> u64 {
    let (xc, _) = x.as_chunks::<4>();
    let (yc, _) = y.as_chunks::<4>();
    let (zc, _) = z.as_chunks::<4>();
    let (wc, _) = w.as_chunks::<4>();
    let (mut s0, mut s1) = (0u64, 0u64);
    for (((a, b), c), d) in xc.iter().zip(yc).zip(zc).zip(wc) {
        let p0 = u64::from(a[0]) * u64::from(b[0]);
        let p1 = u64::from(a[1]) * u64::from(b[1]);
        let p2 = u64::from(a[2]) * u64::from(b[2]);
        let p3 = u64::from(a[3]) * u64::from(b[3]);
        let q0 = u64::from(c[0]) * u64::from(d[0]);
        let q1 = u64::from(c[1]) * u64::from(d[1]);
        let q2 = u64::from(c[2]) * u64::from(d[2]);
        let q3 = u64::from(c[3]) * u64::from(d[3]);
        s0 = s0
            .wrapping_add(p0)
            .wrapping_add(p2)
            .wrapping_add(q0)
            .wrapping_add(q2);
        s1 = s1
            .wrapping_add(p1)
            .wrapping_add(p3)
            .wrapping_add(q1)
            .wrapping_add(q3);
    }
    s0.wrapping_add(s1)
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::*;

    /// All-ones mask that LLVM cannot see through. ANDing the loaded vectors
    /// with it keeps LLVM from rewriting `i64x2.extmul_*_i32x4_u` (3 x86
    /// instructions in V8) into `v128.load32x2_u` + `i64x2.mul`, which V8 has
    /// to emulate with three multiplications and five more instructions.
    #[inline(always)]
    pub(super) fn opaque_ones() -> v128 {
        core::hint::black_box(u32x4_splat(u32::MAX))
    }

    #[inline(always)]
    pub(super) fn load(a: &[u32; 4], ones: v128) -> v128 {
        v128_and(u32x4(a[0], a[1], a[2], a[3]), ones)
    }

    /// Products of the four lane pairs, added into two u64x2 accumulators.
    #[inline(always)]
    pub(super) fn mac(acc: &mut (v128, v128), a: v128, b: v128) {
        acc.0 = i64x2_add(acc.0, u64x2_extmul_low_u32x4(a, b));
        acc.1 = i64x2_add(acc.1, u64x2_extmul_high_u32x4(a, b));
    }

    #[inline(always)]
    pub(super) fn sum(acc: (v128, v128)) -> u64 {
        let v = i64x2_add(acc.0, acc.1);
        u64x2_extract_lane::<0>(v).wrapping_add(u64x2_extract_lane::<1>(v))
    }

    #[inline(always)]
    pub(super) fn zero() -> (v128, v128) {
        (u64x2_splat(0), u64x2_splat(0))
    }
}

/// Dot product with wasm SIMD: `i64x2.extmul_{low,high}_i32x4_u` gives two
/// 32x32->64 bit products per instruction.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
fn dot(x: &[u32], y: &[u32]) -> u64 {
    let ones = simd::opaque_ones();
    let (xc, xr) = x.as_chunks::<4>();
    let (yc, yr) = y.as_chunks::<4>();
    let mut acc = simd::zero();
    for (a, b) in xc.iter().zip(yc) {
        simd::mac(&mut acc, simd::load(a, ones), simd::load(b, ones));
    }
    let mut s = simd::sum(acc);
    for (&a, &b) in xr.iter().zip(yr) {
        s = s.wrapping_add(u64::from(a) * u64::from(b));
    }
    s
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
fn dot2(x: &[u32], y: &[u32], z: &[u32], w: &[u32]) -> u64 {
    let ones = simd::opaque_ones();
    let (xc, _) = x.as_chunks::<4>();
    let (yc, _) = y.as_chunks::<4>();
    let (zc, _) = z.as_chunks::<4>();
    let (wc, _) = w.as_chunks::<4>();
    let mut acc = simd::zero();
    for (((a, b), c), d) in xc.iter().zip(yc).zip(zc).zip(wc) {
        simd::mac(&mut acc, simd::load(a, ones), simd::load(b, ones));
        simd::mac(&mut acc, simd::load(c, ones), simd::load(d, ones));
    }
    simd::sum(acc)
}
