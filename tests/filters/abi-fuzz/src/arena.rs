//! The guest's memory as the fuzzer uses it: static regions (no heap allocation after start-up,
//! so that whatever the host writes where the fuzzer told it to can only land in these regions,
//! in the shadow stack's unused bottom or past the heap's end):
//! - `ARGS`: a ring where each call's inputs and result slots are built;
//! - `OUT`: a ring that `proxy_on_memory_allocate` hands out when it answers honestly;
//! - `BIG`: large inputs (maps of many entries, long bodies and values), rebuilt on demand.

use std::cell::{Cell, UnsafeCell};

pub const ARGS_SIZE: usize = 64 << 10;
pub const OUT_SIZE: usize = 256 << 10;
pub const BIG_SIZE: usize = 1 << 20;

/// A fixed region of linear memory, written through raw pointers only (the host writes into it
/// behind Rust's back, so it is never borrowed as a slice).
pub struct Region<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: wasm32-wasip1 guests are single-threaded; the region is only touched through raw
// pointers by this module.
unsafe impl<const N: usize> Sync for Region<N> {}

impl<const N: usize> Region<N> {
    const fn new() -> Self {
        Region(UnsafeCell::new([0; N]))
    }

    /// The region's address in linear memory (wasm32: pointers are 32-bit).
    pub fn base(&self) -> u32 {
        self.0.get() as usize as u32
    }

    /// Copies `bytes` at `offset`, cut at the region's end; the number of bytes copied.
    pub fn put(&self, offset: usize, bytes: &[u8]) -> usize {
        let n = bytes.len().min(N.saturating_sub(offset));
        if n > 0 {
            // SAFETY: `offset + n <= N`, inside the region; a raw copy (no reference to the
            // region is alive).
            unsafe {
                let dst = self.0.get().cast::<u8>().add(offset);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, n);
            }
        }
        n
    }

    /// Fills `len` bytes at `offset` with `byte`, cut at the region's end.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        let n = len.min(N.saturating_sub(offset));
        if n > 0 {
            // SAFETY: as in `put`.
            unsafe { std::ptr::write_bytes(self.0.get().cast::<u8>().add(offset), byte, n) }
        }
    }

    /// Copies up to `dst.len()` bytes from `offset` out of the region; the number copied.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        let n = dst.len().min(N.saturating_sub(offset));
        if n > 0 {
            // SAFETY: `offset + n <= N`, inside the region, copied out.
            unsafe {
                let src = self.0.get().cast::<u8>().add(offset);
                std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n);
            }
        }
        n
    }

    /// Reads the `u32` at `offset` (0 out of range).
    pub fn u32_at(&self, offset: usize) -> u32 {
        if offset.saturating_add(4) > N {
            return 0;
        }
        let mut b = [0u8; 4];
        // SAFETY: 4 bytes inside the region, copied out.
        unsafe {
            let src = self.0.get().cast::<u8>().add(offset);
            std::ptr::copy_nonoverlapping(src, b.as_mut_ptr(), 4);
        }
        u32::from_le_bytes(b)
    }
}

pub static ARGS: Region<ARGS_SIZE> = Region::new();
pub static OUT: Region<OUT_SIZE> = Region::new();
pub static BIG: Region<BIG_SIZE> = Region::new();

/// Bump cursors of the two rings.
pub struct Cursors {
    args: Cell<usize>,
    out: Cell<usize>,
}

impl Cursors {
    pub const fn new() -> Cursors {
        Cursors {
            args: Cell::new(0),
            out: Cell::new(0),
        }
    }

    /// Copies `bytes` into `ARGS` (8-byte aligned, wrapping to the start when it does not fit)
    /// and returns its address and length.
    pub fn arg(&self, bytes: &[u8]) -> (u32, u32) {
        let len = bytes.len().min(ARGS_SIZE);
        let at = self.reserve_args(len);
        ARGS.put(at, bytes);
        (ARGS.base().wrapping_add(at as u32), len as u32)
    }

    /// Reserves `len` bytes of `ARGS` (result slots, iovec arrays): their offset.
    pub fn reserve_args(&self, len: usize) -> usize {
        let mut at = (self.args.get() + 7) & !7;
        if at.saturating_add(len) > ARGS_SIZE {
            at = 0;
        }
        self.args.set(at.saturating_add(len));
        at
    }

    /// An 8-byte result slot in `ARGS`.
    pub fn slot(&self) -> u32 {
        let at = self.reserve_args(8);
        ARGS.fill(at, 8, 0xa5);
        ARGS.base().wrapping_add(at as u32)
    }

    /// `len` bytes of `OUT` (its start when `len` exceeds the ring): the honest allocation.
    pub fn out(&self, len: usize) -> u32 {
        let mut at = (self.out.get() + 7) & !7;
        if at.saturating_add(len) > OUT_SIZE {
            at = 0;
        }
        self.out.set(at.saturating_add(len).min(OUT_SIZE));
        OUT.base().wrapping_add(at as u32)
    }
}

/// Bytes of linear memory now.
pub fn memory_end() -> u32 {
    #[cfg(target_arch = "wasm32")]
    let pages = core::arch::wasm32::memory_size::<0>();
    #[cfg(not(target_arch = "wasm32"))]
    let pages = 64usize;
    u32::try_from(pages.saturating_mul(65536)).unwrap_or(u32::MAX)
}
