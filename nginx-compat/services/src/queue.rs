//! `shm_queue` zones: proxy-wasm shared queues (`proxy_register_shared_queue`,
//! `proxy_enqueue_shared_queue`, `proxy_dequeue_shared_queue`) in nginx shared memory, one FIFO
//! of byte messages per zone, shared by every worker process (directive `shm_queue NAME SIZE`,
//! ngx_wasm_module's syntax). Any number of producers and consumers in any processes; every
//! message is returned by exactly one dequeue (or dropped, see below).
//!
//! # Layout (all offsets from the region's 64-byte-aligned base; every field little-endian
//! native `u32`/`u64` accessed atomically)
//! ```text
//! line 0   header: magic "TGSHMQU1", layout version, line size, zone size (bytes), ring
//!          capacity (bytes), ring offset, vm id bytes, length prefix bytes (the sentinel:
//!          attaching an existing zone whose header differs in any field is refused instead of
//!          reading the memory with the wrong layout)
//! line 1   lock word, lock takeovers
//! line 2   head, tail (monotonic u64 byte offsets into the ring), messages enqueued (the
//!          sequence), dequeued, dropped, depth (messages in the ring)
//! line 3   registration: flag (1 = registered), vm id length, 48 bytes of vm id
//! line 4…  the ring: capacity = zone size - 256 bytes
//! ```
//! A message is a 4-byte little-endian length followed by its bytes, written at ring position
//! `tail % capacity` and wrapping around the end of the ring (both the length and the bytes may
//! be split in two). `tail - head` bytes are used; the oldest message starts at `head`. The
//! offsets only grow (2^64 bytes is never reached), except when a corrupted queue is reset.
//!
//! # Concurrency
//! One spinlock per zone (see `lock.rs`: pid in the lock word, takeover from dead owners) for
//! [`QueueZone::enqueue`], [`QueueZone::dequeue`], [`QueueZone::register`],
//! [`QueueZone::registered_by`] and [`QueueZone::stats`]; each is O(1) apart from copying the
//! message (and dropping old messages when the ring is full). [`QueueZone::sequence`] and
//! [`QueueZone::is_empty`] are single atomic loads, cheap enough for every worker to poll
//! (`proxy_on_queue_ready`).
//!
//! # When the ring is full
//! [`QueueZone::enqueue`] drops the oldest messages until the new one fits and reports how many
//! it dropped (also counted in [`QueueStats::dropped`]): a queue of telemetry keeps the freshest
//! data and producers never block or fail. ngx_wasm_module refuses the push instead
//! (`ngx_wasm_shm_queue_push_locked` returns `NGX_ABORT`); Envoy's queues are unbounded.
//!
//! # Corruption
//! Everything read from the zone is validated under the lock: `head <= tail`,
//! `tail - head <= capacity`, a depth consistent with the used bytes, every message length
//! within the used bytes (and the last message ending exactly at `tail`). A worker killed in the
//! middle of an operation can leave the queue inconsistent; the next operation that notices
//! returns [`QueueError::Corrupt`] and, under the same lock, resets the queue to empty (the
//! messages it held are lost and counted in [`QueueStats::dropped`]), so the queue works again
//! from the next call instead of staying broken. The counters and the registration survive the
//! reset.
//!
//! # Proxy-wasm statuses
//! [`QueueError::Empty`] → `Empty`; [`QueueError::TooLarge`] → `BadArgument`;
//! [`QueueError::Corrupt`] → `InternalFailure`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::lock::{lock, Guard};
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};

const LINE: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"TGSHMQU1");
/// Layout version; bump on any change of the layout below.
const VERSION: u32 = 1;
/// Smallest zone accepted (bytes): 3840 bytes of ring.
pub const MIN_QUEUE_BYTES: usize = 4096;
/// Longest vm id [`QueueZone::register`] accepts (bytes).
pub const MAX_VM_ID_BYTES: usize = 48;
/// Bytes of the length written before every message.
const LEN_PREFIX: usize = 4;

// Header (line 0).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_LINE: usize = 12;
const H_ZONE_SIZE: usize = 16;
const H_CAPACITY: usize = 24;
const H_RING_OFF: usize = 32;
const H_VM_ID: usize = 40;
const H_LEN_PREFIX: usize = 44;
// Lock line (line 1).
const L_LOCK: usize = 64;
const L_STEALS: usize = 68;
// Queue state (line 2).
const S_HEAD: usize = 128;
const S_TAIL: usize = 136;
const S_ENQUEUED: usize = 144;
const S_DEQUEUED: usize = 152;
const S_DROPPED: usize = 160;
const S_DEPTH: usize = 168;
// Registration (line 3).
const R_FLAG: usize = 192;
const R_LEN: usize = 196;
const R_VM_ID: usize = 200;
/// The ring (line 4 onwards).
const RING_OFF: usize = 256;

/// Errors of [`QueueZone`] operations (the proxy-wasm statuses are in the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueError {
    /// No message to dequeue.
    Empty,
    /// A message (or a vm id, for [`QueueZone::register`]) longer than the zone accepts: its
    /// length and the maximum, in bytes.
    TooLarge {
        /// Length given (bytes).
        len: usize,
        /// Largest length accepted (bytes).
        max: usize,
    },
    /// The zone's memory held an impossible value (a worker probably died mid-update); the
    /// queue was reset to empty (see the module documentation) and the operation did nothing
    /// else: a retry works.
    Corrupt,
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueError::Empty => f.write_str("shm_queue empty"),
            QueueError::TooLarge { len, max } => write!(
                f,
                "{len} bytes is longer than the shm_queue accepts ({max} bytes)"
            ),
            QueueError::Corrupt => f.write_str("shm_queue corrupted (reset to empty)"),
        }
    }
}

impl std::error::Error for QueueError {}

/// Counters of a zone, for logs and tests. While nothing is corrupted,
/// `enqueued == dequeued + dropped + depth`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages in the queue.
    pub depth: u32,
    /// Bytes of the ring in use (messages and their 4-byte length prefixes).
    pub used_bytes: u64,
    /// Messages enqueued since the zone was initialised ([`QueueZone::sequence`]).
    pub enqueued: u64,
    /// Messages dequeued since the zone was initialised.
    pub dequeued: u64,
    /// Messages dropped since the zone was initialised: the oldest ones, to make room for new
    /// ones, and those lost when a corrupted queue was reset.
    pub dropped: u64,
    /// Locks taken over from dead owner processes.
    pub lock_takeovers: u32,
}

/// One `shm_queue` zone attached in this process. Cheap to clone; `Send + Sync` (all state is
/// in the shared region, behind its lock).
#[derive(Debug, Clone)]
pub struct QueueZone {
    region: SharedRegion,
    name: String,
    capacity: usize,
    max_message: usize,
}

/// The queue's state as read (and validated) under the lock.
#[derive(Debug, Clone, Copy)]
struct State {
    head: u64,
    tail: u64,
    depth: u32,
}

impl State {
    /// Bytes in use (`head <= tail` is checked when the state is read and kept by every update).
    fn used(&self) -> u64 {
        self.tail.saturating_sub(self.head)
    }
}

impl QueueZone {
    /// Attaches the zone `name` in `region` (the whole region: nginx's zone address and size).
    ///
    /// With [`Init::Fresh`] the region is formatted (the 256 header bytes only: do it once, in the
    /// nginx master's zone `init`, before workers fork); the queue starts empty and unregistered.
    /// With [`Init::Existing`] the header written by a previous `Fresh` attach must match this
    /// build's layout for this region size exactly, and the queue keeps its messages.
    ///
    /// # Errors
    /// [`AttachError::TooSmall`] below [`MIN_QUEUE_BYTES`]; for `Existing`,
    /// [`AttachError::NotInitialized`] (no queue zone: wrong magic) or [`AttachError::Mismatch`]
    /// (the size/version sentinel: e.g. `SIZE` changed across a reload).
    pub fn attach(region: SharedRegion, name: &str, init: Init) -> Result<QueueZone, AttachError> {
        let len = region.len();
        let too_small = AttachError::TooSmall {
            len,
            min: MIN_QUEUE_BYTES,
        };
        if len < MIN_QUEUE_BYTES {
            return Err(too_small);
        }
        let capacity = len.checked_sub(RING_OFF).ok_or(too_small)?;
        let max_message = capacity
            .saturating_sub(LEN_PREFIX)
            .min(usize::try_from(u32::MAX).unwrap_or(usize::MAX));
        let zone = QueueZone {
            region,
            name: name.to_string(),
            capacity,
            max_message,
        };
        match init {
            Init::Fresh => zone
                .format()
                .map_err(|_| AttachError::BadLayout("format"))?,
            Init::Existing => zone.verify()?,
        }
        Ok(zone)
    }

    /// The zone's name (the `NAME` of `shm_queue NAME SIZE`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of the data ring (the zone size minus 256 bytes of header). Each message takes its
    /// length plus 4 bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The longest message [`QueueZone::enqueue`] accepts (bytes): the capacity minus the
    /// 4-byte length prefix (an enqueue of that size drops every other message).
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    fn header_values(&self) -> [crate::zone::Field; 7] {
        // (field, offset, expected value, is u64)
        [
            ("layout version", H_VERSION, u64::from(VERSION), false),
            ("line size", H_LINE, LINE as u64, false),
            ("zone size", H_ZONE_SIZE, self.region.len() as u64, true),
            ("ring capacity", H_CAPACITY, self.capacity as u64, true),
            ("ring offset", H_RING_OFF, RING_OFF as u64, true),
            ("vm id bytes", H_VM_ID, MAX_VM_ID_BYTES as u64, false),
            (
                "length prefix bytes",
                H_LEN_PREFIX,
                LEN_PREFIX as u64,
                false,
            ),
        ]
    }

    fn format(&self) -> Result<(), QueueError> {
        self.f64(H_MAGIC)?.store(0, Ordering::Release);
        if !self.region.zero(0, RING_OFF) {
            return Err(QueueError::Corrupt);
        }
        if !crate::zone::publish(&self.region, H_MAGIC, MAGIC, &self.header_values()) {
            return Err(QueueError::Corrupt);
        }
        Ok(())
    }

    fn verify(&self) -> Result<(), AttachError> {
        crate::zone::verify(&self.region, H_MAGIC, MAGIC, &self.header_values())
    }

    // ---- raw field access --------------------------------------------------------------

    fn f32(&self, off: usize) -> Result<&AtomicU32, QueueError> {
        self.region.u32_at(off).ok_or(QueueError::Corrupt)
    }

    fn f64(&self, off: usize) -> Result<&AtomicU64, QueueError> {
        self.region.u64_at(off).ok_or(QueueError::Corrupt)
    }

    fn load64(&self, off: usize) -> u64 {
        self.region
            .u64_at(off)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    fn load32(&self, off: usize) -> u32 {
        self.region
            .u32_at(off)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }

    fn lock(&self) -> Result<Guard<'_>, QueueError> {
        Ok(lock(self.f32(L_LOCK)?, self.region.u32_at(L_STEALS)))
    }

    /// Runs `op` under the lock; when it finds the queue corrupted, resets the queue before
    /// releasing the lock.
    fn locked<T>(&self, op: impl FnOnce() -> Result<T, QueueError>) -> Result<T, QueueError> {
        let _g = self.lock()?;
        let result = op();
        if matches!(result, Err(QueueError::Corrupt)) {
            // Constant offsets inside the header: cannot fail on an attached zone.
            let _ = self.reset_locked();
        }
        result
    }

    /// Empties the queue (lock held): positions and depth to 0, the lost messages counted as
    /// dropped (`dropped = enqueued - dequeued`, which restores the stats invariant).
    fn reset_locked(&self) -> Result<(), QueueError> {
        self.f64(S_HEAD)?.store(0, Ordering::Relaxed);
        self.f64(S_TAIL)?.store(0, Ordering::Relaxed);
        self.f32(S_DEPTH)?.store(0, Ordering::Release);
        let enqueued = self.f64(S_ENQUEUED)?.load(Ordering::Relaxed);
        let dequeued = self.f64(S_DEQUEUED)?.load(Ordering::Relaxed);
        self.f64(S_DROPPED)?
            .store(enqueued.saturating_sub(dequeued), Ordering::Relaxed);
        Ok(())
    }

    /// Reads and validates the state (lock held).
    fn state(&self) -> Result<State, QueueError> {
        let head = self.f64(S_HEAD)?.load(Ordering::Relaxed);
        let tail = self.f64(S_TAIL)?.load(Ordering::Relaxed);
        let depth = self.f32(S_DEPTH)?.load(Ordering::Relaxed);
        let used = tail.checked_sub(head).ok_or(QueueError::Corrupt)?;
        let min_used = u64::from(depth).saturating_mul(LEN_PREFIX as u64);
        if used > self.capacity as u64 || (depth == 0) != (used == 0) || min_used > used {
            return Err(QueueError::Corrupt);
        }
        Ok(State { head, tail, depth })
    }

    /// Writes the state back (lock held).
    fn store_state(&self, st: &State) -> Result<(), QueueError> {
        self.f64(S_HEAD)?.store(st.head, Ordering::Relaxed);
        self.f64(S_TAIL)?.store(st.tail, Ordering::Relaxed);
        self.f32(S_DEPTH)?.store(st.depth, Ordering::Release);
        Ok(())
    }

    // ---- ring ----------------------------------------------------------------------------

    /// Region offset of the ring byte at monotonic offset `offset`.
    fn ring_pos(&self, offset: u64) -> Result<usize, QueueError> {
        let pos = offset
            .checked_rem(self.capacity as u64)
            .ok_or(QueueError::Corrupt)?;
        usize::try_from(pos).map_err(|_| QueueError::Corrupt)
    }

    /// Copies `src` into the ring at `offset`, in two parts when it crosses the end.
    fn ring_write(&self, offset: u64, src: &[u8]) -> Result<(), QueueError> {
        let pos = self.ring_pos(offset)?;
        let first = self.capacity.saturating_sub(pos).min(src.len());
        let (a, b) = src.split_at_checked(first).ok_or(QueueError::Corrupt)?;
        if !self.region.write(RING_OFF.saturating_add(pos), a) || !self.region.write(RING_OFF, b) {
            return Err(QueueError::Corrupt);
        }
        Ok(())
    }

    /// Copies ring bytes from `offset` into `dst`, in two parts when they cross the end.
    fn ring_read(&self, offset: u64, dst: &mut [u8]) -> Result<(), QueueError> {
        let pos = self.ring_pos(offset)?;
        let first = self.capacity.saturating_sub(pos).min(dst.len());
        let (a, b) = dst.split_at_mut_checked(first).ok_or(QueueError::Corrupt)?;
        if !self.region.read(RING_OFF.saturating_add(pos), a) || !self.region.read(RING_OFF, b) {
            return Err(QueueError::Corrupt);
        }
        Ok(())
    }

    /// The oldest message's length (bytes, without the prefix), validated against the state
    /// (lock held; `st.depth > 0`).
    fn oldest_len(&self, st: &State) -> Result<usize, QueueError> {
        let mut prefix = [0u8; LEN_PREFIX];
        self.ring_read(st.head, &mut prefix)?;
        let len = u32::from_le_bytes(prefix);
        let total = u64::from(len).saturating_add(LEN_PREFIX as u64);
        let used = st.used();
        if st.depth == 0 || total > used || (st.depth == 1 && total != used) {
            return Err(QueueError::Corrupt);
        }
        usize::try_from(len).map_err(|_| QueueError::Corrupt)
    }

    /// Removes the oldest message of `len` bytes from `st` (not yet stored).
    fn pop_front(st: &mut State, len: usize) {
        let total = (len as u64).saturating_add(LEN_PREFIX as u64);
        st.head = st.head.saturating_add(total);
        st.depth = st.depth.saturating_sub(1);
    }

    // ---- operations ----------------------------------------------------------------------

    /// `proxy_enqueue_shared_queue`: appends `value` (bytes, possibly empty). When the ring lacks
    /// room, drops the oldest messages until it fits (counted in [`QueueStats::dropped`]) and
    /// returns how many were dropped (0 usually).
    ///
    /// # Errors
    /// [`QueueError::TooLarge`] when `value.len() > max_message()` (nothing changed);
    /// [`QueueError::Corrupt`] (the queue was reset, `value` was not stored).
    pub fn enqueue(&self, value: &[u8]) -> Result<u32, QueueError> {
        if value.len() > self.max_message {
            return Err(QueueError::TooLarge {
                len: value.len(),
                max: self.max_message,
            });
        }
        let len = u32::try_from(value.len()).map_err(|_| QueueError::TooLarge {
            len: value.len(),
            max: self.max_message,
        })?;
        let need = (value.len() as u64).saturating_add(LEN_PREFIX as u64);
        let capacity = self.capacity as u64;
        self.locked(|| {
            let mut st = self.state()?;
            let mut dropped = 0u32;
            while capacity.saturating_sub(st.used()) < need {
                let oldest = self.oldest_len(&st)?;
                Self::pop_front(&mut st, oldest);
                dropped = dropped.saturating_add(1);
            }
            // An empty ring restarts at offset 0 only through a reset; otherwise it keeps going.
            let tail = st.tail;
            let body = tail
                .checked_add(LEN_PREFIX as u64)
                .ok_or(QueueError::Corrupt)?;
            let end = tail.checked_add(need).ok_or(QueueError::Corrupt)?;
            self.ring_write(tail, &len.to_le_bytes())?;
            self.ring_write(body, value)?;
            st.tail = end;
            st.depth = st.depth.checked_add(1).ok_or(QueueError::Corrupt)?;
            self.store_state(&st)?;
            if dropped > 0 {
                self.f64(S_DROPPED)?
                    .fetch_add(u64::from(dropped), Ordering::Relaxed);
            }
            self.f64(S_ENQUEUED)?.fetch_add(1, Ordering::Release);
            Ok(dropped)
        })
    }

    /// `proxy_dequeue_shared_queue`: removes and returns the oldest message.
    ///
    /// # Errors
    /// [`QueueError::Empty`] when there is none; [`QueueError::Corrupt`] (the queue was reset).
    pub fn dequeue(&self) -> Result<Vec<u8>, QueueError> {
        self.locked(|| {
            let mut st = self.state()?;
            if st.depth == 0 {
                return Err(QueueError::Empty);
            }
            let len = self.oldest_len(&st)?;
            let body = st
                .head
                .checked_add(LEN_PREFIX as u64)
                .ok_or(QueueError::Corrupt)?;
            // `len` is at most the ring's capacity (validated above).
            let mut value = vec![0u8; len];
            self.ring_read(body, &mut value)?;
            Self::pop_front(&mut st, len);
            self.store_state(&st)?;
            self.f64(S_DEQUEUED)?.fetch_add(1, Ordering::Relaxed);
            Ok(value)
        })
    }

    /// Messages ever enqueued (monotonic, survives a corruption reset), one atomic load without
    /// the lock: workers poll it to notice new messages cheaply (`proxy_on_queue_ready`). A new
    /// value means messages were enqueued, not that any is still there.
    pub fn sequence(&self) -> u64 {
        self.region
            .u64_at(S_ENQUEUED)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// Whether the queue holds no message, one atomic load without the lock (a snapshot: another
    /// process may enqueue or dequeue right after).
    pub fn is_empty(&self) -> bool {
        self.region
            .u32_at(S_DEPTH)
            .is_none_or(|a| a.load(Ordering::Acquire) == 0)
    }

    /// `proxy_register_shared_queue`: records that the VM `vm_id` registered this queue; the last
    /// registration wins (as in Envoy, where a queue belongs to the last VM that registered it).
    ///
    /// # Errors
    /// [`QueueError::TooLarge`] when `vm_id` is longer than [`MAX_VM_ID_BYTES`] (nothing changed).
    pub fn register(&self, vm_id: &str) -> Result<(), QueueError> {
        if vm_id.len() > MAX_VM_ID_BYTES {
            return Err(QueueError::TooLarge {
                len: vm_id.len(),
                max: MAX_VM_ID_BYTES,
            });
        }
        let len = u32::try_from(vm_id.len()).map_err(|_| QueueError::Corrupt)?;
        let _g = self.lock()?;
        // Unflagged while the bytes change: a writer dying here leaves "not registered".
        let flag = self.f32(R_FLAG)?;
        flag.store(0, Ordering::Relaxed);
        if !self.region.write(R_VM_ID, vm_id.as_bytes()) {
            return Err(QueueError::Corrupt);
        }
        self.f32(R_LEN)?.store(len, Ordering::Relaxed);
        flag.store(1, Ordering::Relaxed);
        Ok(())
    }

    /// The vm id of the last [`QueueZone::register`] (`proxy_resolve_shared_queue` compares it),
    /// `None` if the queue was never registered, or if the stored registration is invalid (a
    /// flag other than 0/1, a length above [`MAX_VM_ID_BYTES`], bytes that are not UTF-8: it is
    /// then cleared).
    pub fn registered_by(&self) -> Option<String> {
        let _g = self.lock().ok()?;
        let flag = self.f32(R_FLAG).ok()?;
        let clear = || {
            flag.store(0, Ordering::Relaxed);
            None
        };
        match flag.load(Ordering::Relaxed) {
            0 => return None,
            1 => {}
            _ => return clear(),
        }
        let len = usize::try_from(self.load32(R_LEN)).unwrap_or(usize::MAX);
        if len > MAX_VM_ID_BYTES {
            return clear();
        }
        let mut bytes = vec![0u8; len];
        if !self.region.read(R_VM_ID, &mut bytes) {
            return clear();
        }
        match String::from_utf8(bytes) {
            Ok(vm_id) => Some(vm_id),
            Err(_) => clear(),
        }
    }

    /// The zone's counters, a consistent snapshot taken under the lock.
    pub fn stats(&self) -> QueueStats {
        let _g = self.lock().ok();
        QueueStats {
            depth: self.load32(S_DEPTH),
            used_bytes: self.load64(S_TAIL).saturating_sub(self.load64(S_HEAD)),
            enqueued: self.load64(S_ENQUEUED),
            dequeued: self.load64(S_DEQUEUED),
            dropped: self.load64(S_DROPPED),
            lock_takeovers: self.load32(L_STEALS),
        }
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn queue(len: usize) -> QueueZone {
        let region = SharedRegion::anonymous(len).unwrap();
        QueueZone::attach(region, "q", Init::Fresh).unwrap()
    }

    /// xorshift64, deterministic.
    fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed | 1;
        move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        }
    }

    fn message(tag: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (tag as u8).wrapping_mul(31) ^ (i as u8))
            .collect()
    }

    fn invariant_holds(q: &QueueZone) -> bool {
        let s = q.stats();
        s.enqueued == s.dequeued + s.dropped + u64::from(s.depth)
    }

    #[test]
    fn fifo_order_empty_and_zero_length() {
        let q = queue(MIN_QUEUE_BYTES);
        assert_eq!(q.name(), "q");
        assert_eq!(q.capacity(), MIN_QUEUE_BYTES - 256);
        assert_eq!(q.max_message(), q.capacity() - 4);
        assert!(q.is_empty());
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
        assert_eq!(q.sequence(), 0);
        for m in [&b"one"[..], b"two", b"", b"three"] {
            assert_eq!(q.enqueue(m), Ok(0));
        }
        assert!(!q.is_empty());
        assert_eq!(q.sequence(), 4);
        let s = q.stats();
        assert_eq!((s.depth, s.used_bytes), (4, 4 * 4 + 3 + 3 + 5));
        assert_eq!(q.dequeue().unwrap(), b"one");
        assert_eq!(q.dequeue().unwrap(), b"two");
        assert_eq!(q.dequeue().unwrap(), b"");
        assert_eq!(q.dequeue().unwrap(), b"three");
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
        assert!(q.is_empty());
        assert_eq!(
            q.stats(),
            QueueStats {
                depth: 0,
                used_bytes: 0,
                enqueued: 4,
                dequeued: 4,
                dropped: 0,
                lock_takeovers: 0
            }
        );
        // Only a zero-length message.
        assert_eq!(q.enqueue(b""), Ok(0));
        assert_eq!(q.stats().used_bytes, 4);
        assert!(!q.is_empty());
        assert_eq!(q.dequeue().unwrap(), Vec::<u8>::new());
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
    }

    #[test]
    fn too_large_is_refused_and_the_largest_fits() {
        let q = queue(MIN_QUEUE_BYTES);
        let max = q.max_message();
        q.enqueue(b"old").unwrap();
        assert_eq!(
            q.enqueue(&vec![1u8; max + 1]),
            Err(QueueError::TooLarge { len: max + 1, max })
        );
        assert_eq!(q.stats().depth, 1);
        // The largest message fills the ring: it drops everything else.
        let big = message(9, max);
        assert_eq!(q.enqueue(&big), Ok(1));
        assert_eq!(q.stats().used_bytes, q.capacity() as u64);
        // ...and is dropped by the next message.
        assert_eq!(q.enqueue(b"x"), Ok(1));
        assert_eq!(q.dequeue().unwrap(), b"x");
        assert_eq!(q.enqueue(&big), Ok(0));
        assert_eq!(q.dequeue().unwrap(), big);
        assert_eq!(q.stats().dropped, 2);
        assert!(invariant_holds(&q));
    }

    #[test]
    fn full_ring_drops_the_oldest() {
        let q = queue(MIN_QUEUE_BYTES);
        let per = 100 + 4;
        let fit = q.capacity() / per;
        for i in 0..fit {
            assert_eq!(q.enqueue(&message(i as u64, 100)), Ok(0));
        }
        // One more 100-byte message: exactly one dropped (the capacity is not a multiple of 104
        // but the remainder is smaller than 104).
        assert!(q.capacity() - fit * per < per);
        assert_eq!(q.enqueue(&message(fit as u64, 100)), Ok(1));
        // A longer message drops as many 104-byte messages as it needs beyond the free bytes.
        let len = 4 * per + 50;
        let free = q.capacity() - fit * per;
        let expect = (len + 4 - free).div_ceil(per);
        assert_eq!(q.enqueue(&message(1000, len)), Ok(expect as u32));
        let s = q.stats();
        assert_eq!(s.dropped, 1 + expect as u64);
        assert!(invariant_holds(&q));
        // The survivors come out in order, oldest first.
        let first = 1 + expect;
        for i in first..=fit {
            assert_eq!(q.dequeue().unwrap(), message(i as u64, 100));
        }
        assert_eq!(q.dequeue().unwrap(), message(1000, len));
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
    }

    /// Random enqueues and dequeues against a `VecDeque` model with the same drop-oldest rule,
    /// on rings of several sizes, so messages (and their length prefixes) straddle the end of
    /// the ring at every alignment.
    #[test]
    fn random_operations_match_a_model() {
        let (mut straddle_body, mut straddle_prefix) = (0u32, 0u32);
        for (round, len) in [4096usize, 4097, 4099, 4133, 5000, 8192]
            .into_iter()
            .enumerate()
        {
            let q = queue(len);
            let cap = q.capacity();
            let mut rnd = rng(0x9e37_79b9_7f4a_7c15 ^ len as u64);
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            let mut used = 0usize;
            let (mut enq, mut deq, mut dropped) = (0u64, 0u64, 0u64);
            for step in 0..6000u64 {
                if rnd(5) < 3 {
                    let size = match rnd(10) {
                        0 => 0,
                        1..=5 => rnd(40) as usize,
                        6..=8 => rnd(400) as usize,
                        _ => rnd(q.max_message() as u64 + 1) as usize,
                    };
                    let m = message(step, size);
                    let pos = (q.load64(S_TAIL) % cap as u64) as usize;
                    if pos + 4 > cap {
                        straddle_prefix += 1;
                    } else if pos + 4 + size > cap && pos + 4 < cap {
                        straddle_body += 1;
                    }
                    let mut want_dropped = 0u32;
                    while cap - used < size + 4 {
                        let old = model.pop_front().unwrap();
                        used -= old.len() + 4;
                        want_dropped += 1;
                    }
                    assert_eq!(q.enqueue(&m), Ok(want_dropped), "round {round} step {step}");
                    used += size + 4;
                    model.push_back(m);
                    enq += 1;
                    dropped += u64::from(want_dropped);
                } else {
                    match model.pop_front() {
                        Some(m) => {
                            assert_eq!(q.dequeue().unwrap(), m, "round {round} step {step}");
                            used -= m.len() + 4;
                            deq += 1;
                        }
                        None => assert_eq!(q.dequeue(), Err(QueueError::Empty)),
                    }
                }
                assert_eq!(q.is_empty(), model.is_empty());
                assert_eq!(q.sequence(), enq);
            }
            assert_eq!(
                q.stats(),
                QueueStats {
                    depth: model.len() as u32,
                    used_bytes: used as u64,
                    enqueued: enq,
                    dequeued: deq,
                    dropped,
                    lock_takeovers: 0,
                }
            );
            while let Some(m) = model.pop_front() {
                assert_eq!(q.dequeue().unwrap(), m);
            }
            assert_eq!(q.dequeue(), Err(QueueError::Empty));
        }
        assert!(
            straddle_body > 100 && straddle_prefix > 5,
            "{straddle_body} bodies and {straddle_prefix} length prefixes straddled the end"
        );
    }

    /// The tail placed at every position near the end of the ring: the length prefix split
    /// 1+3, 2+2, 3+1 bytes, the body split anywhere, or starting exactly at the ring's start.
    #[test]
    fn messages_straddle_the_end_at_every_alignment() {
        for back in 0..24usize {
            let q = queue(MIN_QUEUE_BYTES);
            let cap = q.capacity();
            // A filler message that leaves the tail `back` bytes before the end (0: at the end,
            // i.e. at position 0 again).
            let filler = message(1, cap - back - 4);
            q.enqueue(&filler).unwrap();
            assert_eq!(q.dequeue().unwrap(), filler);
            assert_eq!(q.ring_pos(q.load64(S_TAIL)).unwrap(), (cap - back) % cap);
            let sizes = [0usize, 1, 2, 3, 5, 17, 100];
            for (i, &size) in sizes.iter().enumerate() {
                assert_eq!(q.enqueue(&message(i as u64, size)), Ok(0));
            }
            for (i, &size) in sizes.iter().enumerate() {
                assert_eq!(q.dequeue().unwrap(), message(i as u64, size), "back {back}");
            }
            assert_eq!(q.dequeue(), Err(QueueError::Empty));
            // And one message as large as the ring, starting there.
            let big = message(7, q.max_message());
            assert_eq!(q.enqueue(&big), Ok(0));
            assert_eq!(q.dequeue().unwrap(), big);
        }
    }

    #[test]
    fn existing_attach_sees_the_same_queue() {
        let region = SharedRegion::anonymous(16 * 1024).unwrap();
        let a = QueueZone::attach(region.clone(), "logs", Init::Fresh).unwrap();
        a.enqueue(b"first").unwrap();
        a.enqueue(b"second").unwrap();
        a.register("receiver").unwrap();
        let b = QueueZone::attach(region.clone(), "logs", Init::Existing).unwrap();
        assert_eq!(b.capacity(), a.capacity());
        assert_eq!(b.sequence(), 2);
        assert_eq!(b.registered_by().as_deref(), Some("receiver"));
        assert_eq!(b.dequeue().unwrap(), b"first");
        assert_eq!(a.dequeue().unwrap(), b"second");
        assert_eq!(b.dequeue(), Err(QueueError::Empty));
        // A Fresh attach erases everything.
        let c = QueueZone::attach(region, "logs", Init::Fresh).unwrap();
        assert_eq!(c.stats(), QueueStats::default());
        assert_eq!(a.registered_by(), None);
    }

    #[test]
    fn sentinel_mismatch_refuses_to_attach() {
        let region = SharedRegion::anonymous(64 * 1024).unwrap();
        QueueZone::attach(region.clone(), "q", Init::Fresh).unwrap();
        // Another size (the directive changed across a reload): refused.
        let smaller = region.prefix(32 * 1024).unwrap();
        assert_eq!(
            QueueZone::attach(smaller, "q", Init::Existing).unwrap_err(),
            AttachError::Mismatch {
                field: "zone size",
                expected: 32 * 1024,
                found: 64 * 1024
            }
        );
        // Another layout version: refused.
        region
            .u32_at(H_VERSION)
            .unwrap()
            .store(VERSION + 1, Ordering::Relaxed);
        assert!(matches!(
            QueueZone::attach(region.clone(), "q", Init::Existing),
            Err(AttachError::Mismatch {
                field: "layout version",
                ..
            })
        ));
        // A bad magic (e.g. a shm_kv zone): refused.
        region
            .u64_at(H_MAGIC)
            .unwrap()
            .store(u64::from_le_bytes(*b"TGSHMKV1"), Ordering::Relaxed);
        assert_eq!(
            QueueZone::attach(region, "q", Init::Existing).unwrap_err(),
            AttachError::NotInitialized
        );
        // Memory that never held a zone: refused.
        let blank = SharedRegion::anonymous(64 * 1024).unwrap();
        assert_eq!(
            QueueZone::attach(blank, "q", Init::Existing).unwrap_err(),
            AttachError::NotInitialized
        );
        // Too small.
        let tiny = SharedRegion::anonymous(MIN_QUEUE_BYTES - 1).unwrap();
        assert_eq!(
            QueueZone::attach(tiny, "q", Init::Fresh).unwrap_err(),
            AttachError::TooSmall {
                len: MIN_QUEUE_BYTES - 1,
                min: MIN_QUEUE_BYTES
            }
        );
    }

    #[test]
    fn corruption_is_reported_and_the_queue_recovers() {
        let q = queue(MIN_QUEUE_BYTES);
        for m in [&b"aaaa"[..], b"bbbb", b"cccc"] {
            q.enqueue(m).unwrap();
        }
        assert_eq!(q.dequeue().unwrap(), b"aaaa");
        // The next message's length prefix claims more than what is used.
        let head = q.load64(S_HEAD);
        let pos = q.ring_pos(head).unwrap();
        assert!(q.region.write(RING_OFF + pos, &1000u32.to_le_bytes()));
        assert_eq!(q.dequeue(), Err(QueueError::Corrupt));
        // Reset to empty; the two lost messages count as dropped; the queue works again.
        assert!(q.is_empty());
        let s = q.stats();
        assert_eq!((s.depth, s.used_bytes, s.dropped), (0, 0, 2));
        assert!(invariant_holds(&q));
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
        q.enqueue(b"dddd").unwrap();
        assert_eq!(q.dequeue().unwrap(), b"dddd");

        // A length that fits in the used bytes but does not end at the tail of the last message.
        q.enqueue(b"eeeeeeee").unwrap();
        let pos = q.ring_pos(q.load64(S_HEAD)).unwrap();
        assert!(q.region.write(RING_OFF + pos, &3u32.to_le_bytes()));
        assert_eq!(q.dequeue(), Err(QueueError::Corrupt));
        assert!(q.is_empty());

        // head > tail: noticed by an enqueue, which stores nothing and resets.
        q.enqueue(b"ffff").unwrap();
        q.region
            .u64_at(S_HEAD)
            .unwrap()
            .store(1 << 40, Ordering::Relaxed);
        assert_eq!(q.enqueue(b"gggg"), Err(QueueError::Corrupt));
        assert_eq!(q.dequeue(), Err(QueueError::Empty));
        assert_eq!(q.enqueue(b"hhhh"), Ok(0));
        assert_eq!(q.dequeue().unwrap(), b"hhhh");

        // A depth that disagrees with the used bytes.
        q.enqueue(b"iiii").unwrap();
        q.region
            .u32_at(S_DEPTH)
            .unwrap()
            .store(9, Ordering::Relaxed);
        assert_eq!(q.dequeue(), Err(QueueError::Corrupt));
        assert_eq!(q.enqueue(b"jjjj"), Ok(0));
        assert_eq!(q.dequeue().unwrap(), b"jjjj");
        assert!(invariant_holds(&q));
        assert_eq!(q.sequence(), 9);
    }

    #[test]
    fn registration_last_wins() {
        let q = queue(MIN_QUEUE_BYTES);
        assert_eq!(q.registered_by(), None);
        q.register("sender-vm-with-a-long-name").unwrap();
        assert_eq!(
            q.registered_by().as_deref(),
            Some("sender-vm-with-a-long-name")
        );
        q.register("receiver").unwrap();
        assert_eq!(q.registered_by().as_deref(), Some("receiver"));
        q.register("").unwrap();
        assert_eq!(q.registered_by().as_deref(), Some(""));
        let longest = "v".repeat(MAX_VM_ID_BYTES);
        q.register(&longest).unwrap();
        assert_eq!(q.registered_by(), Some(longest.clone()));
        let too_long = "v".repeat(MAX_VM_ID_BYTES + 1);
        assert_eq!(
            q.register(&too_long),
            Err(QueueError::TooLarge {
                len: MAX_VM_ID_BYTES + 1,
                max: MAX_VM_ID_BYTES
            })
        );
        assert_eq!(q.registered_by(), Some(longest));
        // A corrupted length reads as unregistered and is cleared.
        q.region
            .u32_at(R_LEN)
            .unwrap()
            .store(4000, Ordering::Relaxed);
        assert_eq!(q.registered_by(), None);
        assert_eq!(q.load32(R_FLAG), 0);
        // The queue itself is unaffected by registrations.
        q.enqueue(b"m").unwrap();
        q.register("again").unwrap();
        assert_eq!(q.dequeue().unwrap(), b"m");
        assert_eq!(q.registered_by().as_deref(), Some("again"));
    }

    /// A message tagged with its producer and sequence number, with a variable-length body
    /// derived from both (checked by the consumer).
    fn tagged(producer: u32, seq: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&producer.to_le_bytes());
        m.extend_from_slice(&seq.to_le_bytes());
        m.extend(message(
            (u64::from(producer) << 32) | u64::from(seq),
            (seq % 53) as usize,
        ));
        m
    }

    fn untag(m: &[u8]) -> Option<(u32, u32)> {
        let producer = u32::from_le_bytes(m.get(0..4)?.try_into().ok()?);
        let seq = u32::from_le_bytes(m.get(4..8)?.try_into().ok()?);
        (tagged(producer, seq) == m).then_some((producer, seq))
    }

    /// One producer-consumer: waits until all `producers` arrived at `start` (so they really
    /// run at the same time), enqueues `each` tagged messages, dequeuing after three of every
    /// four; `seen(producer, seq)` records each dequeued message. False on a malformed message,
    /// on a producer's messages out of order, or on any error but `Empty`.
    fn produce_and_consume(
        q: &QueueZone,
        start: &AtomicU32,
        me: u32,
        producers: usize,
        each: u32,
        mut seen: impl FnMut(u32, u32),
    ) -> bool {
        start.fetch_add(1, Ordering::AcqRel);
        while (start.load(Ordering::Acquire) as usize) < producers {
            std::thread::yield_now();
        }
        let mut last = vec![None::<u32>; producers];
        let mut take = |q: &QueueZone| -> Option<bool> {
            match q.dequeue() {
                Ok(m) => {
                    let Some((p, s)) = untag(&m) else {
                        return Some(false);
                    };
                    let Some(l) = last.get_mut(p as usize) else {
                        return Some(false);
                    };
                    if l.is_some_and(|prev| prev >= s) {
                        return Some(false);
                    }
                    *l = Some(s);
                    seen(p, s);
                    Some(true)
                }
                Err(QueueError::Empty) => None,
                Err(_) => Some(false),
            }
        };
        for seq in 0..each {
            if q.enqueue(&tagged(me, seq)) != Ok(0) {
                return false;
            }
            if seq % 4 != 0 && take(q) == Some(false) {
                return false;
            }
        }
        // Drain what is left (other producers may still be adding: stop at the first Empty).
        loop {
            match take(q) {
                Some(true) => {}
                Some(false) => return false,
                None => return true,
            }
        }
    }

    #[test]
    fn threads_deliver_every_message_exactly_once() {
        const THREADS: usize = 4;
        const EACH: u32 = 20_000;
        // Room for every message: nothing is dropped.
        let q = queue(THREADS * EACH as usize * 70 + 4096);
        let counts: Vec<AtomicU32> = (0..THREADS * EACH as usize)
            .map(|_| AtomicU32::new(0))
            .collect();
        let start = AtomicU32::new(0);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let q = q.clone();
                    let (counts, start) = (&counts, &start);
                    s.spawn(move || {
                        produce_and_consume(&q, start, t as u32, THREADS, EACH, |p, seq| {
                            counts[p as usize * EACH as usize + seq as usize]
                                .fetch_add(1, Ordering::Relaxed);
                        })
                    })
                })
                .collect();
            for h in handles {
                assert!(h.join().unwrap());
            }
        });
        // Whatever the threads left behind (none: each drained after its last enqueue, but a
        // thread may have finished before another's last messages).
        while let Ok(m) = q.dequeue() {
            let (p, seq) = untag(&m).unwrap();
            counts[p as usize * EACH as usize + seq as usize].fetch_add(1, Ordering::Relaxed);
        }
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        let s = q.stats();
        assert_eq!(
            (s.enqueued, s.dequeued, s.dropped, s.depth),
            (80_000, 80_000, 0, 0)
        );
    }

    #[test]
    fn forked_processes_deliver_every_message_exactly_once() {
        const CHILDREN: usize = 3;
        const EACH: u32 = 20_000;
        let region = SharedRegion::anonymous(CHILDREN * EACH as usize * 70 + 4096).unwrap();
        let q = QueueZone::attach(region.clone(), "q", Init::Fresh).unwrap();
        // One u32 per (producer, seq): how many times it was dequeued, in any process; then the
        // start barrier.
        let barrier = CHILDREN * EACH as usize * 4;
        let counts = SharedRegion::anonymous(barrier + 64).unwrap();
        let count = |p: u32, seq: u32| {
            counts
                .u32_at((p as usize * EACH as usize + seq as usize) * 4)
                .unwrap()
                .fetch_add(1, Ordering::Relaxed);
        };
        let codes = crate::shm::fork_children(CHILDREN, |i| {
            // Each child attaches the existing zone, as an nginx worker would.
            let Ok(q) = QueueZone::attach(region.clone(), "q", Init::Existing) else {
                return false;
            };
            let Some(start) = counts.u32_at(barrier) else {
                return false;
            };
            produce_and_consume(&q, start, i as u32, CHILDREN, EACH, count)
        });
        assert_eq!(codes, vec![0; CHILDREN]);
        while let Ok(m) = q.dequeue() {
            let (p, seq) = untag(&m).unwrap();
            count(p, seq);
        }
        for i in 0..CHILDREN * EACH as usize {
            assert_eq!(
                counts.u32_at(i * 4).unwrap().load(Ordering::Relaxed),
                1,
                "{i}"
            );
        }
        let s = q.stats();
        let total = (CHILDREN as u32 * EACH) as u64;
        assert_eq!(
            (s.enqueued, s.dequeued, s.dropped, s.depth),
            (total, total, 0, 0)
        );
    }

    #[test]
    fn a_worker_dying_with_the_lock_does_not_wedge_the_queue() {
        let region = SharedRegion::anonymous(MIN_QUEUE_BYTES).unwrap();
        let q = QueueZone::attach(region, "q", Init::Fresh).unwrap();
        q.enqueue(b"before").unwrap();
        let codes = crate::shm::fork_children(1, |_| {
            // Take the lock and exit without releasing it (a crashed worker).
            let Ok(guard) = q.lock() else {
                return false;
            };
            std::mem::forget(guard);
            true
        });
        assert_eq!(codes, vec![0]);
        assert_eq!(q.dequeue().unwrap(), b"before");
        assert_eq!(q.stats().lock_takeovers, 1);
    }
}
