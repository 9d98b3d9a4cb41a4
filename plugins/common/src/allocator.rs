//! The filters' global allocator on wasm32 ([`ALLOCATOR`]): Rust's port of dlmalloc behind
//! [`SmallBlocks`], a cache of freed small blocks.
//!
//! A request allocates and frees about forty small blocks in the likely stack, more than half of
//! them for values the host returns (`proxy_on_memory_allocate`: a header, a property, a body
//! chunk, a shared-data record), and the same sizes come back on every request. dlmalloc spends
//! about 190 instructions on each malloc/free pair (bins, chunk headers, coalescing); a freed
//! block kept on a list of its size class and handed out again costs a few. Blocks of at most
//! [`LARGEST`] bytes are rounded up to a power of two (16 to 512 bytes); each class keeps at most
//! [`KEPT`] freed blocks (32 KiB in all for a VM), the rest go back to dlmalloc, as do larger
//! blocks and those with an alignment over [`ALIGN`].
//!
//! Sizes only: a block's size class comes from the `Layout` Rust passes to `dealloc` and
//! `realloc`, which is the one it was allocated with (the `GlobalAlloc` contract), so no header
//! is needed.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr;

/// Largest block the cache handles, in bytes.
pub const LARGEST: usize = 512;
/// Freed blocks kept per size class.
pub const KEPT: u32 = 32;
/// The alignment every cached block has (dlmalloc's on wasm32: two pointers); a layout asking
/// for more goes to the inner allocator.
pub const ALIGN: usize = 8;
/// Size classes: 16, 32, 64, 128, 256 and 512 bytes.
const CLASSES: usize = 6;

/// The freed blocks of one class, as a singly linked list through their first word.
#[derive(Clone, Copy)]
struct List {
    head: *mut u8,
    len: u32,
}

/// A cache of freed small blocks in front of the allocator `A` (see the module documentation).
/// Single-threaded: the filters' wasm32 target has no threads.
pub struct SmallBlocks<A> {
    inner: A,
    lists: UnsafeCell<[List; CLASSES]>,
}

// SAFETY: wasm32 without the `atomics` feature runs one thread, so the lists are never used
// from two threads at once.
#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
#[allow(unsafe_code)]
unsafe impl<A: Sync> Sync for SmallBlocks<A> {}

/// The size class of a layout the cache handles: `Some(c)` for blocks of `16 << c` bytes
/// (`c` below [`CLASSES`]).
#[inline(always)]
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if size == 0 || size > LARGEST || layout.align() > ALIGN {
        return None;
    }
    // The bits of `size - 1`, at least 4: 16 bytes is class 0, 17 to 32 class 1, ...
    let bits = usize::BITS.saturating_sub(((size.saturating_sub(1)) | 15).leading_zeros());
    Some((bits as usize).saturating_sub(4))
}

/// The layout of a class's blocks, as the inner allocator sees them.
fn class_layout(c: usize) -> Option<Layout> {
    Layout::from_size_align(16usize.checked_shl(u32::try_from(c).ok()?)?, ALIGN).ok()
}

impl<A> SmallBlocks<A> {
    /// The cache over `inner`, empty.
    pub const fn new(inner: A) -> SmallBlocks<A> {
        SmallBlocks {
            inner,
            lists: UnsafeCell::new(
                [List {
                    head: ptr::null_mut(),
                    len: 0,
                }; CLASSES],
            ),
        }
    }

    /// Blocks kept now in each class (16 to 512 bytes), for tests.
    pub fn kept(&self) -> [u32; CLASSES] {
        // SAFETY: one thread (see `Sync`); no reference into the lists outlives a call.
        #[allow(unsafe_code)]
        let lists = unsafe { *self.lists.get() };
        lists.map(|l| l.len)
    }
}

#[allow(unsafe_code)]
// SAFETY: every block handed out is either the inner allocator's for the caller's layout, or a
// block of `class_layout(c)` (at least as large, `ALIGN`-aligned) that the inner allocator gave
// and that was freed into class `c`; a block goes back to the inner allocator with the layout
// it was allocated with.
unsafe impl<A: GlobalAlloc> GlobalAlloc for SmallBlocks<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(c) = class(layout) {
            // SAFETY: one thread; the list's blocks are free blocks of class `c`, each holding
            // the next one's address in its first word (aligned: `ALIGN` is a pointer's or more).
            unsafe {
                if let Some(list) = (*self.lists.get()).get_mut(c) {
                    let block = list.head;
                    if !block.is_null() {
                        list.head = block.cast::<*mut u8>().read();
                        list.len = list.len.saturating_sub(1);
                        return block;
                    }
                }
                return match class_layout(c) {
                    Some(l) => self.inner.alloc(l),
                    None => ptr::null_mut(),
                };
            }
        }
        // SAFETY: the caller's layout, as is.
        unsafe { self.inner.alloc(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if let Some(c) = class(layout) {
            // SAFETY: one thread; `block` is a block of class `c` (`alloc`) no longer used by
            // the caller, large and aligned enough for the link word.
            unsafe {
                if let Some(list) = (*self.lists.get()).get_mut(c) {
                    if list.len < KEPT {
                        block.cast::<*mut u8>().write(list.head);
                        list.head = block;
                        list.len = list.len.saturating_add(1);
                        return;
                    }
                }
                if let Some(l) = class_layout(c) {
                    self.inner.dealloc(block, l);
                }
                return;
            }
        }
        // SAFETY: allocated by the inner allocator with this layout (`alloc`).
        unsafe { self.inner.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        match (class(layout), class(new_layout)) {
            // The block already has the room (its class's size).
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: neither is a class block: the inner allocator's own block and layout.
            (None, None) => unsafe { self.inner.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: a new block for the new layout; the old one's bytes up to the smaller
                // size copied, then the old one freed with its own layout.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

/// The allocator of every filter on wasm32: dlmalloc's port as the global allocator (so that
/// `Box`, `Vec` and `String` call it directly rather than through std's wrappers and wasi-libc's
/// `malloc`), behind [`SmallBlocks`]. wasi-libc keeps its own heap for libc's few allocations,
/// so no filter may export `malloc`, which a host would use instead of
/// `proxy_on_memory_allocate` (tests/e2e/test_wasm_exports.py).
#[cfg(target_family = "wasm")]
#[global_allocator]
pub static ALLOCATOR: SmallBlocks<dlmalloc::GlobalDlmalloc> =
    SmallBlocks::new(dlmalloc::GlobalDlmalloc);

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use std::alloc::System;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 1).unwrap()
    }

    #[test]
    fn sizes_map_to_their_power_of_two_class() {
        let classes: Vec<Option<usize>> = [1, 16, 17, 32, 33, 100, 256, 257, 512, 513]
            .into_iter()
            .map(|n| class(layout(n)))
            .collect();
        assert_eq!(
            classes,
            [
                Some(0),
                Some(0),
                Some(1),
                Some(1),
                Some(2),
                Some(3),
                Some(4),
                Some(5),
                Some(5),
                None
            ]
        );
        assert_eq!(class(Layout::from_size_align(8, 16).unwrap()), None);
        assert_eq!(class(layout(0)), None);
        assert_eq!(class_layout(5).map(|l| l.size()), Some(512));
    }

    /// A freed block is handed out again for any size of its class, and a block is never
    /// handed out twice while in use.
    #[test]
    fn a_freed_block_is_reused_within_its_class() {
        let cache = SmallBlocks::new(System);
        unsafe {
            let a = cache.alloc(layout(40));
            let b = cache.alloc(layout(40));
            assert_ne!(a, b);
            a.write_bytes(0xAA, 40);
            cache.dealloc(a, layout(40));
            assert_eq!(cache.kept()[2], 1);
            // 33 to 64 bytes: the same class.
            let c = cache.alloc(layout(64));
            assert_eq!(c, a);
            assert_eq!(cache.kept()[2], 0);
            c.write_bytes(0x55, 64);
            let d = cache.alloc(layout(50));
            assert!(d != a && d != b);
            for p in [b, d] {
                cache.dealloc(p, layout(50));
            }
            cache.dealloc(c, layout(64));
            assert_eq!(cache.kept()[2], 3);
            // Another class does not take them.
            let e = cache.alloc(layout(100));
            assert!(![a, b, d].contains(&e));
            cache.dealloc(e, layout(100));
        }
    }

    /// At most `KEPT` blocks a class stay cached; the others go back to the inner allocator.
    #[test]
    fn each_class_keeps_a_bounded_number_of_blocks() {
        let cache = SmallBlocks::new(System);
        unsafe {
            let blocks: Vec<*mut u8> = (0..KEPT + 10).map(|_| cache.alloc(layout(8))).collect();
            for b in blocks {
                cache.dealloc(b, layout(8));
            }
        }
        assert_eq!(cache.kept(), [KEPT, 0, 0, 0, 0, 0]);
    }

    /// Growing within a class keeps the block; across classes or out of them the bytes move.
    #[test]
    fn realloc_keeps_the_block_within_its_class_and_moves_the_bytes_across() {
        let cache = SmallBlocks::new(System);
        unsafe {
            let a = cache.alloc(layout(20));
            for i in 0..20u8 {
                a.add(usize::from(i)).write(i);
            }
            let holds_0_to_19 = |p: *mut u8| {
                std::slice::from_raw_parts(p, 20)
                    .iter()
                    .copied()
                    .eq(0..20u8)
            };
            assert_eq!(cache.realloc(a, layout(20), 32), a);
            let b = cache.realloc(a, layout(32), 200);
            assert!(b != a && holds_0_to_19(b));
            let c = cache.realloc(b, layout(200), 4000);
            assert!(holds_0_to_19(c));
            let d = cache.realloc(c, layout(4000), 100);
            assert!(holds_0_to_19(d));
            cache.dealloc(d, layout(100));
            assert_eq!(cache.kept(), [0, 1, 0, 1, 1, 0]);
        }
    }

    /// A larger alignment than the classes' goes to the inner allocator, with its alignment.
    #[test]
    fn an_over_aligned_layout_bypasses_the_cache() {
        let cache = SmallBlocks::new(System);
        let l = Layout::from_size_align(32, 64).unwrap();
        unsafe {
            let p = cache.alloc(l);
            assert_eq!(p as usize % 64, 0);
            cache.dealloc(p, l);
        }
        assert_eq!(cache.kept(), [0; CLASSES]);
    }
}
