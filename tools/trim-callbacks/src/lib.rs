//! A build step: removes from a filter's module the exports of the proxy-wasm HTTP stream
//! callbacks that the filter does not implement.
//!
//! The proxy-wasm Rust SDK exports every `proxy_on_*` callback whether or not the filter
//! overrides it, and every exported stream callback costs the host a call into the VM per
//! request (per body chunk for the body callbacks), only for the SDK's default `Continue`.
//! Hosts call a stream callback only when the module exports it:
//! - proxy-wasm-cpp-host (Envoy): `ContextBase::onRequestHeaders`, `onResponseBody`, `onLog`,
//!   `onDone`... return `Continue` (or do nothing) without entering the VM when the export is
//!   missing (`src/context.cc`);
//! - ngx_wasm_module requires only `proxy_on_context_create`, `proxy_on_vm_start` and
//!   `proxy_on_configure`, and skips the stream callbacks a filter lacks;
//! - nginx-compat's host treats every callback as optional.
//!
//! `proxy_on_context_create` and `proxy_on_delete` are never removed: the SDK creates and frees
//! its per-request context there. Root-context callbacks (`proxy_on_tick`,
//! `proxy_on_http_call_response`, `proxy_on_queue_ready`...) are not stream callbacks and stay.

use std::collections::HashSet;

use wasm_encoder::reencode::{Error as ReencodeError, Reencode};

/// The stream callbacks this step may remove, as `proxy_on_<name>` (proxy-wasm ABI 0.2.1).
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

/// Drops the exports named in `drop` and re-encodes everything else unchanged.
struct DropExports {
    drop: HashSet<String>,
}

impl Reencode for DropExports {
    type Error = std::convert::Infallible;

    fn parse_export(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        export: wasmparser::Export<'_>,
    ) -> Result<(), ReencodeError<Self::Error>> {
        if self.drop.contains(export.name) {
            return Ok(());
        }
        wasm_encoder::reencode::utils::parse_export(self, exports, export)
    }
}

/// The export names of a core module, in order.
///
/// # Errors
/// The bytes are not a WebAssembly module.
pub fn export_names(module: &[u8]) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ExportSection(reader) = payload.map_err(|e| e.to_string())? {
            for export in reader {
                names.push(export.map_err(|e| e.to_string())?.name.to_owned());
            }
        }
    }
    Ok(names)
}

/// Returns `module` without the exports `proxy_on_<name>` of the [`HTTP_CALLBACKS`] that are
/// not in `keep`; the result is validated.
///
/// # Errors
/// A name in `keep` that is not one of [`HTTP_CALLBACKS`], or that the module does not export
/// (a typo would otherwise silently switch a callback off); a module that does not parse or
/// validate.
pub fn trim(module: &[u8], keep: &[&str]) -> Result<Vec<u8>, String> {
    let exported: HashSet<String> = export_names(module)?.into_iter().collect();
    for name in keep {
        if !HTTP_CALLBACKS.contains(name) {
            return Err(format!(
                "unknown callback {name:?}: expected one of {}",
                HTTP_CALLBACKS.join(", ")
            ));
        }
        if !exported.contains(&format!("proxy_on_{name}")) {
            return Err(format!("the module does not export proxy_on_{name}"));
        }
    }
    let drop = HTTP_CALLBACKS
        .iter()
        .filter(|name| !keep.contains(name))
        .map(|name| format!("proxy_on_{name}"))
        .collect();
    let mut out = wasm_encoder::Module::new();
    DropExports { drop }
        .parse_core_module(&mut out, wasmparser::Parser::new(0), module)
        .map_err(|e| format!("cannot re-encode the module: {e}"))?;
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
}

/// The filters of a workspace from `cargo metadata --no-deps --format-version 1`: every package
/// with a `cdylib` target, with its `[package.metadata.tollgate] http-callbacks` list.
///
/// # Errors
/// JSON that is not cargo's metadata; a `cdylib` package without the list (every filter must
/// say what it implements), or a list that is not an array of strings.
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
        let field = format!("{name}: [package.metadata.tollgate] http-callbacks");
        let list = package
            .pointer("/metadata/tollgate/http-callbacks")
            .ok_or_else(|| {
                format!("{field} is missing (the stream callbacks the filter implements)")
            })?
            .as_array()
            .ok_or_else(|| format!("{field} must be an array of callback names"))?;
        let callbacks = list
            .iter()
            .map(|c| c.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("{field} must be an array of callback names"))?;
        filters.push(Filter {
            package: name.to_owned(),
            file: format!("{}.wasm", lib.replace('-', "_")),
            callbacks,
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

    /// A module shaped like an SDK filter: memory, `malloc`, `_initialize`, and the callbacks
    /// (each a function of its own, as the SDK's are).
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
            functions.function(0);
            let mut f = Function::new([]);
            f.instruction(&Instruction::LocalGet(0));
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

    #[test]
    fn removes_only_the_stream_callbacks_not_kept() {
        let out = trim(&sdk_like(), &["request_headers", "log"]).unwrap();
        assert_eq!(
            export_names(&out).unwrap(),
            [
                "memory",
                "proxy_on_context_create",
                "proxy_on_request_headers",
                "proxy_on_log",
                "proxy_on_delete",
                "proxy_on_tick",
            ]
        );
    }

    #[test]
    fn keeping_nothing_leaves_context_create_and_delete() {
        let out = trim(&sdk_like(), &[]).unwrap();
        let names = export_names(&out).unwrap();
        assert!(names.contains(&"proxy_on_context_create".to_owned()));
        assert!(names.contains(&"proxy_on_delete".to_owned()));
        assert!(!names
            .iter()
            .any(|n| n.contains("headers") || n.contains("body")));
    }

    #[test]
    fn keeping_everything_is_the_same_module() {
        let module = sdk_like();
        assert_eq!(
            trim(&module, &HTTP_CALLBACKS).err(),
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
        assert_eq!(trim(&module, &exported).unwrap(), module);
    }

    #[test]
    fn filters_come_from_cdylib_packages_and_their_metadata() {
        let meta = br#"{"packages": [
            {"name": "tollgate-common", "targets": [{"name": "tollgate_common", "crate_types": ["lib"]}],
             "metadata": null},
            {"name": "tollgate-rate-limit",
             "targets": [{"name": "tollgate_rate_limit", "crate_types": ["cdylib", "rlib"]}],
             "metadata": {"tollgate": {"http-callbacks": ["request_headers", "response_headers"]}}}
        ]}"#;
        assert_eq!(
            filters_from_metadata(meta).unwrap(),
            [Filter {
                package: "tollgate-rate-limit".into(),
                file: "tollgate_rate_limit.wasm".into(),
                callbacks: vec!["request_headers".into(), "response_headers".into()],
            }]
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
        assert!(filters_from_metadata(b"[]").is_err());
    }

    #[test]
    fn unknown_or_missing_names_are_refused() {
        let err = trim(&sdk_like(), &["request_header"]).unwrap_err();
        assert!(
            err.starts_with("unknown callback \"request_header\""),
            "{err}"
        );
        assert!(trim(&sdk_like(), &["delete"]).is_err());
        assert!(trim(b"not wasm", &[]).is_err());
    }
}
