//! The per-VM cache of verified tokens, so that a client reusing its token does not pay a
//! signature check on every request. Bounded (LRU, `lru` crate); an entry is dropped once its
//! token's `exp` has passed, and the whole cache when a provider's keys change.

use std::num::NonZeroUsize;
use std::rc::Rc;

use lru::LruCache;

use crate::verify::Verified;

/// Verified tokens by their compact serialization.
pub struct VerifiedCache {
    entries: Option<LruCache<String, Rc<Verified>>>,
}

impl VerifiedCache {
    /// A cache of at most `capacity` entries; 0 disables it.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: NonZeroUsize::new(capacity).map(LruCache::new),
        }
    }

    /// The verified token, if cached and not past its `exp` at `now` (Unix seconds).
    pub fn get(&mut self, token: &str, now: u64) -> Option<Rc<Verified>> {
        let entries = self.entries.as_mut()?;
        let hit = entries.get(token)?;
        if hit.expires_at.is_some_and(|exp| now > exp) {
            entries.pop(token);
            return None;
        }
        Some(Rc::clone(hit))
    }

    /// Remembers a verified token.
    pub fn insert(&mut self, token: &str, verified: &Rc<Verified>) {
        if let Some(entries) = self.entries.as_mut() {
            entries.put(token.to_string(), Rc::clone(verified));
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

    #[test]
    fn bounded_and_never_past_exp() {
        let mut c = VerifiedCache::new(2);
        c.insert("a", &verified(Some(100)));
        c.insert("b", &verified(None));
        c.insert("c", &verified(Some(100)));
        assert_eq!(c.len(), 2);
        assert!(
            c.get("a", 50).is_none(),
            "least recently used entry evicted"
        );
        assert!(c.get("c", 100).is_some());
        assert!(c.get("c", 101).is_none());
        assert_eq!(c.len(), 1, "expired entry removed");
        c.clear();
        assert!(c.is_empty());
        let mut off = VerifiedCache::new(0);
        off.insert("a", &verified(None));
        assert!(off.get("a", 0).is_none());
    }
}
