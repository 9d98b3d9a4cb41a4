//! Header and trailer maps (`proxy_map_type_t`: request/response headers and trailers, and the
//! headers and trailers of an HTTP call's response): `proxy_get_header_map_pairs`, `_size`,
//! `_value`, `proxy_set_header_map_pairs`, `proxy_add_`/`replace_`/`remove_header_map_value`.
//! Every write is checked ([`refused_field`], [`refused_map`], [`refused_growth`]).

use crate::abi::store::{
    eq_name, ms, refused_field, refused_growth, refused_map, return_u32, return_with, Def, State,
    BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY_ACCESS, NOT_FOUND, OK, R,
};
use crate::deferred_headers::{DeferredMap, HeaderEdit, MAX_EDITS};
use crate::error::Error;
use crate::header_map::HeaderMap;
use crate::mem;
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
            if c.data().deferred(t).is_some() {
                // Serialised from the source and the edits (the map stays deferred) into the
                // state's buffer, taken out while the guest's allocator runs (a guest calling
                // back from it gets a buffer of its own), and put back to be reused.
                let mut pairs = std::mem::take(&mut c.data_mut().pairs);
                if let Some(d) = c.data().deferred(t) {
                    d.serialize(&mut pairs);
                }
                let status = match pairs.size() {
                    Some(size) => {
                        return_with(&mut c, ret_ptr, ret_size, size, |dst, _| pairs.copy_to(dst))
                    }
                    None => Ok(INTERNAL_FAILURE),
                };
                c.data_mut().pairs = pairs;
                return status;
            }
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
            let size = match c.data().deferred(t) {
                Some(d) => d.serialized_size(),
                None => match c.data().map(t) {
                    Some(map) => mem::serialized_size(map),
                    None => return NOT_FOUND,
                },
            };
            match size.and_then(|s| u32::try_from(s).ok()) {
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
            if state.deferred(t).is_some() {
                // Read in place; the name is kept for the copy after the guest's allocator ran.
                state.header_key.clear();
                state
                    .header_key
                    .extend(key.iter().map(u8::to_ascii_lowercase));
                let found = state.deferred(t).and_then(|d| d.first(&state.header_key));
                let Some(len) = found.map(<[u8]>::len) else {
                    return Ok(NOT_FOUND);
                };
                return return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                    mem::copy(dst, s.deferred(t)?.first(&s.header_key)?)
                });
            }
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
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, state.held_bytes(t), extra) {
                return code;
            }
            state.edit(t, HeaderEdit::add(key, value))
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
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, state.held_bytes(t), extra) {
                return code;
            }
            state.edit(t, HeaderEdit::replace(key, value))
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
            let edit = HeaderEdit::remove(key);
            let key = edit.name();
            // Only a real change marks the map changed.
            let present = match state.deferred(t) {
                Some(d) => Some(d.count(key) > 0),
                None => state.map(t).map(|m| m.iter().any(|(k, _)| eq_name(k, key))),
            };
            match present {
                None => NOT_FOUND,
                Some(false) => OK,
                Some(true) => state.edit(t, edit),
            }
        },
    )?;
    Ok(())
}

impl State {
    /// Builds map `t` if it is deferred (the request or response headers: see
    /// [`crate::deferred_headers`]); [`State::map_mut`] calls it first, for a write of the
    /// whole map (`proxy_set_header_map_pairs`) or an edit past [`MAX_EDITS`]. The reads of
    /// the whole map serialise a deferred one without building it.
    pub(crate) fn load(&mut self, t: u32) {
        match t {
            0 => self.stream_mut().load_headers(false),
            2 => self.stream_mut().load_headers(true),
            _ => {}
        }
    }

    /// Map `t` while it is deferred (read in place, not built).
    pub(crate) fn deferred(&self, t: u32) -> Option<&DeferredMap> {
        match t {
            0 => self.stream().request_headers_deferred.as_ref(),
            2 => self.stream().response_headers_deferred.as_ref(),
            _ => None,
        }
    }

    /// Appends the value of header `key` (any case) in map `t` to `out`, as
    /// `proxy_get_header_map_value` answers it (the first field of that name); false when the
    /// map has none (or the host has no map `t`).
    pub(crate) fn append_header_value(&mut self, t: u32, key: &[u8], out: &mut Vec<u8>) -> bool {
        if self.deferred(t).is_some() {
            // A deferred map is read by the lower-case name (most callers send one).
            if !key.iter().any(u8::is_ascii_uppercase) {
                let value = self.deferred(t).and_then(|d| d.first(key));
                return value.map(|v| out.extend_from_slice(v)).is_some();
            }
            let mut lower = std::mem::take(&mut self.header_key);
            lower.clear();
            lower.extend(key.iter().map(u8::to_ascii_lowercase));
            let value = self.deferred(t).and_then(|d| d.first(&lower));
            let found = value.map(|v| out.extend_from_slice(v)).is_some();
            self.header_key = lower;
            return found;
        }
        let value = self
            .map(t)
            .and_then(|map| map.iter().find(|(k, _)| eq_name(k, key)));
        value.map(|(_, v)| out.extend_from_slice(v)).is_some()
    }

    /// The bytes map `t` holds, for the size limit (a deferred map's bound: see
    /// [`DeferredMap::bytes`]).
    fn held_bytes(&self, t: u32) -> usize {
        match self.deferred(t) {
            Some(d) => d.bytes(),
            None => self.map(t).map_or(0, valid::map_bytes),
        }
    }

    /// Makes `edit` to map `t` and marks it changed: kept on the deferred map while it has
    /// fewer than [`MAX_EDITS`], else applied to the built map. The status `map_mut` gives
    /// for a map type without a map.
    fn edit(&mut self, t: u32, edit: HeaderEdit) -> u32 {
        if self.map_unavailable(t) {
            return BAD_ARGUMENT;
        }
        let s = self.stream_mut();
        let (deferred, changed) = match t {
            0 => (
                &mut s.request_headers_deferred,
                &mut s.request_headers_changed,
            ),
            2 => (
                &mut s.response_headers_deferred,
                &mut s.response_headers_changed,
            ),
            _ => {
                return match self.map_mut(t) {
                    Ok(map) => {
                        edit.apply(map);
                        OK
                    }
                    Err(code) => code,
                }
            }
        };
        if let Some(d) = deferred.as_mut().filter(|d| d.edits().len() < MAX_EDITS) {
            d.push(edit);
            *changed = true;
            return OK;
        }
        match self.map_mut(t) {
            Ok(map) => {
                edit.apply(map);
                OK
            }
            Err(code) => code,
        }
    }

    /// Map `t` as it is built (call [`State::load`] first).
    pub(crate) fn map(&self, t: u32) -> Option<&HeaderMap> {
        match t {
            0 => Some(&self.stream().request_headers),
            1 => Some(&self.stream().request_trailers),
            2 => Some(&self.stream().response_headers),
            3 => Some(&self.stream().response_trailers),
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
        match t {
            6 => {
                return self
                    .call_response
                    .as_mut()
                    .map(|r| &mut r.headers)
                    .ok_or(NOT_FOUND)
            }
            7 => {
                return self
                    .call_response
                    .as_mut()
                    .map(|r| &mut r.trailers)
                    .ok_or(NOT_FOUND)
            }
            _ => {}
        }
        let s = self.stream_mut();
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
            _ => Err(NOT_FOUND),
        }
    }

    /// True for a map the embedding said the stream never has (reads see it empty).
    pub(crate) fn map_unavailable(&self, t: u32) -> bool {
        t == 1 && self.stream().request_trailers_unavailable
    }
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::{MapSource, MemoryHost};
    use crate::{HeaderEdit, Stream, StreamCallback, Vm};

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
    fn a_pairs_read_of_a_deferred_map_leaves_it_deferred() {
        // on_request_headers adds `x-n: 1`, then reads the request map's pairs and its size,
        // sets the response trailers (a built map) to those pairs, and adds `x-ok` with the
        // statuses of the pairs read, the size read and the set, and whether the two sizes agree.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_header_map_size" (func $size (param i32 i32) (result i32)))
               (import "env" "proxy_set_header_map_pairs" (func $set (param i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "x-n")
               (data (i32.const 110) "1")
               (data (i32.const 120) "x-ok")
               (func $digit (param $at i32) (param $n i32)
                 (i32.store8 (local.get $at) (i32.add (i32.const 48) (local.get $n))))
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (drop (call $add (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
                 (call $digit (i32.const 200) (call $pairs (i32.const 0) (i32.const 300) (i32.const 304)))
                 (call $digit (i32.const 201) (call $size (i32.const 0) (i32.const 308)))
                 (call $digit (i32.const 202) (i32.eq (i32.load (i32.const 304)) (i32.load (i32.const 308))))
                 (call $digit (i32.const 203)
                   (call $set (i32.const 3) (i32.load (i32.const 300)) (i32.load (i32.const 304))))
                 (drop (call $add (i32.const 0) (i32.const 120) (i32.const 4) (i32.const 200) (i32.const 4)))
                 (i32.const 0))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let source = MapSource::new(vec![
            (b":path".to_vec(), b"/".to_vec()),
            (b"x-a".to_vec(), b"7".to_vec()),
            (b"x-n".to_vec(), b"0".to_vec()),
        ]);
        let builds = source.builds.clone();
        let mut s = source.deferred_request();
        let id = vm.create_http(root).unwrap();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        // The pairs are the map with the pending add, read without building it; the edits
        // made after the read are kept as edits, for the write-back in place.
        assert_eq!(
            s.response_trailers,
            vec![
                (b":path".to_vec(), b"/".to_vec()),
                (b"x-a".to_vec(), b"7".to_vec()),
                (b"x-n".to_vec(), b"0".to_vec()),
                (b"x-n".to_vec(), b"1".to_vec()),
            ]
        );
        assert_eq!(builds.get(), 0, "a pairs or size read built the map");
        let d = s.request_headers_deferred.as_ref().unwrap();
        assert_eq!(
            d.edits(),
            [
                HeaderEdit::add(b"x-n", b"1"),
                HeaderEdit::add(b"x-ok", b"0010"),
            ]
        );
        assert!(s.request_headers.is_empty() && s.request_headers_changed);
    }

    #[test]
    fn a_deferred_map_is_read_sized_and_edited_in_place() {
        // on_request_headers gets num_headers; at the end of the stream it reads x-a, writes
        // `x-n: <num_headers><x-a's value>` with an add and removes x-b; then, on a second
        // end-of-stream call with a trailing `x-n` present, it asks for the map's size (the
        // whole map's, serialised from the source and the edits).
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_remove_header_map_value" (func $remove (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_get_header_map_size" (func $size (param i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "x-n")
               (data (i32.const 110) "X-A")
               (data (i32.const 120) "x-b")
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (if (local.get 2)
                   (then
                     (if (i32.eqz (call $get (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 300) (i32.const 304)))
                       (then (drop (call $size (i32.const 0) (i32.const 308))) (return (i32.const 0))))
                     (drop (call $get (i32.const 0) (i32.const 110) (i32.const 3) (i32.const 300) (i32.const 304)))
                     (i32.store8 (i32.const 200) (i32.add (i32.const 48) (local.get 1)))
                     (i32.store8 (i32.const 201) (i32.load8_u (i32.load (i32.const 300))))
                     (drop (call $add (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 200) (i32.const 2)))
                     (drop (call $remove (i32.const 0) (i32.const 120) (i32.const 3)))))
                 (i32.const 0))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let source = MapSource::new(vec![
            (b":path".to_vec(), b"/".to_vec()),
            (b"x-a".to_vec(), b"7".to_vec()),
            (b"x-b".to_vec(), b"2".to_vec()),
        ]);
        let builds = source.builds.clone();
        let mut s = source.deferred_request();
        let id = vm.create_http(root).unwrap();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap();
        assert!(!s.request_headers_changed);

        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(
            builds.get(),
            0,
            "reads and edits of one field build nothing"
        );
        assert!(s.request_headers_changed);
        let d = s.request_headers_deferred.as_ref().unwrap();
        assert_eq!(
            d.edits(),
            [HeaderEdit::add(b"x-n", b"37"), HeaderEdit::remove(b"x-b")]
        );
        assert_eq!(s.headers_len(false), 3);

        // The map's size leaves it deferred, edits kept; the embedding that cannot apply them
        // in place builds it once, with the edits applied.
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert_eq!(builds.get(), 0);
        assert_eq!(
            s.request_headers_deferred.as_ref().unwrap().edits().len(),
            2
        );
        s.load_headers(false);
        assert_eq!(builds.get(), 1);
        assert!(s.request_headers_deferred.is_none());
        assert_eq!(
            s.request_headers,
            vec![
                (b":path".to_vec(), b"/".to_vec()),
                (b"x-a".to_vec(), b"7".to_vec()),
                (b"x-n".to_vec(), b"37".to_vec()),
            ]
        );
    }
}
