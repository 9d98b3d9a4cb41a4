//! The worker's list of the requests in flight: a request joins it when it enters its first
//! chain and leaves it when it ends, so that the requests whose HTTP contexts a replaced
//! instance held can all be found and refused (`request::resume::orphaned`), paused or not.
//! Joining and leaving are O(1): each request keeps its place, and the last one takes the
//! place of one that leaves (the caller updates that one's place from what [`InFlight::remove`]
//! returns). Nginx-free: tested in `tests/pure.rs`.

/// The requests in flight (`T`: a request's handle), in no order.
#[derive(Debug)]
pub struct InFlight<T> {
    list: Vec<T>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight { list: Vec::new() }
    }
}

impl<T: Copy + PartialEq> InFlight<T> {
    /// Adds `request`; returns its place.
    pub fn add(&mut self, request: T) -> usize {
        self.list.push(request);
        self.list.len().saturating_sub(1)
    }

    /// Removes `request`, whose place is `at` (as [`InFlight::add`] gave it, or as a later
    /// `remove` moved it). Returns the request that took that place and the place, for the
    /// caller to record; `None` when none moved. A request not at `at` (a caller's bug) is looked
    /// for, so that it never stays listed once its request is gone; one not listed is left.
    pub fn remove(&mut self, request: T, at: usize) -> Option<(T, usize)> {
        let at = if self.list.get(at) == Some(&request) {
            at
        } else {
            self.list.iter().position(|&r| r == request)?
        };
        self.list.swap_remove(at);
        self.list.get(at).map(|&moved| (moved, at))
    }

    /// The requests in flight.
    pub fn as_slice(&self) -> &[T] {
        &self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Requests join and leave in a scrambled order; each keeps its place as the caller
    /// records it from `remove`'s answers, and the list always holds exactly those in flight.
    #[test]
    fn places_follow_the_moves_through_any_order() {
        let mut list = InFlight::default();
        let mut places: HashMap<u32, usize> = HashMap::new();
        let mut state = 0x9e37_79b9u32;
        let mut next = 0u32;
        for _ in 0..5_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            if places.is_empty() || state % 5 < 3 {
                next += 1;
                places.insert(next, list.add(next));
            } else {
                let mut live: Vec<u32> = places.keys().copied().collect();
                live.sort_unstable();
                let leaving = live[(state >> 8) as usize % live.len()];
                let at = places.remove(&leaving).unwrap();
                if let Some((moved, to)) = list.remove(leaving, at) {
                    places.insert(moved, to);
                }
            }
            for (&r, &at) in &places {
                assert_eq!(list.as_slice()[at], r, "{r} is not where it was told");
            }
            assert_eq!(list.as_slice().len(), places.len());
        }
    }

    /// One off its place is still removed; one not listed removes nothing.
    #[test]
    fn a_request_off_its_place_is_found_and_an_unlisted_one_left() {
        let mut list = InFlight::default();
        for r in [1u32, 2, 3] {
            list.add(r);
        }
        assert_eq!(list.remove(1, 2), Some((3, 0)));
        assert_eq!(list.as_slice(), &[3, 2]);
        assert_eq!(list.remove(9, 0), None);
        assert_eq!(list.as_slice(), &[3, 2]);
    }
}
