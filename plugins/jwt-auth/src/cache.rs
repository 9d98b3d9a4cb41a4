//! The per-VM cache of verified tokens, so that a client reusing its token does not pay a
//! signature check on every request. Bounded (LRU, `lru` crate); an entry is dropped once its
//! token's `exp` has passed, and the whole cache when a provider's keys change.
//!
//! The keys are tokens, which clients choose: the map hashes them with std's keyed SipHash-1-3
//! (`RandomState`, random keys per VM), so that a client cannot aim tokens at one bucket, and
//! only tokens that verified are ever inserted. The hash covers a token's last
//! [`HASHED_BYTES`] bytes only: in a token that verified they are part of its signature (the
//! last segment, at least 43 characters for every algorithm accepted), unpredictable and
//! distinct from one token to the next, so entries spread as under a hash of the whole token,
//! which cost 1,262 instructions per request for a 240-byte token. A lookup still compares the
//! whole token, with [`tollgate_common::bytes::same_bytes`] (8 bytes a step), not `==`
//! (wasi-libc's `memcmp`, one byte a step: 5,000 instructions per request for that token).

use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::rc::Rc;

use lru::LruCache;
use tollgate_common::bytes::same_bytes;

use crate::verify::Verified;

/// How many bytes at the end of a token its hash covers (see the module documentation).
pub const HASHED_BYTES: usize = 32;

/// A token as a cache key: hashed by its last [`HASHED_BYTES`] bytes (all of a shorter one),
/// compared whole with [`same_bytes`] (the same equality as `str`'s). Equal tokens have equal
/// tails, so `Hash` and `Eq` agree.
#[derive(Debug, Clone)]
pub struct TokenKey(String);

impl TokenKey {
    /// The token (the compact serialization).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for TokenKey {
    fn from(token: String) -> Self {
        Self(token)
    }
}

impl PartialEq for TokenKey {
    fn eq(&self, other: &Self) -> bool {
        same_bytes(self.0.as_bytes(), other.0.as_bytes())
    }
}

impl Eq for TokenKey {}

impl Hash for TokenKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let bytes = self.0.as_bytes();
        let tail = bytes.get(bytes.len().saturating_sub(HASHED_BYTES)..);
        tail.unwrap_or(bytes).hash(state);
    }
}

/// Verified tokens by their compact serialization.
pub struct VerifiedCache {
    entries: Option<LruCache<TokenKey, Rc<Verified>>>,
}

impl VerifiedCache {
    /// A cache of at most `capacity` entries; 0 disables it.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: NonZeroUsize::new(capacity).map(LruCache::new),
        }
    }

    /// The verified token, if cached and not past its `exp` at `now` (Unix seconds).
    pub fn get(&mut self, token: &TokenKey, now: u64) -> Option<Rc<Verified>> {
        let entries = self.entries.as_mut()?;
        let hit = entries.get(token)?;
        if hit.expires_at.is_some_and(|exp| now > exp) {
            entries.pop(token);
            return None;
        }
        Some(Rc::clone(hit))
    }

    /// Remembers a token that verified (never another: see the module documentation).
    pub fn insert(&mut self, token: TokenKey, verified: &Rc<Verified>) {
        if let Some(entries) = self.entries.as_mut() {
            entries.put(token, Rc::clone(verified));
        }
    }

    /// Forgets everything (after a key change).
    pub fn clear(&mut self) {
        if let Some(entries) = self.entries.as_mut() {
            entries.clear();
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, LruCache::len)
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(exp: Option<u64>) -> Rc<Verified> {
        Rc::new(Verified {
            provider: 0,
            expires_at: exp,
            audiences: vec![],
            headers: vec![],
        })
    }

    fn k(token: &str) -> TokenKey {
        TokenKey::from(token.to_string())
    }

    #[test]
    fn bounded_and_never_past_exp() {
        let mut c = VerifiedCache::new(2);
        c.insert(k("a"), &verified(Some(100)));
        c.insert(k("b"), &verified(None));
        c.insert(k("c"), &verified(Some(100)));
        assert_eq!(c.len(), 2);
        assert!(
            c.get(&k("a"), 50).is_none(),
            "least recently used entry evicted"
        );
        assert!(c.get(&k("c"), 100).is_some());
        assert!(c.get(&k("c"), 101).is_none());
        assert_eq!(c.len(), 1, "expired entry removed");
        c.clear();
        assert!(c.is_empty());
        let mut off = VerifiedCache::new(0);
        off.insert(k("a"), &verified(None));
        assert!(off.get(&k("a"), 0).is_none());
    }

    #[test]
    fn only_the_exact_token_hits() {
        // A token of realistic length (the word-wise comparison decides), and every token one
        // byte away from it: changed at any position, cut short, or extended.
        let token = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImhzIn0.eyJzdWIiOiJiZW5jaC11c2VyIn0.\
                     c2lnbmF0dXJlLXNpZ25hdHVyZS1zaWduYXR1cmUtc2ln";
        let mut c = VerifiedCache::new(1024);
        c.insert(k(token), &verified(None));
        assert!(c.get(&k(token), 0).is_some());
        let bytes = token.as_bytes();
        for at in 0..bytes.len() {
            let mut other = bytes.to_vec();
            other[at] = if other[at] == b'A' { b'B' } else { b'A' };
            let other = String::from_utf8(other).unwrap();
            assert!(c.get(&k(&other), 0).is_none(), "{other}");
            assert!(
                c.get(&k(token.get(..at).unwrap()), 0).is_none(),
                "prefix of {at}"
            );
        }
        assert!(c.get(&k(&format!("{token}A")), 0).is_none());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn tokens_with_one_tail_are_told_apart() {
        // Tokens that differ only before their hashed tail share a hash: each is still found
        // by itself only (lookups compare whole tokens).
        let tail = "s".repeat(HASHED_BYTES);
        let tokens: Vec<String> = (0..64).map(|i| format!("h.p{i}.{tail}")).collect();
        let mut c = VerifiedCache::new(1024);
        for (i, t) in tokens.iter().enumerate() {
            c.insert(k(t), &verified(Some(i as u64)));
        }
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!(c.get(&k(t), 0).unwrap().expires_at, Some(i as u64), "{t}");
        }
        assert!(c.get(&k(&format!("h.p64.{tail}")), 0).is_none());
        assert!(c.get(&k(&tail), 0).is_none());
        assert!(c.get(&k(""), 0).is_none());
    }

    #[test]
    fn key_equality_is_str_equality() {
        for (a, b) in [
            ("", ""),
            ("abc", "abc"),
            ("abc", "abd"),
            ("0123456789", "0123456789"),
        ] {
            assert_eq!(k(a) == k(b), a == b, "{a:?} {b:?}");
        }
        assert!(k("0123456789abcdefX") != k("0123456789abcdefY"));
    }
}
