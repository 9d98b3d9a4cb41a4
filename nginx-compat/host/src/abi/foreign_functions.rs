//! `proxy_call_foreign_function`: the host's one foreign function, [`GET_VALUES`]
//! (`tollgate.get_values`), which answers several header and property reads of the running
//! callback, and the clock, in one call. Any other name is `NotFound`, as Envoy answers an
//! unknown name.
//!
//! A filter that reads five values in a callback makes five host calls on the plain ABI, each
//! with its own trip into the guest's allocator for the answer; through this function it makes
//! one, with one allocation. Each value is the one the plain call gives in the same place
//! (`proxy_get_header_map_value`, `proxy_get_property`: the same lookups), so a filter may use
//! either. The host lists it in its property `tollgate.foreign_functions` (path
//! `tollgate\0foreign_functions`, `abi::properties`): filters read that first, and use the plain
//! calls where a host has no such property (Envoy, Kong's ngx_wasm_module, which traps a filter
//! calling a foreign function it does not know): `tollgate_common::prefetch`.
//!
//! Argument: the reads, back to back, each `kind: u8`, `map: u8`, `len: u32` little-endian,
//! then `len` bytes: kind 0 is a property (the bytes are its path, segments joined by NUL;
//! `map` is 0), kind 1 a header (the bytes are its name, any case; `map` is its
//! `proxy_map_type_t`), kind 2 the clock (`map` and `len` are 0: the answer is 8 bytes, the
//! Unix nanoseconds little-endian that `proxy_get_current_time_nanoseconds` gives at that
//! moment). At most [`MAX_READS`] reads. Answer: for each read in order, `len: u32`
//! little-endian and `len` bytes, or [`ABSENT`] alone when there is no such value (or its map
//! does not exist). Statuses: `Ok`; `BadArgument` for an argument that does not decode or
//! holds more than [`MAX_READS`] reads; `InternalFailure` for an answer longer than
//! [`MAX_ANSWER_BYTES`]; `InvalidMemoryAccess` for pointers outside the guest's memory.

use crate::abi::store::{
    keep_buffer, ms, realtime_ns, return_bytes, Def, State, BAD_ARGUMENT, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, NOT_FOUND, R,
};
use crate::error::Error;
use crate::mem;
use crate::valid;

/// The name of the batched read.
pub const GET_VALUES: &[u8] = b"tollgate.get_values";
/// Most reads in one call.
pub const MAX_READS: usize = 32;
/// Most bytes of one answer (the values and their lengths): beyond it the call answers
/// `InternalFailure` and a filter reads the values one call each, so a guest cannot make the host
/// assemble [`MAX_READS`] large values at once.
pub const MAX_ANSWER_BYTES: usize = valid::MAX_MAP_BYTES;
/// The length that marks a read without a value.
pub const ABSENT: u32 = u32::MAX;
/// A read's kind: a property.
const PROPERTY: u8 = 0;
/// A read's kind: a header of a map.
const HEADER: u8 = 1;
/// A read's kind: the clock (`proxy_get_current_time_nanoseconds`).
const CLOCK: u8 = 2;

/// Defines `proxy_call_foreign_function`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_call_foreign_function",
        |mut c: C<'_>, np: u32, nl: u32, ap: u32, al: u32, rp: u32, rs: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let (Some(name), Some(argument)) = (mem::slice(mem, np, nl), mem::slice(mem, ap, al))
            else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if name != GET_VALUES {
                return Ok(NOT_FOUND);
            }
            // The answer is assembled in a buffer kept in the state, taken while the guest's
            // allocator runs (an allocator calling this again gets a new one).
            let mut out = std::mem::take(&mut state.values_out);
            out.clear();
            let status = match get_values(state, argument, &mut out) {
                Some(()) if out.len() > MAX_ANSWER_BYTES => Ok(INTERNAL_FAILURE),
                Some(()) => return_bytes(&mut c, rp, rs, &out),
                None => Ok(BAD_ARGUMENT),
            };
            c.data_mut().values_out = keep_buffer(out);
            status
        },
    )
}

/// Answers the reads of `argument` into `out` (the module documentation's encoding); `None`
/// when the argument does not decode or holds more than [`MAX_READS`] reads.
fn get_values(state: &mut State, mut argument: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut value = std::mem::take(&mut state.value);
    let mut reads = 0usize;
    let mut answered = Some(());
    while !argument.is_empty() {
        reads = reads.saturating_add(1);
        let Some((kind, map, key, rest)) = next_read(argument).filter(|_| reads <= MAX_READS)
        else {
            answered = None;
            break;
        };
        argument = rest;
        if out.len() > MAX_ANSWER_BYTES {
            // Refused whole (see the caller); no need to read the rest.
            break;
        }
        let at = out.len();
        out.extend_from_slice(&ABSENT.to_le_bytes());
        let found = match kind {
            PROPERTY => state.append_property(key, out, &mut value),
            CLOCK => {
                out.extend_from_slice(&realtime_ns().to_le_bytes());
                true
            }
            _ => state.append_header_value(u32::from(map), key, out),
        };
        let len = out.len().saturating_sub(at.saturating_add(4));
        match u32::try_from(len) {
            Ok(len) if found && len != ABSENT => {
                if let Some(slot) = out.get_mut(at..at.saturating_add(4)) {
                    slot.copy_from_slice(&len.to_le_bytes());
                }
            }
            _ => out.truncate(at.saturating_add(4)),
        }
    }
    state.value = keep_buffer(value);
    answered
}

/// The first read of `argument`: its kind, map, name or path, and what follows it.
fn next_read(argument: &[u8]) -> Option<(u8, u8, &[u8], &[u8])> {
    let (&kind, rest) = argument.split_first()?;
    let (&map, rest) = rest.split_first()?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    let clock_as_written = kind != CLOCK || (map == 0 && len == 0);
    if rest.len() < len || !matches!(kind, PROPERTY | HEADER | CLOCK) || !clock_as_written {
        return None;
    }
    let (key, rest) = rest.split_at(len);
    Some((kind, map, key, rest))
}

#[cfg(test)]
mod tests {
    //! A hand-written module (WAT) asks for values in one call and keeps the answer as a
    //! property, which the test decodes.
    use std::rc::Rc;

    use super::*;
    use crate::stream::{Stream, StreamCallback};
    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::{MapSource, MemoryHost};
    use crate::Vm;

    /// One read in the argument's encoding.
    fn read(kind: u8, map: u8, key: &[u8]) -> Vec<u8> {
        let mut r = vec![kind, map];
        r.extend_from_slice(&u32::try_from(key.len()).unwrap().to_le_bytes());
        r.extend_from_slice(key);
        r
    }

    /// `bytes` as a WAT data string.
    fn data(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("\\{b:02x}")).collect()
    }

    /// The answer, decoded: one value (or `None`) per read.
    fn decode(mut answer: &[u8]) -> Vec<Option<Vec<u8>>> {
        let mut values = Vec::new();
        while !answer.is_empty() {
            let (len, rest) = answer.split_first_chunk::<4>().unwrap();
            let len = u32::from_le_bytes(*len);
            if len == ABSENT {
                values.push(None);
                answer = rest;
            } else {
                let (v, rest) = rest.split_at(len as usize);
                values.push(Some(v.to_vec()));
                answer = rest;
            }
        }
        values
    }

    /// A module whose `proxy_on_request_headers` sets property `mine` to `v`, runs `setup`
    /// (WAT instructions; `$set` is `proxy_set_property`, `big` is at 140), calls foreign
    /// function `name` with `argument`, and sets property `status` to the status as a digit and,
    /// when it is Ok, property `answer` to the answer.
    fn module_with(setup: &str, name: &str, argument: &[u8]) -> crate::Module {
        compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_call_foreign_function" (func $call (param i32 i32 i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_set_property" (func $set (param i32 i32 i32 i32) (result i32)))"#,
            &format!(
                r#"(data (i32.const 100) "mine")
                   (data (i32.const 110) "v")
                   (data (i32.const 120) "status")
                   (data (i32.const 130) "answer")
                   (data (i32.const 140) "big")
                   (data (i32.const 200) "{name}")
                   (data (i32.const 300) "{argument}")
                   (func (export "proxy_on_context_create") (param i32 i32))
                   (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                     (local $status i32)
                     (drop (call $set (i32.const 100) (i32.const 4) (i32.const 110) (i32.const 1)))
                     {setup}
                     (local.set $status (call $call (i32.const 200) (i32.const {name_len})
                       (i32.const 300) (i32.const {argument_len}) (i32.const 1000) (i32.const 1004)))
                     (i32.store8 (i32.const 1010) (i32.add (i32.const 48) (local.get $status)))
                     (drop (call $set (i32.const 120) (i32.const 6) (i32.const 1010) (i32.const 1)))
                     (if (i32.eqz (local.get $status))
                       (then (drop (call $set (i32.const 130) (i32.const 6)
                         (i32.load (i32.const 1000)) (i32.load (i32.const 1004))))))
                     (i32.const 0))"#,
                name_len = name.len(),
                argument = data(argument),
                argument_len = argument.len(),
            ),
        ))
        .unwrap()
    }

    /// [`module_with`] without a setup.
    fn module(name: &str, argument: &[u8]) -> crate::Module {
        module_with("", name, argument)
    }

    /// Runs `m`'s request headers over a deferred map of `x-a: 7` and `x-a: 8`, with the
    /// embedding's property `tollgate\0answer` set; the stream after it.
    fn run(m: &crate::Module) -> Stream {
        let host = Rc::new(MemoryHost::new());
        host.properties
            .borrow_mut()
            .push((b"tollgate\0answer".to_vec(), b"42".to_vec()));
        let mut vm = Vm::new(m, host, "my_vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        let source = MapSource::new(vec![
            (b":path".to_vec(), b"/".to_vec()),
            (b"x-a".to_vec(), b"7".to_vec()),
            (b"x-a".to_vec(), b"8".to_vec()),
        ]);
        let mut s = source.deferred_request();
        let id = vm.create_http(root).unwrap();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        s
    }

    fn property(s: &Stream, name: &[u8]) -> Option<Vec<u8>> {
        s.properties.get(name).map(<[u8]>::to_vec)
    }

    #[test]
    fn values_answer_as_the_plain_calls_in_one_call() {
        let argument: Vec<u8> = [
            read(HEADER, 0, b"X-A"),
            read(HEADER, 0, b"x-missing"),
            read(HEADER, 2, b":status"),
            read(PROPERTY, 0, b"mine"),
            read(PROPERTY, 0, b"plugin_vm_id"),
            read(PROPERTY, 0, b"tollgate\0answer"),
            read(PROPERTY, 0, b"unset"),
            read(HEADER, 0, b":path"),
            read(HEADER, 0, b""),
            read(PROPERTY, 0, b"tollgate\0foreign_functions"),
            read(CLOCK, 0, b""),
        ]
        .concat();
        let before = realtime_ns();
        let s = run(&module("tollgate.get_values", &argument));
        let after = realtime_ns();
        assert_eq!(property(&s, b"status").as_deref(), Some(&b"0"[..]));
        let answer = property(&s, b"answer").unwrap();
        let some = |v: &[u8]| Some(v.to_vec());
        let values = decode(&answer);
        assert_eq!(
            values[..10],
            [
                some(b"7"),
                None,
                None,
                some(b"v"),
                some(b"my_vm"),
                some(b"42"),
                None,
                some(b"/"),
                None,
                some(b"tollgate.get_values"),
            ]
        );
        // The clock: 8 bytes, the Unix nanoseconds of the call.
        let clock = values[10].clone().unwrap();
        let ns = u64::from_le_bytes(clock.try_into().unwrap());
        assert!(
            (before..=after).contains(&ns),
            "{before} <= {ns} <= {after}"
        );
    }

    #[test]
    fn an_answer_past_the_bound_is_refused() {
        // The guest sets property `big` to half the bound, then reads it `reads` times in one
        // call: one read is answered, two are refused with InternalFailure (10, ':' after '9'),
        // and the filter would read them one call each.
        let setup = format!(
            "(drop (memory.grow (i32.const 40)))
             (global.set $heap (i32.const 1048576))
             (drop (call $set (i32.const 140) (i32.const 3) (i32.const 65536) (i32.const {})))",
            MAX_ANSWER_BYTES / 2
        );
        let status = |reads: usize| {
            let argument = read(PROPERTY, 0, b"big").repeat(reads);
            let m = module_with(&setup, "tollgate.get_values", &argument);
            property(&run(&m), b"status").unwrap()
        };
        assert_eq!(status(1), b"0");
        assert_eq!(status(2), b":");
    }

    #[test]
    fn another_name_is_not_found_and_a_bad_argument_is_refused() {
        let one = read(PROPERTY, 0, b"mine");
        let s = run(&module("tollgate.other", &one));
        assert_eq!(property(&s, b"status").as_deref(), Some(&b"1"[..]));
        // Cut short, an unknown kind, one read too many: BadArgument (2), no answer.
        let too_many = one.repeat(MAX_READS + 1);
        // A clock read with a map or a name is not one.
        for argument in [
            &one[..one.len() - 1],
            &read(7, 0, b"mine")[..],
            &read(CLOCK, 0, b"x")[..],
            &read(CLOCK, 2, b"")[..],
            &too_many[..],
        ] {
            let s = run(&module("tollgate.get_values", argument));
            assert_eq!(property(&s, b"status").as_deref(), Some(&b"2"[..]));
            assert_eq!(property(&s, b"answer"), None);
        }
        // Exactly the most reads is answered.
        let s = run(&module("tollgate.get_values", &one.repeat(MAX_READS)));
        let answer = property(&s, b"answer").unwrap();
        assert_eq!(decode(&answer), vec![Some(b"v".to_vec()); MAX_READS]);
    }
}
