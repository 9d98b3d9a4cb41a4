//! Walking an `ngx_list_t` of `ngx_table_elt_t` (nginx's header lists) without allocating.
//! nginx-free (its types only), so tests/pure.rs tests it on lists built by hand.

use ngx::ffi::{ngx_list_part_t, ngx_list_t, ngx_table_elt_t};

/// Iterates the elements of an `ngx_list_t` of `ngx_table_elt_t` (headers), part by part as
/// nginx's own loops do, without allocating.
///
/// # Safety
/// `list` must be an initialised list of `ngx_table_elt_t` that outlives the iteration and is
/// not changed during it.
pub unsafe fn table_elts(list: *mut ngx_list_t) -> TableElts {
    let mut it = TableElts {
        // SAFETY: the caller's live list.
        part: unsafe { &raw mut (*list).part },
        at: std::ptr::null_mut(),
        end: std::ptr::null_mut(),
    };
    it.enter_part();
    it
}

/// The iterator of [`table_elts`]: the current part's elements as a pointer range, so that
/// a step within a part is a compare and an increment (header lookups walk the list element by
/// element on every request).
pub struct TableElts {
    /// The part whose elements `at..end` are, or null at the end of the list.
    part: *mut ngx_list_part_t,
    at: *mut ngx_table_elt_t,
    end: *mut ngx_table_elt_t,
}

impl TableElts {
    /// Points `at..end` at the elements of `part`, or of the first non-empty part after it.
    #[cold]
    fn enter_part(&mut self) {
        // SAFETY: `table_elts`' caller keeps the list alive and unchanged while this iterates;
        // a part's `elts` holds `nelts` elements.
        unsafe {
            while !self.part.is_null() {
                let elts = (*self.part).elts.cast::<ngx_table_elt_t>();
                let n = (*self.part).nelts;
                if !elts.is_null() && n > 0 {
                    self.at = elts;
                    self.end = elts.add(n);
                    return;
                }
                self.part = (*self.part).next;
            }
            self.at = std::ptr::null_mut();
            self.end = std::ptr::null_mut();
        }
    }
}

impl Iterator for TableElts {
    type Item = *mut ngx_table_elt_t;

    #[inline]
    fn next(&mut self) -> Option<*mut ngx_table_elt_t> {
        if self.at == self.end {
            if self.part.is_null() {
                return None;
            }
            // SAFETY: as in `enter_part`: the part is live; its successor is the next one.
            self.part = unsafe { (*self.part).next };
            self.enter_part();
            if self.at == self.end {
                return None;
            }
        }
        let h = self.at;
        // SAFETY: `at` is below `end`, within the part's elements (one past is allowed).
        self.at = unsafe { self.at.add(1) };
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elt(n: usize) -> ngx_table_elt_t {
        // SAFETY: a plain C struct; all-zero is a valid value (null pointers, zero lengths).
        let mut e: ngx_table_elt_t = unsafe { std::mem::zeroed() };
        e.hash = n;
        e
    }

    /// Every element once, in order, across parts of any length, empty ones (a list's first
    /// part before anything is pushed, or a part left empty) included.
    #[test]
    fn walks_every_element_of_every_part_in_order() {
        for lens in [
            &[][..],
            &[0],
            &[3],
            &[0, 2],
            &[2, 0, 0, 1],
            &[1, 1, 1],
            &[4, 0],
        ] {
            let mut storage: Vec<Vec<ngx_table_elt_t>> = Vec::new();
            let mut next = 1usize;
            for &len in lens {
                storage.push((0..len).map(|i| elt(next + i)).collect());
                next += len;
            }
            // SAFETY: plain C structs, filled in below.
            let mut parts: Vec<ngx_list_part_t> =
                lens.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
            let count = parts.len();
            for i in (0..count).rev() {
                let following = if i + 1 < count {
                    &raw mut parts[i + 1]
                } else {
                    std::ptr::null_mut()
                };
                parts[i].next = following;
                parts[i].nelts = storage[i].len();
                parts[i].elts = storage[i].as_mut_ptr().cast();
            }
            // SAFETY: as above.
            let mut list: ngx_list_t = unsafe { std::mem::zeroed() };
            if let Some(first) = parts.first() {
                list.part = *first;
            }
            // SAFETY: the list and its parts outlive the walk.
            let seen: Vec<usize> = unsafe { table_elts(&raw mut list) }
                .map(|h| unsafe { (*h).hash })
                .collect();
            assert_eq!(seen, (1..next).collect::<Vec<_>>(), "{lens:?}");
        }
    }
}
