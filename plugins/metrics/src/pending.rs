//! Counter increments held in the VM between flushes.
//!
//! The filter adds each request's counts here instead of calling the host once per series per
//! request (`proxy_increment_metric`: about ten calls a request in an LLM chain). The root
//! context hands them over on its tick, one call per series that changed since the last flush,
//! and when the host shuts the plugin down (`proxy_on_done`). Each worker owns its VM, so
//! nothing here is shared and no count is taken twice; a scrape sees a worker's counts at most
//! one flush interval late (see the README, "Flush interval").
//!
//! Histograms are not held: the ABI records one sample per call (`proxy_record_metric`), so
//! holding samples would move the calls, not save them.
//!
//! Size: ids come from the series cache, which holds at most its `max` series, so a client
//! cannot grow this beyond that. Hosts number their metrics upwards from a small id (nginx-compat:
//! the zone's index, below 4,096; Envoy: a step of 4 per metric of the VM), so ids below
//! [`DENSE_IDS`] index a vector of sums directly (8 bytes per id up to the largest one used) and
//! a list of those that changed; any other id goes to a hash table.

use hashbrown::HashTable;

use crate::series::avalanche;

/// Ids below this index [`PendingCounters`]' vector (at most 128 KiB of sums).
pub const DENSE_IDS: u32 = 1 << 14;

/// Increments by metric id (the host's id from `proxy_define_metric`), summed until flushed.
#[derive(Debug, Default)]
pub struct PendingCounters {
    /// The sum of each id below [`DENSE_IDS`] (0: nothing held).
    dense: Vec<u64>,
    /// The ids whose `dense` sum is not 0, each once.
    dirty: Vec<u32>,
    /// `(id, increments since the last flush)` of the other ids; hashed by [`avalanche`] of the
    /// id (ids are the host's, not a client's).
    table: HashTable<(u32, u64)>,
}

impl PendingCounters {
    /// Adds `n` to counter `id` (saturating: a counter that would pass `u64::MAX` between two
    /// flushes stays there). Zero adds nothing.
    pub fn add(&mut self, id: u32, n: u64) {
        if n == 0 {
            return;
        }
        if id < DENSE_IDS {
            let at = id as usize;
            if at >= self.dense.len() {
                self.dense.resize(at.saturating_add(1), 0);
            }
            if let Some(sum) = self.dense.get_mut(at) {
                if *sum == 0 {
                    self.dirty.push(id);
                }
                *sum = sum.saturating_add(n);
            }
            return;
        }
        let hash = avalanche(u64::from(id));
        match self.table.find_mut(hash, |e| e.0 == id) {
            Some(entry) => entry.1 = entry.1.saturating_add(n),
            None => {
                self.table
                    .insert_unique(hash, (id, n), |e| avalanche(u64::from(e.0)));
            }
        }
    }

    /// Hands every held sum to `emit(id, n)`, once each, and forgets them (the table's memory
    /// is kept for the next interval).
    pub fn flush(&mut self, mut emit: impl FnMut(u32, u64)) {
        for id in self.dirty.drain(..) {
            if let Some(sum) = self.dense.get_mut(id as usize) {
                emit(id, std::mem::take(sum));
            }
        }
        for (id, n) in self.table.drain() {
            emit(id, n);
        }
    }

    /// How many series hold increments.
    pub fn len(&self) -> usize {
        self.dirty.len().saturating_add(self.table.len())
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flushed(p: &mut PendingCounters) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        p.flush(|id, n| out.push((id, n)));
        out.sort_unstable();
        out
    }

    #[test]
    fn sums_by_id_and_empties_on_flush() {
        let mut p = PendingCounters::default();
        let big = DENSE_IDS + 1;
        for (id, n) in [
            (7, 1),
            (3, 40),
            (7, 1),
            (7, 0),
            (1 << 31, 5),
            (3, 2),
            (big, 1),
            (big, 1),
        ] {
            p.add(id, n);
        }
        assert_eq!(p.len(), 4);
        assert_eq!(
            flushed(&mut p),
            vec![(3, 42), (7, 2), (big, 2), (1 << 31, 5)]
        );
        assert!(p.is_empty());
        assert_eq!(flushed(&mut p), vec![], "each sum is handed over once");
        p.add(7, 3);
        assert_eq!(flushed(&mut p), vec![(7, 3)]);
    }

    #[test]
    fn zero_holds_nothing_and_a_sum_saturates() {
        let mut p = PendingCounters::default();
        p.add(1, 0);
        assert!(p.is_empty());
        for id in [1, u32::MAX] {
            p.add(id, u64::MAX - 1);
            p.add(id, 5);
        }
        assert_eq!(flushed(&mut p), vec![(1, u64::MAX), (u32::MAX, u64::MAX)]);
    }

    #[test]
    fn many_series_each_once() {
        let mut p = PendingCounters::default();
        // Below and above DENSE_IDS.
        let ids = || (0..5_000u32).map(|i| i * 8);
        for round in 0..3u64 {
            for id in ids() {
                p.add(id, round + 1);
            }
        }
        let out = flushed(&mut p);
        assert_eq!(out.len(), 5_000);
        assert!(out
            .iter()
            .zip(ids())
            .all(|(&(id, n), want)| id == want && n == 6));
        assert!(p.is_empty() && flushed(&mut p).is_empty());
        for id in 0..5_000u32 {
            p.add(id, 6);
        }
        let out = flushed(&mut p);
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, &(id, n))| id as usize == i && n == 6));
    }
}
