//! Request and response headers read in place from the embedding's own header list
//! ([`HeaderSource`]) instead of a [`HeaderMap`] built for every request, with the filters'
//! writes kept as an ordered list of edits ([`HeaderEdit`]) over it ([`DeferredMap`]).
//!
//! Most filters read a few fields of a request and write one or two: building the whole map
//! (an allocation per name and value), freeing it and rebuilding the embedding's list from it
//! cost more than the filters' own header work. A deferred map answers `num_headers`,
//! `proxy_get_header_map_value` and the add / replace / remove of one field without being built;
//! `proxy_get_header_map_pairs`, `_size` and `proxy_set_header_map_pairs` build it
//! ([`DeferredMap::build`]: the source's map with the edits applied in order), and so does a
//! long run of edits ([`MAX_EDITS`]). The embedding applies the edits to its own list itself
//! where it can (`module/src/headers.rs`), or builds the map and writes all of it back.
//!
//! Every answer is the one the built map would give: the edits follow the semantics of the
//! ABI's functions on a [`HeaderMap`] ([`HeaderEdit::apply`], which the built path uses too).

use crate::header_map::HeaderMap;

/// Edits kept before a deferred map is built instead (each lookup walks them).
pub const MAX_EDITS: usize = 16;

/// The embedding's header list of one request or response, as the [`HeaderMap`] it would build
/// (names lower-case, pseudo-headers first). Every method reads the list as it is when called.
pub trait HeaderSource {
    /// The entry count of the map (pseudo-headers included): `num_headers` of
    /// `proxy_on_request_headers` / `proxy_on_response_headers`.
    fn len(&self) -> usize;
    /// Whether the map has no entry.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The value of the first entry named `name` (lower-case ASCII), if any.
    fn first(&self, name: &[u8]) -> Option<&[u8]>;
    /// The number of entries named `name` (lower-case ASCII).
    fn count(&self, name: &[u8]) -> usize;
    /// The bytes of every name and value of the map (`valid::map_bytes` of the built map).
    fn bytes(&self) -> usize;
    /// The map, built.
    fn build(&self) -> HeaderMap;
    /// The embedding applied the edits to the list this source reads: the map now has `len`
    /// entries; anything computed from the list before is stale.
    fn edits_applied(&mut self, len: usize);
}

/// One write to a map, names lower-case (proxy-wasm ABI 0.2.1, the semantics of Envoy's
/// `HeaderMap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit {
    /// `proxy_add_header_map_value`: a new entry at the end (Envoy's `addCopy`).
    Add(Vec<u8>, Vec<u8>),
    /// `proxy_replace_header_map_value` (Envoy's `setCopy`): the first entry of the name takes
    /// the value and the later ones go; without one, a new entry at the end.
    Replace(Vec<u8>, Vec<u8>),
    /// `proxy_remove_header_map_value`: every entry of the name goes.
    Remove(Vec<u8>),
}

impl HeaderEdit {
    /// The name the edit writes (lower-case).
    pub fn name(&self) -> &[u8] {
        match self {
            HeaderEdit::Add(k, _) | HeaderEdit::Replace(k, _) | HeaderEdit::Remove(k) => k,
        }
    }

    /// Applies the edit to a built map (names compared case-insensitively, as the ABI's
    /// functions do on maps a guest may have set with `proxy_set_header_map_pairs`).
    pub fn apply(&self, map: &mut HeaderMap) {
        match self {
            HeaderEdit::Add(key, value) => map.push((key.clone(), value.clone())),
            HeaderEdit::Replace(key, value) => {
                let mut found = false;
                map.retain_mut(|(k, v)| {
                    if !k.eq_ignore_ascii_case(key) {
                        return true;
                    }
                    if found {
                        return false;
                    }
                    found = true;
                    v.clone_from(value);
                    true
                });
                if !found {
                    map.push((key.clone(), value.clone()));
                }
            }
            HeaderEdit::Remove(key) => map.retain(|(k, _)| !k.eq_ignore_ascii_case(key)),
        }
    }

    /// The count of entries named as the edit after it, given the count before.
    fn count_after(&self, before: usize) -> usize {
        match self {
            HeaderEdit::Add(..) => before.saturating_add(1),
            HeaderEdit::Replace(..) => 1,
            HeaderEdit::Remove(_) => 0,
        }
    }
}

/// A map read from its [`HeaderSource`] with the edits made since (see the module
/// documentation).
pub struct DeferredMap {
    pub source: Box<dyn HeaderSource>,
    /// The filters' writes, in order, not applied to the source.
    pub edits: Vec<HeaderEdit>,
}

impl DeferredMap {
    /// A map that is its source, unedited.
    pub fn new(source: Box<dyn HeaderSource>) -> DeferredMap {
        DeferredMap {
            source,
            edits: Vec::new(),
        }
    }

    /// The value of the first entry named `name` (lower-case) after the edits.
    pub fn first(&self, name: &[u8]) -> Option<&[u8]> {
        let mut value = self.source.first(name);
        for e in self.edits.iter().filter(|e| e.name() == name) {
            match e {
                HeaderEdit::Add(_, v) => {
                    if value.is_none() {
                        value = Some(v);
                    }
                }
                HeaderEdit::Replace(_, v) => value = Some(v),
                HeaderEdit::Remove(_) => value = None,
            }
        }
        value
    }

    /// The number of entries named `name` (lower-case) after the edits.
    pub fn count(&self, name: &[u8]) -> usize {
        self.count_before(name, self.edits.len())
    }

    /// The number of entries named `name` after the first `n` edits.
    fn count_before(&self, name: &[u8], n: usize) -> usize {
        self.edits
            .iter()
            .take(n)
            .filter(|e| e.name() == name)
            .fold(self.source.count(name), |c, e| e.count_after(c))
    }

    /// The entry count after the edits.
    pub fn len(&self) -> usize {
        self.edits
            .iter()
            .enumerate()
            .fold(self.source.len(), |n, (i, e)| {
                let before = self.count_before(e.name(), i);
                n.saturating_sub(before)
                    .saturating_add(e.count_after(before))
            })
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// At least the bytes of every name and value after the edits: the source's bytes plus
    /// every edit's, replaced and removed entries still counted (so a guest cannot grow the
    /// edit list past the map size limit either).
    pub fn bytes(&self) -> usize {
        self.edits.iter().fold(self.source.bytes(), |n, e| {
            let v = match e {
                HeaderEdit::Add(_, v) | HeaderEdit::Replace(_, v) => v.len(),
                HeaderEdit::Remove(_) => 0,
            };
            n.saturating_add(e.name().len()).saturating_add(v)
        })
    }

    /// Has the embedding apply the edits to its own list (`apply`: `Ok(true)` when it did,
    /// `Ok(false)` when it cannot and will write the built map back instead); then the source
    /// reads them from there. The entry count is taken before `apply` runs: the source's counts
    /// read the list as it is, and afterwards it already holds the edits.
    ///
    /// # Errors
    /// `apply`'s, with the edits kept.
    pub fn apply_in_place<E>(
        &mut self,
        apply: impl FnOnce(&[HeaderEdit]) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let len = self.len();
        if !apply(&self.edits)? {
            return Ok(false);
        }
        self.edits.clear();
        self.source.edits_applied(len);
        Ok(true)
    }

    /// The map with the edits applied.
    pub fn build(&self) -> HeaderMap {
        let mut map = self.source.build();
        for e in &self.edits {
            e.apply(&mut map);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MapSource;

    /// An embedding's list that the test edits in place, read live (as nginx's is), and the
    /// entry count the map last gave the source.
    struct LiveList(
        std::rc::Rc<std::cell::RefCell<HeaderMap>>,
        std::rc::Rc<std::cell::Cell<usize>>,
    );

    impl HeaderSource for LiveList {
        fn len(&self) -> usize {
            self.0.borrow().len()
        }
        fn first(&self, _: &[u8]) -> Option<&[u8]> {
            None
        }
        fn count(&self, name: &[u8]) -> usize {
            self.0.borrow().iter().filter(|(k, _)| k == name).count()
        }
        fn bytes(&self) -> usize {
            0
        }
        fn build(&self) -> HeaderMap {
            self.0.borrow().clone()
        }
        fn edits_applied(&mut self, len: usize) {
            self.1.set(len);
        }
    }

    #[test]
    fn the_count_given_after_applying_in_place_is_the_edited_lists() {
        // A removed field present twice and an added one: counted on the list as it was, not
        // on the list that already holds the edits (that gave 3 here, not 2).
        let list = std::rc::Rc::new(std::cell::RefCell::new(pairs(&[
            ("x", "1"),
            ("x", "2"),
            ("y", "3"),
        ])));
        let given = std::rc::Rc::new(std::cell::Cell::new(usize::MAX));
        let mut d = DeferredMap::new(Box::new(LiveList(list.clone(), given.clone())));
        d.edits.push(HeaderEdit::Remove(b"x".to_vec()));
        d.edits.push(HeaderEdit::Add(b"z".to_vec(), b"4".to_vec()));
        let applied = d.apply_in_place(|edits| {
            for e in edits {
                e.apply(&mut list.borrow_mut());
            }
            Ok::<bool, ()>(true)
        });
        assert_eq!(applied, Ok(true));
        assert_eq!(given.get(), 2);
        assert_eq!(given.get(), list.borrow().len());
        assert!(d.edits.is_empty());
        // An embedding that cannot: the edits stay for the built map.
        d.edits.push(HeaderEdit::Remove(b"y".to_vec()));
        assert_eq!(d.apply_in_place(|_| Ok::<bool, ()>(false)), Ok(false));
        assert_eq!(d.edits.len(), 1);
    }

    fn pairs(p: &[(&str, &str)]) -> HeaderMap {
        p.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// Every name the edits or the base use, and one they do not.
    const NAMES: [&[u8]; 4] = [b"a", b"b", b"c", b"zz"];

    #[test]
    fn answers_are_those_of_the_built_map_after_every_edit() {
        // A base with duplicates, and every kind of edit on present, duplicated and absent
        // names, in an order that re-adds removed names and replaces added ones.
        let base = pairs(&[(":path", "/"), ("a", "1"), ("b", "2"), ("a", "3")]);
        let edits = [
            HeaderEdit::Add(b"c".to_vec(), b"4".to_vec()),
            HeaderEdit::Replace(b"a".to_vec(), b"5".to_vec()),
            HeaderEdit::Remove(b"b".to_vec()),
            HeaderEdit::Add(b"b".to_vec(), b"6".to_vec()),
            HeaderEdit::Add(b"b".to_vec(), b"7".to_vec()),
            HeaderEdit::Replace(b"zz".to_vec(), b"8".to_vec()),
            HeaderEdit::Remove(b"a".to_vec()),
            HeaderEdit::Add(b"a".to_vec(), b"9".to_vec()),
            HeaderEdit::Replace(b"b".to_vec(), b"10".to_vec()),
        ];
        let mut d = DeferredMap::new(Box::new(MapSource::new(base.clone())));
        let mut built = base;
        for e in edits {
            e.apply(&mut built);
            d.edits.push(e);
            assert_eq!(d.build(), built);
            assert_eq!(d.len(), built.len(), "after {:?}", d.edits.last());
            assert!(d.bytes() >= crate::valid::map_bytes(&built));
            for name in NAMES {
                let first = built.iter().find(|(k, _)| k == name).map(|(_, v)| &v[..]);
                assert_eq!(d.first(name), first, "{name:?} after {:?}", d.edits.last());
                let count = built.iter().filter(|(k, _)| k == name).count();
                assert_eq!(d.count(name), count, "{name:?}");
            }
        }
    }

    #[test]
    fn reads_do_not_build_the_map() {
        let base = pairs(&[(":path", "/"), ("a", "1")]);
        let source = MapSource::new(base);
        let builds = source.builds.clone();
        let mut d = DeferredMap::new(Box::new(source));
        d.edits.push(HeaderEdit::Add(b"b".to_vec(), b"2".to_vec()));
        assert_eq!(d.first(b"a"), Some(&b"1"[..]));
        assert_eq!(d.first(b"b"), Some(&b"2"[..]));
        assert_eq!((d.len(), d.count(b"a"), d.count(b"b")), (3, 1, 1));
        assert_eq!(builds.get(), 0);
        assert_eq!(d.build().len(), 3);
        assert_eq!(builds.get(), 1);
    }
}
