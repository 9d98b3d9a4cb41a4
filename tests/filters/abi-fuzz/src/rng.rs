//! The seeded PRNG (SplitMix64: Steele, Lea and Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014), kept in a `Cell` so that re-entrant callbacks share one sequence.

use std::cell::Cell;

pub struct Rng(Cell<u64>);

impl Rng {
    pub const fn new() -> Rng {
        Rng(Cell::new(0x853c_49e6_748f_ea9b))
    }

    /// Restarts the sequence from `seed`.
    pub fn seed(&self, seed: u64) {
        self.0.set(seed ^ 0x853c_49e6_748f_ea9b);
    }

    pub fn next(&self) -> u64 {
        let s = self.0.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.0.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn u32(&self) -> u32 {
        (self.next() >> 32) as u32
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        ((u64::from(self.u32()) * u64::from(n)) >> 32) as u32
    }

    /// True with probability `percent` / 100.
    pub fn percent(&self, percent: u32) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (the first when empty is impossible: callers pass non-empty slices).
    pub fn pick<T: Copy>(&self, items: &[T], default: T) -> T {
        let i = self.below(items.len() as u32) as usize;
        items.get(i).copied().unwrap_or(default)
    }
}
