//! Montgomery arithmetic modulo n in product-scanning form: multiplication, squaring, and the
//! exponentiation without entering the Montgomery domain (`Modulus::pow_free`).

use super::dot::{dot2_at, dot_at};
use super::limbs::{less_than, round4, sub_in_place, LIMB_BITS, LIMB_MASK, PAD};

/// Scratch space for one exponentiation; every buffer is `k + PAD` limbs.
pub(super) struct Workspace {
    /// Montgomery quotient digits of the current multiplication.
    pub(super) m: Vec<u32>,
    /// Result buffer.
    tmp: Vec<u32>,
    /// Reversed copy of the base (multiplier) and of the value being squared.
    x_rev: Vec<u32>,
    a_rev: Vec<u32>,
}

impl Workspace {
    pub(super) fn new(k: usize) -> Self {
        let z = vec![0; k + PAD];
        Workspace {
            m: z.clone(),
            tmp: z.clone(),
            x_rev: z.clone(),
            a_rev: z,
        }
    }
}

/// An odd modulus in limb form with its Montgomery constant.
pub(super) struct Modulus<'a> {
    /// k limbs.
    pub(super) n: &'a [u32],
    /// k limbs reversed, then PAD zeros.
    pub(super) n_rev: &'a [u32],
    pub(super) n0inv: u32,
}

impl Modulus<'_> {
    /// `v = 2v mod n` for `v < n` (k limbs).
    pub(super) fn double(&self, v: &mut [u32]) {
        let mut carry = 0u32;
        for x in v.iter_mut() {
            let d = (*x << 1) | carry;
            *x = d & LIMB_MASK;
            carry = d >> LIMB_BITS;
        }
        if carry != 0 || !less_than(v, self.n) {
            sub_in_place(v, self.n);
        }
    }

    /// Low column `i < k` of the reduction, after the product terms are in
    /// `col`: computes m[i] from the column and returns the carry into
    /// column i + 1. The column must already include `m[j] * n[i-j]`, j < i.
    #[inline(always)]
    fn reduce_low(&self, col: u64, i: usize, m: &mut [u32]) -> u64 {
        let n0 = self.n.first().copied().unwrap_or(1);
        let mi = (col as u32).wrapping_mul(self.n0inv) & LIMB_MASK;
        if let Some(slot) = m.get_mut(i) {
            *slot = mi;
        }
        col.wrapping_add(u64::from(mi) * u64::from(n0)) >> LIMB_BITS
    }

    /// Final conditional subtraction: the result is `out + top * R < 2n`.
    fn finish(&self, out: &mut [u32], carry: u64) {
        let k = self.n.len();
        if let Some(o) = out.get_mut(k - 1) {
            *o = (carry as u32) & LIMB_MASK;
        }
        if let Some(out) = out.get_mut(..k) {
            if carry >> LIMB_BITS != 0 || !less_than(out, self.n) {
                sub_in_place(out, self.n);
            }
        }
    }

    /// Montgomery multiplication `out = a * b * R^-1 mod n` for a, b < n,
    /// product scanning (FIPS) form; the product and reduction terms of a
    /// column are summed in one pass. `b_rev` is b with its limbs reversed;
    /// `m` is scratch. All slices are `k + PAD` limbs with zero padding.
    pub(super) fn mul(&self, out: &mut [u32], a: &[u32], b_rev: &[u32], m: &mut [u32]) {
        let k = self.n.len();
        let mut carry = 0u64;
        for i in 0..k {
            // sum_{j<=i} a[j] b[i-j] + m[j] n[i-j], with b[i-j] = b_rev[k-1-i+j]
            // and m[i] = 0 for now. Rounding the length up reads a[i+1..]
            // against the zero padding of b_rev and n_rev.
            if let Some(slot) = m.get_mut(i) {
                *slot = 0;
            }
            let col = carry.wrapping_add(dot2_at(
                a,
                0,
                b_rev,
                k - 1 - i,
                m,
                self.n_rev,
                round4(i + 1),
            ));
            carry = self.reduce_low(col, i, m);
        }
        for (i, o) in (k..2 * k - 1).zip(out.iter_mut()) {
            // sum_{j=i-k+1}^{k-1}: a[s..] against b_rev[0..]; rounding up
            // reads the zero padding of a and m.
            let s = i + 1 - k;
            let col = carry.wrapping_add(dot2_at(
                a,
                s,
                b_rev,
                0,
                m,
                self.n_rev,
                round4(2 * k - 1 - i),
            ));
            *o = (col as u32) & LIMB_MASK;
            carry = col >> LIMB_BITS;
        }
        self.finish(out, carry);
    }

    /// Montgomery squaring `out = a^2 * R^-1 mod n`: each cross product is
    /// computed once and doubled. `a_rev` is scratch for a reversed copy of a.
    fn sqr(&self, out: &mut [u32], a: &[u32], a_rev: &mut [u32], m: &mut [u32]) {
        let k = self.n.len();
        for (r, &x) in a_rev.iter_mut().zip(a.iter().take(k).rev()) {
            *r = x;
        }
        let a_rev: &[u32] = a_rev;
        let mut carry = 0u64;
        for i in 0..2 * k - 1 {
            // Cross products a[j] * a[i-j], s <= j < i-j: j in s..s+cnt,
            // a[i-j] = a_rev[k-1-i+j].
            let s = (i + 1).saturating_sub(k);
            let cnt = (i + 1 - 2 * s) / 2;
            let cross = dot_at(a, s, a_rev, (k - 1 + s) - i, cnt);
            let mut col = carry.wrapping_add(cross << 1);
            if i % 2 == 0 {
                let x = u64::from(a.get(i / 2).copied().unwrap_or(0));
                col = col.wrapping_add(x * x);
            }
            if i < k {
                if let Some(slot) = m.get_mut(i) {
                    *slot = 0;
                }
                col = col.wrapping_add(dot_at(m, 0, self.n_rev, k - 1 - i, round4(i + 1)));
                carry = self.reduce_low(col, i, m);
            } else {
                col = col.wrapping_add(dot_at(m, s, self.n_rev, 0, round4(2 * k - 1 - i)));
                if let Some(o) = out.get_mut(i - k) {
                    *o = (col as u32) & LIMB_MASK;
                }
                carry = col >> LIMB_BITS;
            }
        }
        self.finish(out, carry);
    }

    /// Exponentiation without entering the Montgomery domain: for `x < n`
    /// returns `x^e * R^(1-e) mod n`. Invariant: the running value is
    /// `x^a * R^(1-a)`, and the Montgomery product of two such values is
    /// again of that form with the exponents added.
    pub(super) fn pow_free(&self, x: &[u32], e: u64, ws: &mut Workspace) -> Vec<u32> {
        let k = self.n.len();
        for (r, &v) in ws.x_rev.iter_mut().zip(x.iter().take(k).rev()) {
            *r = v;
        }
        let mut acc = x.to_vec();
        let top = 63 - e.leading_zeros().min(63);
        for bit in (0..top).rev() {
            self.sqr(&mut ws.tmp, &acc, &mut ws.a_rev, &mut ws.m);
            core::mem::swap(&mut acc, &mut ws.tmp);
            if (e >> bit) & 1 == 1 {
                self.mul(&mut ws.tmp, &acc, &ws.x_rev, &mut ws.m);
                core::mem::swap(&mut acc, &mut ws.tmp);
            }
        }
        acc
    }
}
