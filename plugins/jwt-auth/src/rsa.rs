//! Fast RSA signature verification for JWT `RS256/384/512` and `PS256/384/512`: the hot path
//! of RS*/PS* tokens. jwt-simple's pure-Rust RSA (rsa 0.9 on num-bigint-dig with u64 digits)
//! took about 2,700 µs per RS256-2048 verify in V8 Wasm; this module about 240 µs scalar and
//! 120 µs with wasm SIMD (`bench` numbers in plugins/jwt-auth/README.md).
//!
//! * RSASSA-PKCS1-v1_5 verification, RFC 8017 section 8.2.2 (EMSA-PKCS1-v1_5
//!   re-encoded and compared whole, DigestInfo prefixes from section 9.2 note 1).
//! * RSASSA-PSS verification, RFC 8017 section 8.1.2 / EMSA-PSS-VERIFY 9.1.2,
//!   MGF1 with the message hash and salt length = hash length (RFC 7518 section 3.5).
//!
//! Written for `wasm32` (proxy-wasm filters running in V8), where wasm has a
//! native 32x32->64 bit multiply but no 64x64->128 one (so bignum code with
//! u64 digits, like `num-bigint-dig` as used by `rsa` 0.9, pays for a software
//! u128 multiply on every digit product). The modular exponentiation here is
//! Montgomery multiplication in product-scanning form on 27-bit limbs, so that
//! each column is one carry-free u64 dot product; s^e is computed without
//! converting into the Montgomery domain (see `Modulus::pow_free`), i.e. 16
//! squarings + 2 multiplications for e = 65537.
//!
//! Build the wasm module with `-C target-feature=+simd128` (V8 has had wasm
//! SIMD on by default since 9.1) to get the `i64x2.extmul` inner loops, about
//! 1.7x faster than the scalar ones; without it the same code runs scalar.
//!
//! Only public values are handled, so the code is not constant-time.
//! No function here panics on any input: all slice access goes through `get`,
//! iterators or fixed-size arrays, and arithmetic is on bounded values or
//! wrapping (the workspace lints deny unsafe code, indexing, unwrap and panics).

// Bignum code: limb counts and indices are bounded by MAX_MODULUS_BITS (checked in
// `from_components`) and limb products fit u64 by construction (27-bit limbs); the tests run with
// overflow checks against num-bigint, including all-ones moduli up to 8192 bits.
#![allow(clippy::arithmetic_side_effects)]

use core::fmt;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// Smallest accepted modulus, in bits.
pub const MIN_MODULUS_BITS: usize = 2048;
/// Largest accepted modulus, in bits.
pub const MAX_MODULUS_BITS: usize = 8192;

/// Hash function of the signature scheme (also used by MGF1 for PSS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RsaHash {
    Sha256,
    Sha384,
    Sha512,
}

/// Why a key was refused or a signature did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RsaError {
    /// Modulus or exponent unsupported: n outside 2048..=8192 bits, n even,
    /// e even, e < 3, or e longer than 64 bits.
    InvalidKey,
    /// PEM / DER could not be parsed, or it is not an RSA public key.
    InvalidEncoding,
    /// The signature is not exactly as long as the modulus.
    InvalidSignatureLength,
    /// The signature, as an integer, is not smaller than the modulus.
    SignatureOutOfRange,
    /// The signature does not match the message (wrong padding, hash, key, ...).
    VerificationFailed,
}

impl fmt::Display for RsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RsaError::InvalidKey => "unsupported or malformed RSA public key",
            RsaError::InvalidEncoding => "malformed PEM/DER RSA public key",
            RsaError::InvalidSignatureLength => "RSA signature length differs from modulus length",
            RsaError::SignatureOutOfRange => "RSA signature representative out of range",
            RsaError::VerificationFailed => "RSA signature verification failed",
        })
    }
}

impl std::error::Error for RsaError {}

/// An RSA public key with everything needed for verification precomputed.
#[derive(Clone, PartialEq, Eq)]
pub struct RsaPublicKey {
    /// Modulus, `k` little-endian limbs of 27 bits.
    n: Vec<u32>,
    /// The limbs of n in reverse order, then `PAD` zero limbs (see `Modulus::mul`).
    n_rev: Vec<u32>,
    /// `-n^-1 mod 2^27`.
    n0inv: u32,
    /// Public exponent (odd, >= 3).
    e: u64,
    /// `R^e mod n` with `R = 2^(27k)`, limbs reversed and padded: turns the result of
    /// the Montgomery-domain-free exponentiation back into `s^e mod n` with
    /// one Montgomery multiplication.
    fix_rev: Vec<u32>,
    /// Bit length of n.
    bits: usize,
    /// Byte length of n (= signature length).
    byte_len: usize,
}

impl fmt::Debug for RsaPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RsaPublicKey")
            .field("bits", &self.bits)
            .field("e", &self.e)
            .finish_non_exhaustive()
    }
}

impl RsaPublicKey {
    /// Builds a key from the modulus `n` and public exponent `e`, both
    /// big-endian unsigned byte strings (as the base64url-decoded `n` and `e`
    /// of a JWK, RFC 7518 section 6.3.1). Leading zero bytes are ignored.
    ///
    /// Errors if n has fewer than 2048 or more than 8192 bits, n is even, e is
    /// even, e < 3, or e does not fit in 64 bits.
    pub fn from_components(n: &[u8], e: &[u8]) -> Result<Self, RsaError> {
        let n_bytes = strip_leading_zeros(n);
        if n_bytes.len() > MAX_MODULUS_BITS / 8 {
            return Err(RsaError::InvalidKey);
        }
        let bits = bit_length_be(n_bytes);
        if !(MIN_MODULUS_BITS..=MAX_MODULUS_BITS).contains(&bits) {
            return Err(RsaError::InvalidKey);
        }
        if n_bytes.last().is_none_or(|b| b & 1 == 0) {
            return Err(RsaError::InvalidKey);
        }
        let e_bytes = strip_leading_zeros(e);
        if e_bytes.len() > 8 {
            return Err(RsaError::InvalidKey);
        }
        let e = e_bytes
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        if e < 3 || e & 1 == 0 {
            return Err(RsaError::InvalidKey);
        }
        let k = bits.div_ceil(LIMB_BITS);
        let n = be_bytes_to_limbs(n_bytes, k).ok_or(RsaError::InvalidKey)?;
        let n0 = *n.first().ok_or(RsaError::InvalidKey)?;
        let n_rev = reversed_padded(&n);
        let n0inv = neg_inv(n0);
        let modulus = Modulus {
            n: &n,
            n_rev: &n_rev,
            n0inv,
        };

        // RR = R^2 mod n by doubling, starting from 2^(bits-1) < n.
        let mut rr = vec![0u32; k + PAD];
        if let Some(top) = rr.get_mut((bits - 1) / LIMB_BITS) {
            *top = 1u32 << ((bits - 1) % LIMB_BITS);
        }
        if let Some(v) = rr.get_mut(..k) {
            for _ in (bits - 1)..(2 * LIMB_BITS * k) {
                modulus.double(v);
            }
        }
        // fix = R^e mod n: pow_free(RR, e) = RR^e * R^(1-e) = R^(e+1); one
        // more Montgomery multiplication by 1 divides by R.
        let mut ws = Workspace::new(k);
        let re1 = modulus.pow_free(&rr, e, &mut ws);
        let mut one_rev = vec![0u32; k + PAD];
        if let Some(last) = one_rev.get_mut(k - 1) {
            *last = 1;
        }
        let mut fix = vec![0u32; k + PAD];
        modulus.mul(&mut fix, &re1, &one_rev, &mut ws.m);

        Ok(RsaPublicKey {
            n,
            n_rev,
            n0inv,
            e,
            fix_rev: reversed_padded(fix.get(..k).unwrap_or_default()),
            bits,
            byte_len: bits.div_ceil(8),
        })
    }

    /// Bit length of the modulus.
    pub fn modulus_bits(&self) -> usize {
        self.bits
    }

    /// Byte length of the modulus, which is the length of every valid signature.
    pub fn size(&self) -> usize {
        self.byte_len
    }

    /// The public exponent.
    pub fn exponent(&self) -> u64 {
        self.e
    }

    /// Verifies an RSASSA-PKCS1-v1_5 signature (JWA `RS256`, `RS384`, `RS512`).
    pub fn verify_pkcs1v15(
        &self,
        hash: RsaHash,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), RsaError> {
        let em = self.rsavp1(signature)?;
        let (prefix, digest): (&[u8], Vec<u8>) = match hash {
            RsaHash::Sha256 => (&SHA256_PREFIX, Sha256::digest(message).to_vec()),
            RsaHash::Sha384 => (&SHA384_PREFIX, Sha384::digest(message).to_vec()),
            RsaHash::Sha512 => (&SHA512_PREFIX, Sha512::digest(message).to_vec()),
        };
        // EM = 0x00 || 0x01 || PS (0xff..., >= 8 bytes) || 0x00 || DigestInfo
        let t_len = prefix.len().saturating_add(digest.len());
        let ps_len = self
            .byte_len
            .checked_sub(t_len.saturating_add(3))
            .filter(|&l| l >= 8)
            .ok_or(RsaError::VerificationFailed)?;
        let mut expected = Vec::with_capacity(self.byte_len);
        expected.extend_from_slice(&[0x00, 0x01]);
        expected.resize(2 + ps_len, 0xff);
        expected.push(0x00);
        expected.extend_from_slice(prefix);
        expected.extend_from_slice(&digest);
        if expected == em {
            Ok(())
        } else {
            Err(RsaError::VerificationFailed)
        }
    }

    /// Verifies an RSASSA-PSS signature (JWA `PS256`, `PS384`, `PS512`): MGF1
    /// with the same hash, salt length equal to the hash length, trailer 0xbc.
    pub fn verify_pss(
        &self,
        hash: RsaHash,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), RsaError> {
        let em = self.rsavp1(signature)?;
        match hash {
            RsaHash::Sha256 => self.emsa_pss_verify::<Sha256>(message, &em),
            RsaHash::Sha384 => self.emsa_pss_verify::<Sha384>(message, &em),
            RsaHash::Sha512 => self.emsa_pss_verify::<Sha512>(message, &em),
        }
    }

    /// The raw RSA public-key operation, RSAVP1 (RFC 8017 section 5.2.2)
    /// followed by I2OSP: checks that the signature is exactly `size()` bytes
    /// and that `s < n`, and returns `s^e mod n` as `size()` big-endian bytes.
    /// No padding is checked: use `verify_pkcs1v15` or `verify_pss`.
    pub fn rsavp1(&self, signature: &[u8]) -> Result<Vec<u8>, RsaError> {
        if signature.len() != self.byte_len {
            return Err(RsaError::InvalidSignatureLength);
        }
        let k = self.n.len();
        let mut s = be_bytes_to_limbs(signature, k).ok_or(RsaError::SignatureOutOfRange)?;
        if !less_than(&s, &self.n) {
            return Err(RsaError::SignatureOutOfRange);
        }
        s.resize(k + PAD, 0);
        let modulus = Modulus {
            n: &self.n,
            n_rev: &self.n_rev,
            n0inv: self.n0inv,
        };
        let mut ws = Workspace::new(k);
        let x = modulus.pow_free(&s, self.e, &mut ws);
        let mut m = vec![0u32; k + PAD];
        modulus.mul(&mut m, &x, &self.fix_rev, &mut ws.m);
        limbs_to_be_bytes(m.get(..k).unwrap_or_default(), self.byte_len)
            .ok_or(RsaError::VerificationFailed)
    }

    /// EMSA-PSS-VERIFY (RFC 8017 section 9.1.2) with sLen = hLen.
    fn emsa_pss_verify<D: Digest>(&self, message: &[u8], em_full: &[u8]) -> Result<(), RsaError> {
        const FAIL: RsaError = RsaError::VerificationFailed;
        let m_hash = D::digest(message);
        let m_hash = m_hash.as_slice();
        let h_len = m_hash.len();
        let s_len = h_len;
        // emBits = modBits - 1, emLen = ceil(emBits / 8). When emBits is a
        // multiple of 8, emLen = k - 1 and the first byte of the k-byte
        // RSAVP1 output must be zero (I2OSP(m, emLen) must not fail).
        let em_bits = self.bits.checked_sub(1).ok_or(FAIL)?;
        let em_len = em_bits.div_ceil(8);
        let skip = em_full.len().checked_sub(em_len).ok_or(FAIL)?;
        let (lead, em) = em_full.split_at_checked(skip).ok_or(FAIL)?;
        if lead.iter().any(|&b| b != 0) {
            return Err(FAIL);
        }
        // Step 3.
        if em_len < h_len.saturating_add(s_len).saturating_add(2) {
            return Err(FAIL);
        }
        // Step 4.
        let (trailer, rest) = em.split_last().ok_or(FAIL)?;
        if *trailer != 0xbc {
            return Err(FAIL);
        }
        // Step 5.
        let db_len = em_len.checked_sub(h_len + 1).ok_or(FAIL)?;
        let (masked_db, h) = rest.split_at_checked(db_len).ok_or(FAIL)?;
        // Step 6: the leftmost 8*emLen - emBits bits must be zero.
        let zero_bits = 8 * em_len - em_bits;
        let top_mask = 0xffu8 >> zero_bits;
        if masked_db.first().is_none_or(|b| b & !top_mask != 0) {
            return Err(FAIL);
        }
        // Steps 7-9.
        let mut db = masked_db.to_vec();
        mgf1_xor::<D>(h, &mut db);
        if let Some(first) = db.first_mut() {
            *first &= top_mask;
        }
        // Step 10: DB = PS (zeros) || 0x01 || salt.
        let ps_len = db_len.checked_sub(s_len + 1).ok_or(FAIL)?;
        let (ps, rest) = db.split_at_checked(ps_len).ok_or(FAIL)?;
        let (one, salt) = rest.split_first().ok_or(FAIL)?;
        if ps.iter().any(|&b| b != 0) || *one != 0x01 || salt.len() != s_len {
            return Err(FAIL);
        }
        // Steps 12-14.
        let mut hasher = D::new();
        hasher.update([0u8; 8]);
        hasher.update(m_hash);
        hasher.update(salt);
        let h2 = hasher.finalize();
        if h2.as_slice() == h {
            Ok(())
        } else {
            Err(FAIL)
        }
    }
}

/// DigestInfo DER prefixes, RFC 8017 section 9.2 note 1.
const SHA256_PREFIX: [u8; 19] = [
    0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05,
    0x00, 0x04, 0x20,
];
const SHA384_PREFIX: [u8; 19] = [
    0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05,
    0x00, 0x04, 0x30,
];
const SHA512_PREFIX: [u8; 19] = [
    0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05,
    0x00, 0x04, 0x40,
];

/// `out ^= MGF1(seed, out.len())` (RFC 8017 appendix B.2.1).
fn mgf1_xor<D: Digest>(seed: &[u8], out: &mut [u8]) {
    let h_len = <D as Digest>::output_size().max(1);
    for (counter, chunk) in out.chunks_mut(h_len).enumerate() {
        let mut hasher = D::new();
        hasher.update(seed);
        hasher.update((counter as u32).to_be_bytes());
        let block = hasher.finalize();
        for (o, m) in chunk.iter_mut().zip(block.as_slice()) {
            *o ^= m;
        }
    }
}

// ---------------------------------------------------------------------------
// Multi-precision arithmetic.
//
// Numbers are `k` little-endian limbs of 27 bits, each stored in a u32, with
// R = 2^(27k) > n. A 27x27-bit product is below 2^54, so a whole column of a
// product-scanning Montgomery multiplication (at most 2k products plus the
// carry, k <= 304 for 8192-bit moduli: < 608 * 2^54 + 2^37 < 2^64) can be
// summed in one u64 with no carry handling inside the loops. Each column is
// then a plain dot product of two forward-running slices (one operand is kept
// with its limbs reversed): 2 loads, 1 multiply and 1 add per product in
// scalar code, and `i64x2.extmul_{low,high}_i32x4_u` (4 products per pair of
// instructions) with the wasm `simd128` feature.
// ---------------------------------------------------------------------------

const LIMB_BITS: usize = 27;
const LIMB_MASK: u32 = (1 << LIMB_BITS) - 1;

fn strip_leading_zeros(b: &[u8]) -> &[u8] {
    let z = b.iter().take_while(|&&x| x == 0).count();
    b.get(z..).unwrap_or_default()
}

/// Bit length of a big-endian byte string without leading zero bytes.
fn bit_length_be(b: &[u8]) -> usize {
    match b.first() {
        None => 0,
        Some(&top) => (b.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
    }
}

/// Big-endian bytes to `k` little-endian limbs; `None` if the value does not fit.
fn be_bytes_to_limbs(bytes: &[u8], k: usize) -> Option<Vec<u32>> {
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
fn limbs_to_be_bytes(limbs: &[u32], len: usize) -> Option<Vec<u8>> {
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
fn neg_inv(x: u32) -> u32 {
    let mut inv = x;
    for _ in 0..4 {
        inv = inv.wrapping_mul(2u32.wrapping_sub(x.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & LIMB_MASK
}

/// `a < b` for equal-length limb slices.
fn less_than(a: &[u32], b: &[u32]) -> bool {
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            return x < y;
        }
    }
    false
}

/// `a -= b` (mod R).
fn sub_in_place(a: &mut [u32], b: &[u32]) {
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
const PAD: usize = 3;

fn round4(x: usize) -> usize {
    (x + 3) & !3
}

/// The limbs of `v` in reverse order followed by `PAD` zeros.
fn reversed_padded(v: &[u32]) -> Vec<u32> {
    let mut r: Vec<u32> = v.iter().rev().copied().collect();
    r.resize(v.len() + PAD, 0);
    r
}

/// `x[xs..xs+len] . y[ys..ys+len]` (+ `z[zs..] . w[ws..]` for `dot2`), or 0
/// if a range is out of bounds (which the callers never ask for).
#[inline(always)]
fn dot_at(x: &[u32], xs: usize, y: &[u32], ys: usize, len: usize) -> u64 {
    match (x.get(xs..xs + len), y.get(ys..ys + len)) {
        (Some(a), Some(b)) => dot(a, b),
        _ => 0,
    }
}

#[inline(always)]
fn dot2_at(x: &[u32], xs: usize, y: &[u32], ys: usize, z: &[u32], w: &[u32], len: usize) -> u64 {
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
/// bound in the section comment: the sum never wraps.
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

/// Scratch space for one exponentiation; every buffer is `k + PAD` limbs.
struct Workspace {
    /// Montgomery quotient digits of the current multiplication.
    m: Vec<u32>,
    /// Result buffer.
    tmp: Vec<u32>,
    /// Reversed copy of the base (multiplier) and of the value being squared.
    x_rev: Vec<u32>,
    a_rev: Vec<u32>,
}

impl Workspace {
    fn new(k: usize) -> Self {
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
struct Modulus<'a> {
    /// k limbs.
    n: &'a [u32],
    /// k limbs reversed, then PAD zeros.
    n_rev: &'a [u32],
    n0inv: u32,
}

impl Modulus<'_> {
    /// `v = 2v mod n` for `v < n` (k limbs).
    fn double(&self, v: &mut [u32]) {
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
    fn mul(&self, out: &mut [u32], a: &[u32], b_rev: &[u32], m: &mut [u32]) {
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
    fn pow_free(&self, x: &[u32], e: u64, ws: &mut Workspace) -> Vec<u32> {
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
