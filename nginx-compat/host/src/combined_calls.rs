//! One guest entry for callbacks the host makes back to back: an HTTP context's creation with
//! its first `proxy_on_request_headers`, and `proxy_on_log`, `proxy_on_done` and
//! `proxy_on_delete` at its end.
//!
//! Each entry into a guest costs the host wasmtime's entry and exit (its trap handler), the
//! loan of the stream and a deadline; the likely chain made 18 a request, 8 of them for
//! contexts' creation and deletion (`docs/performance.md`; combined: 12 entries, 1.3k
//! instructions a request fewer, `bench/results/history/instructions_issue34_session6.md`).
//! So every module gets an
//! adapter: a small module generated from the callbacks the filter implements for HTTP contexts
//! (its stubs skipped as everywhere, `stubs.rs`), instantiated in the same store with the
//! filter's exports as its imports, whose functions call them in order, wasm to wasm:
//! - `create_request_headers(context, root, headers, end_of_stream) -> action`:
//!   `proxy_on_context_create(context, root)`, then `proxy_on_request_headers`;
//! - `end(context, create, root)`: `proxy_on_context_create` first when `create` is 1 (a
//!   context that never got a callback), then `proxy_on_log`, `proxy_on_done` (its answer
//!   ignored, as before), `proxy_on_delete`, each only where the filter implements it.
//!
//! So [`crate::Vm::create_http`] only registers the context; the guest creates it on the
//! context's first callback, in the same entry where that is `proxy_on_request_headers` (the
//! order Envoy and the SDKs see is unchanged: creation, then the stream's callbacks, then log,
//! done, delete). The combined callbacks share one deadline (the call deadline, for all of them
//! together: stricter, never looser). Each starts from its own context as the effective one, as
//! in an entry of its own: `proxy_set_effective_context` raises the adapter's imported flag
//! `effective_moved`, and the adapter then calls the host's `reset_effective` before its next
//! callback (a paused request would otherwise have its call's response delivered to another
//! context, and hang: the nginx ABI fuzzer found it). A trap names the callback it happened in:
//! the adapter writes its step into its exported global `stage` before each call.

use wasmtime::{
    Caller, Extern, Func, Global, GlobalType, Instance, Mutability, Store, TypedFunc, Val, ValType,
};

use crate::abi::store::State;
use crate::error::Error;
use crate::stream::StreamCallback;

/// The callbacks a module implements for HTTP contexts, found once at link time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    create: bool,
    request_headers: bool,
    log: bool,
    done: bool,
    delete: bool,
}

/// The callbacks in the adapter's step order (`stage` 1 to 5), with their import names.
const STEPS: [&str; 5] = [
    "proxy_on_context_create",
    "proxy_on_request_headers",
    "proxy_on_log",
    "proxy_on_done",
    "proxy_on_delete",
];

/// `create_request_headers(context, root, headers, end_of_stream) -> action`.
pub(crate) type CreateRequestHeaders = TypedFunc<(u32, u32, u32, u32), u32>;
/// `end(context, create, root)`.
pub(crate) type End = TypedFunc<(u32, u32, u32), ()>;

impl Plan {
    /// What `module` exports as functions, less its stubs.
    pub(crate) fn of(module: &wasmtime::Module, stubs: &[StreamCallback]) -> Plan {
        let has =
            |name: &str| matches!(module.get_export(name), Some(wasmtime::ExternType::Func(_)));
        let live = |name: &str, cb: StreamCallback| has(name) && !stubs.contains(&cb);
        Plan {
            create: has("proxy_on_context_create"),
            request_headers: live("proxy_on_request_headers", StreamCallback::RequestHeaders),
            log: live("proxy_on_log", StreamCallback::Log),
            done: live("proxy_on_done", StreamCallback::Done),
            delete: has("proxy_on_delete"),
        }
    }

    fn steps(&self) -> [bool; 5] {
        [
            self.create,
            self.request_headers,
            self.log,
            self.done,
            self.delete,
        ]
    }

    /// The adapter's text (WebAssembly text format).
    fn wat(&self) -> String {
        const TYPES: [&str; 5] = [
            "(param i32 i32)",
            "(param i32 i32 i32) (result i32)",
            "(param i32)",
            "(param i32) (result i32)",
            "(param i32)",
        ];
        let mut out = String::from("(module\n");
        out.push_str("  (import \"host\" \"effective_moved\" (global $moved (mut i32)))\n");
        out.push_str("  (import \"host\" \"reset_effective\" (func $reset_effective))\n");
        for ((name, ty), live) in STEPS.iter().zip(TYPES).zip(self.steps()) {
            if live {
                out.push_str(&format!(
                    "  (import \"f\" \"{name}\" (func ${name} {ty}))\n"
                ));
            }
        }
        out.push_str("  (global $stage (export \"stage\") (mut i32) (i32.const 0))\n");
        let step = |n: usize, call: &str| {
            format!(
                "    (if (global.get $moved) (then (call $reset_effective)))\n    (global.set $stage (i32.const {n})) {call}\n"
            )
        };
        if self.create && self.request_headers {
            out.push_str("  (func (export \"create_request_headers\") (param $ctx i32) (param $root i32) (param $n i32) (param $eos i32) (result i32)\n");
            out.push_str(&step(
                1,
                "(call $proxy_on_context_create (local.get $ctx) (local.get $root))",
            ));
            out.push_str(&step(
                2,
                "(call $proxy_on_request_headers (local.get $ctx) (local.get $n) (local.get $eos))",
            ));
            out.push_str("  )\n");
        }
        out.push_str(
            "  (func (export \"end\") (param $ctx i32) (param $create i32) (param $root i32)\n",
        );
        if self.create {
            out.push_str("    (if (local.get $create) (then\n");
            out.push_str(&step(
                1,
                "(call $proxy_on_context_create (local.get $ctx) (local.get $root))",
            ));
            out.push_str("    ))\n");
        }
        if self.log {
            out.push_str(&step(3, "(call $proxy_on_log (local.get $ctx))"));
        }
        if self.done {
            out.push_str(&step(4, "(drop (call $proxy_on_done (local.get $ctx)))"));
        }
        if self.delete {
            out.push_str(&step(5, "(call $proxy_on_delete (local.get $ctx))"));
        }
        out.push_str("  )\n)\n");
        out
    }

    /// The adapter, compiled by `engine`.
    pub(crate) fn compile(&self, engine: &wasmtime::Engine) -> Result<wasmtime::Module, Error> {
        let wasm = wat::parse_str(self.wat())
            .map_err(|e| Error(format!("the callbacks' adapter does not parse: {e}")))?;
        wasmtime::Module::new(engine, wasm)
            .map_err(|e| Error::wasm("cannot compile the callbacks' adapter", &e))
    }

    /// Whether an HTTP context's `end` calls anything (`create`: its creation is pending).
    pub(crate) fn ends(&self, create: bool) -> bool {
        (create && self.create) || self.log || self.done || self.delete
    }

    /// Whether the module creates its HTTP contexts (exports `proxy_on_context_create`): only
    /// then is there a creation to defer.
    pub(crate) fn creates(&self) -> bool {
        self.create
    }
}

/// The adapter instantiated beside one instance of the filter.
pub(crate) struct Combined {
    /// `None`: the module lacks `proxy_on_context_create` or `proxy_on_request_headers`.
    pub(crate) create_request_headers: Option<CreateRequestHeaders>,
    pub(crate) end: End,
    stage: Global,
}

impl Combined {
    /// Instantiates `adapter` (compiled from `plan`) with `filter`'s exports as its imports.
    pub(crate) fn instantiate(
        store: &mut Store<State>,
        filter: &Instance,
        plan: &Plan,
        adapter: &wasmtime::Module,
    ) -> Result<Combined, Error> {
        let moved = Global::new(
            &mut *store,
            GlobalType::new(ValType::I32, Mutability::Var),
            Val::I32(0),
        )
        .map_err(|e| Error::wasm("the callbacks' adapter's flag", &e))?;
        store.data_mut().effective_moved = Some(moved);
        let reset = Func::wrap(&mut *store, |mut c: Caller<'_, State>| {
            let data = c.data_mut();
            data.set_effective(data.current);
            if let Some(moved) = data.effective_moved {
                // This store's i32 global: setting it cannot fail.
                let _ = moved.set(&mut c, Val::I32(0));
            }
        });
        let mut imports = vec![Extern::Global(moved), Extern::Func(reset)];
        for (name, live) in STEPS.iter().zip(plan.steps()) {
            if live {
                let f = filter
                    .get_func(&mut *store, name)
                    .ok_or_else(|| Error(format!("the module exports no function {name}")))?;
                imports.push(Extern::Func(f));
            }
        }
        let instance = Instance::new(&mut *store, adapter, &imports)
            .map_err(|e| Error::wasm("cannot instantiate the callbacks' adapter", &e))?;
        let typed_err = |e| Error::wasm("the callbacks' adapter", &e);
        let create_request_headers = match instance.get_func(&mut *store, "create_request_headers")
        {
            Some(f) => Some(f.typed(&*store).map_err(typed_err)?),
            None => None,
        };
        let end = instance
            .get_typed_func(&mut *store, "end")
            .map_err(typed_err)?;
        let stage = instance
            .get_global(&mut *store, "stage")
            .ok_or_else(|| Error("the callbacks' adapter has no stage".into()))?;
        Ok(Combined {
            create_request_headers,
            end,
            stage,
        })
    }

    /// The export that was running when the last combined call stopped (after a trap).
    pub(crate) fn stage_name(&self, store: &mut Store<State>) -> &'static str {
        let step = self.stage.get(&mut *store).i32().unwrap_or(0);
        usize::try_from(step)
            .ok()
            .and_then(|s| s.checked_sub(1))
            .and_then(|i| STEPS.get(i))
            .copied()
            .unwrap_or("the callbacks' adapter")
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::testing::wat_fixtures::{compile, wat, LOG};
    use crate::testing::MemoryHost;
    use crate::{Stream, Vm};

    /// A module whose HTTP callbacks log their names (`unreachable` in `trap`'s), with
    /// `proxy_on_request_headers` or without it.
    fn module(trap: &str, request_headers: bool) -> crate::Module {
        let callback = |name: &str, at: u32, len: u32, params: &str, result: &str| {
            // A context_create trap: for HTTP contexts only (their root, the 2nd argument, is set).
            let trap = match (name == trap, name) {
                (false, _) => "",
                (true, "context_create") => "(if (local.get 1) (then unreachable))",
                (true, _) => "unreachable",
            };
            let answer = if result.is_empty() {
                ""
            } else {
                "(i32.const 0)"
            };
            format!(
                r#"(func (export "proxy_on_{name}") {params} {result}
                     (drop (call $log (i32.const 2) (i32.const {at}) (i32.const {len}))) {trap} {answer})"#
            )
        };
        let mut body = String::from(
            r#"(data (i32.const 100) "context_create")
               (data (i32.const 120) "request_headers")
               (data (i32.const 140) "request_body")
               (data (i32.const 160) "log")
               (data (i32.const 170) "done")
               (data (i32.const 180) "delete")"#,
        );
        body.push_str(&callback("context_create", 100, 14, "(param i32 i32)", ""));
        if request_headers {
            body.push_str(&callback(
                "request_headers",
                120,
                15,
                "(param i32 i32 i32)",
                "(result i32)",
            ));
        }
        body.push_str(&callback(
            "request_body",
            140,
            12,
            "(param i32 i32 i32)",
            "(result i32)",
        ));
        body.push_str(&callback("log", 160, 3, "(param i32)", ""));
        body.push_str(&callback("done", 170, 4, "(param i32)", "(result i32)"));
        body.push_str(&callback("delete", 180, 6, "(param i32)", ""));
        compile(&wat("0_2_1", LOG, &body)).unwrap()
    }

    fn logged(host: &MemoryHost) -> Vec<String> {
        host.logs
            .borrow_mut()
            .drain(..)
            .map(|l| l.message)
            .collect()
    }

    /// The context is created with its first callback, in the same call as its request headers;
    /// log, done and delete follow at its end, in the order the ABI gives.
    #[test]
    fn a_context_is_created_with_its_first_callback_and_ended_in_order() {
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&module("", true), host.clone(), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        logged(&host);
        let id = vm.create_http(root).unwrap();
        assert!(
            logged(&host).is_empty(),
            "created before its first callback"
        );
        let mut s = Stream::default();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap();
        assert_eq!(logged(&host), ["context_create", "request_headers"]);
        vm.on_stream(StreamCallback::RequestBody, id, &mut s, true)
            .unwrap();
        assert_eq!(logged(&host), ["request_body"]);
        vm.on_log_and_delete(id, &mut s).unwrap();
        assert_eq!(logged(&host), ["log", "done", "delete"]);

        // A context that got no callback (an earlier filter answered) is created at its end.
        let id = vm.create_http(root).unwrap();
        vm.on_log_and_delete(id, &mut s).unwrap();
        assert_eq!(logged(&host), ["context_create", "log", "done", "delete"]);

        // Without request headers, the first callback the module implements creates it.
        let mut vm = Vm::new(&module("", false), host.clone(), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        logged(&host);
        let id = vm.create_http(root).unwrap();
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, false)
            .unwrap();
        assert!(logged(&host).is_empty());
        vm.on_stream(StreamCallback::RequestBody, id, &mut s, true)
            .unwrap();
        assert_eq!(logged(&host), ["context_create", "request_body"]);
    }

    /// A context the guest makes effective in one callback of a combined call does not carry
    /// into the next (each starts from its own, as in an entry of its own): here the creation
    /// switches to the other plugin's root and logs under it; the request headers then log
    /// under their own plugin again.
    #[test]
    fn each_callback_starts_from_its_own_effective_context() {
        let imports = format!(
            r#"{LOG} (import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))"#
        );
        let m = compile(&wat(
            "0_2_1",
            &imports,
            r#"(data (i32.const 100) "create")
               (data (i32.const 110) "headers")
               (func (export "proxy_on_context_create") (param i32 i32)
                 (if (local.get 1) (then
                   (drop (call $eff (i32.const 2)))
                   (drop (call $log (i32.const 2) (i32.const 100) (i32.const 6))))))
               (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                 (drop (call $log (i32.const 2) (i32.const 110) (i32.const 7)))
                 (i32.const 0))
               (func (export "proxy_on_delete") (param i32))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        let p = vm.create_root("p", b"").unwrap();
        vm.create_root("q", b"").unwrap();
        let id = vm.create_http(p).unwrap();
        let mut s = Stream::default();
        for _ in 0..2 {
            vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
                .unwrap();
        }
        let lines: Vec<(String, String)> = host
            .logs
            .borrow()
            .iter()
            .map(|l| (l.plugin.clone(), l.message.clone()))
            .collect();
        let want = |p: &str, m: &str| (p.to_string(), m.to_string());
        assert_eq!(
            lines,
            [
                want("q", "create"),
                want("p", "headers"),
                want("p", "headers")
            ]
        );
    }

    /// A trap in a combined call names the callback it happened in, and poisons the instance.
    #[test]
    fn a_trap_names_the_callback_it_happened_in() {
        for trap in ["context_create", "request_headers", "log", "done", "delete"] {
            let host = Rc::new(MemoryHost::new());
            let mut vm = Vm::new(&module(trap, true), host.clone(), "vm", b"").unwrap();
            let root = vm.create_root("p", b"").unwrap();
            let id = vm.create_http(root).unwrap();
            let mut s = Stream::default();
            let err = match vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true) {
                Err(e) => e,
                Ok(_) => vm.on_log_and_delete(id, &mut s).unwrap_err(),
            };
            assert!(
                err.0.starts_with(&format!("proxy_on_{trap}: wasm trap")),
                "{trap}: {err}"
            );
            assert!(vm.is_poisoned(), "{trap}");
        }
    }

    #[test]
    fn the_adapter_calls_only_what_the_filter_implements() {
        let all = Plan {
            create: true,
            request_headers: true,
            log: true,
            done: true,
            delete: true,
        };
        let text = all.wat();
        for name in STEPS {
            assert!(text.contains(&format!("call ${name}")), "{text}");
        }
        let bare = Plan {
            request_headers: false,
            log: false,
            done: false,
            ..all
        };
        let text = bare.wat();
        assert!(!text.contains("create_request_headers"), "{text}");
        assert!(
            !text.contains("proxy_on_log") && !text.contains("proxy_on_done"),
            "{text}"
        );
        assert!(text.contains("call $proxy_on_delete"), "{text}");
        let engine = wasmtime::Engine::default();
        for plan in [all, bare] {
            plan.compile(&engine).unwrap();
        }
    }
}
