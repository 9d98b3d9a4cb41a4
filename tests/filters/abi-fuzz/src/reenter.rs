//! Re-entrant calls that conflict with the call in progress: when the host asks
//! `proxy_on_memory_allocate` for room for a result, the guest may first change the very state the
//! host is returning (the header it is reading, the property, the buffer, the shared-data key,
//! the queue, the effective root whose name or configuration it copies). A host that measured
//! the result before allocating and copies it after must cope with it having changed.

use crate::imports as abi;
use crate::Fuzz;

/// What the call in progress is reading (the state a conflicting call changes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outer {
    None,
    /// A header map, and a key in the guest's memory.
    Map {
        t: u32,
        kp: u32,
        kl: u32,
    },
    /// A property path.
    Property {
        pp: u32,
        pl: u32,
    },
    /// A buffer.
    Buffer {
        t: u32,
    },
    /// Something of the effective root: its plugin name, configuration.
    Root,
    /// A shared-data key.
    Shared {
        kp: u32,
        kl: u32,
    },
    /// A shared queue.
    Queue {
        id: u32,
    },
}

impl Fuzz {
    /// Runs `call` with `outer` recorded as what it reads (for `conflict`).
    pub fn reading<R>(&self, outer: Outer, call: impl FnOnce() -> R) -> R {
        let before = self.outer.replace(outer);
        let r = call();
        self.outer.set(before);
        r
    }

    /// One call that changes what the call in progress reads; false when there is none.
    pub fn conflict(&self) -> bool {
        let outer = self.outer.get();
        if outer == Outer::None || !self.spend() {
            return false;
        }
        let r = &self.rng;
        // SAFETY (every block below): host imports taking plain integers, as in `calls.rs`.
        match outer {
            Outer::None => {}
            Outer::Map { t, kp, kl } => match r.below(4) {
                0 => {
                    let (vp, vl) = self.payload();
                    let _ = unsafe { abi::proxy_replace_header_map_value(t, kp, kl, vp, vl) };
                }
                1 => {
                    let _ = unsafe { abi::proxy_remove_header_map_value(t, kp, kl) };
                }
                2 => {
                    let (p, l) = self.map();
                    let _ = unsafe { abi::proxy_set_header_map_pairs(t, p, l) };
                }
                _ => {
                    let (vp, vl) = self.payload();
                    let _ = unsafe { abi::proxy_add_header_map_value(t, kp, kl, vp, vl) };
                }
            },
            Outer::Property { pp, pl } => {
                let (vp, vl) = self.payload();
                let _ = unsafe { abi::proxy_set_property(pp, pl, vp, vl) };
            }
            Outer::Buffer { t } => {
                let (p, l) = self.payload();
                let (start, size) = (r.below(8), r.pick(&[0, 1, 100, u32::MAX], 0));
                let _ = unsafe { abi::proxy_set_buffer_bytes(t, start, size, p, l) };
            }
            Outer::Root => {
                let i = r.below(self.roots.len() as u32) as usize;
                let root = self.roots.get(i).map_or(0, std::cell::Cell::get);
                if unsafe { abi::proxy_set_effective_context(root) } == 0 {
                    self.effective.set(root);
                }
            }
            Outer::Shared { kp, kl } => {
                let (vp, vl) = self.payload();
                let _ = unsafe { abi::proxy_set_shared_data(kp, kl, vp, vl, r.below(4)) };
            }
            Outer::Queue { id } => {
                let (vp, vl) = self.payload();
                let _ = unsafe { abi::proxy_enqueue_shared_queue(id, vp, vl) };
            }
        }
        true
    }
}
