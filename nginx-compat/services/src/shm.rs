//! Raw shared memory: the only module of the crate with `unsafe` code.
//!
//! A [`SharedRegion`] is a byte range mapped `MAP_SHARED` (by nginx before `fork`, or by
//! [`SharedRegion::anonymous`] for tests) and seen by every worker process at the same address.
//! The rest of the crate reaches it only through bounds- and alignment-checked accessors that
//! return `None` for an offset outside the region, so a corrupted offset read from shared memory
//! is an error, never an out-of-bounds access:
//!
//! - fields are read and written as atomics ([`SharedRegion::u32_at`], [`SharedRegion::u64_at`]),
//!   so concurrent accesses from other processes or threads are never data races;
//! - byte payloads (keys, values, metric names) are copied in and out
//!   ([`SharedRegion::read`], [`SharedRegion::write`]) only while the lock that protects them
//!   is held (see `lock.rs`), or before the region is published (fresh initialisation).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Once};

/// Why a region could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// The pointer was null.
    Null,
    /// The base address is not aligned to 64 bytes (a cache line); nginx's shared zones are
    /// page-aligned.
    Misaligned {
        /// The address.
        addr: usize,
    },
    /// The length was 0.
    Empty,
    /// `mmap` failed (for [`SharedRegion::anonymous`]); the OS error number.
    Map {
        /// `errno`.
        errno: i32,
    },
}

impl std::fmt::Display for RegionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionError::Null => write!(f, "shared memory region: null pointer"),
            RegionError::Misaligned { addr } => {
                write!(
                    f,
                    "shared memory region: address {addr:#x} is not 64-byte aligned"
                )
            }
            RegionError::Empty => write!(f, "shared memory region: length 0"),
            RegionError::Map { errno } => {
                write!(f, "shared memory region: mmap failed, errno {errno}")
            }
        }
    }
}

impl std::error::Error for RegionError {}

/// An anonymous `MAP_SHARED` mapping owned by this process (unmapped when the last
/// [`SharedRegion`] referring to it is dropped). Forked children keep their own mapping.
#[derive(Debug)]
struct AnonMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every access goes through atomics or through copies made
// under the crate's locks (see the module documentation). The pointer is never dereferenced
// outside `SharedRegion`'s accessors.
unsafe impl Send for AnonMapping {}
// SAFETY: as above.
unsafe impl Sync for AnonMapping {}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what `mmap` returned in `SharedRegion::anonymous`,
        // and no `SharedRegion` refers to the mapping any more (this is the last `Arc`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// A byte range of shared memory, `len` bytes from a 64-byte-aligned base. Cheap to clone (the
/// clones refer to the same memory).
///
/// Build it with [`SharedRegion::from_raw`] from the address and size nginx gives a shared zone
/// (`ngx_shm_zone_t.shm.addr`, `.size`), or with [`SharedRegion::anonymous`] in tests.
#[derive(Debug, Clone)]
pub struct SharedRegion {
    base: NonNull<u8>,
    len: usize,
    _owner: Option<Arc<AnonMapping>>,
}

// SAFETY: see `AnonMapping`: all accesses are atomic or lock-protected copies, and the memory is
// designed to be shared between processes, hence between threads too.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Wraps memory the caller mapped.
    ///
    /// # Errors
    /// [`RegionError::Null`], [`RegionError::Empty`], [`RegionError::Misaligned`] (the base must
    /// be 64-byte aligned).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable and writable memory that stays mapped at this address for
    /// as long as any clone of the returned region (or anything built on it) exists, and that
    /// nothing else accesses except through this crate (other processes running this crate on
    /// the same mapping are fine: that is the point).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<SharedRegion, RegionError> {
        let base = NonNull::new(ptr).ok_or(RegionError::Null)?;
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let addr = base.as_ptr() as usize;
        if !addr.is_multiple_of(64) {
            return Err(RegionError::Misaligned { addr });
        }
        Ok(SharedRegion {
            base,
            len,
            _owner: None,
        })
    }

    /// A fresh zero-filled anonymous `MAP_SHARED` mapping of `len` bytes (rounded up to pages
    /// by the kernel; the region is `len` bytes), shared with processes forked afterwards.
    ///
    /// # Errors
    /// [`RegionError::Empty`] for `len == 0`, [`RegionError::Map`] when `mmap` fails.
    pub fn anonymous(len: usize) -> Result<SharedRegion, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        // SAFETY: an anonymous mapping with no address hint has no precondition; the result is
        // checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(RegionError::Map {
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(RegionError::Null)?;
        let owner = Arc::new(AnonMapping { base, len });
        Ok(SharedRegion {
            base,
            len,
            _owner: Some(owner),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a region has at least one byte); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` bytes of this region (same memory, same owner); `None` when `len` is 0
    /// or longer than the region.
    pub fn prefix(&self, len: usize) -> Option<SharedRegion> {
        if len == 0 || len > self.len {
            return None;
        }
        Some(SharedRegion {
            base: self.base,
            len,
            _owner: self._owner.clone(),
        })
    }

    /// Whether `off..off+size` lies inside the region and `off` is a multiple of `align`.
    fn check(&self, off: usize, size: usize, align: usize) -> bool {
        match off.checked_add(size) {
            Some(end) => end <= self.len && off.checked_rem(align) == Some(0),
            None => false,
        }
    }

    /// The `u32` at byte offset `off` (4-byte aligned), as an atomic.
    pub(crate) fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        if !self.check(off, 4, 4) {
            return None;
        }
        // SAFETY: in bounds and aligned (checked above; the base is 64-byte aligned), valid for
        // the lifetime of `&self` (the mapping outlives the region by `from_raw`'s contract or
        // by the owning `Arc`). AtomicU32 has the layout of u32 and any bit pattern is valid.
        Some(unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// The `u64` at byte offset `off` (8-byte aligned), as an atomic.
    pub(crate) fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        if !self.check(off, 8, 8) {
            return None;
        }
        // SAFETY: as in `u32_at`, with 8-byte alignment checked.
        Some(unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() })
    }

    /// Copies `dst.len()` bytes from offset `off` into `dst`. False (nothing copied) when out of
    /// bounds. The caller holds the lock protecting those bytes.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.check(off, dst.len(), 1) {
            return false;
        }
        // SAFETY: source in bounds (checked); `dst` is a distinct local buffer, so the ranges do
        // not overlap; writers of these bytes hold the same lock as the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), dst.as_mut_ptr(), dst.len());
        }
        true
    }

    /// Copies `src` to offset `off`. False (nothing copied) when out of bounds. The caller holds
    /// the lock protecting those bytes (or the region is not yet published).
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> bool {
        if !self.check(off, src.len(), 1) {
            return false;
        }
        // SAFETY: destination in bounds (checked); `src` is caller memory outside the region
        // or at least not these bytes (we never copy region-to-region); readers of these bytes
        // hold the same lock as the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(off), src.len());
        }
        true
    }

    /// Zeroes `len` bytes from `off` (fresh initialisation, before the region is published).
    pub(crate) fn zero(&self, off: usize, len: usize) -> bool {
        if !self.check(off, len, 1) {
            return false;
        }
        // SAFETY: in bounds (checked); only called before the zone's magic is published, when
        // no other process uses the zone.
        unsafe {
            std::ptr::write_bytes(self.base.as_ptr().add(off), 0, len);
        }
        true
    }
}

/// This process's id, cached (`getpid` is a system call and every lock acquisition needs it);
/// 0 = not cached. A `pthread_atfork` child handler clears the cache, so a forked child (an
/// nginx worker) never uses its parent's pid.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forget_pid() {
    // Async-signal-safe: a single atomic store.
    PID.store(0, Ordering::Relaxed);
}

/// This process's id (the value a lock word holds while this process owns it).
pub(crate) fn current_pid() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only performs an atomic store, valid for the whole
        // life of the process (a static function); no prepare/parent handlers.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_pid));
        }
    });
    let pid = std::process::id();
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// Milliseconds of `CLOCK_MONOTONIC_COARSE` (system-wide, so comparable between worker
/// processes; a few ms of resolution, much cheaper than the precise clocks on VMs whose
/// clocksource is not the TSC). 0 if the clock is unavailable.
pub(crate) fn coarse_now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer to a local timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis)
}

/// Whether a process with id `pid` exists (`kill(pid, 0)`: success or `EPERM` mean it exists).
/// A zombie counts as existing until its parent reaps it (nginx's master does promptly).
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Test support: runs `f(i)` in `n` forked child processes and waits for them; returns the
/// children's exit codes (0 when `f` returned true, 1 when false or it panicked).
#[cfg(test)]
pub(crate) fn fork_children<F: Fn(usize) -> bool>(n: usize, f: F) -> Vec<i32> {
    let mut pids = Vec::new();
    for i in 0..n {
        // SAFETY: the child only runs `f` (atomics on a MAP_SHARED region and allocation, which
        // glibc makes fork-safe) and leaves with `_exit`, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).unwrap_or(false);
            // SAFETY: terminate the child without running the parent's atexit handlers or
            // destructors (the test harness belongs to the parent).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        pids.push(pid);
    }
    pids.into_iter()
        .map(|pid| {
            if pid < 0 {
                return -1;
            }
            let mut status = 0;
            // SAFETY: waiting for our own child with a valid out-pointer.
            let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
            if rc == pid && libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            }
        })
        .collect()
}
