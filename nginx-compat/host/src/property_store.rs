//! The properties a stream's filters set ([`PropertyStore`]): `proxy_set_property` writes them,
//! `proxy_get_property` reads them before the embedding's own.
//!
//! Every path and value lives in one byte buffer, found through a list of offsets, so a
//! stream's properties cost two allocations (the buffer and the list) instead of two a
//! property, and none at all once an embedding reuses a cleared store for its next request
//! ([`PropertyStore::clear`] keeps both). A stream has a few properties (the Tollgate chain
//! sets four): up to [`LINEAR`] are found by comparing lengths, then bytes; past that, through
//! a hash table of the list, so a guest setting thousands stays O(1) a call.
//!
//! A value replaced by a longer one is appended anew; the bytes it leaves behind are reclaimed
//! when they outgrow the live ones ([`PropertyStore::held`] counts only live bytes, which is
//! what the host's limit, `valid::MAX_MAP_BYTES`, bounds), so the buffer stays within twice
//! the live bytes plus [`SLACK`].

use std::hash::Hasher;
use std::ops::Range;

use hashbrown::HashTable;

/// Unreclaimed bytes tolerated before a compaction, whatever the live size (bytes).
pub const SLACK: usize = 4096;

/// Most properties looked up by a walk of the list; more are indexed by a hash table.
pub const LINEAR: usize = 8;

/// Where one property's path and value are in the buffer.
#[derive(Debug, Clone)]
struct Entry {
    path: Range<usize>,
    value: Range<usize>,
}

/// The properties set on one stream (see the module documentation). Paths are the ABI's,
/// segments joined by `\0`, compared byte for byte.
#[derive(Debug, Default)]
pub struct PropertyStore {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
    /// `entries`' positions by path hash, while there are more than [`LINEAR`] (else empty).
    index: HashTable<usize>,
    /// Live bytes: the paths and values the entries point at.
    live: usize,
}

/// FxHash of a path (paths come from the guests, which the operator chose, not from clients).
fn hash(path: &[u8]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    h.write(path);
    h.finish()
}

/// `bytes[range]`, empty when out of bounds (never: the table's ranges are the buffer's).
fn at(bytes: &[u8], range: Range<usize>) -> &[u8] {
    bytes.get(range).unwrap_or_default()
}

impl PropertyStore {
    /// The position of `path`'s entry.
    fn find(&self, path: &[u8]) -> Option<usize> {
        let (bytes, entries) = (&self.bytes, &self.entries);
        let is = |e: &Entry| e.path.len() == path.len() && at(bytes, e.path.clone()) == path;
        if entries.len() <= LINEAR {
            return entries.iter().position(is);
        }
        self.index
            .find(hash(path), |&i| entries.get(i).is_some_and(is))
            .copied()
    }

    /// The value set for `path`.
    pub fn get(&self, path: &[u8]) -> Option<&[u8]> {
        let e = self.entries.get(self.find(path)?)?;
        Some(at(&self.bytes, e.value.clone()))
    }

    /// Sets `path` to `value` (replacing what it had).
    pub fn set(&mut self, path: &[u8], value: &[u8]) {
        match self.find(path) {
            Some(i) => self.replace(i, value),
            None => self.insert(path, value),
        }
        if self.bytes.len().saturating_sub(self.live) > self.live.max(SLACK) {
            self.compact();
        }
    }

    /// Entry `i` takes `value`: where the old value was when it fits, else appended.
    fn replace(&mut self, i: usize, value: &[u8]) {
        let PropertyStore {
            bytes,
            entries,
            live,
            ..
        } = self;
        let Some(e) = entries.get_mut(i) else {
            return;
        };
        *live = live
            .saturating_sub(e.value.len())
            .saturating_add(value.len());
        let start = e.value.start;
        let end = start.saturating_add(value.len());
        match bytes.get_mut(start..end) {
            Some(dst) if value.len() <= e.value.len() => {
                dst.copy_from_slice(value);
                e.value = start..end;
            }
            _ => {
                e.value = bytes.len()..bytes.len().saturating_add(value.len());
                bytes.extend_from_slice(value);
            }
        }
    }

    /// A new entry for `path`.
    fn insert(&mut self, path: &[u8], value: &[u8]) {
        let at_path = self.bytes.len();
        self.bytes.extend_from_slice(path);
        let at_value = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.entries.push(Entry {
            path: at_path..at_value,
            value: at_value..self.bytes.len(),
        });
        self.live = self
            .live
            .saturating_add(path.len())
            .saturating_add(value.len());
        let (bytes, entries) = (&self.bytes, &self.entries);
        let rehash = |&i: &usize| {
            let path = entries
                .get(i)
                .map_or(&[][..], |e| at(bytes, e.path.clone()));
            hash(path)
        };
        if entries.len() == LINEAR.saturating_add(1) {
            // Past the walk: every entry indexed.
            for i in 0..entries.len() {
                self.index.insert_unique(rehash(&i), i, rehash);
            }
        } else if entries.len() > LINEAR {
            let last = entries.len().saturating_sub(1);
            self.index.insert_unique(hash(path), last, rehash);
        }
    }

    /// Live bytes: the paths and values set (what the host's limit counts).
    pub fn held(&self) -> usize {
        self.live
    }

    /// The number of properties set.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every property, keeping the allocations for the next stream.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
        self.index.clear();
        self.live = 0;
    }

    /// Bytes allocated (the buffer's, the list's and the index's capacity), for an embedding
    /// deciding whether a cleared store is worth keeping.
    pub fn allocated(&self) -> usize {
        let entries = self
            .entries
            .capacity()
            .saturating_mul(std::mem::size_of::<Entry>());
        let index = self
            .index
            .capacity()
            .saturating_mul(std::mem::size_of::<usize>());
        entries
            .saturating_add(index)
            .saturating_add(self.bytes.capacity())
    }

    /// Every `(path, value)`, in the order first set.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.entries.iter().map(|e| {
            (
                at(&self.bytes, e.path.clone()),
                at(&self.bytes, e.value.clone()),
            )
        })
    }

    /// Copies the live paths and values into a new buffer, dropping what replaced values
    /// left behind (the entries keep their positions, so the index stays valid).
    fn compact(&mut self) {
        let mut bytes = Vec::with_capacity(self.live);
        for e in &mut self.entries {
            let path = bytes.len();
            bytes.extend_from_slice(at(&self.bytes, e.path.clone()));
            let value = bytes.len();
            bytes.extend_from_slice(at(&self.bytes, e.value.clone()));
            e.path = path..value;
            e.value = value..bytes.len();
        }
        self.bytes = bytes;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn set_get_replace() {
        let mut s = PropertyStore::default();
        assert_eq!(s.get(b"a"), None);
        s.set(b"a", b"one");
        s.set(b"b\0c", b"");
        assert_eq!(s.get(b"a"), Some(&b"one"[..]));
        assert_eq!(s.get(b"b\0c"), Some(&b""[..]));
        assert_eq!(s.get(b"b"), None);
        s.set(b"a", b"longer value");
        assert_eq!(s.get(b"a"), Some(&b"longer value"[..]));
        s.set(b"a", b"x");
        assert_eq!(s.get(b"a"), Some(&b"x"[..]));
        assert_eq!((s.len(), s.held()), (2, 1 + 1 + 3));
        s.clear();
        assert!(s.is_empty());
        assert_eq!((s.get(b"a"), s.held()), (None, 0));
    }

    #[test]
    fn a_value_replaced_again_and_again_stays_bounded() {
        // A guest rewriting one property with ever longer values (within the host's limit)
        // leaves garbage behind each time: the buffer is compacted, never more than twice the
        // live bytes plus the slack.
        let mut s = PropertyStore::default();
        s.set(b"other", b"kept");
        for n in 1..5000usize {
            let value = vec![b'v'; n % 700 + 1];
            s.set(b"p", &value);
            assert_eq!(s.get(b"p"), Some(&value[..]));
            assert!(
                s.bytes.len() <= 2 * s.held() + SLACK,
                "{} {}",
                s.bytes.len(),
                s.held()
            );
        }
        assert_eq!(s.get(b"other"), Some(&b"kept"[..]));
    }

    #[test]
    fn agrees_with_a_map_on_random_operations() {
        let mut s = PropertyStore::default();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let r = next();
            let path = format!("p\0{}", r % 97).into_bytes();
            match r % 7 {
                0 => {
                    assert_eq!(s.get(&path), model.get(&path).map(Vec::as_slice));
                }
                6 if r % 1000 == 6 => {
                    s.clear();
                    model.clear();
                }
                _ => {
                    let value = vec![(r >> 8) as u8; ((r >> 16) % 300) as usize];
                    s.set(&path, &value);
                    model.insert(path, value);
                }
            }
            let held: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!((s.held(), s.len()), (held, model.len()));
        }
        let mut all: Vec<_> = s.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        all.sort();
        let mut want: Vec<_> = model.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
    }
}
