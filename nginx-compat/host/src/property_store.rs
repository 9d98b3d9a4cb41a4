//! The properties a stream's filters set ([`PropertyStore`]): `proxy_set_property` writes them,
//! `proxy_get_property` reads them before the embedding's own.
//!
//! Every path and value lives in one byte buffer, found through a hash table of offsets, so a
//! stream's properties cost two allocations (the buffer and the table) instead of two a
//! property, and none at all once an embedding reuses a cleared store for its next request
//! ([`PropertyStore::clear`] keeps both). A value replaced by a longer one is appended anew;
//! the bytes it leaves behind are reclaimed when they outgrow the live ones
//! ([`PropertyStore::held`] counts only live bytes, which is what the host's limit,
//! `valid::MAX_MAP_BYTES`, bounds), so the buffer stays within twice the live bytes plus
//! [`SLACK`].

use std::hash::Hasher;
use std::ops::Range;

use hashbrown::HashTable;

/// Unreclaimed bytes tolerated before a compaction, whatever the live size (bytes).
pub const SLACK: usize = 4096;

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
    table: HashTable<Entry>,
    /// Live bytes: the paths and values the table points at.
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
    /// The value set for `path`.
    pub fn get(&self, path: &[u8]) -> Option<&[u8]> {
        let bytes = &self.bytes;
        self.table
            .find(hash(path), |e| at(bytes, e.path.clone()) == path)
            .map(|e| at(bytes, e.value.clone()))
    }

    /// Sets `path` to `value` (replacing what it had).
    pub fn set(&mut self, path: &[u8], value: &[u8]) {
        let PropertyStore { bytes, table, live } = self;
        let h = hash(path);
        if let Some(e) = table.find_mut(h, |e| at(bytes, e.path.clone()) == path) {
            *live = live
                .saturating_sub(e.value.len())
                .saturating_add(value.len());
            let start = e.value.start;
            let end = start.saturating_add(value.len());
            // Fits where the old value was: written there; else appended.
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
        } else {
            let at_path = bytes.len();
            bytes.extend_from_slice(path);
            let at_value = bytes.len();
            bytes.extend_from_slice(value);
            let entry = Entry {
                path: at_path..at_value,
                value: at_value..bytes.len(),
            };
            table.insert_unique(h, entry, |e| hash(at(bytes, e.path.clone())));
            *live = live.saturating_add(path.len()).saturating_add(value.len());
        }
        if self.bytes.len().saturating_sub(self.live) > self.live.max(SLACK) {
            self.compact();
        }
    }

    /// Live bytes: the paths and values set (what the host's limit counts).
    pub fn held(&self) -> usize {
        self.live
    }

    /// The number of properties set.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Forgets every property, keeping the allocations for the next stream.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.table.clear();
        self.live = 0;
    }

    /// Bytes allocated (the buffer's and the table's capacity), for an embedding deciding
    /// whether a cleared store is worth keeping.
    pub fn allocated(&self) -> usize {
        self.table
            .capacity()
            .saturating_mul(std::mem::size_of::<Entry>())
            .saturating_add(self.bytes.capacity())
    }

    /// Every `(path, value)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.table.iter().map(|e| {
            (
                at(&self.bytes, e.path.clone()),
                at(&self.bytes, e.value.clone()),
            )
        })
    }

    /// Copies the live paths and values into a new buffer, dropping what replaced values
    /// left behind.
    fn compact(&mut self) {
        let mut bytes = Vec::with_capacity(self.live);
        for e in self.table.iter_mut() {
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
