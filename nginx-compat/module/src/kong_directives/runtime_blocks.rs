//! The runtimes' blocks of `wasm{}`: `wasmtime { flag NAME VALUE; }` (Kong's Wasmtime flags,
//! checked, no effect), and `wasmer {}` and `v8 {}`, ignored as Kong's Wasmtime build ignores
//! them. (`cache_config` of `wasmtime {}`: `cache_config.rs`.)

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use ngx::ffi::ngx_uint_t;

use super::handlers::{block, directive_name, handler};
use super::slot_values::{arg, raw_arg, size_of};
use crate::util::{conf_error, CONF_OK};
/// `cmd_type` inside `wasm { wasmtime {} }`.
pub(super) const WASMTIME_CONF: ngx_uint_t = 0x0400_0000;
/// `cmd_type` inside `wasm { wasmer {} }` and `wasm { v8 {} }` (other runtimes' blocks).
pub(super) const OTHER_RUNTIME_CONF: ngx_uint_t = 0x0800_0000;

/// The Wasmtime flags of Kong's module (`flag_handlers` of `ngx_wrt_wasmtime.c`): name and
/// value type. Kong checks the name at configuration time and the value when it starts.
const WASMTIME_FLAGS: &[(&str, FlagType)] = &[
    ("debug_info", FlagType::Bool),
    ("consume_fuel", FlagType::Bool),
    ("epoch_interruption", FlagType::Bool),
    ("max_wasm_stack", FlagType::Size),
    ("wasm_threads", FlagType::Bool),
    ("wasm_reference_types", FlagType::Bool),
    ("wasm_relaxed_simd", FlagType::Bool),
    ("wasm_simd", FlagType::Bool),
    ("wasm_bulk_memory", FlagType::Bool),
    ("wasm_multi_value", FlagType::Bool),
    ("wasm_multi_memory", FlagType::Bool),
    ("wasm_memory64", FlagType::Bool),
    ("strategy", FlagType::Any),
    ("parallel_compilation", FlagType::Bool),
    ("cranelift_debug_verifier", FlagType::Bool),
    ("cranelift_nan_canonicalization", FlagType::Bool),
    ("cranelift_opt_level", FlagType::Any),
    ("profiler", FlagType::Any),
    ("static_memory_maximum_size", FlagType::Size),
    ("static_memory_guard_size", FlagType::Size),
    ("dynamic_memory_guard_size", FlagType::Size),
];

#[derive(Clone, Copy)]
enum FlagType {
    /// `on` or `off` (exactly, as `bool_flag_handler`).
    Bool,
    /// nginx's size syntax.
    Size,
    /// Anything (Kong ignores an unknown `strategy`, `cranelift_opt_level` or `profiler`).
    Any,
}

handler!(wasmtime_block, |cf, _conf, _name| block(cf, WASMTIME_CONF));

handler!(other_runtime_block, |cf, _conf, _name| block(
    cf,
    OTHER_RUNTIME_CONF
));

handler!(
/// `flag NAME VALUE;` in `wasmtime{}`: a flag of Kong's Wasmtime table with a value of its
/// type; accepted, no effect (this host configures its engine itself).
wasmtime_flag, |cf, _conf, _name| {
    let (name, value) = (arg(cf, 1), arg(cf, 2));
    let Some((_, kind)) = WASMTIME_FLAGS.iter().find(|(n, _)| *n == name) else {
        return conf_error(
            cf,
            &format!("tollgate: unknown \"wasmtime\" configuration flag: \"{name}\""),
        );
    };
    let ok = match kind {
        FlagType::Bool => value == "on" || value == "off",
        FlagType::Size => raw_arg(cf, 2).and_then(|v| size_of(v)).is_some(),
        FlagType::Any => true,
    };
    if ok {
        CONF_OK
    } else {
        conf_error(
            cf,
            &format!(
                "tollgate: invalid value \"{value}\" of wasmtime flag \"{name}\": flag {name} {};",
                match kind {
                    FlagType::Bool => "on|off",
                    FlagType::Size => "SIZE",
                    FlagType::Any => "VALUE",
                }
            ),
        )
    }
});

handler!(
/// `flag NAME VALUE;` in `wasmer{}` or `v8{}`: ignored, as Kong's Wasmtime build ignores the
/// flags of another runtime's block.
other_runtime_flag, |_cf, _conf, _name| CONF_OK);
