//! The shared core of the proxy-wasm host functions: the `Store`'s state ([`State`]: contexts,
//! the loaded stream, pending calls), the status codes returned to the guest, guest memory
//! access ([`ms`], [`return_with`] and friends), the checks on what a guest may write
//! ([`refused_field`], [`refused_map`], [`refused_growth`]) and [`Def`], which records each
//! definition for the linker. Every ABI area (`abi/*.rs`) and WASI (`wasi.rs`) build on this
//! only. Spec: <https://github.com/proxy-wasm/spec/tree/main/abi-versions/v0.2.1>; the
//! serialization and the status codes the SDKs accept follow proxy-wasm-rust-sdk 0.2's
//! `hostcalls.rs`. Every guest pointer is bounds-checked (`InvalidMemoryAccess`); data returned
//! to the guest is allocated with its `proxy_on_memory_allocate` (or `malloc`) export.

use std::collections::HashSet;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use wasmtime::{Caller, Linker, Memory, TypedFunc};

use crate::context_ids::HttpId;
use crate::embedder::{Host, HttpCallResponse, LogLevel, Status};
use crate::error::Error;
use crate::header_map::HeaderMap;
use crate::limits::Limiter;
use crate::mem;
use crate::stream::Stream;
use crate::valid;

pub(crate) const OK: u32 = 0;
pub(crate) const NOT_FOUND: u32 = Status::NotFound as u32;
pub(crate) const BAD_ARGUMENT: u32 = Status::BadArgument as u32;
pub(crate) const INVALID_MEMORY_ACCESS: u32 = 6;
pub(crate) const INTERNAL_FAILURE: u32 = Status::InternalFailure as u32;
pub(crate) const UNIMPLEMENTED: u32 = Status::Unimplemented as u32;

pub(crate) fn code(s: Status) -> u32 {
    s as u32
}

/// A root context: the plugin it belongs to.
pub(crate) struct RootInfo {
    pub(crate) id: u32,
    pub(crate) plugin_name: String,
    pub(crate) configuration: Vec<u8>,
    pub(crate) tick_ms: u32,
}

/// A context's entry in [`State::contexts`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContextEntry {
    /// The index of its root in `roots` (a root's own).
    pub(crate) root_index: usize,
    /// An HTTP context whose `proxy_on_context_create` has not run yet: it runs with the
    /// context's first callback (`combined_calls.rs`).
    pub(crate) pending_create: bool,
}

/// The `Store`'s data: everything host functions see.
pub(crate) struct State {
    pub(crate) host: Rc<dyn Host>,
    /// The stream of the running HTTP callback, lent by the embedding for that call
    /// (`crate::vm`'s `enter`, through [`LentStream`]); null outside one. Read through
    /// [`State::stream`]: a pointer, not a copy, because the stream (hundreds of bytes) would
    /// otherwise be moved in and out of the store on every call into the guest.
    lent_stream: *mut Stream,
    /// The stream root callbacks see: empty, cleared after each.
    pub(crate) idle_stream: Stream,
    pub(crate) memory: Option<Memory>,
    pub(crate) malloc: Option<Rc<TypedFunc<u32, u32>>>,
    /// The callbacks' adapter's flag (`combined_calls.rs`): set to 1 when the guest changes its
    /// effective context, so that the adapter has the host reset it before its next callback.
    pub(crate) effective_moved: Option<wasmtime::Global>,
    pub(crate) vm_id: String,
    pub(crate) vm_config: Vec<u8>,
    pub(crate) roots: Vec<RootInfo>,
    /// Every live context, root and HTTP, by id.
    pub(crate) contexts: FxHashMap<u32, ContextEntry>,
    /// The context of the running callback (0: none).
    pub(crate) current: u32,
    /// The effective context (`proxy_set_effective_context`), initially `current`.
    pub(crate) effective: u32,
    /// Index in `roots` of the effective context's root.
    pub(crate) root_index: usize,
    /// The response an `on_http_call_response` callback sees.
    pub(crate) call_response: Option<HttpCallResponse>,
    pub(crate) next_token: u32,
    /// Pending HTTP calls: token to the context that dispatched it.
    pub(crate) calls: FxHashMap<u32, u32>,
    /// HTTP and gRPC calls dispatched since the instance started (wrapping): an embedding
    /// compares it around a callback to learn that the callback dispatched one
    /// ([`crate::Vm::calls_dispatched`]).
    pub(crate) dispatched: u64,
    /// Pending unary gRPC calls: token (1 mod 4, see `abi::grpc_calls`) to the root context
    /// that owns it (proxy-wasm-cpp-host makes every call on the effective context's root) and
    /// the context that dispatched it (whose request's stream the embedding may load).
    pub(crate) grpc_calls: FxHashMap<u32, (u32, u32)>,
    pub(crate) next_grpc_token: u32,
    /// The reply message a `proxy_on_grpc_receive` callback sees (buffer type 5).
    pub(crate) grpc_receive: Option<Vec<u8>>,
    /// What `proxy_get_status` returns: the status and message of the `proxy_on_grpc_close`
    /// being delivered (the message is cleared after it, the code kept, as Envoy does).
    pub(crate) grpc_status: (u32, Vec<u8>),
    /// Registered shared queues: id to the root context that registered it.
    pub(crate) queues: FxHashMap<u32, u32>,
    pub(crate) resumed: Vec<HttpId>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    /// A reused buffer: the answer of `tollgate.get_values` as it is assembled
    /// (`abi::foreign_functions`; taken for the call).
    pub(crate) values_out: Vec<u8>,
    /// A reused buffer: the value `proxy_get_shared_data` or `proxy_get_property` returns, or
    /// where `tollgate.get_values` reads a property source's value (taken for the call: a
    /// nested call gets an empty one).
    pub(crate) value: Vec<u8>,
    /// The lower-case name of the header `proxy_get_header_map_value` returns from a deferred
    /// map (read again after the guest's allocator ran).
    pub(crate) header_key: Vec<u8>,
    /// A reused buffer: a deferred header map serialized for `proxy_get_header_map_pairs`.
    pub(crate) pairs: crate::mem::Pairs,
    /// The instance's memory and table caps (the store's `ResourceLimiter`).
    pub(crate) limiter: Limiter,
}

impl State {
    pub(crate) fn new(
        host: Rc<dyn Host>,
        vm_id: &str,
        vm_config: &[u8],
        limiter: Limiter,
    ) -> State {
        State {
            host,
            limiter,
            lent_stream: std::ptr::null_mut(),
            idle_stream: Stream::default(),
            memory: None,
            malloc: None,
            effective_moved: None,
            vm_id: vm_id.to_owned(),
            vm_config: vm_config.to_vec(),
            roots: Vec::new(),
            contexts: FxHashMap::default(),
            current: 0,
            effective: 0,
            root_index: usize::MAX,
            call_response: None,
            next_token: 1,
            calls: FxHashMap::default(),
            dispatched: 0,
            grpc_calls: FxHashMap::default(),
            next_grpc_token: 1,
            grpc_receive: None,
            grpc_status: (0, Vec::new()),
            queues: FxHashMap::default(),
            resumed: Vec::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            values_out: Vec::new(),
            value: Vec::new(),
            header_key: Vec::new(),
            pairs: crate::mem::Pairs::default(),
        }
    }

    /// The stream of the running HTTP callback, or the empty `idle_stream` in a root callback.
    #[allow(unsafe_code)]
    pub(crate) fn stream(&self) -> &Stream {
        // SAFETY: `lent_stream` is null or the stream `LentStream` lends for the call under
        // way, which its lender does not touch until the call returns and the loan ends.
        match unsafe { self.lent_stream.as_ref() } {
            Some(stream) => stream,
            None => &self.idle_stream,
        }
    }

    /// [`State::stream`], to change.
    #[allow(unsafe_code)]
    pub(crate) fn stream_mut(&mut self) -> &mut Stream {
        // SAFETY: as in `stream`; `&mut self` makes this the only reference through the state.
        match unsafe { self.lent_stream.as_mut() } {
            Some(stream) => stream,
            None => &mut self.idle_stream,
        }
    }

    /// Whether an HTTP callback's stream is lent (not a root callback's empty one).
    pub(crate) fn stream_loaded(&self) -> bool {
        !self.lent_stream.is_null()
    }

    pub(crate) fn add_root(&mut self, id: u32, plugin_name: &str, configuration: &[u8]) {
        self.roots.push(RootInfo {
            id,
            plugin_name: plugin_name.to_owned(),
            configuration: configuration.to_vec(),
            tick_ms: 0,
        });
        let index = self.roots.len().saturating_sub(1);
        self.contexts.insert(
            id,
            ContextEntry {
                root_index: index,
                pending_create: false,
            },
        );
    }

    /// Forgets a root whose creation failed (its slot in `roots` stays, renamed, so indexes
    /// of other roots remain valid).
    pub(crate) fn remove_root(&mut self, id: u32) {
        self.contexts.remove(&id);
        self.queues.retain(|_, root| *root != id);
        self.calls.retain(|_, ctx| *ctx != id);
        self.grpc_calls.retain(|_, (root, _)| *root != id);
        if let Some(r) = self.roots.iter_mut().find(|r| r.id == id) {
            r.configuration = Vec::new();
            r.tick_ms = 0;
            tick_periods_changed();
        }
    }

    /// Registers HTTP context `id` of root `root`; `pending_create`: its
    /// `proxy_on_context_create` is still to run.
    pub(crate) fn add_http(&mut self, id: u32, root: u32, pending_create: bool) {
        if let Some(&ContextEntry { root_index, .. }) = self.contexts.get(&root) {
            self.contexts.insert(
                id,
                ContextEntry {
                    root_index,
                    pending_create,
                },
            );
        }
    }

    /// The root id of HTTP context `id` when its `proxy_on_context_create` is pending, which
    /// it no longer is after this call (the caller runs it).
    pub(crate) fn take_pending_create(&mut self, id: u32) -> Option<u32> {
        let entry = self.contexts.get_mut(&id)?;
        if !entry.pending_create {
            return None;
        }
        entry.pending_create = false;
        let index = entry.root_index;
        self.roots.get(index).map(|r| r.id)
    }

    /// Makes context `id` the effective one (its root's index with it); false, and nothing
    /// changed, when there is no such context.
    pub(crate) fn set_effective(&mut self, id: u32) -> bool {
        match self.contexts.get(&id) {
            Some(e) => {
                self.effective = id;
                self.root_index = e.root_index;
                true
            }
            None => false,
        }
    }

    pub(crate) fn is_root(&self, id: u32) -> bool {
        match self.contexts.get(&id) {
            Some(e) => self.roots.get(e.root_index).is_some_and(|r| r.id == id),
            None => false,
        }
    }

    pub(crate) fn root_name(&self, id: u32) -> &str {
        self.roots
            .iter()
            .find(|r| r.id == id)
            .map_or("", |r| r.plugin_name.as_str())
    }

    pub(crate) fn tick_period(&self, id: u32) -> u32 {
        if !self.is_root(id) {
            return 0;
        }
        self.roots
            .iter()
            .find(|r| r.id == id)
            .map_or(0, |r| r.tick_ms)
    }

    pub(crate) fn root(&self) -> Option<&RootInfo> {
        self.roots.get(self.root_index)
    }

    pub(crate) fn plugin_name(&self) -> &str {
        self.root().map_or("", |r| r.plugin_name.as_str())
    }

    pub(crate) fn log(&self, level: LogLevel, message: &[u8]) {
        if level >= self.host.log_level() {
            self.host
                .log(level, self.plugin_name(), &String::from_utf8_lossy(message));
        }
    }
}

pub(crate) type C<'a> = Caller<'a, State>;
pub(crate) type R = wasmtime::Result<u32>;

/// The guest memory and the state, borrowed together.
pub(crate) fn ms<'a>(caller: &'a mut C<'_>) -> Option<(&'a mut [u8], &'a mut State)> {
    let memory = caller.data().memory?;
    Some(memory.data_and_store_mut(caller))
}

pub(crate) fn eq_name(a: &[u8], b: &[u8]) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Returns `len` bytes to the guest: allocates them with the guest's allocator, lets `fill`
/// write them (from the state), and stores the pointer and size at `ret_ptr` / `ret_size`.
/// A zero length returns a null pointer without allocating (as Envoy does). The allocator is
/// guest code and may call the host first, changing what `fill` copies (the header, property,
/// effective root...): `fill` then returns `None` (see [`mem::copy`]), and so does this
/// (`InternalFailure`), rather than copying something of another length.
pub(crate) fn return_with(
    caller: &mut C<'_>,
    ret_ptr: u32,
    ret_size: u32,
    len: usize,
    fill: impl FnOnce(&mut [u8], &State) -> Option<()>,
) -> R {
    let Ok(len32) = u32::try_from(len) else {
        return Ok(INTERNAL_FAILURE);
    };
    let mut addr = 0u32;
    if len32 > 0 {
        let Some(malloc) = caller.data().malloc.clone() else {
            return Ok(INTERNAL_FAILURE);
        };
        addr = malloc.call(&mut *caller, len32)?;
        if addr == 0 {
            return Ok(INTERNAL_FAILURE);
        }
    }
    let Some((mem, state)) = ms(caller) else {
        return Ok(INTERNAL_FAILURE);
    };
    if len32 > 0 {
        let Some(dst) = mem::slice_mut(mem, addr, len) else {
            return Ok(INVALID_MEMORY_ACCESS);
        };
        if fill(dst, state).is_none() {
            return Ok(INTERNAL_FAILURE);
        }
    }
    if mem::write_u32(mem, ret_ptr, addr) && mem::write_u32(mem, ret_size, len32) {
        Ok(OK)
    } else {
        Ok(INVALID_MEMORY_ACCESS)
    }
}

/// Largest buffer the store keeps for the next call ([`keep_buffer`]), in bytes.
pub(crate) const KEPT_BUFFER_BYTES: usize = 64 * 1024;

/// `buf` to be kept in the state for the next call: as it is, or an empty one when it grew
/// past [`KEPT_BUFFER_BYTES`] (one large value read once is not held for the VM's life).
pub(crate) fn keep_buffer(buf: Vec<u8>) -> Vec<u8> {
    if buf.capacity() > KEPT_BUFFER_BYTES {
        Vec::new()
    } else {
        buf
    }
}

/// Returns owned bytes to the guest (see [`return_with`]).
pub(crate) fn return_bytes(caller: &mut C<'_>, ret_ptr: u32, ret_size: u32, bytes: &[u8]) -> R {
    return_with(caller, ret_ptr, ret_size, bytes.len(), |dst, _| {
        dst.copy_from_slice(bytes);
        Some(())
    })
}

/// Writes `bytes` at `ptr` in guest memory; false when out of bounds.
pub(crate) fn put(caller: &mut C<'_>, ptr: u32, bytes: &[u8]) -> bool {
    match ms(caller) {
        Some((m, _)) => mem::write(m, ptr, bytes),
        None => false,
    }
}

/// Writes a `u32` result; `InvalidMemoryAccess` when out of bounds.
pub(crate) fn return_u32(caller: &mut C<'_>, ptr: u32, v: u32) -> u32 {
    if put(caller, ptr, &v.to_le_bytes()) {
        OK
    } else {
        INVALID_MEMORY_ACCESS
    }
}

/// Writes a `u64` result; `InvalidMemoryAccess` when out of bounds.
pub(crate) fn return_u64(caller: &mut C<'_>, ptr: u32, v: u64) -> u32 {
    if put(caller, ptr, &v.to_le_bytes()) {
        OK
    } else {
        INVALID_MEMORY_ACCESS
    }
}

/// A guest string (lossy UTF-8 is not accepted: names must be UTF-8).
pub(crate) fn guest_str(caller: &mut C<'_>, ptr: u32, len: u32) -> Result<String, u32> {
    let (mem, _) = ms(caller).ok_or(INTERNAL_FAILURE)?;
    let b = mem::slice(mem, ptr, len).ok_or(INVALID_MEMORY_ACCESS)?;
    String::from_utf8(b.to_vec()).map_err(|_| BAD_ARGUMENT)
}

pub(crate) fn status_of(r: Result<(), Status>) -> u32 {
    match r {
        Ok(()) => OK,
        Err(s) => code(s),
    }
}

/// `Some(BadArgument)` (logged at warn, the bytes escaped) when a guest may not write the
/// field `k: v` (see [`valid`]); `None` when it may.
pub(crate) fn refused_field(state: &State, func: &str, k: &[u8], v: &[u8]) -> Option<u32> {
    let why = if !valid::name(k) {
        "its name is not an RFC 9110 token"
    } else if !valid::value(v) {
        "its value contains CR, LF or NUL"
    } else {
        return None;
    };
    let msg = format!("{func}: refused the field \"{}\": {why}", k.escape_ascii());
    state.log(LogLevel::Warn, msg.as_bytes());
    Some(BAD_ARGUMENT)
}

/// [`refused_field`] for every pair of `m`, and `BadArgument` (logged) when `m` holds more
/// than [`valid::MAX_MAP_BYTES`].
pub(crate) fn refused_map(state: &State, func: &str, m: &HeaderMap) -> Option<u32> {
    if let Some(code) = m.iter().find_map(|(k, v)| refused_field(state, func, k, v)) {
        return Some(code);
    }
    if valid::map_bytes(m) > valid::MAX_MAP_BYTES {
        let msg = format!("{func}: refused: more than {} bytes", valid::MAX_MAP_BYTES);
        state.log(LogLevel::Warn, msg.as_bytes());
        return Some(BAD_ARGUMENT);
    }
    None
}

/// `BadArgument` (logged) when adding `extra` bytes to `current` would pass
/// [`valid::MAX_MAP_BYTES`].
pub(crate) fn refused_growth(
    state: &State,
    func: &str,
    current: usize,
    extra: usize,
) -> Option<u32> {
    if current.saturating_add(extra) <= valid::MAX_MAP_BYTES {
        return None;
    }
    let msg = format!("{func}: refused: more than {} bytes", valid::MAX_MAP_BYTES);
    state.log(LogLevel::Warn, msg.as_bytes());
    Some(BAD_ARGUMENT)
}

/// A stream lent to a store for one call into the guest: the host functions of that call see
/// it through [`State::stream`]. The loan ends when this is dropped (after the call, or when it
/// unwinds), so the store never keeps a pointer to a stream past the call.
pub(crate) struct LentStream<'s> {
    pub(crate) store: &'s mut wasmtime::Store<State>,
}

impl<'s> LentStream<'s> {
    /// Lends `stream` to `store` until the returned loan is dropped; `stream` stays borrowed
    /// as long.
    pub(crate) fn new(
        store: &'s mut wasmtime::Store<State>,
        stream: &'s mut Stream,
    ) -> LentStream<'s> {
        store.data_mut().lent_stream = stream;
        LentStream { store }
    }
}

impl Drop for LentStream<'_> {
    fn drop(&mut self) {
        self.store.data_mut().lent_stream = std::ptr::null_mut();
    }
}

/// Records defined names, to link the other imports of `env` to stubs.
pub(crate) struct Def<'a> {
    linker: &'a mut Linker<State>,
    /// The `(module, name)` pairs defined so far.
    pub(crate) names: HashSet<(&'static str, &'static str)>,
}

impl<'a> Def<'a> {
    /// Records definitions into `linker`.
    pub(crate) fn new(linker: &'a mut Linker<State>) -> Def<'a> {
        Def {
            linker,
            names: HashSet::new(),
        }
    }
}

impl Def<'_> {
    pub(crate) fn env<Params, Args>(
        &mut self,
        name: &'static str,
        f: impl wasmtime::IntoFunc<State, Params, Args>,
    ) -> Result<(), Error> {
        self.module("env", name, f)
    }

    pub(crate) fn module<Params, Args>(
        &mut self,
        module: &'static str,
        name: &'static str,
        f: impl wasmtime::IntoFunc<State, Params, Args>,
    ) -> Result<(), Error> {
        self.linker
            .func_wrap(module, name, f)
            .map_err(|e| Error::wasm(&format!("cannot define {module}.{name}"), &e))?;
        self.names.insert((module, name));
        Ok(())
    }
}

/// Wall clock, nanoseconds since the Unix epoch.
pub(crate) fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Def<'_> {
    /// Defines `name` in WASI's module `wasi_snapshot_preview1`.
    pub(crate) fn wasi_func<Params, Args>(
        &mut self,
        name: &'static str,
        f: impl wasmtime::IntoFunc<State, Params, Args>,
    ) -> Result<(), Error> {
        self.module("wasi_snapshot_preview1", name, f)
    }
}

/// Counts the changes of any root context's tick period in this process (a set period, a
/// forgotten root, a `Vm` dropped), so that an embedding re-reads the periods only when this
/// moved: O(1) per request instead of a walk over every root.
static TICK_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Marks the tick periods changed (see [`tick_generation`]).
pub(crate) fn tick_periods_changed() {
    TICK_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The number of changes of the tick periods so far in this process: when it did not move
/// since an embedding last read the periods ([`crate::Vm::tick_period_ms`]), none changed.
pub fn tick_generation() -> u64 {
    TICK_GENERATION.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::compile;
    use crate::testing::MemoryHost;
    use crate::{Stream, StreamCallback, Vm};

    #[test]
    fn a_large_buffer_is_not_kept() {
        // A value read once past the bound (a large shared-data entry) is not held by the VM
        // for its life; one within it is, with its allocation.
        let small = Vec::<u8>::with_capacity(1024);
        let at = small.as_ptr();
        let kept = super::keep_buffer(small);
        assert_eq!((kept.as_ptr(), kept.capacity() >= 1024), (at, true));
        let large = Vec::<u8>::with_capacity(super::KEPT_BUFFER_BYTES + 1);
        assert_eq!(super::keep_buffer(large).capacity(), 0);
    }

    #[test]
    fn an_allocator_that_changes_the_result_it_is_asked_room_for_gets_a_status() {
        // The host measures a result, calls the guest's allocator, then copies. This allocator first
        // changes what is being returned (mode 1: makes the other root effective, so the plugin
        // name and configuration change; 2: replaces the header being read; 3: sets the property
        // being read), to another length. Each read that copies after the allocator answers
        // InternalFailure (10), logged as 4 bytes; the host used to panic (copy_from_slice of two
        // lengths: an abort in nginx). A property is copied out before the allocator runs: it
        // answers Ok (0) with the value as it was when asked.
        let m = wat::parse_str(
            r#"(module
              (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
              (import "env" "proxy_get_configuration" (func $getcfg (param i32 i32) (result i32)))
              (import "env" "proxy_get_header_map_value" (func $gethdr (param i32 i32 i32 i32 i32) (result i32)))
              (import "env" "proxy_get_header_map_pairs" (func $getmap (param i32 i32 i32) (result i32)))
              (import "env" "proxy_replace_header_map_value" (func $rephdr (param i32 i32 i32 i32 i32) (result i32)))
              (import "env" "proxy_get_property" (func $getprop (param i32 i32 i32 i32) (result i32)))
              (import "env" "proxy_set_property" (func $setprop (param i32 i32 i32 i32) (result i32)))
              (import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
              (memory (export "memory") 1)
              (global $heap (mut i32) (i32.const 4096))
              (global $mode (mut i32) (i32.const 0))
              (data (i32.const 100) "x-h")
              (data (i32.const 110) "a much longer value")
              (data (i32.const 140) "prop")
              (data (i32.const 150) "plugin_name")
              (func (export "proxy_abi_version_0_2_1"))
              (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
                (local $p i32)
                (if (i32.eq (global.get $mode) (i32.const 1))
                  (then (drop (call $eff (i32.const 1)))))
                (if (i32.eq (global.get $mode) (i32.const 2))
                  (then (drop (call $rephdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 19)))))
                (if (i32.eq (global.get $mode) (i32.const 3))
                  (then (drop (call $setprop (i32.const 140) (i32.const 4) (i32.const 110) (i32.const 19)))))
                (local.set $p (global.get $heap))
                (global.set $heap (i32.add (global.get $heap) (local.get $n)))
                (local.get $p))
              (func $report (param $status i32)
                (i32.store (i32.const 200) (local.get $status))
                (drop (call $log (i32.const 2) (i32.const 200) (i32.const 4))))
              (func (export "proxy_on_context_create") (param i32 i32))
              (func (export "proxy_on_configure") (param $root i32) (param i32) (result i32)
                (if (i32.eq (local.get $root) (i32.const 2))
                  (then
                    (global.set $mode (i32.const 1))
                    (call $report (call $getcfg (i32.const 300) (i32.const 304)))
                    (drop (call $eff (i32.const 2)))
                    (call $report (call $getprop (i32.const 150) (i32.const 11) (i32.const 300) (i32.const 304)))
                    (global.set $mode (i32.const 0))))
                (i32.const 1))
              (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                (global.set $mode (i32.const 2))
                (call $report (call $gethdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 300) (i32.const 304)))
                (drop (call $rephdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 100) (i32.const 1)))
                (call $report (call $getmap (i32.const 0) (i32.const 300) (i32.const 304)))
                (drop (call $setprop (i32.const 140) (i32.const 4) (i32.const 140) (i32.const 4)))
                (global.set $mode (i32.const 3))
                (call $report (call $getprop (i32.const 140) (i32.const 4) (i32.const 300) (i32.const 304)))
                (global.set $mode (i32.const 0))
                (i32.const 0)))"#,
        )
        .unwrap();
        let m = compile(&m).unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("a", b"short").unwrap();
        let root = vm
            .create_root("bbbb", b"a much longer configuration")
            .unwrap();
        let id = vm.create_http(root).unwrap();
        let mut s = Stream {
            request_headers: vec![(b"x-h".to_vec(), b"v".to_vec())],
            ..Default::default()
        };
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap();
        assert!(!vm.is_poisoned());
        let statuses: Vec<u32> = host
            .logs
            .borrow()
            .iter()
            .map(|l| u32::from_le_bytes(l.message.as_bytes().try_into().unwrap()))
            .collect();
        assert_eq!(statuses, [10, 0, 10, 10, 0]);
    }
}
