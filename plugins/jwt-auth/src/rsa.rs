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
//!
//! One concern a file:
//! - `key`: the public key (`RsaPublicKey::from_components`) and RSAVP1, `s^e mod n`;
//! - `padding`: the signature schemes checked on RSAVP1's output, PKCS #1 v1.5 and PSS;
//! - `error`: why a key or a signature is refused;
//! - `limbs`: numbers as 27-bit limbs, and byte strings to and from limbs;
//! - `dot`: the column dot products, scalar and wasm SIMD;
//! - `montgomery`: Montgomery multiplication, squaring and exponentiation modulo n.

// Bignum code (this module and its files): limb counts and indices are bounded by
// MAX_MODULUS_BITS (checked in `from_components`) and limb products fit u64 by construction
// (27-bit limbs); the tests run with overflow checks against num-bigint, including all-ones moduli
// up to 8192 bits.
#![allow(clippy::arithmetic_side_effects)]

mod dot;
mod error;
mod key;
mod limbs;
mod montgomery;
mod padding;

pub use error::RsaError;
pub use key::{RsaPublicKey, MAX_MODULUS_BITS, MIN_MODULUS_BITS};
pub use padding::RsaHash;
