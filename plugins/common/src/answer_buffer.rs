//! The VM's buffer for answers the host writes into the guest's own memory: the argument of a
//! `tollgate.get_values_into` call goes in it, and the nginx host writes the answer over it
//! (nginx-compat/host's `abi/foreign_functions.rs`), so that the host does not enter the guest's
//! allocator for the answer and the guest frees nothing afterwards. A value read on the plain
//! ABI costs that trip into the guest (about 300 instructions in nginx) and an allocation.
//!
//! One buffer per VM, of [`CAPACITY`] bytes, made at its first use and kept for the VM's life:
//! a call borrows it ([`Lent::take`]) and gives it back when its answer is dropped. While it is
//! lent (a caller still reading an answer calls the host again), `take` gives nothing and the
//! caller uses a call whose answer the host allocates.

use std::cell::Cell;
use std::ops::Deref;

/// Bytes of the buffer (the argument and the answer of one call; a longer answer is allocated
/// by the host instead).
pub const CAPACITY: usize = 4096;

thread_local! {
    /// The buffer, while it is not lent.
    static FREE: Cell<Option<Box<[u8]>>> = const { Cell::new(None) };
    /// Whether the buffer was made (then an empty `FREE` means lent).
    static MADE: Cell<bool> = const { Cell::new(false) };
}

/// The VM's buffer, lent to one call and to the reader of its answer; back to the VM when
/// dropped.
#[derive(Debug)]
pub struct Lent {
    buf: Box<[u8]>,
    /// Bytes of the answer at the buffer's start.
    len: usize,
}

impl Lent {
    /// The buffer; `None` while it is lent already.
    pub fn take() -> Option<Lent> {
        let buf = FREE.with(Cell::take).or_else(|| {
            (!MADE.with(|made| made.replace(true))).then(|| vec![0u8; CAPACITY].into_boxed_slice())
        })?;
        Some(Lent { buf, len: 0 })
    }

    /// Writes a `tollgate.get_values_into` argument at the buffer's start: the buffer's address
    /// and capacity (`u32` little-endian each), then `parts` back to back. Its length, or `None`
    /// when it does not fit (or the address is not a 32-bit one: not a wasm32 guest).
    pub fn put_argument(&mut self, parts: &[&[u8]]) -> Option<usize> {
        let ptr = u32::try_from(self.buf.as_ptr() as usize).ok()?;
        let cap = u32::try_from(self.buf.len()).ok()?;
        let mut at = 0usize;
        for part in [&ptr.to_le_bytes()[..], &cap.to_le_bytes()]
            .iter()
            .chain(parts)
        {
            let end = at.checked_add(part.len())?;
            self.buf.get_mut(at..end)?.copy_from_slice(part);
            at = end;
        }
        Some(at)
    }

    /// The whole buffer, for the call that writes the answer in it.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Records that the answer is the buffer's first `len` bytes (at most its capacity).
    pub fn set_answer(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
    }
}

impl Deref for Lent {
    type Target = [u8];

    /// The answer.
    fn deref(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        FREE.with(|free| free.set(Some(buf)));
    }
}

/// A host's answer: in the VM's buffer, or allocated by the host.
#[derive(Debug)]
pub enum Answer {
    /// Written into the VM's buffer.
    Lent(Lent),
    /// Allocated by the host (the guest owns it).
    Owned(Vec<u8>),
}

impl Deref for Answer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Answer::Lent(lent) => lent,
            Answer::Owned(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_buffer_lent_at_a_time_and_kept() {
        let mut first = Lent::take().unwrap();
        let base = first.bytes_mut().as_ptr();
        assert!(Lent::take().is_none(), "lent already");
        drop(first);
        let mut again = Lent::take().unwrap();
        assert_eq!(
            again.bytes_mut().as_ptr(),
            base,
            "the same buffer, not a new one"
        );
        assert_eq!(again.bytes_mut().len(), CAPACITY);
    }

    #[test]
    fn the_argument_starts_with_the_buffers_address_and_capacity() {
        let mut lent = Lent::take().unwrap();
        let Some(len) = lent.put_argument(&[b"ab", b"", b"c"]) else {
            // A native test's buffer may sit above 4 GiB: no 32-bit address to write.
            assert!(u32::try_from(lent.bytes_mut().as_ptr() as usize).is_err());
            return;
        };
        let ptr = u32::try_from(lent.bytes_mut().as_ptr() as usize).unwrap();
        let cap = u32::try_from(CAPACITY).unwrap();
        let want = [&ptr.to_le_bytes()[..], &cap.to_le_bytes(), b"abc"].concat();
        assert_eq!(len, want.len());
        assert_eq!(&lent.bytes_mut()[..len], &want[..]);
        // What does not fit is refused, not cut.
        let big = vec![0u8; CAPACITY - 8 + 1];
        assert_eq!(lent.put_argument(&[&big]), None);
        lent.set_answer(CAPACITY + 5);
        assert_eq!(
            lent.len(),
            CAPACITY,
            "an answer is never longer than the buffer"
        );
    }
}
