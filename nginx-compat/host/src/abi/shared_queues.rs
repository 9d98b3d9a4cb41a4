//! Shared queues: `proxy_register_shared_queue` (remembering the registering root context for
//! `proxy_on_queue_ready`), `proxy_resolve_shared_queue`, `proxy_enqueue_shared_queue`,
//! `proxy_dequeue_shared_queue`.

use crate::abi::store::{
    code, guest_str, ms, return_bytes, return_u32, status_of, Def, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, R,
};
use crate::error::Error;
use crate::mem;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: u32, nl: u32, ret_id: u32| -> u32 {
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let state = c.data_mut();
            let root = state.root().map(|r| r.id);
            match state.host.register_shared_queue(&name) {
                Ok(id) => {
                    if let Some(root) = root {
                        state.queues.insert(id, root);
                    }
                    return_u32(&mut c, ret_id, id)
                }
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vp: u32, vl: u32, np: u32, nl: u32, ret_id: u32| -> u32 {
            let vm_id = match guest_str(&mut c, vp, vl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            match c.data().host.resolve_shared_queue(&vm_id, &name) {
                Ok(id) => return_u32(&mut c, ret_id, id),
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(value) = mem::slice(mem, vp, vl) else {
                return INVALID_MEMORY_ACCESS;
            };
            status_of(state.host.enqueue_shared_queue(id, value))
        },
    )?;
    d.env(
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: u32, ret_ptr: u32, ret_size: u32| -> R {
            match c.data().host.dequeue_shared_queue(id) {
                Ok(v) => return_bytes(&mut c, ret_ptr, ret_size, &v),
                Err(s) => Ok(code(s)),
            }
        },
    )?;
    Ok(())
}
