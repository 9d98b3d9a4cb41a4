//! Header and trailer maps (`proxy_map_type_t`: request/response headers and trailers, and the
//! headers and trailers of an HTTP call's response): `proxy_get_header_map_pairs`, `_size`,
//! `_value`, `proxy_set_header_map_pairs`, `proxy_add_`/`replace_`/`remove_header_map_value`.
//! Every write is checked ([`refused_field`], [`refused_map`], [`refused_growth`]).

use crate::abi::core::{
    eq_name, ms, refused_field, refused_growth, refused_map, return_u32, return_with, Def, State,
    BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY_ACCESS, NOT_FOUND, OK, R,
};
use crate::error::Error;
use crate::mem;
use crate::stream::HeaderMap;
use crate::valid;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    define_reads(d)?;
    define_writes(d)
}

/// `proxy_get_header_map_pairs`, `proxy_get_header_map_size`, `proxy_get_header_map_value`.
fn define_reads(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, t: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some(map) = c.data().map(t) else {
                return Ok(NOT_FOUND);
            };
            let Some(size) = mem::serialized_size(map) else {
                return Ok(INTERNAL_FAILURE);
            };
            return_with(&mut c, ret_ptr, ret_size, size, |dst, s| {
                mem::serialize_into(s.map(t)?, dst)
            })
        },
    )?;
    d.env(
        "proxy_get_header_map_size",
        |mut c: C<'_>, t: u32, ret_size: u32| -> u32 {
            let Some(map) = c.data().map(t) else {
                return NOT_FOUND;
            };
            match mem::serialized_size(map).and_then(|s| u32::try_from(s).ok()) {
                Some(size) => return_u32(&mut c, ret_size, size),
                None => INTERNAL_FAILURE,
            }
        },
    )?;
    d.env(
        "proxy_get_header_map_value",
        |mut c: C<'_>, t: u32, key_ptr: u32, key_len: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(key) = mem::slice(mem, key_ptr, key_len) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(map) = state.map(t) else {
                return Ok(NOT_FOUND);
            };
            let Some(index) = map.iter().position(|(k, _)| eq_name(k, key)) else {
                return Ok(NOT_FOUND);
            };
            let len = map.get(index).map_or(0, |(_, v)| v.len());
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, &s.map(t)?.get(index)?.1)
            })
        },
    )?;
    Ok(())
}

/// `proxy_set_header_map_pairs` and the add, replace and remove of one field.
fn define_writes(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, t: u32, ptr: u32, len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(bytes) = mem::slice(mem, ptr, len) else {
                return INVALID_MEMORY_ACCESS;
            };
            let Some(new) = mem::deserialize(bytes, true) else {
                return BAD_ARGUMENT;
            };
            if let Some(code) = refused_map(state, "proxy_set_header_map_pairs", &new) {
                return code;
            }
            match state.map_mut(t) {
                Ok(map) => {
                    *map = new;
                    OK
                }
                Err(code) => code,
            }
        },
    )?;
    d.env(
        "proxy_add_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            const F: &str = "proxy_add_header_map_value";
            if let Some(code) = refused_field(state, F, key, value) {
                return code;
            }
            let held = state.map(t).map_or(0, valid::map_bytes);
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, held, extra) {
                return code;
            }
            match state.map_mut(t) {
                Ok(map) => {
                    map.push((key.to_ascii_lowercase(), value.to_vec()));
                    OK
                }
                Err(code) => code,
            }
        },
    )?;
    d.env(
        "proxy_replace_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            const F: &str = "proxy_replace_header_map_value";
            if let Some(code) = refused_field(state, F, key, value) {
                return code;
            }
            let held = state.map(t).map_or(0, valid::map_bytes);
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, held, extra) {
                return code;
            }
            let map = match state.map_mut(t) {
                Ok(map) => map,
                Err(code) => return code,
            };
            // Envoy's setCopy: the first entry takes the value, later duplicates go.
            let mut found = false;
            map.retain_mut(|(k, v)| {
                if !eq_name(k, key) {
                    return true;
                }
                if found {
                    return false;
                }
                found = true;
                v.clear();
                v.extend_from_slice(value);
                true
            });
            if !found {
                map.push((key.to_ascii_lowercase(), value.to_vec()));
            }
            OK
        },
    )?;
    d.env(
        "proxy_remove_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(key) = mem::slice(mem, kp, kl) else {
                return INVALID_MEMORY_ACCESS;
            };
            if state.map_unavailable(t) {
                return BAD_ARGUMENT;
            }
            // Only a real change marks the map changed.
            let present = state.map(t).map(|m| m.iter().any(|(k, _)| eq_name(k, key)));
            match present {
                None => NOT_FOUND,
                Some(false) => OK,
                Some(true) => {
                    if let Ok(map) = state.map_mut(t) {
                        map.retain(|(k, _)| !eq_name(k, key));
                    }
                    OK
                }
            }
        },
    )?;
    Ok(())
}

impl State {
    pub(crate) fn map(&self, t: u32) -> Option<&HeaderMap> {
        match t {
            0 => Some(&self.stream.request_headers),
            1 => Some(&self.stream.request_trailers),
            2 => Some(&self.stream.response_headers),
            3 => Some(&self.stream.response_trailers),
            6 => self.call_response.as_ref().map(|r| &r.headers),
            7 => self.call_response.as_ref().map(|r| &r.trailers),
            _ => None,
        }
    }

    /// Map `t` for writing, marked changed. `Err(NOT_FOUND)` for a map type the host has no
    /// map for; `Err(BAD_ARGUMENT)` for a map the stream does not have (Envoy's status when a
    /// trailer map does not exist at that point).
    pub(crate) fn map_mut(&mut self, t: u32) -> Result<&mut HeaderMap, u32> {
        if self.map_unavailable(t) {
            return Err(BAD_ARGUMENT);
        }
        let s = &mut self.stream;
        match t {
            0 => {
                s.request_headers_changed = true;
                Ok(&mut s.request_headers)
            }
            1 => {
                s.request_trailers_changed = true;
                Ok(&mut s.request_trailers)
            }
            2 => {
                s.response_headers_changed = true;
                Ok(&mut s.response_headers)
            }
            3 => {
                s.response_trailers_changed = true;
                Ok(&mut s.response_trailers)
            }
            6 => self
                .call_response
                .as_mut()
                .map(|r| &mut r.headers)
                .ok_or(NOT_FOUND),
            7 => self
                .call_response
                .as_mut()
                .map(|r| &mut r.trailers)
                .ok_or(NOT_FOUND),
            _ => Err(NOT_FOUND),
        }
    }

    /// True for a map the embedding said the stream never has (reads see it empty).
    pub(crate) fn map_unavailable(&self, t: u32) -> bool {
        t == 1 && self.stream.request_trailers_unavailable
    }
}
