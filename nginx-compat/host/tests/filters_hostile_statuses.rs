#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

//! No host status makes a Tollgate filter trap. Each real filter (`scripts/build.sh` builds
//! them) runs its whole lifecycle (start, `on_configure`, `on_tick`, an HTTP context through
//! every callback, `on_http_call_response`) under a bare host on wasmtime in which every
//! import answers plainly (`Ok`, nothing found), except one import that answers with one status
//! a host may return (`NotFound`, `BadArgument`, `InternalFailure`, `Unimplemented`, and 99,
//! outside the ABI's list). Hosts differ here: ngx_wasm_module answers `NotFound` to
//! `proxy_set_property` on keys outside its namespaces, the nginx host `InternalFailure` for a
//! full zone, and both `Unimplemented` for calls they lack. The proxy-wasm Rust SDK's wrappers
//! `panic!` on statuses they do not expect; the filters call the raw ABI instead
//! (`plugins/common/src/raw.rs`), and this test is what shows it.
//!
//! Two SDK paths remain, excluded below with the reason: `proxy_set_effective_context`, which
//! the SDK's dispatcher itself calls and unwraps before entering the filter, and
//! `proxy_http_call` statuses other than `Ok`, `BadArgument` and `InternalFailure` (the SDK's
//! `dispatch_http_call` must register the call's token with its dispatcher, so the filters
//! keep it).

use std::collections::HashMap;
use std::path::PathBuf;

use wasmtime::{Caller, Engine, Extern, Func, Instance, Linker, Module, Store, Val, ValType};

/// proxy-wasm ABI 0.2.1 `proxy_status_t` values a host may answer, and one outside the list.
const STATUSES: [i32; 5] = [1, 2, 10, 12, 99];
/// The ABI's buffer types the bare host serves (`proxy_buffer_type_t`).
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;

/// The filter's build; `TOLLGATE_WASM_DIR` points at another build (e.g. an older commit's, to
/// show that this test fails there), as in the gateway lab (lab/paths.py).
fn wasm(filter: &str) -> PathBuf {
    let dir = std::env::var_os("TOLLGATE_WASM_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm32-wasip1/release"),
        PathBuf::from,
    );
    let path = dir.join(format!("tollgate_{filter}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/build.sh",
        path.display()
    );
    path
}

/// What the bare host knows: the plugin configuration, and which import answers what.
struct Bare {
    config: Vec<u8>,
    hostile: String,
    status: i32,
    /// Imports called, with how often (to show the hostile one was reached).
    called: HashMap<String, u32>,
}

fn memory(caller: &mut Caller<'_, Bare>) -> wasmtime::Memory {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => m,
        _ => panic!("the filter exports no memory"),
    }
}

fn write_u32(caller: &mut Caller<'_, Bare>, at: i32, value: u32) -> bool {
    let mem = memory(caller);
    mem.write(caller, at as usize, &value.to_le_bytes()).is_ok()
}

fn write_u64(caller: &mut Caller<'_, Bare>, at: i32, value: u64) -> bool {
    let mem = memory(caller);
    mem.write(caller, at as usize, &value.to_le_bytes()).is_ok()
}

/// Hands `bytes` to the guest the ABI's way: `proxy_on_memory_allocate`, copy, write the
/// pointer and the size to the guest's out-parameters.
fn hand_over(caller: &mut Caller<'_, Bare>, bytes: &[u8], ptr_out: i32, size_out: i32) -> bool {
    let Some(Extern::Func(alloc)) = caller.get_export("proxy_on_memory_allocate") else {
        return false;
    };
    let mut ptr = [Val::I32(0)];
    if alloc
        .call(&mut *caller, &[Val::I32(bytes.len() as i32)], &mut ptr)
        .is_err()
    {
        return false;
    }
    let ptr = ptr[0].unwrap_i32();
    let mem = memory(caller);
    mem.write(&mut *caller, ptr as usize, bytes).is_ok()
        && write_u32(caller, ptr_out, ptr as u32)
        && write_u32(caller, size_out, bytes.len() as u32)
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The plain answer of import `name` (every status `Ok` = 0 unless said).
fn plain(caller: &mut Caller<'_, Bare>, name: &str, p: &[Val]) -> Result<i32, wasmtime::Error> {
    let arg = |i: usize| p.get(i).and_then(Val::i32).unwrap_or(0);
    Ok(match name {
        "proxy_get_buffer_bytes" => {
            let kind = arg(0);
            if kind == PLUGIN_CONFIGURATION || kind == VM_CONFIGURATION {
                let config = if kind == PLUGIN_CONFIGURATION {
                    caller.data().config.clone()
                } else {
                    Vec::new()
                };
                if hand_over(caller, &config, arg(3), arg(4)) {
                    0
                } else {
                    10
                }
            } else {
                1
            }
        }
        "proxy_get_header_map_value" | "proxy_get_property" | "proxy_get_shared_data" => 1,
        "proxy_get_header_map_pairs" => {
            let ok = write_u32(caller, arg(1), 0) && write_u32(caller, arg(2), 0);
            if ok {
                0
            } else {
                10
            }
        }
        "proxy_get_current_time_nanoseconds" => {
            if write_u64(caller, arg(0), now_nanos()) {
                0
            } else {
                10
            }
        }
        "proxy_define_metric" => {
            if write_u32(caller, arg(3), 1) {
                0
            } else {
                10
            }
        }
        "proxy_http_call" => {
            if write_u32(caller, arg(9), 1) {
                0
            } else {
                10
            }
        }
        "proxy_dispatch_http_call" => {
            if write_u32(caller, arg(9), 1) {
                0
            } else {
                10
            }
        }
        // WASI: no environment, no arguments, the clock, writes taken whole.
        "environ_sizes_get" | "args_sizes_get" => {
            if write_u32(caller, arg(0), 0) && write_u32(caller, arg(1), 0) {
                0
            } else {
                28
            }
        }
        "clock_time_get" => {
            if write_u64(caller, arg(2), now_nanos()) {
                0
            } else {
                28
            }
        }
        "fd_write" => {
            let mem = memory(caller);
            let (iovs, n) = (arg(1) as usize, arg(2) as usize);
            let mut total = 0u32;
            for i in 0..n {
                let mut len = [0u8; 4];
                if mem.read(&*caller, iovs + i * 8 + 4, &mut len).is_err() {
                    return Ok(28);
                }
                total += u32::from_le_bytes(len);
            }
            if write_u32(caller, arg(3), total) {
                0
            } else {
                28
            }
        }
        "proc_exit" => return Err(wasmtime::Error::msg("proc_exit")),
        _ => 0,
    })
}

/// One lifecycle of `filter` with `config`, import `hostile` answering `status`. `Err` names
/// the callback that trapped and why.
fn lifecycle(
    engine: &Engine,
    module: &Module,
    config: &[u8],
    hostile: &str,
    status: i32,
) -> Result<u32, String> {
    let mut linker: Linker<Bare> = Linker::new(engine);
    for import in module.imports() {
        let Some(ty) = import.ty().func().cloned() else {
            continue;
        };
        let name = import.name().to_owned();
        let returns_status = ty
            .results()
            .next()
            .is_some_and(|t| matches!(t, ValType::I32));
        linker
            .func_new(
                import.module(),
                import.name(),
                ty,
                move |mut caller, params, results| {
                    *caller.data_mut().called.entry(name.clone()).or_default() += 1;
                    let answer = if caller.data().hostile == name {
                        caller.data().status
                    } else {
                        plain(&mut caller, &name, params)?
                    };
                    if returns_status {
                        results[0] = Val::I32(answer);
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
    let bare = Bare {
        config: config.to_vec(),
        hostile: hostile.to_owned(),
        status,
        called: HashMap::new(),
    };
    let mut store = Store::new(engine, bare);
    let instance: Instance = linker
        .instantiate(&mut store, module)
        .map_err(|e| format!("instantiate: {e}"))?;
    let call = |store: &mut Store<Bare>, name: &str, args: &[i32]| -> Result<i32, String> {
        let Some(f): Option<Func> = instance.get_func(&mut *store, name) else {
            return Ok(0);
        };
        let args: Vec<Val> = args.iter().map(|a| Val::I32(*a)).collect();
        let mut out = vec![Val::I32(0); f.ty(&*store).results().len()];
        f.call(&mut *store, &args, &mut out)
            .map_err(|e| format!("{name}: {e:?}"))?;
        Ok(out.first().and_then(Val::i32).unwrap_or(0))
    };
    if instance.get_func(&mut store, "_initialize").is_some() {
        call(&mut store, "_initialize", &[])?;
    } else {
        call(&mut store, "_start", &[])?;
    }
    call(&mut store, "proxy_on_context_create", &[1, 0])?;
    call(&mut store, "proxy_on_vm_start", &[1, 0])?;
    let configured = call(&mut store, "proxy_on_configure", &[1, config.len() as i32])?;
    if configured != 0 {
        call(&mut store, "proxy_on_tick", &[1])?;
        call(&mut store, "proxy_on_http_call_response", &[1, 1, 0, 0, 0]).ok();
        call(&mut store, "proxy_on_context_create", &[2, 1])?;
        call(&mut store, "proxy_on_request_headers", &[2, 0, 0])?;
        call(&mut store, "proxy_on_request_body", &[2, 2, 1])?;
        call(&mut store, "proxy_on_response_headers", &[2, 0, 0])?;
        call(&mut store, "proxy_on_response_body", &[2, 2, 1])?;
        call(&mut store, "proxy_on_log", &[2])?;
        call(&mut store, "proxy_on_done", &[2])?;
        call(&mut store, "proxy_on_delete", &[2])?;
    }
    if hostile == "proxy_on_configure" {
        return Ok(if configured != 0 { CONFIGURED } else { 0 });
    }
    Ok(store.data().called.get(hostile).copied().unwrap_or(0))
}

/// What [`lifecycle`] returns, asked about `proxy_on_configure`, when the filter accepted its
/// configuration under the plain host.
const CONFIGURED: u32 = u32::MAX;

/// Configurations that reach most host calls: remote JWKS (ticks, calls), budgets and spend
/// headers, metrics with signals, every rate-limit key source, sticky cookies.
fn filters() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "jwt_auth",
            r#"{"providers": {"main": {"issuer": "https://issuer.test",
                "remote_jwks": {"cluster": "idp", "path": "/jwks.json", "authority": "idp.test"}}}}"#,
        ),
        (
            "rate_limit",
            r#"{"rules": [{"name": "api", "match": {"prefix": "/"}, "limits": [{"algorithm":
                "token_bucket", "capacity": 3, "requests": 1, "per": "day"}]}]}"#,
        ),
        (
            "cost",
            r#"{"prices": {"gpt-4o-mini": {"input_cost_per_token": 1.5e-07,
                "output_cost_per_token": 6e-07}}, "tenant": {"unverified_header": "x-jwt-sub"},
                "budgets": {"default": {"day_nano_usd": 1000000000}}}"#,
        ),
        ("metrics", r#"{"routes": [{"name": "api", "prefix": "/"}]}"#),
        (
            "sticky_upstream",
            r#"{"upstreams": [{"name": "blue", "weight": 3}, {"name": "green", "weight": 1}],
                "secret": "0123456789abcdef0123456789abcdef"}"#,
        ),
    ]
}

#[test]
fn no_host_status_makes_a_filter_trap() {
    let engine = Engine::default();
    let mut failures = Vec::new();
    let mut reached = 0u32;
    for (filter, config) in filters() {
        let module = Module::from_file(&engine, wasm(filter)).unwrap();
        // The configuration must load under the plain host, or the test proves little.
        assert_eq!(
            lifecycle(&engine, &module, config.as_bytes(), "proxy_on_configure", 0),
            Ok(CONFIGURED),
            "{filter}: the plain host run must load the configuration and run every callback"
        );
        let imports: Vec<String> = module
            .imports()
            .filter(|i| i.module() == "env" && i.ty().func().is_some())
            .map(|i| i.name().to_owned())
            .collect();
        for import in &imports {
            if import == "proxy_set_effective_context" {
                continue; // The SDK's dispatcher unwraps it (module documentation).
            }
            for status in STATUSES {
                if (import == "proxy_http_call" || import == "proxy_dispatch_http_call")
                    && ![2, 10].contains(&status)
                {
                    continue; // The SDK's dispatch_http_call (module documentation).
                }
                match lifecycle(&engine, &module, config.as_bytes(), import, status) {
                    Ok(calls) => reached += u32::from(calls > 0),
                    Err(e) => failures.push(format!("{filter}: {import} -> {status}: {e}")),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} traps:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(reached > 100, "hostile imports reached: {reached}");
}
