//! The per-VM cache of cookie values that verified, so that a pinned client does not pay the
//! HMAC-SHA256 check of its cookie on every request (two SHA-256 compressions and the tag
//! comparison: about 13,000 of the 23,000 instructions the filter cost per request,
//! bench/results/instructions_filters.md).
//!
//! **What it holds.** Only values whose tag verified under the configuration's [`Signer`] and
//! that were honoured (`sticky::read_cookie`): the value, its expiry and its upstream's index.
//! A value and a configuration determine both, so an entry gives exactly what verifying again
//! would; the expiry is checked against the clock on every request, as for an uncached value.
//! One cache belongs to one configuration (the filter keeps it beside its [`Config`]): a new
//! configuration (another secret, cookie name or upstream list) starts with an empty one.
//!
//! **What a client can do to it.** A value is honoured from the cache only if it is byte for
//! byte a value that verified, so no value is accepted that would not verify. The values are
//! client-chosen, so the slot of a value is its SipHash-1-3 under keys drawn once per VM (std's
//! `RandomState`, seeded by WASI `random_get`): a client cannot aim values at a slot. The cache
//! is direct-mapped, [`SLOTS`] slots of one entry each, an entry replacing whatever held its slot:
//! memory is bounded ([`SLOTS`] values of at most [`MAX_VALUE_BYTES`]), each request costs one
//! hash and at most one comparison, and the worst a client can do (present many genuine values it
//! collected) is to evict others' entries, which then cost a verification again. A lookup
//! compares the value with its slot's entry only; that comparison returns at the first differing
//! word, which tells nothing useful: a client cannot choose which entry it is compared with, and
//! entries are values the filter itself gave out to clients.
//!
//! [`Signer`]: crate::cookie_value::Signer
//! [`Config`]: crate::config::Config
//! [`MAX_VALUE_BYTES`]: crate::cookie_value::MAX_VALUE_BYTES

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use tollgate_common::bytes::same_bytes;

/// Slots of the filter's cache: at most this many values are remembered per VM (a few hundred
/// kilobytes at most).
pub const SLOTS: usize = 1024;

/// What a verified, honoured value pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// Index of the upstream it names.
    pub upstream: usize,
    /// Its expiry (Unix seconds).
    pub expiry: u64,
}

#[derive(Debug)]
struct Entry {
    value: Box<str>,
    pin: Pin,
}

/// Verified cookie values by value, direct-mapped (see the module documentation).
#[derive(Debug)]
pub struct VerifiedCookies {
    slots: Vec<Option<Entry>>,
    keys: RandomState,
}

impl VerifiedCookies {
    /// A cache of `slots` slots (the filter uses [`SLOTS`]); 0 disables it (nothing is kept,
    /// every value is verified).
    pub fn new(slots: usize) -> Self {
        VerifiedCookies {
            slots: (0..slots).map(|_| None).collect(),
            keys: RandomState::new(),
        }
    }

    /// The slot of `value`: its keyed hash modulo the number of slots.
    fn slot(&self, value: &str) -> Option<usize> {
        let len = u64::try_from(self.slots.len()).ok()?;
        let at = self.keys.hash_one(value).checked_rem(len)?;
        usize::try_from(at).ok()
    }

    /// What `value` pins, if it is (byte for byte) a value remembered with [`Self::insert`].
    pub fn get(&self, value: &str) -> Option<Pin> {
        let entry = self.slots.get(self.slot(value)?)?.as_ref()?;
        same_bytes(entry.value.as_bytes(), value.as_bytes()).then_some(entry.pin)
    }

    /// Remembers `value`, which verified and pins `pin`, in place of its slot's entry. Call it
    /// only for a value that verified under this cache's configuration.
    pub fn insert(&mut self, value: &str, pin: Pin) {
        let Some(at) = self.slot(value) else {
            return;
        };
        if let Some(slot) = self.slots.get_mut(at) {
            *slot = Some(Entry {
                value: value.into(),
                pin,
            });
        }
    }

    /// Number of values held (at most the number of slots); scans the slots (tests).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: Pin = Pin {
        upstream: 1,
        expiry: 1_800_003_600,
    };
    const VALUE: &str = "blue.1800003600.Xw3aQ0x2fY9n1Jc8k4mV7sR2bT6uH0pL3eD5gA1zKqW";

    #[test]
    fn only_the_exact_value_hits() {
        // One slot: every value lands on the remembered one, so the comparison decides alone.
        let mut c = VerifiedCookies::new(1);
        assert_eq!(c.get(VALUE), None);
        c.insert(VALUE, PIN);
        assert_eq!(c.get(VALUE), Some(PIN));
        let bytes = VALUE.as_bytes();
        for at in 0..bytes.len() {
            for xor in [1u8, 0x20, 0x40] {
                let mut other = bytes.to_vec();
                other[at] ^= xor;
                let Ok(other) = String::from_utf8(other) else {
                    continue;
                };
                assert_eq!(c.get(&other), None, "{other}");
            }
            assert_eq!(c.get(VALUE.get(..at).unwrap()), None, "prefix of {at}");
        }
        assert_eq!(c.get(&format!("{VALUE}A")), None);
        assert_eq!(c.get(&format!("{VALUE}{VALUE}")), None);
    }

    #[test]
    fn bounded_and_replacing() {
        let mut c = VerifiedCookies::new(8);
        for i in 0..1000u64 {
            c.insert(&format!("blue.{i}.tag"), PIN);
            assert!(c.len() <= 8);
        }
        assert!(!c.is_empty());
        assert_eq!(c.get("blue.999.tag"), Some(PIN), "the latest value is held");
        let mut one = VerifiedCookies::new(1);
        one.insert("a.1.x", PIN);
        one.insert(
            "b.2.y",
            Pin {
                upstream: 0,
                expiry: 2,
            },
        );
        assert_eq!(one.get("a.1.x"), None, "replaced");
        assert_eq!(
            one.get("b.2.y"),
            Some(Pin {
                upstream: 0,
                expiry: 2
            })
        );
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn disabled_keeps_nothing() {
        let mut off = VerifiedCookies::new(0);
        off.insert(VALUE, PIN);
        assert_eq!(off.get(VALUE), None);
        assert!(off.is_empty());
    }

    #[test]
    fn slots_are_keyed_per_cache() {
        // Two caches place the same values differently (with overwhelming probability): the
        // slot of a value is not something a client can compute.
        let (a, b) = (VerifiedCookies::new(SLOTS), VerifiedCookies::new(SLOTS));
        let differ = (0..64)
            .filter(|i| {
                let v = format!("blue.{i}.tag");
                a.slot(&v) != b.slot(&v)
            })
            .count();
        assert!(differ > 32, "{differ}");
    }
}
