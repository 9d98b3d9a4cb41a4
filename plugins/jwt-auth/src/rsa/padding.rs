//! The signature schemes, checked on the output of RSAVP1 ([`RsaPublicKey::rsavp1`]):
//! RSASSA-PKCS1-v1_5 (EMSA-PKCS1-v1_5 re-encoded and compared whole, RFC 8017 section 8.2.2)
//! and RSASSA-PSS (EMSA-PSS-VERIFY with MGF1, RFC 8017 section 9.1.2), over the hash of
//! [`RsaHash`].

use sha2::{Digest, Sha256, Sha384, Sha512};

use super::error::RsaError;
use super::key::RsaPublicKey;

/// Hash function of the signature scheme (also used by MGF1 for PSS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RsaHash {
    Sha256,
    Sha384,
    Sha512,
}

impl RsaPublicKey {
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
