//! Shared data (key-value with CAS tokens, shared by every `Vm` of the embedding):
//! `proxy_get_shared_data`, `proxy_set_shared_data`.

use crate::abi::store::{
    code, keep_buffer, ms, return_bytes, return_u32, status_of, Def, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, OK, R,
};
use crate::error::Error;
use crate::mem;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_get_shared_data",
        |mut c: C<'_>, kp: u32, kl: u32, ret_ptr: u32, ret_size: u32, ret_cas: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(key) = mem::slice(mem, kp, kl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            // The value goes through a buffer kept in the state: the guest's allocator runs
            // between the read and the copy (and may call the host, which then reads into a
            // new buffer).
            let mut value = std::mem::take(&mut state.value);
            let r = match state.host.get_shared_data(key, &mut value) {
                Ok(cas) => match return_bytes(&mut c, ret_ptr, ret_size, &value) {
                    Ok(OK) => Ok(return_u32(&mut c, ret_cas, cas)),
                    other => other,
                },
                Err(s) => Ok(code(s)),
            };
            c.data_mut().value = keep_buffer(value);
            r
        },
    )?;
    d.env(
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: u32, kl: u32, vp: u32, vl: u32, cas: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            status_of(state.host.set_shared_data(key, value, cas))
        },
    )?;
    Ok(())
}
