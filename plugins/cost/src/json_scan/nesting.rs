//! The nesting stack: a container opens (entering the object of a top-level `message` or
//! `response` member) or closes, and whether the innermost one is an object.

use super::{JsonScan, St};

impl JsonScan {
    /// Whether the innermost open container is an object (`None`: none is open).
    pub(super) fn in_object(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        let word = self.stack.get(d / 64)?;
        Some(word.wrapping_shr((d % 64) as u32) & 1 == 1)
    }
    /// `{` (`object`) or `[` opens a container; `next`: just after it.
    pub(super) fn open(&mut self, chunk: &[u8], object: bool, next: usize) -> usize {
        let d = self.depth;
        let Some(word) = self.stack.get_mut(d / 64) else {
            return self.fail(chunk);
        };
        let bit = 1u64.wrapping_shl((d % 64) as u32);
        if object {
            *word |= bit;
        } else {
            *word &= !bit;
        }
        // Entering the object of a top-level `message` / `response` member.
        if object && d == 1 {
            self.inner_parent = match self.top {
                Some(Err(parent)) => Some(parent),
                _ => None,
            };
            self.inner = None;
        }
        self.depth = d.saturating_add(1);
        self.st = if object { St::ObjFirst } else { St::ArrFirst };
        next
    }

    /// `]` or `}` (`object`) closes the innermost container; `next`: just after it.
    pub(super) fn close(&mut self, chunk: &[u8], object: bool, next: usize) -> usize {
        if self.in_object() != Some(object) {
            return self.fail(chunk);
        }
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 1 {
            self.inner_parent = None;
        }
        self.value_end(chunk, next);
        next
    }
}
