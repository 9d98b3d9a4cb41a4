//! The shared-data values: a compact binary encoding (not JSON), little-endian, fixed size.
//!
//! Per-key limit state, [`STATE_BYTES`] = 21 bytes:
//!
//! ```text
//! byte 0       tag: 1 = token bucket v1, 2 = fixed window v1
//! bytes 1..5   u32 fingerprint of the limit's parameters (Limit::fingerprint)
//! bytes 5..13  u64 token bucket: level (steps, 1 unit = period-in-ms steps)
//!                  fixed window: window start (Unix ms)
//! bytes 13..21 u64 token bucket: last refill (Unix ms)
//!                  fixed window: units counted in the window
//! ```
//!
//! Creation record (one per zone: the key count, the key-creation lock and whether the store has
//! refused a key), [`ZONE_BYTES`] = 18:
//!
//! ```text
//! byte 0       tag: 16 = creation record
//! bytes 1..9   u64 keys created in the zone (counted against max_keys)
//! bytes 9..17  u64 creation lock held until (Unix ms; 0 = free)
//! byte 17      flags: bit 0 = the store refused a new key (sticky: later keys are refused
//!              without taking the lock)
//! ```
//!
//! Decoding refuses a wrong size, an unknown tag or (for states) another fingerprint; the caller
//! then treats the key as fresh and overwrites it with a CAS write.

use crate::algorithm::{Limit, State};

/// Size of an encoded limit state (bytes).
pub const STATE_BYTES: usize = 21;

const TAG_TOKEN_BUCKET: u8 = 1;
const TAG_FIXED_WINDOW: u8 = 2;

/// Encodes `state` of `limit` (see the module documentation).
pub fn encode(limit: &Limit, state: &State) -> [u8; STATE_BYTES] {
    let (tag, a, b) = match *state {
        State::TokenBucket {
            level,
            updated_at_ms,
        } => (TAG_TOKEN_BUCKET, level, updated_at_ms),
        State::FixedWindow {
            window_start_ms,
            count,
        } => (TAG_FIXED_WINDOW, window_start_ms, count),
    };
    let mut out = [0u8; STATE_BYTES];
    write(&mut out, 0, &[tag]);
    write(&mut out, 1, &limit.fingerprint().to_le_bytes());
    write(&mut out, 5, &a.to_le_bytes());
    write(&mut out, 13, &b.to_le_bytes());
    out
}

/// Decodes a state written for `limit`; `None` if the bytes are not one (wrong size, tag, or
/// parameters).
pub fn decode(limit: &Limit, bytes: &[u8]) -> Option<State> {
    if bytes.len() != STATE_BYTES {
        return None;
    }
    let tag = *bytes.first()?;
    let fingerprint = u32::from_le_bytes(bytes.get(1..5)?.try_into().ok()?);
    if fingerprint != limit.fingerprint() {
        return None;
    }
    let a = read_u64(bytes, 5)?;
    let b = read_u64(bytes, 13)?;
    match tag {
        TAG_TOKEN_BUCKET => Some(State::TokenBucket {
            level: a,
            updated_at_ms: b,
        }),
        TAG_FIXED_WINDOW => Some(State::FixedWindow {
            window_start_ms: a,
            count: b,
        }),
        _ => None,
    }
}

/// The creation record (key count and creation lease), shared with the cost filter.
pub use tollgate_common::shared_data::{CreationRecord, ZONE_BYTES};

fn write(out: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = at
        .checked_add(bytes.len())
        .and_then(|end| out.get_mut(at..end))
    {
        dst.copy_from_slice(bytes);
    }
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let end = at.checked_add(8)?;
    Some(u64::from_le_bytes(bytes.get(at..end)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Period;

    #[test]
    fn round_trips_and_layout() {
        let tb = Limit::token_bucket(20, 10, Period::Second).unwrap();
        let s = State::TokenBucket {
            level: 0x0102_0304_0506_0708,
            updated_at_ms: 1_700_000_000_123,
        };
        let bytes = encode(&tb, &s);
        assert_eq!(bytes.len(), 21);
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..5], &tb.fingerprint().to_le_bytes());
        assert_eq!(&bytes[5..13], &[8, 7, 6, 5, 4, 3, 2, 1], "little-endian");
        assert_eq!(decode(&tb, &bytes), Some(s));
        let fw = Limit::fixed_window(50, Period::Minute).unwrap();
        let s = State::FixedWindow {
            window_start_ms: u64::MAX,
            count: 0,
        };
        assert_eq!(decode(&fw, &encode(&fw, &s)), Some(s));
        assert_eq!(decode(&fw, &encode(&fw, &fw.initial())), Some(fw.initial()));
        let z = CreationRecord {
            keys: 7,
            locked_until_ms: 9,
            store_full: false,
            pending: false,
        };
        assert_eq!(CreationRecord::decode(&z.encode()), Some(z));
        assert_eq!(z.encode()[0], 16);
    }

    #[test]
    fn refuses_bytes_that_are_not_a_state_of_this_limit() {
        let tb = Limit::token_bucket(20, 10, Period::Second).unwrap();
        let good = encode(&tb, &tb.initial());
        assert_eq!(decode(&tb, &good[..20]), None, "short");
        assert_eq!(decode(&tb, &[good.as_slice(), &[0]].concat()), None, "long");
        assert_eq!(decode(&tb, &[]), None);
        let mut bad_tag = good;
        bad_tag[0] = 3;
        assert_eq!(decode(&tb, &bad_tag), None, "unknown version/tag");
        let other = Limit::token_bucket(21, 10, Period::Second).unwrap();
        assert_eq!(decode(&other, &good), None, "other parameters");
        assert_eq!(decode(&tb, br#"{"level":1}"#), None);
        assert_eq!(CreationRecord::decode(&good), None);
        assert_eq!(
            CreationRecord::decode(&CreationRecord::default().encode()[..16]),
            None
        );
        let mut z = CreationRecord::default().encode();
        z[0] = 1;
        assert_eq!(CreationRecord::decode(&z), None);
    }
}
