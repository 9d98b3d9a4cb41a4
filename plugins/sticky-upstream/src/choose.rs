//! Choosing an upstream for a client that has no valid cookie.
//!
//! - **Weighted** ([`Chooser::weighted`]): upstream `i` with probability `weight[i] / Σ weight`,
//!   from one uniformly random `u64` (deterministic given that input, so it is tested with seeded
//!   draws). The `u64` is mapped onto `[0, Σ weight)` by the multiply-shift reduction
//!   (`(draw × total) >> 64`), whose bias is below `total / 2^64`, then looked up in the
//!   cumulative weights by binary search.
//! - **By key** ([`Chooser::by_key`]): weighted rendezvous hashing (highest random weight,
//!   Thaler and Ravishankar 1998, with weights as in Schindelhauer and Schomaker's "weighted
//!   distributed hash tables"): for a key `k`, each upstream draws a pseudo-random
//!   `u = H(k, i) ∈ (0, 1)` and scores `-ln(u) / weight[i]`, an exponential variable of rate
//!   `weight[i]`; the smallest score wins, so each upstream gets a share of keys proportional to
//!   its weight, a key always maps to the same upstream, and removing an upstream moves only the
//!   keys it had. `H` is SHA-256 of the key (domain-separated, computed once per choice) mixed
//!   with a per-upstream SHA-256 of its name, so it is stable across restarts, workers, gateways
//!   and Rust releases.
//!
//! An upstream of weight 0 is never chosen (it is draining: clients pinned to it by a cookie stay
//! there, no new client goes there).
//!
//! Both choices take an optional upstream to exclude, for re-pinning a client away from an
//! upstream that failed.
//!
//! [`Draws`] is where the random `u64`s come from in the filter: SipHash-1-3 (std's
//! `RandomState`) keyed once per VM with 128 random bits, applied to a counter. On
//! `wasm32-wasip1` std takes those bits from WASI `random_get`, which the proxy-wasm hosts
//! implement with their own random source; SipHash is a pseudo-random function, so the draws are
//! unpredictable to clients without relying on the host's clock.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use sha2::{Digest, Sha256};

/// Domain-separation prefix of key hashes.
const KEY_DOMAIN: &[u8] = b"tollgate-sticky-upstream/key/v1\0";
/// Domain-separation prefix of upstream-name hashes.
const UPSTREAM_DOMAIN: &[u8] = b"tollgate-sticky-upstream/upstream/v1\0";

/// The first 8 bytes of SHA-256(`domain` ‖ `data`), big-endian.
fn sha256_u64(domain: &[u8], data: &[u8]) -> u64 {
    let digest = Sha256::new()
        .chain_update(domain)
        .chain_update(data)
        .finalize();
    let mut first = [0u8; 8];
    for (dst, src) in first.iter_mut().zip(digest.iter()) {
        *dst = *src;
    }
    u64::from_be_bytes(first)
}

/// The stable 64-bit hash of a choice key (a header value), SHA-256 based.
pub fn key_hash(key: &[u8]) -> u64 {
    sha256_u64(KEY_DOMAIN, key)
}

/// SplitMix64's output function (Steele, Lea and Flood 2014): a bijection of `u64` with full
/// avalanche, used to combine a key hash with an upstream hash.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `draw` mapped uniformly onto `[0, n)` (Lemire's multiply-shift; `n > 0`).
fn reduce(draw: u64, n: u64) -> u64 {
    let wide = u128::from(draw).wrapping_mul(u128::from(n));
    u64::try_from(wide >> 64).unwrap_or(0)
}

/// The precomputed tables of a set of weighted upstreams.
#[derive(Debug, Clone)]
pub struct Chooser {
    weights: Vec<u64>,
    /// `cumulative[i]` = Σ weights[..=i].
    cumulative: Vec<u64>,
    /// Per-upstream hash of its name, for rendezvous hashing.
    seeds: Vec<u64>,
}

impl Chooser {
    /// Tables for upstreams `(name, weight)`, in configuration order. The caller checks that the
    /// total weight is positive; with a zero total every choice is `None`.
    pub fn new<'a>(upstreams: impl IntoIterator<Item = (&'a str, u32)>) -> Chooser {
        let mut chooser = Chooser {
            weights: Vec::new(),
            cumulative: Vec::new(),
            seeds: Vec::new(),
        };
        let mut total = 0u64;
        for (name, weight) in upstreams {
            let weight = u64::from(weight);
            total = total.saturating_add(weight);
            chooser.weights.push(weight);
            chooser.cumulative.push(total);
            chooser
                .seeds
                .push(sha256_u64(UPSTREAM_DOMAIN, name.as_bytes()));
        }
        chooser
    }

    fn total(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// The upstream for a uniformly random `draw`, by weight, never `exclude`. `None` when no
    /// upstream (other than `exclude`) has a positive weight.
    pub fn weighted(&self, draw: u64, exclude: Option<usize>) -> Option<usize> {
        let excluded_weight = exclude
            .and_then(|i| self.weights.get(i))
            .copied()
            .unwrap_or(0);
        let total = self.total().saturating_sub(excluded_weight);
        if total == 0 {
            return None;
        }
        let target = reduce(draw, total);
        match exclude {
            // Common case: O(log n) in the cumulative weights.
            None => {
                let i = self.cumulative.partition_point(|&c| c <= target);
                (i < self.weights.len()).then_some(i)
            }
            // Re-pinning (rare): walk the weights, skipping the excluded upstream.
            Some(ex) => {
                let mut acc = 0u64;
                for (i, &w) in self.weights.iter().enumerate() {
                    if i == ex {
                        continue;
                    }
                    acc = acc.saturating_add(w);
                    if target < acc {
                        return Some(i);
                    }
                }
                None
            }
        }
    }

    /// The upstream for a key hash ([`key_hash`]), by weighted rendezvous hashing, never
    /// `exclude`. `None` when no upstream (other than `exclude`) has a positive weight.
    pub fn by_key(&self, key_hash: u64, exclude: Option<usize>) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, (&w, &seed)) in self.weights.iter().zip(self.seeds.iter()).enumerate() {
            if w == 0 || Some(i) == exclude {
                continue;
            }
            let h = mix64(key_hash ^ seed);
            // 53 random bits onto the open interval (0, 1): never 0, so ln is finite.
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let score = -u.ln() / w as f64;
            if best.is_none_or(|(_, s)| score < s) {
                best = Some((i, score));
            }
        }
        best.map(|(i, _)| i)
    }
}

/// The filter's source of uniformly random `u64`s: a keyed pseudo-random function of a counter.
pub struct Draws {
    keys: RandomState,
    counter: u64,
}

impl Draws {
    /// Keyed with 128 bits from the platform's random source (WASI `random_get` in a VM).
    pub fn from_platform() -> Draws {
        Draws {
            keys: RandomState::new(),
            counter: 0,
        }
    }

    /// The next draw.
    pub fn next_u64(&mut self) -> u64 {
        self.counter = self.counter.wrapping_add(1);
        self.keys.hash_one(self.counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_covers_the_range() {
        assert_eq!(reduce(0, 10), 0);
        assert_eq!(reduce(u64::MAX, 10), 9);
        assert_eq!(reduce(u64::MAX / 2, 10), 4);
    }

    #[test]
    fn weighted_boundaries() {
        let c = Chooser::new([("a", 1), ("b", 0), ("c", 3)]);
        assert_eq!(c.weighted(0, None), Some(0));
        assert_eq!(c.weighted(u64::MAX / 4 - 1, None), Some(0));
        assert_eq!(c.weighted(u64::MAX / 4 + 1, None), Some(2));
        assert_eq!(c.weighted(u64::MAX, None), Some(2));
        assert_eq!(c.weighted(0, Some(0)), Some(2));
        assert_eq!(c.weighted(u64::MAX, Some(2)), Some(0));
        let only = Chooser::new([("a", 5), ("b", 0)]);
        assert_eq!(
            only.weighted(7, Some(0)),
            None,
            "nothing else can take new clients"
        );
        assert_eq!(Chooser::new([]).weighted(7, None), None);
    }

    #[test]
    fn draws_differ() {
        let mut d = Draws::from_platform();
        let (a, b) = (d.next_u64(), d.next_u64());
        assert_ne!(a, b);
    }
}
