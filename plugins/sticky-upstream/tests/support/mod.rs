//! What the test crates of this filter share.
#![allow(dead_code, clippy::arithmetic_side_effects)]

/// SplitMix64 (Steele, Lea and Flood 2014): a seeded sequence of uniform `u64`s for the
/// randomised tests.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next state's output through the filter's own finaliser (`choose::mix64`).
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        tollgate_sticky_upstream::choose::mix64(self.0)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
