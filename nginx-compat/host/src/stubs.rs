//! Stream callbacks whose whole body is the SDK's default answer, so that calling them would
//! change nothing: the host skips them as if the module did not export them.
//!
//! Tollgate's build (`tools/trim-callbacks`) points every stream callback a filter does not
//! implement at such a stub instead of removing the export, because Kong's ngx_wasm_module calls
//! every stream callback without checking that it exists. A stub is a function with no locals
//! whose body is `i32.const 0` (`Action::Continue`: headers, bodies, trailers), `i32.const 1`
//! (`proxy_on_done`: the context may be deleted) or empty (`proxy_on_log`). Skipping one is
//! exactly what calling it would do, and spares the host the work that only feeds it (a body
//! no filter reads is never buffered).
//!
//! A module may also carry a custom section [`HTTP_CALLBACKS_SECTION`]: the stream callbacks
//! its HTTP contexts implement, as comma-separated names without `proxy_on_` (`request_headers,
//! log`). Every other stream callback it exports is then skipped for HTTP contexts too. The
//! build writes it for a filter that keeps `proxy_on_done` for its root context only (metrics:
//! its counters at shutdown), which the host calls at the worker's exit (`Vm::on_root_done`)
//! and never per request.

use std::collections::HashMap;

use crate::stream::StreamCallback;

/// What a stub of `cb` returns (`None`: no result): the SDK's default answer.
fn default_answer(cb: StreamCallback) -> Option<i32> {
    match cb {
        StreamCallback::Log => None,
        StreamCallback::Done => Some(1),
        _ => Some(0),
    }
}

/// The custom section naming the stream callbacks a module's HTTP contexts implement (see the
/// module's documentation).
pub const HTTP_CALLBACKS_SECTION: &str = "tollgate.http_callbacks";

/// The stream callbacks `wasm` exports as stubs, or leaves out of its
/// [`HTTP_CALLBACKS_SECTION`]. A module that does not parse yields none
/// (wasmtime has already refused it).
pub(crate) fn stub_callbacks(wasm: &[u8]) -> Vec<StreamCallback> {
    stubs(wasm).unwrap_or_default()
}

fn stubs(wasm: &[u8]) -> Result<Vec<StreamCallback>, wasmparser::BinaryReaderError> {
    // Function index of each stream callback export, then the defined functions' bodies.
    let mut wanted: HashMap<u32, Vec<StreamCallback>> = HashMap::new();
    let mut imported: u32 = 0;
    let mut defined: u32 = 0;
    let mut out = Vec::new();
    // The callbacks the custom section names, when there is one.
    let mut declared: Option<Vec<StreamCallback>> = None;
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload? {
            wasmparser::Payload::CustomSection(reader)
                if reader.name() == HTTP_CALLBACKS_SECTION =>
            {
                let text = String::from_utf8_lossy(reader.data());
                let names: Vec<&str> = text.split(',').map(str::trim).collect();
                declared = Some(
                    StreamCallback::ALL
                        .into_iter()
                        .filter(|cb| {
                            cb.name()
                                .strip_prefix("proxy_on_")
                                .is_some_and(|n| names.contains(&n))
                        })
                        .collect(),
                );
            }
            wasmparser::Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if matches!(import?.ty, wasmparser::TypeRef::Func(_)) {
                        imported = imported.saturating_add(1);
                    }
                }
            }
            wasmparser::Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export?;
                    if export.kind != wasmparser::ExternalKind::Func {
                        continue;
                    }
                    if let Some(cb) = StreamCallback::ALL
                        .into_iter()
                        .find(|cb| cb.name() == export.name)
                    {
                        wanted.entry(export.index).or_default().push(cb);
                    }
                }
            }
            wasmparser::Payload::CodeSectionEntry(body) => {
                let index = imported.saturating_add(defined);
                defined = defined.saturating_add(1);
                if let Some(callbacks) = wanted.get(&index) {
                    out.extend(
                        callbacks
                            .iter()
                            .copied()
                            .filter(|cb| is_stub(&body, default_answer(*cb))),
                    );
                }
            }
            _ => {}
        }
    }
    if let Some(declared) = declared {
        for cb in wanted.values().flatten() {
            if !declared.contains(cb) && !out.contains(cb) {
                out.push(*cb);
            }
        }
    }
    Ok(out)
}

/// No locals, and the operators `i32.const answer; end` (only `end` when `answer` is `None`).
fn is_stub(body: &wasmparser::FunctionBody<'_>, answer: Option<i32>) -> bool {
    let Ok(locals) = body.get_locals_reader() else {
        return false;
    };
    if locals.get_count() != 0 {
        return false;
    }
    let Ok(reader) = body.get_operators_reader() else {
        return false;
    };
    let mut ops = Vec::with_capacity(2);
    for op in reader {
        match op {
            Ok(op) if ops.len() < 2 => ops.push(op),
            _ => return false,
        }
    }
    match (answer, ops.as_slice()) {
        (Some(v), [wasmparser::Operator::I32Const { value }, wasmparser::Operator::End]) => {
            *value == v
        }
        (None, [wasmparser::Operator::End]) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::stub_callbacks;
    use crate::stream::StreamCallback::*;

    fn module(funcs: &str) -> Vec<u8> {
        wat::parse_str(format!("(module {funcs} (memory (export \"memory\") 1))")).unwrap()
    }

    #[test]
    fn constant_default_answers_are_stubs() {
        let m = module(
            r#"(import "env" "proxy_log" (func (param i32 i32 i32) (result i32)))
               (func $continue (param i32 i32 i32) (result i32) (i32.const 0))
               (func $done (param i32) (result i32) (i32.const 1))
               (func $log (param i32))
               (export "proxy_on_request_body" (func $continue))
               (export "proxy_on_response_body" (func $continue))
               (export "proxy_on_done" (func $done))
               (export "proxy_on_log" (func $log))"#,
        );
        let got = stub_callbacks(&m);
        assert_eq!(got.len(), 4, "{got:?}");
        for cb in [RequestBody, ResponseBody, Log, Done] {
            assert!(got.contains(&cb), "{cb:?} in {got:?}");
        }
    }

    #[test]
    fn a_declared_list_skips_the_exports_it_leaves_out() {
        let funcs = r#"(func $work (param i32 i32 i32) (result i32) (local i32) (i32.const 0))
               (func $done (param i32) (result i32) (local i32) (i32.const 1))
               (func $log (param i32) (nop))
               (export "proxy_on_request_headers" (func $work))
               (export "proxy_on_response_body" (func $work))
               (export "proxy_on_done" (func $done))
               (export "proxy_on_log" (func $log))"#;
        assert_eq!(
            stub_callbacks(&module(funcs)),
            vec![],
            "no section: all called"
        );
        let mut m = module(funcs);
        // A custom section: id 0, size, name, data.
        let name = super::HTTP_CALLBACKS_SECTION.as_bytes();
        let data = b"request_headers, log";
        let size = u8::try_from(1 + name.len() + data.len()).unwrap();
        m.extend([0, size, u8::try_from(name.len()).unwrap()]);
        m.extend_from_slice(name);
        m.extend_from_slice(data);
        let mut got = stub_callbacks(&m);
        got.sort_by_key(|cb| cb.name());
        assert_eq!(got, vec![Done, ResponseBody]);
    }

    #[test]
    fn anything_else_is_called() {
        let m = module(
            r#"(func $pause (param i32 i32 i32) (result i32) (i32.const 1))
               (func $work (param i32 i32 i32) (result i32) (local i32) (i32.const 0))
               (func $echo (param i32 i32 i32) (result i32) (local.get 0))
               (func $not_done (param i32) (result i32) (i32.const 0))
               (func $log (param i32) (nop))
               (export "proxy_on_request_headers" (func $pause))
               (export "proxy_on_request_body" (func $work))
               (export "proxy_on_response_headers" (func $echo))
               (export "proxy_on_done" (func $not_done))
               (export "proxy_on_log" (func $log))
               (export "proxy_on_tick" (func $log))"#,
        );
        assert!(stub_callbacks(&m).is_empty());
        assert!(stub_callbacks(b"not wasm").is_empty());
    }
}
