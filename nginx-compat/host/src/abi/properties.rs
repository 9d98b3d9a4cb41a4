//! Properties: `proxy_get_property` (set by filters first, then the host's own builtins, then
//! the embedding's read-only ones ([`Host::property`](crate::Host::property), every context),
//! then the stream's [`PropertySource`](crate::stream::PropertySource)) and
//! `proxy_set_property` (refused with `BadArgument` for the embedding's read-only paths).

use crate::abi::store::{
    keep_buffer, ms, refused_growth, return_bytes, Def, State, BAD_ARGUMENT, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, NOT_FOUND, OK, R,
};
use crate::error::Error;
use crate::mem;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_get_property",
        |mut c: C<'_>, path_ptr: u32, path_len: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(path) = mem::slice(mem, path_ptr, path_len) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            // Read into a buffer kept in the state, taken while the guest's allocator runs (an
            // allocator calling the host reads into a new one); empty, so a property source
            // writes into it directly and the scratch stays unused.
            let mut value = std::mem::take(&mut state.value);
            value.clear();
            let found = state.append_property(path, &mut value, &mut Vec::new());
            let r = if found {
                return_bytes(&mut c, ret_ptr, ret_size, &value)
            } else {
                Ok(NOT_FOUND)
            };
            c.data_mut().value = keep_buffer(value);
            r
        },
    )?;
    d.env(
        "proxy_set_property",
        |mut c: C<'_>, path_ptr: u32, path_len: u32, val_ptr: u32, val_len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(path), Some(value)) = (
                mem::slice(mem, path_ptr, path_len),
                mem::slice(mem, val_ptr, val_len),
            ) else {
                return INVALID_MEMORY_ACCESS;
            };
            if state.host.property(path).is_some() {
                // The embedding's own (read-only): a filter cannot change what the host says.
                return BAD_ARGUMENT;
            }
            let held = state.stream().properties.held();
            let extra = path.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, "proxy_set_property", held, extra) {
                return code;
            }
            state.stream_mut().properties.set(path, value);
            OK
        },
    )?;
    Ok(())
}

impl State {
    /// Where property `path` (segments joined by NUL) is, looked up in `proxy_get_property`'s
    /// order: set by a filter on this stream, the host's builtins, the embedding's read-only
    /// ones, else the stream's [`PropertySource`](crate::stream::PropertySource) if it has one.
    fn find_property(&self, path: &[u8]) -> Option<Found<'_>> {
        if let Some(v) = self.stream().properties.get(path) {
            return Some(Found::Bytes(v));
        }
        if let Some(which) = self.builtin_property(path) {
            return Some(Found::Bytes(self.builtin(which)));
        }
        if let Some(v) = self.host.property(path) {
            return Some(Found::Owned(v));
        }
        self.stream().property_source.as_deref().map(Found::Source)
    }

    /// Appends the value of property `path` to `out`; false when there is none (`out` as it
    /// was). A value from the stream's property source is written into an empty `out` as it
    /// is, else read into `scratch` first (the source clears the buffer it is given).
    pub(crate) fn append_property(
        &self,
        path: &[u8],
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> bool {
        match self.find_property(path) {
            Some(Found::Bytes(v)) => out.extend_from_slice(v),
            Some(Found::Owned(v)) => out.extend_from_slice(&v),
            Some(Found::Source(source)) if out.is_empty() => return source.property(path, out),
            Some(Found::Source(source)) => {
                if !source.property(path, scratch) {
                    return false;
                }
                out.extend_from_slice(scratch);
            }
            None => return false,
        }
        true
    }

    /// The host's own properties: `plugin_name`, `plugin_root_id` (the plugin name too),
    /// `plugin_vm_id`, and `tollgate.foreign_functions` (path `tollgate\0foreign_functions`:
    /// the names `proxy_call_foreign_function` answers, comma-separated, which a filter reads
    /// before calling one: Kong's ngx_wasm_module traps a filter that calls an unknown name).
    pub(crate) fn builtin_property(&self, path: &[u8]) -> Option<Builtin> {
        match path {
            b"plugin_name" | b"plugin_root_id" => Some(Builtin::PluginName),
            b"plugin_vm_id" => Some(Builtin::VmId),
            b"tollgate\0foreign_functions" => Some(Builtin::ForeignFunctions),
            _ => None,
        }
    }

    pub(crate) fn builtin(&self, which: Builtin) -> &[u8] {
        match which {
            Builtin::PluginName => self.plugin_name().as_bytes(),
            Builtin::VmId => self.vm_id.as_bytes(),
            Builtin::ForeignFunctions => crate::abi::foreign_functions::GET_VALUES,
        }
    }
}

/// Where a property's value is ([`State::find_property`]).
enum Found<'a> {
    Bytes(&'a [u8]),
    Owned(Vec<u8>),
    Source(&'a dyn crate::stream::PropertySource),
}

/// A property the host answers itself.
#[derive(Clone, Copy)]
pub(crate) enum Builtin {
    PluginName,
    VmId,
    ForeignFunctions,
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::Vm;

    #[test]
    fn properties_builtins_and_returned_buffers() {
        // on_configure reads the property named at 100 and logs it.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_property" (func $get (param i32 i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "plugin_vm_id")
               (data (i32.const 120) "plugin_name")
               (func $show (param $p i32) (param $n i32)
                 (if (i32.eqz (call $get (local.get $p) (local.get $n) (i32.const 200) (i32.const 204)))
                   (then (drop (call $log (i32.const 2) (i32.load (i32.const 200)) (i32.load (i32.const 204)))))))
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (call $show (i32.const 100) (i32.const 12))
                 (call $show (i32.const 120) (i32.const 11))
                 (i32.const 1))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "my_vm", b"").unwrap();
        vm.create_root("my_plugin", b"").unwrap();
        let messages: Vec<_> = host
            .logs
            .borrow()
            .iter()
            .map(|l| l.message.clone())
            .collect();
        assert_eq!(messages, ["my_vm", "my_plugin"]);
    }

    #[test]
    fn the_embeddings_properties_answer_in_on_configure_and_are_read_only() {
        // on_configure reads `tollgate\0answer` and logs it, then tries to set it and logs the
        // set's status as one byte ("0" + status), then reads it again.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
               (import "env" "proxy_get_property" (func $get (param i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_set_property" (func $set (param i32 i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "tollgate\00answer")
               (data (i32.const 130) "forged")
               (func $show
                 (if (i32.eqz (call $get (i32.const 100) (i32.const 15) (i32.const 200) (i32.const 204)))
                   (then (drop (call $log (i32.const 2) (i32.load (i32.const 200)) (i32.load (i32.const 204)))))
                   (else (drop (call $log (i32.const 2) (i32.const 130) (i32.const 0))))))
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (call $show)
                 (i32.store8 (i32.const 300)
                   (i32.add (i32.const 48) (call $set (i32.const 100) (i32.const 15) (i32.const 130) (i32.const 6))))
                 (drop (call $log (i32.const 2) (i32.const 300) (i32.const 1)))
                 (call $show)
                 (i32.const 1))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        host.properties
            .borrow_mut()
            .push((b"tollgate\0answer".to_vec(), b"none".to_vec()));
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("p", b"").unwrap();
        let messages: Vec<_> = host
            .logs
            .borrow()
            .iter()
            .map(|l| l.message.clone())
            .collect();
        // BadArgument is status 2.
        assert_eq!(messages, ["none", "2", "none"]);
        // Without the embedding's answer the path is an ordinary property: NotFound, then set.
        host.properties.borrow_mut().clear();
        host.logs.borrow_mut().clear();
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("p", b"").unwrap();
        let messages: Vec<_> = host
            .logs
            .borrow()
            .iter()
            .map(|l| l.message.clone())
            .collect();
        assert_eq!(messages, ["", "0", "forged"]);
    }
}
