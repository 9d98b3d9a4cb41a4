//! Compiling modules: [`Engine`] and [`Module`].

use rayon::prelude::*;
use wasmtime::InstancePre;

use crate::abi::store::State;
use crate::combined_calls::Plan;
use crate::compiled_cache::{CacheNote, CompiledCache};
use crate::error::Error;
use crate::limits::EpochTicker;
use crate::link;
use crate::stubs;

/// The proxy-wasm ABI version a module exports (`proxy_abi_version_0_2_1` or `_0_2_0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiVersion {
    V0_2_0,
    V0_2_1,
}

/// The environment variable that makes [`Engine::new`] write a perf map (`/tmp/perf-<pid>.map`,
/// one line per compiled function: address, size, name from the module's `name` section), as
/// wasmtime's `--profile perfmap` does. Any non-empty value. Off by default: it writes a file.
pub const PERF_MAP_ENV: &str = "TOLLGATE_WASM_PERFMAP";

/// Compiles modules. One per process (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    engine: wasmtime::Engine,
}

/// A compiled module (cheap to clone): the wasmtime module pre-linked with the host functions.
#[derive(Clone)]
pub struct Module {
    pub(crate) pre: InstancePre<State>,
    abi: AbiVersion,
    /// The stream callbacks exported as constant stubs, skipped like missing ones (stubs.rs).
    pub(crate) stubs: Vec<crate::stream::StreamCallback>,
    /// The HTTP callbacks it implements, and the adapter that calls them back to back
    /// (combined_calls.rs).
    pub(crate) plan: Plan,
    pub(crate) adapter: wasmtime::Module,
}

impl Engine {
    /// Cranelift at opt level `speed` (a perf map when [`PERF_MAP_ENV`] is set), a module's
    /// functions compiled in parallel (wasmtime's `parallel-compilation`) on a thread pool that
    /// lives only for the call ([`compile_pool`]: no thread is left when nginx's master forks),
    /// signals-based traps (guard pages instead of bounds checks).
    pub fn new() -> Result<Engine, Error> {
        let mut config = wasmtime::Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        config.parallel_compilation(true);
        // For profilers: the compiled functions' names and addresses in /tmp/perf-<pid>.map
        // (bench/instructions.py attributes the wasm code's instructions to filters with it).
        if std::env::var_os(PERF_MAP_ENV).is_some_and(|v| !v.is_empty()) {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        // Every call into a guest has a deadline (limits.rs): compiled code checks the epoch.
        config.epoch_interruption(!cfg!(feature = "unbounded-guests"));
        let engine =
            wasmtime::Engine::new(&config).map_err(|e| Error::wasm("wasmtime engine", &e))?;
        Ok(Engine { engine })
    }

    /// Starts a thread that advances this engine's epoch every [`EPOCH_TICK`] until the
    /// returned ticker is dropped: the clock of every guest deadline ([`GuestLimits`]).
    pub fn start_epoch_ticker(&self) -> Result<EpochTicker, Error> {
        EpochTicker::start(self.engine.clone())
    }

    /// Compile a `.wasm` file; checks that it exports a supported proxy-wasm ABI version and
    /// that every import can be linked (see [`Engine::compile`]).
    pub fn compile_file(&self, path: &std::path::Path) -> Result<Module, Error> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error(format!("cannot read {}: {e}", path.display())))?;
        self.compile(&bytes)
            .map_err(|e| Error(format!("{}: {}", path.display(), e.0)))
    }

    /// Compile a module from its binary ([`Engine::compile_all`] for one module). Errors: not
    /// Wasm, no `proxy_abi_version_0_2_1` / `proxy_abi_version_0_2_0` export (0.1.0 is not
    /// supported), no exported `memory`, or an import outside the modules `env` (unknown names
    /// there are linked to a stub returning `Unimplemented`) and `wasi_snapshot_preview1`
    /// (unknown names return `ENOSYS`), or an import whose type differs from the ABI's; no
    /// thread could be started for the compilation.
    pub fn compile(&self, wasm: &[u8]) -> Result<Module, Error> {
        self.compile_all(&[wasm], None)
            .pop()
            .unwrap_or_else(|| Err(Error("no compilation result".into())))
            .map(|(module, _)| module)
    }

    /// Compiles every module of `wasms` and links each with the host functions: the modules
    /// side by side and each module's functions in parallel, as tasks of one pool whose threads
    /// have all ended before this returns ([`compile_pool`], so it is still safe in the nginx
    /// master before fork).
    /// With `cache`, a module whose compiled code is there is loaded instead
    /// ([`CompiledCache`]), and each result comes with what the cache did, for the log.
    /// Results in `wasms`' order.
    ///
    /// # Errors
    /// Per module: it does not compile, is not a proxy-wasm module (ABI 0.2.1 or 0.2.0, a
    /// memory named `memory`), imports what the host does not offer; for all: no thread could
    /// be started.
    pub fn compile_all(
        &self,
        wasms: &[&[u8]],
        cache: Option<&CompiledCache>,
    ) -> Vec<Result<(Module, Option<CacheNote>), Error>> {
        let one = |wasm: &&[u8]| self.compile_one(wasm, cache);
        match compile_pool(|| wasms.par_iter().map(one).collect()) {
            Ok(modules) => modules,
            Err(e) => wasms.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// The module of `wasm`: from `cache` when given (with what it did), else compiled; checked
    /// ([`abi_of`]), linked with the host functions, its adapter compiled. Runs on the pool of
    /// [`compile_pool`].
    fn compile_one(
        &self,
        wasm: &[u8],
        cache: Option<&CompiledCache>,
    ) -> Result<(Module, Option<CacheNote>), Error> {
        let (module, note) = match cache {
            Some(c) => c
                .load_or_compile(&self.engine, wasm)
                .map(|(m, note)| (m, Some(note))),
            None => wasmtime::Module::new(&self.engine, wasm).map(|m| (m, None)),
        }
        .map_err(|e| Error::wasm("cannot compile the module", &e))?;
        let abi = abi_of(&module)?;
        let linker = link::linker(&self.engine, &module)?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| Error::wasm("cannot link the module", &e))?;
        let stubs = stubs::stub_callbacks(wasm);
        let plan = Plan::of(&module, &stubs);
        let adapter = plan.compile(&self.engine)?;
        let module = Module {
            pre,
            abi,
            stubs,
            plan,
            adapter,
        };
        Ok((module, note))
    }
}

/// The proxy-wasm ABI version `module` exports; also checks that it exports a memory named
/// `memory`.
///
/// # Errors
/// ABI 0.1.0, no ABI version export, or no memory export.
fn abi_of(module: &wasmtime::Module) -> Result<AbiVersion, Error> {
    let has = |name: &str| matches!(module.get_export(name), Some(wasmtime::ExternType::Func(_)));
    let abi = if has("proxy_abi_version_0_2_1") {
        AbiVersion::V0_2_1
    } else if has("proxy_abi_version_0_2_0") {
        AbiVersion::V0_2_0
    } else if has("proxy_abi_version_0_1_0") {
        return Err(Error(
            "proxy-wasm ABI 0.1.0 is not supported (0.2.0 and 0.2.1 are)".into(),
        ));
    } else {
        return Err(Error(
            "not a proxy-wasm module: no proxy_abi_version_0_2_1 or proxy_abi_version_0_2_0 export"
                .into(),
        ));
    };
    if !matches!(
        module.get_export("memory"),
        Some(wasmtime::ExternType::Memory(_))
    ) {
        return Err(Error(
            "the module exports no memory named \"memory\"".into(),
        ));
    }
    Ok(abi)
}

/// The stack of each compilation thread (bytes): 8 MiB, what a process's main thread gets.
const COMPILE_STACK: usize = 8 << 20;

/// Runs `compile` on a rayon thread pool of [`std::thread::available_parallelism`] threads
/// that exists only for this call: wasmtime's `parallel-compilation` compiles a module's
/// functions on the pool it runs in, and this pool's threads are told to stop and joined
/// (`pthread_join`) before it returns, where rayon's global pool would keep its threads for the
/// life of the process, across nginx's fork. Every compilation of the engine goes through here,
/// and parallel work inside it must use this pool (rayon's iterators, not threads of its own:
/// theirs would reach for the global pool).
///
/// # Errors
/// The pool's threads could not be started.
fn compile_pool<R: Send>(compile: impl FnOnce() -> R + Send) -> Result<R, Error> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let handles = std::sync::Mutex::new(Vec::new());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tollgate-compile-{i}"))
        // A main thread's stack (reserved, not committed): work stealing can run a module's
        // compilation on top of another's on one thread.
        .stack_size(COMPILE_STACK)
        .spawn_handler(|thread| {
            let mut builder = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                builder = builder.name(name.to_owned());
            }
            let handle = builder.spawn(|| thread.run())?;
            if let Ok(mut handles) = handles.lock() {
                handles.push(handle);
            }
            Ok(())
        })
        .build();
    // The pool is dropped at the closure's end, which tells its threads to stop.
    let result = pool.map(|pool| pool.install(compile));
    for handle in handles.into_inner().unwrap_or_default() {
        // A thread that panicked has ended all the same.
        let _ = handle.join();
    }
    result.map_err(|e| Error(format!("cannot start the compilation threads: {e}")))
}

impl Module {
    /// The ABI version the module exports.
    pub fn abi_version(&self) -> AbiVersion {
        self.abi
    }
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat, LOG};
    use crate::testing::MemoryHost;
    use crate::{AbiVersion, LogLevel, Vm};

    #[test]
    fn abi_0_2_0_is_detected_and_runs() {
        let m = compile(&wat(
            "0_2_0",
            LOG,
            r#"(data (i32.const 100) "configured")
               (func (export "proxy_on_context_create") (param i32 i32))
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (drop (call $log (i32.const 2) (i32.const 100) (i32.const 10)))
                 (i32.const 1))"#,
        ))
        .unwrap();
        assert_eq!(m.abi_version(), AbiVersion::V0_2_0);
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("p", b"{}").unwrap();
        let logs = host.logs.borrow();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].message, "configured");
        assert_eq!(logs[0].plugin, "p");
        assert_eq!(logs[0].level, LogLevel::Info);
    }
    #[test]
    fn compile_all_gives_each_modules_result_in_order_and_reuses_compiled_code() {
        let a = wat("0_2_1", "", "");
        let b = wat("0_2_0", "", "");
        let dir = std::env::temp_dir().join(format!("tollgate-compile-all-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = crate::CompiledCache::new(&dir);
        let engine = crate::Engine::new().unwrap();
        let wasms: [&[u8]; 3] = [&a, b"not wasm", &b];
        for reused in [false, true] {
            let r = engine.compile_all(&wasms, Some(&cache));
            assert_eq!(r.len(), 3);
            let (m, note) = r[0].as_ref().unwrap();
            assert_eq!(m.abi_version(), AbiVersion::V0_2_1);
            assert_eq!(note.as_ref().unwrap().reused, reused);
            assert!(r[1].as_ref().err().unwrap().0.contains("cannot compile"));
            let (m, note) = r[2].as_ref().unwrap();
            assert_eq!(m.abi_version(), AbiVersion::V0_2_0);
            assert_eq!(note.as_ref().unwrap().reused, reused);
        }
        // Without a cache: compiled, no note.
        let r = engine.compile_all(&wasms, None);
        assert!(r[0].as_ref().unwrap().1.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn non_proxy_wasm_and_old_abi_are_refused() {
        let err = compile(&wat::parse_str(r#"(module (memory (export "memory") 1))"#).unwrap())
            .err()
            .unwrap();
        assert!(err.0.contains("proxy_abi_version"), "{err}");
        let err = compile(&wat("0_1_0", "", "")).err().unwrap();
        assert!(err.0.contains("0.1.0"), "{err}");
        assert!(compile(b"not wasm").is_err());
    }
}
