//! The linker of a module: every ABI area of `env` (`abi/*.rs`) and WASI, plus stubs for the
//! other imports of those two modules (`Unimplemented` / `ENOSYS`).

use wasmtime::{Engine, Linker, Val, ValType};

use crate::abi;
use crate::abi::store::{Def, State, UNIMPLEMENTED};
use crate::error::Error;
use crate::wasi;

/// The linker for `module`: the host functions of `env` and `wasi_snapshot_preview1`, plus
/// stubs for the other imports of those two modules (`Unimplemented` / `ENOSYS`). An import
/// from any other module is an error.
pub(crate) fn linker(engine: &Engine, module: &wasmtime::Module) -> Result<Linker<State>, Error> {
    let mut linker = Linker::new(engine);
    let mut def = Def::new(&mut linker);
    abi::log_time::define(&mut def)?;
    abi::properties::define(&mut def)?;
    abi::header_maps::define(&mut def)?;
    abi::buffers::define(&mut def)?;
    abi::stream_control::define(&mut def)?;
    abi::shared_data::define(&mut def)?;
    abi::shared_queues::define(&mut def)?;
    abi::http_calls::define(&mut def)?;
    abi::foreign_functions::define(&mut def)?;
    abi::grpc_calls::define(&mut def)?;
    abi::metrics::define(&mut def)?;
    wasi::define(&mut def)?;
    let names = def.names;
    for import in module.imports() {
        let (m, n) = (import.module(), import.name());
        if names.iter().any(|(dm, dn)| *dm == m && *dn == n) {
            continue;
        }
        let stub_code: i32 = match m {
            "env" => UNIMPLEMENTED as i32,
            "wasi_snapshot_preview1" => i32::from(wasi::ENOSYS),
            _ => {
                return Err(Error(format!(
                    "the module imports {m}.{n}, which this host does not provide (only env and wasi_snapshot_preview1)"
                )))
            }
        };
        let wasmtime::ExternType::Func(ty) = import.ty() else {
            return Err(Error(format!(
                "the module imports {m}.{n}, which is not a function"
            )));
        };
        let results: Vec<ValType> = ty.results().collect();
        if results.len() > 1 {
            return Err(Error(format!(
                "the module imports {m}.{n} with several results, unknown to this host"
            )));
        }
        let first = results.first().cloned();
        linker
            .func_new(m, n, ty, move |_caller, _params, out: &mut [Val]| {
                if let (Some(slot), Some(t)) = (out.first_mut(), &first) {
                    *slot = match t {
                        ValType::I64 => Val::I64(i64::from(stub_code)),
                        ValType::F32 => Val::F32(0),
                        ValType::F64 => Val::F64(0),
                        _ => Val::I32(stub_code),
                    };
                }
                Ok(())
            })
            .map_err(|e| Error::wasm(&format!("cannot stub {m}.{n}"), &e))?;
    }
    Ok(linker)
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::Vm;

    #[test]
    fn imports_of_unknown_modules_fail_clearly() {
        let err = compile(&wat(
            "0_2_1",
            r#"(import "foo" "bar" (func (param i32) (result i32)))"#,
            "",
        ))
        .err()
        .unwrap();
        assert!(err.0.contains("foo.bar"), "{err}");
    }
    #[test]
    fn unknown_env_imports_return_unimplemented() {
        // on_configure returns whether the unknown host function returned 12.
        let m = compile(&wat(
            "0_2_1",
            r#"(import "env" "proxy_something_new" (func $new (param i32 i64) (result i32)))
               (import "env" "proxy_grpc_send" (func $send (param i32 i32 i32 i32) (result i32)))"#,
            r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (i32.and
                   (i32.eq (call $new (i32.const 1) (i64.const 2)) (i32.const 12))
                   (i32.eq (call $send (i32.const 2) (i32.const 0) (i32.const 0) (i32.const 0)) (i32.const 12))))"#,
        ))
        .unwrap();
        let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
        vm.create_root("p", b"").unwrap();
    }
}
