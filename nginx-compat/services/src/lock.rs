//! A spinlock in shared memory that works across processes: one `AtomicU32` holding 0 (free) or
//! the owner's process id.
//!
//! Acquisition spins briefly (`spin_loop`), then yields the CPU (`thread::yield_now`) between
//! attempts. Every [`STEAL_CHECK_EVERY`] yields it checks whether the owner process still exists
//! (`kill(pid, 0)`); if the owner died while holding the lock (an nginx worker killed mid-update),
//! the waiter takes the lock over (compare-and-swap from the dead pid to its own) and counts the
//! takeover in the zone's `steals` counter, instead of waiting forever. The data the dead owner
//! was updating may be half-written: the zones bound every walk and check every offset they read,
//! so the damage is at worst a wrong value or a leaked block, never an out-of-bounds access.
//!
//! Threads of one process share a pid: they exclude each other normally, but a thread that
//! died holding the lock (impossible here: nothing panics while holding one) would not be
//! detected. PID reuse by an unrelated process after the owner died delays the takeover until
//! that process exits.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::shm::{current_pid, process_alive};

/// Busy-wait iterations before yielding.
const SPINS: u32 = 64;
/// Yields between two checks of the owner's liveness.
const STEAL_CHECK_EVERY: u32 = 256;

/// Releases the lock when dropped.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    word: &'a AtomicU32,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

fn my_id() -> u32 {
    // pid 0 cannot be a process id here; keep 0 meaning "free" regardless.
    current_pid().max(1)
}

/// Takes the lock if it is free, without waiting.
pub(crate) fn try_lock(word: &AtomicU32) -> Option<Guard<'_>> {
    word.compare_exchange(0, my_id(), Ordering::Acquire, Ordering::Relaxed)
        .ok()
        .map(|_| Guard { word })
}

/// Takes the lock, waiting as long as needed (see the module documentation); `steals` counts
/// takeovers from dead owners.
pub(crate) fn lock<'a>(word: &'a AtomicU32, steals: Option<&AtomicU32>) -> Guard<'a> {
    let me = my_id();
    let mut spins = 0u32;
    let mut yields = 0u32;
    loop {
        let seen = word.load(Ordering::Relaxed);
        if seen == 0 {
            if word
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Guard { word };
            }
            continue;
        }
        if spins < SPINS {
            spins = spins.wrapping_add(1);
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        yields = yields.wrapping_add(1);
        if yields.is_multiple_of(STEAL_CHECK_EVERY)
            && seen != me
            && !process_alive(seen)
            && word
                .compare_exchange(seen, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            if let Some(steals) = steals {
                steals.fetch_add(1, Ordering::Relaxed);
            }
            return Guard { word };
        }
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn excludes_and_releases() {
        let word = AtomicU32::new(0);
        let g = lock(&word, None);
        assert!(try_lock(&word).is_none());
        drop(g);
        assert!(try_lock(&word).is_some());
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn takes_over_from_a_dead_owner() {
        // A pid far above pid_max (4194304 on Linux) exists nowhere.
        let word = AtomicU32::new(0x7fff_fff0);
        let steals = AtomicU32::new(0);
        let g = lock(&word, Some(&steals));
        assert_eq!(steals.load(Ordering::Relaxed), 1);
        assert_eq!(word.load(Ordering::Relaxed), my_id());
        drop(g);
    }
}
