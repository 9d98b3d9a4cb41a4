//! Buffers (`proxy_buffer_type_t`: request/response body chunks, the HTTP call's response
//! body, a unary gRPC call's reply message (`GrpcReceiveBuffer`, during
//! `proxy_on_grpc_receive`), the VM and plugin configurations): `proxy_get_buffer_bytes`, `proxy_set_buffer_bytes`
//! (and their later names `proxy_get_buffer`/`proxy_set_buffer`), `proxy_get_buffer_status`,
//! `proxy_get_configuration`.

use crate::abi::store::{
    ms, put, return_with, Def, State, BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY_ACCESS,
    NOT_FOUND, OK, R,
};
use crate::error::Error;
use crate::mem;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    let get_buffer =
        |mut c: C<'_>, t: u32, start: u32, max: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some(buf) = c.data().buffer(t) else {
                return Ok(NOT_FOUND);
            };
            let (Ok(start), Ok(max)) = (usize::try_from(start), usize::try_from(max)) else {
                return Ok(BAD_ARGUMENT);
            };
            if start > buf.len() {
                return Ok(BAD_ARGUMENT);
            }
            let end = start.saturating_add(max).min(buf.len());
            let len = end.saturating_sub(start);
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, s.buffer(t)?.get(start..end)?)
            })
        };
    d.env("proxy_get_buffer_bytes", get_buffer)?;
    d.env("proxy_get_buffer", get_buffer)?;
    let set_buffer = |mut c: C<'_>, t: u32, start: u32, size: u32, ptr: u32, len: u32| -> u32 {
        let Some((mem, state)) = ms(&mut c) else {
            return INTERNAL_FAILURE;
        };
        let Some(data) = mem::slice(mem, ptr, len) else {
            return INVALID_MEMORY_ACCESS;
        };
        if state.buffer(t).is_none() {
            return NOT_FOUND;
        }
        let Some(buf) = state.buffer_mut(t) else {
            return BAD_ARGUMENT;
        };
        let (Ok(start), Ok(size)) = (usize::try_from(start), usize::try_from(size)) else {
            return BAD_ARGUMENT;
        };
        // Envoy: start 0 replaces the first `size` bytes, start >= length appends.
        if start >= buf.len() {
            buf.extend_from_slice(data);
        } else {
            let end = start.saturating_add(size).min(buf.len());
            buf.splice(start..end, data.iter().copied());
        }
        OK
    };
    d.env("proxy_set_buffer_bytes", set_buffer)?;
    d.env("proxy_set_buffer", set_buffer)?;
    d.env(
        "proxy_get_buffer_status",
        |mut c: C<'_>, t: u32, ret_len: u32, ret_flags: u32| -> u32 {
            let Some(len) = c.data().buffer(t).map(<[u8]>::len) else {
                return NOT_FOUND;
            };
            let Ok(len) = u32::try_from(len) else {
                return INTERNAL_FAILURE;
            };
            if put(&mut c, ret_len, &len.to_le_bytes()) && put(&mut c, ret_flags, &[0; 4]) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            }
        },
    )?;
    d.env(
        "proxy_get_configuration",
        |mut c: C<'_>, ret_ptr: u32, ret_size: u32| -> R {
            let len = c.data().buffer(7).map_or(0, <[u8]>::len);
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, s.buffer(7)?)
            })
        },
    )?;
    Ok(())
}

impl State {
    pub(crate) fn buffer(&self, t: u32) -> Option<&[u8]> {
        match t {
            0 => Some(&self.stream().request_body),
            1 => Some(&self.stream().response_body),
            4 => self.call_response.as_ref().map(|r| r.body.as_slice()),
            5 => self.grpc_receive.as_deref(),
            6 => Some(&self.vm_config),
            7 => self.root().map(|r| r.configuration.as_slice()),
            _ => None,
        }
    }

    pub(crate) fn buffer_mut(&mut self, t: u32) -> Option<&mut Vec<u8>> {
        let s = self.stream_mut();
        match t {
            0 => {
                s.request_body_changed = true;
                Some(&mut s.request_body)
            }
            1 => {
                s.response_body_changed = true;
                Some(&mut s.response_body)
            }
            _ => None,
        }
    }
}
