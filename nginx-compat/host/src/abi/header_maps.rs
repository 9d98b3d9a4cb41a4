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
            c.data_mut().load(t);
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
            c.data_mut().load(t);
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
            state.load(t);
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
            state.load(t);
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
            state.load(t);
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
            state.load(t);
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
    /// Builds map `t` if the embedding deferred it (the request or response headers: see
    /// [`crate::stream::DeferredMap`]); every function of this area calls it before it reads
    /// or writes map `t`.
    pub(crate) fn load(&mut self, t: u32) {
        match t {
            0 => self.stream.load_headers(false),
            2 => self.stream.load_headers(true),
            _ => {}
        }
    }

    /// Map `t` as it is built (call [`State::load`] first).
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
        self.load(t);
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

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::{DeferredMap, Stream, StreamCallback, Vm};

    #[test]
    fn request_trailers_the_embedding_does_not_have_refuse_writes() {
        // on_request_headers tries add, replace, remove and set_pairs (an empty map) on the request
        // trailers (map 1), then add on the response trailers (map 3), reads the request trailers'
        // pairs, and reports the six statuses as digits in the request header `x-status`.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_replace_header_map_value" (func $replace (param i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_remove_header_map_value" (func $remove (param i32 i32 i32) (result i32)))
               (import "env" "proxy_set_header_map_pairs" (func $set (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "x-t")
               (data (i32.const 110) "v")
               (data (i32.const 120) "x-status")
               (func $digit (param $at i32) (param $status i32)
                 (i32.store8 (local.get $at) (i32.add (i32.const 48) (local.get $status))))
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (call $digit (i32.const 300)
                   (call $add (i32.const 1) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
                 (call $digit (i32.const 301)
                   (call $replace (i32.const 1) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
                 (call $digit (i32.const 302)
                   (call $remove (i32.const 1) (i32.const 100) (i32.const 3)))
                 (call $digit (i32.const 303)
                   (call $set (i32.const 1) (i32.const 200) (i32.const 4)))
                 (call $digit (i32.const 304)
                   (call $add (i32.const 3) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
                 (call $digit (i32.const 305)
                   (call $pairs (i32.const 1) (i32.const 400) (i32.const 404)))
                 (drop (call $add (i32.const 0) (i32.const 120) (i32.const 8) (i32.const 300) (i32.const 6)))
                 (i32.const 0))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let status = |s: &Stream| {
            s.request_headers
                .iter()
                .find(|(k, _)| k == b"x-status")
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
                .unwrap()
        };

        // nginx: no request trailers. Writes are BadArgument (2); reads see an empty map.
        let id = vm.create_http(root).unwrap();
        let mut s = Stream {
            request_trailers_unavailable: true,
            ..Default::default()
        };
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(status(&s), "222200");
        assert!(s.request_trailers.is_empty() && !s.request_trailers_changed);
        assert_eq!(s.response_trailers, [(b"x-t".to_vec(), b"v".to_vec())]);
        assert!(s.response_trailers_changed);

        // An embedding that has them: the writes apply and mark the map changed.
        let id = vm.create_http(root).unwrap();
        let mut s = Stream::default();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(status(&s), "000000");
        assert!(s.request_trailers.is_empty(), "set_pairs emptied it last");
        assert!(s.request_trailers_changed);
    }

    #[test]
    fn a_deferred_map_is_built_only_when_a_filter_touches_it() {
        // on_request_headers gets the deferred map's count as num_headers; at the end of the
        // stream it adds `x-n: <num_headers as a digit>` to the request headers, otherwise it
        // does nothing.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "x-n")
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (if (local.get 2)
                   (then
                     (i32.store8 (i32.const 200) (i32.add (i32.const 48) (local.get 1)))
                     (drop (call $add (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 200) (i32.const 1)))))
                 (i32.const 0))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let builds = Rc::new(std::cell::Cell::new(0));
        let counted = builds.clone();
        let mut s = Stream {
            request_headers_deferred: Some(DeferredMap {
                len: 3,
                build: Box::new(move || {
                    counted.set(counted.get() + 1);
                    vec![
                        (b":path".to_vec(), b"/".to_vec()),
                        (b"x-a".to_vec(), b"1".to_vec()),
                        (b"x-b".to_vec(), b"2".to_vec()),
                    ]
                }),
            }),
            ..Default::default()
        };
        let id = vm.create_http(root).unwrap();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap();
        assert_eq!(
            builds.get(),
            0,
            "a filter that reads nothing builds nothing"
        );
        assert!(s.request_headers.is_empty() && !s.request_headers_changed);

        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(builds.get(), 1);
        assert!(s.request_headers_deferred.is_none() && s.request_headers_changed);
        assert_eq!(s.request_headers.len(), 4);
        assert_eq!(s.request_headers[3], (b"x-n".to_vec(), b"3".to_vec()));
        assert_eq!(s.headers_len(false), 4);
    }
}
