//! The RSA public key ([`RsaPublicKey`]): its checks and precomputed Montgomery constants
//! (`from_components`), and the raw public-key operation RSAVP1, `s^e mod n`, that both
//! signature schemes (`padding`) start from.

use core::fmt;

use super::error::RsaError;
use super::limbs::{
    be_bytes_to_limbs, bit_length_be, less_than, limbs_to_be_bytes, neg_inv, reversed_padded,
    strip_leading_zeros, LIMB_BITS, PAD,
};
use super::montgomery::{Modulus, Workspace};

/// Smallest accepted modulus, in bits.
pub const MIN_MODULUS_BITS: usize = 2048;
/// Largest accepted modulus, in bits.
pub const MAX_MODULUS_BITS: usize = 8192;

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
    pub(super) bits: usize,
    /// Byte length of n (= signature length).
    pub(super) byte_len: usize,
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
}
