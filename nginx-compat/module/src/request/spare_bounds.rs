//! What a worker's spares (`spares.rs`) keep, at most: nginx-free, unit-tested by
//! `tests/pure.rs`.

use tollgate_host::MAX_EDITS;

/// Most allocations of each kind a worker keeps (requests in flight at once return theirs).
pub const KEPT: usize = 16;

/// Largest stream buffers kept (bytes allocated, all together): those a large body or a guest
/// grew are freed rather than held by the worker.
pub const KEPT_BUFFER_BYTES: usize = 64 * 1024;

/// Whether a finished request's buffers are kept: `bytes` allocated for its properties and
/// bodies, `edits` the capacities of its two edit lists. Something, and within
/// [`KEPT_BUFFER_BYTES`] and `MAX_EDITS`: a large body a client sent, or a store a guest grew,
/// is freed with its request.
pub fn worth_keeping(bytes: usize, edits: [usize; 2]) -> bool {
    (bytes > 0 || edits != [0, 0])
        && bytes <= KEPT_BUFFER_BYTES
        && edits.iter().all(|n| *n <= MAX_EDITS)
}

#[cfg(test)]
mod tests {
    use super::{worth_keeping, KEPT_BUFFER_BYTES, MAX_EDITS};

    #[test]
    fn large_or_empty_buffers_are_not_kept() {
        // A 1 MiB request body (a hostile client's) or a store a guest grew is freed with its
        // request, not held by the worker; nothing allocated is nothing to keep.
        assert!(worth_keeping(4096, [4, 0]));
        assert!(worth_keeping(KEPT_BUFFER_BYTES, [MAX_EDITS, MAX_EDITS]));
        assert!(worth_keeping(0, [0, 4]));
        assert!(!worth_keeping(0, [0, 0]));
        assert!(!worth_keeping(1 << 20, [0, 0]));
        assert!(!worth_keeping(KEPT_BUFFER_BYTES + 1, [4, 4]));
        assert!(!worth_keeping(4096, [MAX_EDITS + 1, 0]));
    }
}
