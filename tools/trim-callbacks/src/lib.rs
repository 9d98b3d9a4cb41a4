//! A build step: points the exports of the proxy-wasm HTTP stream callbacks that a filter does
//! not implement at constant stubs.
//!
//! The proxy-wasm Rust SDK exports every `proxy_on_*` callback whether or not the filter
//! overrides it, and each runs the SDK's dispatch (a context lookup, a `RefCell` borrow) only to
//! answer the default: `Continue` (0) for headers, bodies and trailers, `true` (1) for
//! `proxy_on_done`, nothing for `proxy_on_log`. Hosts differ on a callback a module lacks:
//! - proxy-wasm-cpp-host (Envoy) returns `Continue` without entering the VM (`src/context.cc`);
//! - Kong's ngx_wasm_module (3bed278) looks up every stream callback at load and calls it
//!   without a NULL check (`ngx_http_proxy_wasm.c`, `ngx_proxy_wasm_on_log`): a module without
//!   `proxy_on_request_body`, `proxy_on_response_headers`, `proxy_on_response_body`,
//!   `proxy_on_log` or `proxy_on_done` crashes its worker (signal 11);
//! - nginx-compat's host treats every callback as optional.
//!
//! So every callback stays exported, and an unimplemented one becomes a function whose whole
//! body is that constant (one per distinct signature and answer): every host can call it, it
//! costs a VM entry and no SDK code, and a host may recognise it (nginx-compat's
//! `host/src/stubs.rs`) and skip the
//! call and the work that only feeds it (nginx-compat does: no body buffering for a filter
//! without a body callback). The SDK's own functions stay in the module, unexported.
//!
//! A filter whose root context needs `proxy_on_done` (the host shutting the plugin down) and
//! whose HTTP contexts do not lists `done` in `root-callbacks`: that export stays the SDK's, and
//! the module gets a custom section `tollgate.http_callbacks` naming the callbacks its HTTP
//! contexts implement (`request_headers, log`), so that nginx-compat skips the others per
//! request and still calls `proxy_on_done` for the root context. Other hosts call it for every
//! context, as they would without this step.
//!
//! `proxy_on_context_create` and `proxy_on_delete` are never touched: the SDK creates and frees
//! its per-request context there. Root-context callbacks (`proxy_on_tick`,
//! `proxy_on_http_call_response`, `proxy_on_queue_ready`...) are not stream callbacks.

use std::collections::{HashMap, HashSet};

use wasm_encoder::reencode::{Error as ReencodeError, Reencode};
use wasm_encoder::{Function, Instruction};

/// The stream callbacks this step may stub, as `proxy_on_<name>` (proxy-wasm ABI 0.2.1).
pub const HTTP_CALLBACKS: [&str; 8] = [
    "request_headers",
    "request_body",
    "request_trailers",
    "response_headers",
    "response_body",
    "response_trailers",
    "log",
    "done",
];

/// The callbacks a root context may keep without its HTTP contexts (`root-callbacks`).
pub const ROOT_CALLBACKS: [&str; 1] = ["done"];

/// The custom section that names the stream callbacks a module's HTTP contexts implement
/// (nginx-compat's `host/src/stubs.rs` reads it).
pub const HTTP_CALLBACKS_SECTION: &str = "tollgate.http_callbacks";

/// The SDK's default answer of stream callback `name` (one of [`HTTP_CALLBACKS`]):
/// `Some(1)` (`true`, the context may be deleted) for `done`, `None` for `log` (no result),
/// `Some(0)` (`Action::Continue`) for the others.
pub fn default_answer(name: &str) -> Option<i32> {
    match name {
        "log" => None,
        "done" => Some(1),
        _ => Some(0),
    }
}

/// Re-encodes a module with some exports pointed at stub functions appended to it.
struct StubExports {
    /// Export name to the index of its stub in the output module.
    redirect: HashMap<String, u32>,
    /// The stubs to append, in index order: (type index, answer).
    stubs: Vec<(u32, Option<i32>)>,
}

impl Reencode for StubExports {
    type Error = std::convert::Infallible;

    fn parse_function_section(
        &mut self,
        functions: &mut wasm_encoder::FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), ReencodeError<Self::Error>> {
        wasm_encoder::reencode::utils::parse_function_section(self, functions, section)?;
        for (ty, _) in &self.stubs {
            functions.function(*ty);
        }
        Ok(())
    }

    fn parse_code_section(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), ReencodeError<Self::Error>> {
        wasm_encoder::reencode::utils::parse_code_section(self, code, section)?;
        for (_, answer) in &self.stubs {
            let mut f = Function::new([]);
            if let Some(v) = answer {
                f.instruction(&Instruction::I32Const(*v));
            }
            f.instruction(&Instruction::End);
            code.function(&f);
        }
        Ok(())
    }

    fn parse_export(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        export: wasmparser::Export<'_>,
    ) -> Result<(), ReencodeError<Self::Error>> {
        match self.redirect.get(export.name) {
            Some(index) => {
                exports.export(export.name, wasm_encoder::ExportKind::Func, *index);
                Ok(())
            }
            None => wasm_encoder::reencode::utils::parse_export(self, exports, export),
        }
    }
}

/// What [`trim`] needs to know of a module: its function exports, the type of each function,
/// and the result count of each type.
struct Shape {
    exports: HashMap<String, u32>,
    /// Type index of every function, imported ones first (function index order).
    func_types: Vec<u32>,
    /// Results of every type index (`None`: not a function type).
    type_results: Vec<Option<Vec<wasmparser::ValType>>>,
}

fn shape(module: &[u8]) -> Result<Shape, String> {
    let mut shape = Shape {
        exports: HashMap::new(),
        func_types: Vec::new(),
        type_results: Vec::new(),
    };
    let err = |e: wasmparser::BinaryReaderError| e.to_string();
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        match payload.map_err(err)? {
            wasmparser::Payload::TypeSection(reader) => {
                for ty in reader.into_iter_err_on_gc_types() {
                    shape
                        .type_results
                        .push(Some(ty.map_err(err)?.results().to_vec()));
                }
            }
            wasmparser::Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if let wasmparser::TypeRef::Func(ty) = import.map_err(err)?.ty {
                        shape.func_types.push(ty);
                    }
                }
            }
            wasmparser::Payload::FunctionSection(reader) => {
                for ty in reader {
                    shape.func_types.push(ty.map_err(err)?);
                }
            }
            wasmparser::Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(err)?;
                    if export.kind == wasmparser::ExternalKind::Func {
                        shape.exports.insert(export.name.to_owned(), export.index);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(shape)
}

/// Returns `module` with the exports `proxy_on_<name>` of the [`HTTP_CALLBACKS`] that are
/// neither in `keep` nor in `root_only` pointed at constant stubs answering [`default_answer`]
/// (see the crate's docs); callbacks the module does not export stay absent. When `root_only`
/// names a callback `keep` does not, the module also gets the [`HTTP_CALLBACKS_SECTION`] listing
/// `keep`. The result is validated.
///
/// # Errors
/// A name in `keep` that is not one of [`HTTP_CALLBACKS`], or that the module does not export
/// (a typo would otherwise silently switch a callback off); a name in `root_only` not in
/// [`ROOT_CALLBACKS`]; a callback whose signature does not return what its default answer
/// needs; a module that does not parse or validate.
pub fn trim(module: &[u8], keep: &[&str], root_only: &[&str]) -> Result<Vec<u8>, String> {
    let shape = shape(module)?;
    for name in root_only {
        if !ROOT_CALLBACKS.contains(name) {
            return Err(format!(
                "unknown root callback {name:?}: expected one of {}",
                ROOT_CALLBACKS.join(", ")
            ));
        }
    }
    let section = root_only
        .iter()
        .any(|n| !keep.contains(n))
        .then(|| keep.join(", "));
    for name in keep {
        if !HTTP_CALLBACKS.contains(name) {
            return Err(format!(
                "unknown callback {name:?}: expected one of {}",
                HTTP_CALLBACKS.join(", ")
            ));
        }
        if !shape.exports.contains_key(&format!("proxy_on_{name}")) {
            return Err(format!("the module does not export proxy_on_{name}"));
        }
    }
    let keep: HashSet<&str> = keep.iter().copied().collect();
    let mut next = u32::try_from(shape.func_types.len()).map_err(|e| e.to_string())?;
    let mut by_kind: HashMap<(u32, Option<i32>), u32> = HashMap::new();
    let mut stubs = StubExports {
        redirect: HashMap::new(),
        stubs: Vec::new(),
    };
    for name in HTTP_CALLBACKS
        .iter()
        .filter(|n| !keep.contains(*n) && !root_only.contains(n))
    {
        let export = format!("proxy_on_{name}");
        let Some(&func) = shape.exports.get(&export) else {
            continue;
        };
        let ty = usize::try_from(func)
            .ok()
            .and_then(|f| shape.func_types.get(f))
            .copied()
            .ok_or_else(|| format!("{export}: no function {func}"))?;
        let results = usize::try_from(ty)
            .ok()
            .and_then(|t| shape.type_results.get(t))
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("{export}: no function type {ty}"))?;
        let answer = default_answer(name);
        let fits = match answer {
            Some(_) => results.as_slice() == [wasmparser::ValType::I32],
            None => results.is_empty(),
        };
        if !fits {
            return Err(format!("{export}: unexpected results {results:?}"));
        }
        let index = *by_kind.entry((ty, answer)).or_insert_with(|| {
            stubs.stubs.push((ty, answer));
            let index = next;
            next = next.saturating_add(1);
            index
        });
        stubs.redirect.insert(export, index);
    }
    if stubs.stubs.is_empty() && section.is_none() {
        return Ok(module.to_vec());
    }
    let mut out = wasm_encoder::Module::new();
    stubs
        .parse_core_module(&mut out, wasmparser::Parser::new(0), module)
        .map_err(|e| format!("cannot re-encode the module: {e}"))?;
    if let Some(list) = &section {
        out.section(&wasm_encoder::CustomSection {
            name: HTTP_CALLBACKS_SECTION.into(),
            data: list.as_bytes().into(),
        });
    }
    let bytes = out.finish();
    wasmparser::Validator::new()
        .validate_all(&bytes)
        .map_err(|e| format!("the trimmed module does not validate: {e}"))?;
    Ok(bytes)
}

/// A filter of the workspace: its module's file name and the callbacks it implements.
#[derive(Debug, PartialEq, Eq)]
pub struct Filter {
    /// The package name, for messages.
    pub package: String,
    /// The module's file name, `<lib name>.wasm` (cargo's `-` to `_`).
    pub file: String,
    /// `[package.metadata.tollgate] http-callbacks`.
    pub callbacks: Vec<String>,
    /// `[package.metadata.tollgate] root-callbacks` (optional; empty without it).
    pub root_callbacks: Vec<String>,
}

/// A metadata list of callback names; `Err` naming `field` when it is not an array of strings.
fn names(list: &serde_json::Value, field: &str) -> Result<Vec<String>, String> {
    list.as_array()
        .and_then(|l| {
            l.iter()
                .map(|c| c.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| format!("{field} must be an array of callback names"))
}

/// The filters of a workspace from `cargo metadata --no-deps --format-version 1`: every package
/// with a `cdylib` target, with its `[package.metadata.tollgate] http-callbacks` list and its
/// optional `root-callbacks` list.
///
/// # Errors
/// JSON that is not cargo's metadata; a `cdylib` package without `http-callbacks` (every filter
/// must say what it implements), or either list not an array of strings.
pub fn filters_from_metadata(json: &[u8]) -> Result<Vec<Filter>, String> {
    let meta: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("cargo metadata: {e}"))?;
    let packages = meta
        .get("packages")
        .and_then(|p| p.as_array())
        .ok_or("cargo metadata: no packages")?;
    let mut filters = Vec::new();
    for package in packages {
        let name = package.get("name").and_then(|n| n.as_str()).unwrap_or("?");
        let cdylib = package
            .get("targets")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
            .find(|t| {
                t.get("crate_types")
                    .and_then(|c| c.as_array())
                    .is_some_and(|c| c.iter().any(|k| k == "cdylib"))
            });
        let Some(cdylib) = cdylib else { continue };
        let lib = cdylib.get("name").and_then(|n| n.as_str()).unwrap_or(name);
        let field = |key: &str| format!("{name}: [package.metadata.tollgate] {key}");
        let callbacks = package
            .pointer("/metadata/tollgate/http-callbacks")
            .ok_or_else(|| {
                format!(
                    "{} is missing (the stream callbacks the filter implements)",
                    field("http-callbacks")
                )
            })
            .and_then(|list| names(list, &field("http-callbacks")))?;
        let root_callbacks = match package.pointer("/metadata/tollgate/root-callbacks") {
            None => Vec::new(),
            Some(list) => names(list, &field("root-callbacks"))?,
        };
        filters.push(Filter {
            package: name.to_owned(),
            file: format!("{}.wasm", lib.replace('-', "_")),
            callbacks,
            root_callbacks,
        });
    }
    Ok(filters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ExportKind, ExportSection, Function, FunctionSection, Instruction,
        MemorySection, MemoryType, Module, TypeSection, ValType,
    };

    /// The export names of a core module, in order.
    ///
    /// # Errors
    /// The bytes are not a WebAssembly module.
    fn export_names(module: &[u8]) -> Result<Vec<String>, String> {
        let mut names = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(module) {
            if let wasmparser::Payload::ExportSection(reader) =
                payload.map_err(|e| e.to_string())?
            {
                for export in reader {
                    names.push(export.map_err(|e| e.to_string())?.name.to_owned());
                }
            }
        }
        Ok(names)
    }

    /// A module shaped like an SDK filter: memory, and the callbacks (each a function of its
    /// own that does some work, as the SDK's are; `proxy_on_log` returns nothing).
    fn sdk_like() -> Vec<u8> {
        let names = [
            "proxy_on_context_create",
            "proxy_on_request_headers",
            "proxy_on_request_body",
            "proxy_on_response_headers",
            "proxy_on_response_body",
            "proxy_on_log",
            "proxy_on_done",
            "proxy_on_delete",
            "proxy_on_tick",
        ];
        let mut types = TypeSection::new();
        types.ty().function([ValType::I32], [ValType::I32]);
        types.ty().function([ValType::I32], []);
        let mut functions = FunctionSection::new();
        let mut code = CodeSection::new();
        let mut exports = ExportSection::new();
        let mut memory = MemorySection::new();
        memory.memory(MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        exports.export("memory", ExportKind::Memory, 0);
        for (i, name) in names.iter().enumerate() {
            let mut f = Function::new([]);
            if *name == "proxy_on_log" {
                functions.function(1);
                f.instruction(&Instruction::LocalGet(0));
                f.instruction(&Instruction::Drop);
            } else {
                functions.function(0);
                f.instruction(&Instruction::LocalGet(0));
            }
            f.instruction(&Instruction::End);
            code.function(&f);
            exports.export(name, ExportKind::Func, u32::try_from(i).unwrap());
        }
        let mut module = Module::new();
        module
            .section(&types)
            .section(&functions)
            .section(&memory)
            .section(&exports)
            .section(&code);
        module.finish()
    }

    /// A stub's bytes (WebAssembly core spec 5.5.13): no local declarations, the answer, `end`.
    fn stub_bytes(answer: Option<i32>) -> Vec<u8> {
        match answer {
            Some(v) => vec![0x00, 0x41, u8::try_from(v).unwrap(), 0x0b],
            None => vec![0x00, 0x0b],
        }
    }

    /// For each exported stream callback: (name, its function index, whether its body's bytes
    /// are a stub answering the SDK's default).
    fn callbacks(module: &[u8]) -> Vec<(String, u32, bool)> {
        let mut exports = Vec::new();
        let mut bodies = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(module) {
            match payload.unwrap() {
                wasmparser::Payload::ExportSection(r) => {
                    for e in r {
                        let e = e.unwrap();
                        if let Some(name) = e.name.strip_prefix("proxy_on_") {
                            if HTTP_CALLBACKS.contains(&name) {
                                exports.push((name.to_owned(), e.index));
                            }
                        }
                    }
                }
                wasmparser::Payload::CodeSectionEntry(body) => {
                    let r = body.range();
                    bodies.push(module[r.start as usize..r.end as usize].to_vec());
                }
                _ => {}
            }
        }
        exports
            .into_iter()
            .map(|(name, index)| {
                let stub = bodies[index as usize] == stub_bytes(default_answer(&name));
                (name, index, stub)
            })
            .collect()
    }

    #[test]
    fn stubs_only_the_stream_callbacks_not_kept() {
        let module = sdk_like();
        let out = trim(&module, &["request_headers", "log"], &[]).unwrap();
        assert_eq!(export_names(&out).unwrap(), export_names(&module).unwrap());
        let cbs = callbacks(&out);
        let stubbed: Vec<&str> = cbs.iter().filter(|c| c.2).map(|c| c.0.as_str()).collect();
        assert_eq!(
            stubbed,
            ["request_body", "response_headers", "response_body", "done"]
        );
        // One stub per signature and answer: the three `Continue` callbacks share a function,
        // `done` (answer 1) has its own, appended after the module's nine.
        let index = |n: &str| cbs.iter().find(|c| c.0 == n).unwrap().1;
        assert_eq!(index("request_body"), 9);
        assert_eq!(index("response_headers"), 9);
        assert_eq!(index("response_body"), 9);
        assert_eq!(index("done"), 10);
        assert_eq!(index("request_headers"), 1);
    }

    /// The custom sections of a module: (name, data).
    fn custom_sections(module: &[u8]) -> Vec<(String, Vec<u8>)> {
        wasmparser::Parser::new(0)
            .parse_all(module)
            .filter_map(|p| match p.unwrap() {
                wasmparser::Payload::CustomSection(r) => {
                    Some((r.name().to_owned(), r.data().to_vec()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_root_only_done_stays_the_sdks_and_the_section_lists_the_http_callbacks() {
        let module = sdk_like();
        let out = trim(&module, &["request_headers", "log"], &["done"]).unwrap();
        let cbs = callbacks(&out);
        let stubbed: Vec<&str> = cbs.iter().filter(|c| c.2).map(|c| c.0.as_str()).collect();
        assert_eq!(
            stubbed,
            ["request_body", "response_headers", "response_body"]
        );
        assert_eq!(
            custom_sections(&out),
            vec![(
                HTTP_CALLBACKS_SECTION.to_owned(),
                b"request_headers, log".to_vec()
            )]
        );
        // Without root-only callbacks, or with `done` kept for HTTP contexts too: no section.
        let plain = trim(&module, &["request_headers", "log"], &[]).unwrap();
        assert!(custom_sections(&plain).is_empty());
        let both = trim(&module, &["request_headers", "done"], &["done"]).unwrap();
        assert!(custom_sections(&both).is_empty());
        assert!(
            trim(&module, &[], &["log"]).is_err(),
            "only done is a root callback"
        );
    }

    #[test]
    fn keeping_nothing_stubs_every_callback_and_leaves_context_create_and_delete() {
        let out = trim(&sdk_like(), &[], &[]).unwrap();
        assert!(callbacks(&out).iter().all(|c| c.2));
        // `log` returns nothing: its stub is an empty body.
        let cbs = callbacks(&out);
        assert!(cbs.iter().any(|c| c.0 == "log" && c.1 == 10));
        assert!(cbs.iter().any(|c| c.0 == "done" && c.1 == 11));
        let names = export_names(&out).unwrap();
        assert!(names.contains(&"proxy_on_context_create".to_owned()));
        assert!(names.contains(&"proxy_on_delete".to_owned()));
    }

    #[test]
    fn the_sdks_own_callbacks_are_not_stubs() {
        assert!(callbacks(&sdk_like()).iter().all(|c| !c.2));
    }

    #[test]
    fn keeping_everything_is_the_same_module() {
        let module = sdk_like();
        assert_eq!(
            trim(&module, &HTTP_CALLBACKS, &[]).err(),
            Some("the module does not export proxy_on_request_trailers".to_owned())
        );
        let exported = [
            "request_headers",
            "request_body",
            "response_headers",
            "response_body",
            "log",
            "done",
        ];
        assert_eq!(trim(&module, &exported, &[]).unwrap(), module);
    }

    #[test]
    fn filters_come_from_cdylib_packages_and_their_metadata() {
        let meta = br#"{"packages": [
            {"name": "tollgate-common", "targets": [{"name": "tollgate_common", "crate_types": ["lib"]}],
             "metadata": null},
            {"name": "tollgate-rate-limit",
             "targets": [{"name": "tollgate_rate_limit", "crate_types": ["cdylib", "rlib"]}],
             "metadata": {"tollgate": {"http-callbacks": ["request_headers", "response_headers"]}}},
            {"name": "tollgate-metrics",
             "targets": [{"name": "tollgate_metrics", "crate_types": ["cdylib"]}],
             "metadata": {"tollgate": {"http-callbacks": ["log"], "root-callbacks": ["done"]}}}
        ]}"#;
        assert_eq!(
            filters_from_metadata(meta).unwrap(),
            [
                Filter {
                    package: "tollgate-rate-limit".into(),
                    file: "tollgate_rate_limit.wasm".into(),
                    callbacks: vec!["request_headers".into(), "response_headers".into()],
                    root_callbacks: vec![],
                },
                Filter {
                    package: "tollgate-metrics".into(),
                    file: "tollgate_metrics.wasm".into(),
                    callbacks: vec!["log".into()],
                    root_callbacks: vec!["done".into()],
                }
            ]
        );
    }

    #[test]
    fn a_filter_without_its_list_is_refused() {
        let missing =
            br#"{"packages": [{"name": "f", "targets": [{"name": "f", "crate_types": ["cdylib"]}],
            "metadata": null}]}"#;
        let err = filters_from_metadata(missing).unwrap_err();
        assert!(
            err.starts_with("f: [package.metadata.tollgate] http-callbacks is missing"),
            "{err}"
        );
        let not_strings =
            br#"{"packages": [{"name": "f", "targets": [{"name": "f", "crate_types": ["cdylib"]}],
            "metadata": {"tollgate": {"http-callbacks": [1]}}}]}"#;
        assert!(filters_from_metadata(not_strings)
            .unwrap_err()
            .contains("array of callback names"));
        let root_not_strings =
            br#"{"packages": [{"name": "f", "targets": [{"name": "f", "crate_types": ["cdylib"]}],
            "metadata": {"tollgate": {"http-callbacks": [], "root-callbacks": "done"}}}]}"#;
        let err = filters_from_metadata(root_not_strings).unwrap_err();
        assert!(
            err.starts_with("f: [package.metadata.tollgate] root-callbacks must be an array"),
            "{err}"
        );
        assert!(filters_from_metadata(b"[]").is_err());
    }

    #[test]
    fn unknown_or_missing_names_are_refused() {
        let err = trim(&sdk_like(), &["request_header"], &[]).unwrap_err();
        assert!(
            err.starts_with("unknown callback \"request_header\""),
            "{err}"
        );
        assert!(trim(&sdk_like(), &["delete"], &[]).is_err());
        assert!(trim(b"not wasm", &[], &[]).is_err());
    }
}
