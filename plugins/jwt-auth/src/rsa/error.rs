//! Why an RSA key was refused or a signature did not verify ([`RsaError`]).

use core::fmt;

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
