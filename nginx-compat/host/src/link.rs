//! The linker of a module: every ABI area of `env` (`abi/*.rs`) and WASI, plus stubs for the
//! other imports of those two modules (`Unimplemented` / `ENOSYS`).

use wasmtime::{Engine, Linker, Val, ValType};

use crate::abi;
use crate::abi::core::{Def, State, UNIMPLEMENTED};
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
