//! Request and response headers read in place from the embedding's own header list
//! ([`HeaderSource`]) instead of a [`HeaderMap`] built for every request, with the filters'
//! writes kept as an ordered list of edits ([`HeaderEdit`]) over it ([`DeferredMap`]).
//!
//! Most filters read a few fields of a request and write one or two: building the whole map
//! (an allocation per name and value), freeing it and rebuilding the embedding's list from it
//! cost more than the filters' own header work. A deferred map answers `num_headers`,
//! `proxy_get_header_map_value` and the add / replace / remove of one field without being built,
//! and `proxy_get_header_map_pairs` and `_size` too: the source lists its entries
//! ([`HeaderSource::for_each_entry`]), the map merges the edits into that listing
//! ([`DeferredMap::for_each_entry`]), and the host serialises it from there (the size summed,
//! the pairs written to a buffer it reuses, then copied into the guest's), so a filter that
//! scans the whole map leaves it deferred.
//! `proxy_set_header_map_pairs` builds it ([`DeferredMap::build`]: the source's map with the
//! edits applied in order), and so does a long run of edits ([`MAX_EDITS`]). The embedding
//! applies the edits to its own list itself where it can (`module/src/headers_in_place.rs`),
//! or builds the map and writes all of it back.
//!
//! Every answer is the one the built map would give: the edits follow the semantics of the
//! ABI's functions on a [`HeaderMap`] ([`HeaderEdit::apply`], which the built path uses too),
//! and the merged listing is the built map's, entry for entry (the tests compare them after
//! every edit).

use std::cell::Cell;

use crate::header_map::HeaderMap;

/// Edits kept before a deferred map is built instead (each lookup walks them).
pub const MAX_EDITS: usize = 16;

/// The embedding's header list of one request or response, as the [`HeaderMap`] it would build
/// (names lower-case, pseudo-headers first). Every method reads the list as it is when called.
/// `Any`: an embedding can take its own source back from a map it is done with
/// ([`DeferredMap::source`]) and reuse its allocation.
pub trait HeaderSource: std::any::Any {
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
    /// Calls `f` with every `(name, value)` entry of the map, in order: the entries of
    /// [`HeaderSource::build`], names in any ASCII case (the map's name is the lower-case form;
    /// an embedding passes its list's names as they are), read from the list without building
    /// the map. `proxy_get_header_map_pairs` and `_size` serialise from it.
    ///
    /// The default builds the map and lists it (one allocation per name and value): an
    /// embedding overrides it to list its own list in place.
    fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (k, v) in &self.build() {
            f(k, v);
        }
    }
    /// The embedding applied the edits to the list this source reads: anything computed from
    /// the list before (its entry count included) is stale, and is read from the list when
    /// next asked.
    fn edits_applied(&mut self);
}

/// A name or value an edit holds: inline up to [`INLINE_BYTES`] bytes (most names and the
/// values filters write), so an edit is usually no allocation.
pub type EditBytes = smallvec::SmallVec<[u8; INLINE_BYTES]>;

/// Bytes of a name or value an edit holds without an allocation.
pub const INLINE_BYTES: usize = 24;

/// One write to a map, names lower-case (proxy-wasm ABI 0.2.1, the semantics of Envoy's
/// `HeaderMap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit {
    /// `proxy_add_header_map_value`: a new entry at the end (Envoy's `addCopy`).
    Add(EditBytes, EditBytes),
    /// `proxy_replace_header_map_value` (Envoy's `setCopy`): the first entry of the name takes
    /// the value and the later ones go; without one, a new entry at the end.
    Replace(EditBytes, EditBytes),
    /// `proxy_remove_header_map_value`: every entry of the name goes.
    Remove(EditBytes),
}

/// `name` in lower case (copied whole, then lowered in place: a byte-by-byte collect was
/// about 200 instructions a name).
fn lower(name: &[u8]) -> EditBytes {
    let mut lower = EditBytes::from_slice(name);
    lower.make_ascii_lowercase();
    lower
}

impl HeaderEdit {
    /// [`HeaderEdit::Add`] of `name` (lower-cased) and `value`.
    pub fn add(name: &[u8], value: &[u8]) -> HeaderEdit {
        HeaderEdit::Add(lower(name), value.into())
    }

    /// [`HeaderEdit::Replace`] of `name` (lower-cased) with `value`.
    pub fn replace(name: &[u8], value: &[u8]) -> HeaderEdit {
        HeaderEdit::Replace(lower(name), value.into())
    }

    /// [`HeaderEdit::Remove`] of `name` (lower-cased).
    pub fn remove(name: &[u8]) -> HeaderEdit {
        HeaderEdit::Remove(lower(name))
    }

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
            HeaderEdit::Add(key, value) => map.push((key.to_vec(), value.to_vec())),
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
                    v.clear();
                    v.extend_from_slice(value);
                    true
                });
                if !found {
                    map.push((key.to_vec(), value.to_vec()));
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
    /// The filters' writes, in order, not applied to the source ([`DeferredMap::push`]).
    edits: Vec<HeaderEdit>,
    /// The entry count after the first `.1` edits, once first asked ([`DeferredMap::len`]):
    /// every filter's `on_request_headers` asks it (`num_headers`), and counting it afresh walks
    /// the source once per edit. Edits made since are counted when it is next asked, not when
    /// made: those of the chain's last filter never are.
    len: Cell<Option<(usize, usize)>>,
}

impl DeferredMap {
    /// A map that is its source, unedited.
    pub fn new(source: Box<dyn HeaderSource>) -> DeferredMap {
        DeferredMap::with_edits(source, Vec::new())
    }

    /// [`DeferredMap::new`], keeping its edits in `edits` (cleared first): a list an embedding
    /// took back from an earlier map ([`DeferredMap::into_parts`]), its allocation reused.
    pub fn with_edits(source: Box<dyn HeaderSource>, mut edits: Vec<HeaderEdit>) -> DeferredMap {
        edits.clear();
        DeferredMap {
            source,
            edits,
            len: Cell::new(None),
        }
    }

    /// The source, and the list the edits were kept in (cleared), for an embedding that
    /// reuses their allocations.
    pub fn into_parts(self) -> (Box<dyn HeaderSource>, Vec<HeaderEdit>) {
        let mut edits = self.edits;
        edits.clear();
        (self.source, edits)
    }

    /// The edits made since the source was last read, in order.
    pub fn edits(&self) -> &[HeaderEdit] {
        &self.edits
    }

    /// Adds an edit (the ABI's add, replace or remove of one field); the entry count follows it
    /// when next asked ([`DeferredMap::len`]).
    pub fn push(&mut self, edit: HeaderEdit) {
        self.edits.push(edit);
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

    /// The entry count after the edits: counted once, then kept, each later edit counted once
    /// when this is next asked (an addition adds one; a replacement or removal counts its
    /// name's entries before it).
    pub fn len(&self) -> usize {
        let (known, counted) = self.len.get().unwrap_or((self.source.len(), 0));
        let n = self
            .edits
            .iter()
            .enumerate()
            .skip(counted)
            .fold(known, |n, (i, e)| {
                if let HeaderEdit::Add(..) = e {
                    return n.saturating_add(1);
                }
                let before = self.count_before(e.name(), i);
                n.saturating_sub(before)
                    .saturating_add(e.count_after(before))
            });
        self.len.set(Some((n, self.edits.len())));
        n
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
    /// reads them from there, its entry count included (counted from the list if it is asked
    /// again: mostly it is not, the list being written back after the last filter).
    ///
    /// # Errors
    /// `apply`'s, with the edits kept.
    pub fn apply_in_place<E>(
        &mut self,
        apply: impl FnOnce(&[HeaderEdit]) -> Result<bool, E>,
    ) -> Result<bool, E> {
        if !apply(&self.edits)? {
            return Ok(false);
        }
        self.edits.clear();
        self.source.edits_applied();
        self.len.set(None);
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

    /// Calls `f` with every `(name, value)` entry of the map after the edits, in order: the
    /// entries of [`DeferredMap::build`] (names in any ASCII case, see
    /// [`HeaderSource::for_each_entry`]), without building it. The source's entries come with
    /// the edits' effect on their names ([`Merge`]), then the entries the edits appended that
    /// are still there. One pass over the source, nothing allocated (more than [`MAX_EDITS`]
    /// edits, which the ABI functions never keep, are listed from the built map instead).
    pub fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        if self.edits.is_empty() {
            return self.source.for_each_entry(f);
        }
        let mut merge = Merge::new();
        if merge.replay(&self.edits).is_none() {
            for (k, v) in &self.build() {
                f(k, v);
            }
            return;
        }
        // Per edited name: whether the source has it, and whether its one kept entry (a
        // replaced name's) was listed.
        let mut seen = [false; MAX_EDITS];
        let mut first_listed = [false; MAX_EDITS];
        self.source.for_each_entry(&mut |k, v| {
            let Some(at) = merge.position(&self.edits, k) else {
                return f(k, v);
            };
            if let Some(seen) = seen.get_mut(at) {
                *seen = true;
            }
            match merge.names.get(at).map(|(_, listed)| *listed) {
                Some(Listed::Kept) | None => f(k, v),
                Some(Listed::First(by)) => {
                    if let (Some(listed @ false), Some(value)) =
                        (first_listed.get_mut(at), value_of(&self.edits, by))
                    {
                        *listed = true;
                        f(k, value);
                    }
                }
                Some(Listed::Gone) => {}
            }
        });
        if seen.iter().take(merge.names_len).any(|seen| !seen) {
            // A name the source has none of: its replaces append (or change an appended entry)
            // instead. The edits replayed knowing it (they were replayed once already: this
            // cannot fail).
            merge = Merge {
                present: seen,
                ..Merge::new()
            };
            if merge.replay(&self.edits).is_none() {
                return;
            }
        }
        for (e, by) in self.edits.iter().zip(merge.appended) {
            if let Some(value) = by.and_then(|by| value_of(&self.edits, by)) {
                f(e.name(), value);
            }
        }
    }

    /// The size (bytes) of the map after the edits in the ABI's serialization
    /// (`proxy_get_header_map_size`: a `u32` count, 8 bytes of sizes and 2 NULs per entry, the
    /// names and values), from [`DeferredMap::for_each_entry`]; `None` past `u32::MAX`.
    pub fn serialized_size(&self) -> Option<usize> {
        crate::mem::entries_size(|sink| self.for_each_entry(sink))
    }

    /// Serializes the map after the edits into `out` (emptied first), names lower-case, from
    /// [`DeferredMap::for_each_entry`] (`proxy_get_header_map_pairs`): `out` then copies out the
    /// bytes `mem::serialize_into` gives for [`DeferredMap::build`].
    pub(crate) fn serialize(&self, out: &mut crate::mem::Pairs) {
        out.clear();
        self.for_each_entry(&mut |k, v| out.push(k, v));
    }
}

/// What the edits leave of the source's entries of one edited name.
#[derive(Clone, Copy)]
enum Listed {
    /// Every one, as it is (only adds so far).
    Kept,
    /// The first one, with the value of this replace (an index in the edits), made while the
    /// source's entries were there.
    First(u8),
    /// None (removed, or the source has none).
    Gone,
}

/// The value edit `at` writes, if it writes one.
fn value_of(edits: &[HeaderEdit], at: u8) -> Option<&[u8]> {
    match edits.get(usize::from(at))? {
        HeaderEdit::Add(_, v) | HeaderEdit::Replace(_, v) => Some(v),
        HeaderEdit::Remove(_) => None,
    }
}

/// The map after at most [`MAX_EDITS`] edits, as a listing of the source needs it: an edit only
/// appends an entry, changes an entry's value or drops entries (never moves one), so the map is
/// the source's entries, each name's kept as [`Listed`] says, followed by the appended entries
/// still there, in the order the edits appended them. Edits are named by their index (a few
/// bytes to set up and copy, not the slices).
struct Merge {
    /// Each edited name, as the index of its first edit, with what is left of its source
    /// entries, in the order of the first edit of each.
    names: [(u8, Listed); MAX_EDITS],
    names_len: usize,
    /// Per edited name (same order): whether the source has an entry of it. Taken as true at
    /// first, which gives the right fate to the source's entries of every name (a name the
    /// source lacks has no entry it would apply to); the listing then tells, and only the
    /// appended entries of a name it lacks need the edits replayed.
    present: [bool; MAX_EDITS],
    /// Bit `n` set: an edited name is `n` bytes long (bit 63: 63 or more), so that most names of
    /// the source are passed over without a comparison.
    lengths: u64,
    /// Per edit: the edit whose value the entry it appended has now (itself, or a later
    /// replace), `None` when it appended none or that entry went since.
    appended: [Option<u8>; MAX_EDITS],
}

impl Merge {
    fn new() -> Merge {
        Merge {
            names: [(0, Listed::Gone); MAX_EDITS],
            names_len: 0,
            present: [true; MAX_EDITS],
            lengths: 0,
            appended: [None; MAX_EDITS],
        }
    }

    /// The bit of [`Merge::lengths`] for a name `len` bytes long.
    fn length_bit(len: usize) -> u64 {
        1u64 << len.min(63)
    }

    /// The index in [`Merge::names`] of `name` (any ASCII case), if an edit names it.
    fn position(&self, edits: &[HeaderEdit], name: &[u8]) -> Option<usize> {
        if self.lengths & Merge::length_bit(name.len()) == 0 {
            return None;
        }
        let names = self.names.get(..self.names_len)?;
        names.iter().position(|(first, _)| {
            edits
                .get(usize::from(*first))
                .is_some_and(|e| e.name().eq_ignore_ascii_case(name))
        })
    }

    /// Replays `edits` on the names they touch, as [`HeaderEdit::apply`] would on the built
    /// map, into a new merge (its `present` set as known). `None` with more than [`MAX_EDITS`]
    /// edits.
    fn replay(&mut self, edits: &[HeaderEdit]) -> Option<()> {
        for (i, e) in edits.iter().enumerate() {
            let index = u8::try_from(i).ok()?;
            let name = e.name();
            let known = self.names.get(..self.names_len)?;
            let same = |at: u8| edits.get(usize::from(at)).is_some_and(|o| o.name() == name);
            let at = match known.iter().position(|(first, _)| same(*first)) {
                Some(at) => at,
                None => {
                    let at = self.names_len;
                    let listed = match self.present.get(at) {
                        Some(false) => Listed::Gone,
                        _ => Listed::Kept,
                    };
                    *self.names.get_mut(at)? = (index, listed);
                    self.names_len = at.checked_add(1)?;
                    self.lengths |= Merge::length_bit(name.len());
                    at
                }
            };
            let listed = &mut self.names.get_mut(at)?.1;
            let (this, before) = self.appended.get_mut(..=i)?.split_last_mut()?;
            let mut same_name = edits
                .iter()
                .zip(before.iter_mut())
                .filter(|(o, by)| o.name() == name && by.is_some())
                .map(|(_, by)| by);
            match e {
                HeaderEdit::Add(..) => *this = Some(index),
                HeaderEdit::Remove(_) => {
                    *listed = Listed::Gone;
                    same_name.for_each(|by| *by = None);
                }
                // The first entry of the name takes the value and the later ones go: a source
                // entry when one is left (they come first), else the first appended one.
                HeaderEdit::Replace(..) => {
                    if matches!(listed, Listed::Gone) {
                        match same_name.next() {
                            Some(first) => *first = Some(index),
                            None => *this = Some(index),
                        }
                    } else {
                        *listed = Listed::First(index);
                    }
                    same_name.for_each(|by| *by = None);
                }
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MapSource;

    /// An embedding's list that the test edits in place, read live (as nginx's is), and how
    /// many times the map said the edits were applied.
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
        fn edits_applied(&mut self) {
            self.1.set(self.1.get().saturating_add(1));
        }
    }

    #[test]
    fn the_count_after_applying_in_place_is_the_edited_lists() {
        // A removed field present twice and an added one, the count asked before (and kept)
        // and after: after, it is the list's, not the kept count with the edits counted again
        // on a list that already holds them (that gave 3 here, not 2).
        let list = std::rc::Rc::new(std::cell::RefCell::new(pairs(&[
            ("x", "1"),
            ("x", "2"),
            ("y", "3"),
        ])));
        let applied = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut d = DeferredMap::new(Box::new(LiveList(list.clone(), applied.clone())));
        d.push(HeaderEdit::remove(b"x"));
        assert_eq!(d.len(), 1);
        d.push(HeaderEdit::add(b"z", b"4"));
        let result = d.apply_in_place(|edits| {
            for e in edits {
                e.apply(&mut list.borrow_mut());
            }
            Ok::<bool, ()>(true)
        });
        assert_eq!(result, Ok(true));
        assert_eq!(applied.get(), 1);
        assert!(d.edits().is_empty());
        assert_eq!(d.len(), 2);
        assert_eq!(d.len(), list.borrow().len());
        // An embedding that cannot: the edits stay for the built map, and are counted.
        d.push(HeaderEdit::remove(b"y"));
        assert_eq!(d.apply_in_place(|_| Ok::<bool, ()>(false)), Ok(false));
        assert_eq!(d.edits().len(), 1);
        assert_eq!(applied.get(), 1);
        assert_eq!(d.len(), 1);
    }

    fn pairs(p: &[(&str, &str)]) -> HeaderMap {
        p.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// Every name the edits or the base use, and one they do not.
    const NAMES: [&[u8]; 4] = [b"a", b"b", b"c", b"zz"];

    /// An embedding's list whose names keep the case they arrived in (as nginx's do): the map
    /// lower-cases them; counts its builds.
    struct CasedList(HeaderMap, std::rc::Rc<std::cell::Cell<usize>>);

    impl HeaderSource for CasedList {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn first(&self, name: &[u8]) -> Option<&[u8]> {
            let mut named = self.0.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name));
            named.next().map(|(_, v)| &v[..])
        }
        fn count(&self, name: &[u8]) -> usize {
            let named = self.0.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name));
            named.count()
        }
        fn bytes(&self) -> usize {
            crate::valid::map_bytes(&self.0)
        }
        fn build(&self) -> HeaderMap {
            self.1.set(self.1.get().saturating_add(1));
            let lower = self
                .0
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()));
            lower.collect()
        }
        fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
            for (k, v) in &self.0 {
                f(k, v);
            }
        }
        fn edits_applied(&mut self) {}
    }

    /// Asserts that `d`'s listing, size and serialization are those of `built` (`d.build()`),
    /// byte for byte, and that none built the map (`builds`: its source's build count).
    fn assert_pairs_are(d: &DeferredMap, built: &HeaderMap, builds: &std::cell::Cell<usize>) {
        let before = builds.get();
        let mut listed = HeaderMap::new();
        d.for_each_entry(&mut |k, v| listed.push((k.to_ascii_lowercase(), v.to_vec())));
        assert_eq!(&listed, built, "after {:?}", d.edits());
        let size = crate::mem::serialized_size(built).unwrap();
        assert_eq!(d.serialized_size(), Some(size));
        let mut want = vec![0u8; size];
        crate::mem::serialize_into(built, &mut want).unwrap();
        // A used buffer, as the host's is.
        let mut pairs = crate::mem::Pairs::default();
        pairs.push(b"stale", b"entry");
        d.serialize(&mut pairs);
        assert_eq!(pairs.size(), Some(size));
        let mut got = vec![0xaa; size];
        assert_eq!(pairs.copy_to(&mut got), Some(()));
        assert_eq!(got, want, "after {:?}", d.edits());
        if d.edits().len() <= MAX_EDITS {
            assert_eq!(builds.get(), before, "a pairs read built the map");
        }
    }

    #[test]
    fn pairs_reads_interleaved_with_edits_are_the_built_maps() {
        // Every sequence of up to four edits from an alphabet that adds, replaces and removes
        // names the source has once, twice (in two cases) or not at all, on a source with those
        // names in mixed case and on one with none of them: the listing after each edit is the
        // built map's, without building it.
        let alphabet = [
            HeaderEdit::add(b"a", b"n1"),
            HeaderEdit::add(b"zz", b"n2"),
            HeaderEdit::replace(b"a", b"r1"),
            HeaderEdit::replace(b"b", b"r2"),
            HeaderEdit::replace(b"zz", b"r3"),
            HeaderEdit::remove(b"a"),
            HeaderEdit::remove(b"zz"),
            HeaderEdit::add(b":path", b"/x"),
        ];
        let bases = [
            pairs(&[
                (":path", "/"),
                ("A", "1"),
                ("b", "2"),
                ("Zy", "3"),
                ("a", "4"),
            ]),
            pairs(&[(":path", "/"), ("x-Other", "5")]),
        ];
        let mut sequences = 0usize;
        for base in &bases {
            let mut todo: Vec<Vec<usize>> = vec![vec![]];
            while let Some(seq) = todo.pop() {
                let builds = std::rc::Rc::new(std::cell::Cell::new(0));
                let mut d = DeferredMap::new(Box::new(CasedList(base.clone(), builds.clone())));
                // Counted first, so that every push keeps the count (DeferredMap::push).
                let unedited = d.len();
                assert_eq!(unedited, base.len());
                for &i in &seq {
                    d.push(alphabet[i].clone());
                }
                let built = d.build();
                assert_eq!(d.len(), built.len(), "{:?}", d.edits());
                assert_pairs_are(&d, &built, &builds);
                sequences = sequences.saturating_add(1);
                if seq.len() < 4 {
                    for i in 0..alphabet.len() {
                        todo.push([&seq[..], &[i]].concat());
                    }
                }
            }
        }
        assert_eq!(sequences, 2 * (1 + 8 + 64 + 512 + 4096));
    }

    #[test]
    fn more_edits_than_kept_are_listed_from_the_built_map() {
        // The ABI functions build the map past MAX_EDITS; a map given more is still listed right.
        let builds = std::rc::Rc::new(std::cell::Cell::new(0));
        let base = pairs(&[(":path", "/"), ("A", "1")]);
        let mut d = DeferredMap::new(Box::new(CasedList(base, builds.clone())));
        for i in 0..=MAX_EDITS {
            let v = i.to_string().into_bytes();
            d.push(match i % 3 {
                0 => HeaderEdit::add(b"a", &v),
                1 => HeaderEdit::replace(b"b", &v),
                _ => HeaderEdit::remove(b"a"),
            });
        }
        let built = d.build();
        assert_pairs_are(&d, &built, &builds);
    }

    #[test]
    fn long_names_and_values_and_reused_lists() {
        // Names and values past the inline size are held whole; names are lower-cased either
        // way; a list taken back from a finished map starts the next one empty.
        let long_name = "X-Tollgate-A-Name-Longer-Than-The-Inline-Bytes";
        let long_value = "v".repeat(3 * INLINE_BYTES + 1);
        assert!(long_name.len() > INLINE_BYTES);
        let lower = long_name.to_ascii_lowercase();
        let source = MapSource::new(pairs(&[(":path", "/"), (&lower, "old")]));
        let builds = source.builds.clone();
        let mut d = DeferredMap::new(Box::new(source));
        d.push(HeaderEdit::replace(
            long_name.as_bytes(),
            long_value.as_bytes(),
        ));
        d.push(HeaderEdit::add(b"Short", long_value.as_bytes()));
        assert_eq!(d.first(lower.as_bytes()), Some(long_value.as_bytes()));
        assert_eq!(d.first(b"short"), Some(long_value.as_bytes()));
        assert_eq!(d.len(), 3);
        assert_eq!(builds.get(), 0);
        let (source, edits) = d.into_parts();
        assert!(edits.is_empty() && edits.capacity() >= 2);
        let again = DeferredMap::with_edits(source, edits);
        assert_eq!(again.first(b"short"), None);
        assert_eq!(again.len(), 2);
        // A list handed over with edits still in it is emptied too.
        let stale = vec![HeaderEdit::remove(b":path")];
        let fresh =
            DeferredMap::with_edits(Box::new(MapSource::new(pairs(&[(":path", "/")]))), stale);
        assert_eq!(fresh.first(b":path"), Some(&b"/"[..]));
    }

    #[test]
    fn answers_are_those_of_the_built_map_after_every_edit() {
        // A base with duplicates, and every kind of edit on present, duplicated and absent
        // names, in an order that re-adds removed names and replaces added ones.
        let base = pairs(&[(":path", "/"), ("a", "1"), ("b", "2"), ("a", "3")]);
        let edits = [
            HeaderEdit::add(b"c", b"4"),
            HeaderEdit::replace(b"a", b"5"),
            HeaderEdit::remove(b"b"),
            HeaderEdit::add(b"b", b"6"),
            HeaderEdit::add(b"b", b"7"),
            HeaderEdit::replace(b"zz", b"8"),
            HeaderEdit::remove(b"a"),
            HeaderEdit::add(b"a", b"9"),
            HeaderEdit::replace(b"b", b"10"),
        ];
        let source = MapSource::new(base.clone());
        let builds = source.builds.clone();
        let mut d = DeferredMap::new(Box::new(source));
        let mut built = base;
        for e in edits {
            e.apply(&mut built);
            d.push(e);
            assert_pairs_are(&d, &built, &builds);
            assert_eq!(d.build(), built);
            assert_eq!(d.len(), built.len(), "after {:?}", d.edits().last());
            assert!(d.bytes() >= crate::valid::map_bytes(&built));
            for name in NAMES {
                let first = built.iter().find(|(k, _)| k == name).map(|(_, v)| &v[..]);
                assert_eq!(
                    d.first(name),
                    first,
                    "{name:?} after {:?}",
                    d.edits().last()
                );
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
        d.push(HeaderEdit::add(b"b", b"2"));
        assert_eq!(d.first(b"a"), Some(&b"1"[..]));
        assert_eq!(d.first(b"b"), Some(&b"2"[..]));
        assert_eq!((d.len(), d.count(b"a"), d.count(b"b")), (3, 1, 1));
        assert_eq!(builds.get(), 0);
        assert_eq!(d.build().len(), 3);
        assert_eq!(builds.get(), 1);
    }
}
