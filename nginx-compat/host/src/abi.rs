//! The host side of the proxy-wasm ABI (module `env`): the `Store`'s state and the host
//! functions. Spec: <https://github.com/proxy-wasm/spec/tree/main/abi-versions/v0.2.1>; the
//! serialization and the status codes the SDKs accept follow proxy-wasm-rust-sdk 0.2's
//! `hostcalls.rs`. Every guest pointer is bounds-checked (`InvalidMemoryAccess`); data returned
//! to the guest is allocated with its `proxy_on_memory_allocate` (or `malloc`) export.

use std::collections::HashSet;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use wasmtime::{Caller, Engine, Linker, Memory, TypedFunc, Val, ValType};

use crate::mem;
use crate::valid;
use crate::{
    Error, HeaderMap, Host, HttpCall, HttpCallResponse, HttpId, LocalResponse, LogLevel,
    MetricKind, Status, Stream,
};

pub(crate) const OK: u32 = 0;
pub(crate) const NOT_FOUND: u32 = Status::NotFound as u32;
pub(crate) const BAD_ARGUMENT: u32 = Status::BadArgument as u32;
pub(crate) const INVALID_MEMORY_ACCESS: u32 = 6;
pub(crate) const INTERNAL_FAILURE: u32 = Status::InternalFailure as u32;
pub(crate) const UNIMPLEMENTED: u32 = Status::Unimplemented as u32;

fn code(s: Status) -> u32 {
    s as u32
}

/// A root context: the plugin it belongs to.
pub(crate) struct RootInfo {
    pub(crate) id: u32,
    pub(crate) plugin_name: String,
    pub(crate) configuration: Vec<u8>,
    pub(crate) tick_ms: u32,
}

/// The `Store`'s data: everything host functions see.
pub(crate) struct State {
    pub(crate) host: Rc<dyn Host>,
    /// The stream of the running HTTP callback (empty for root callbacks).
    pub(crate) stream: Stream,
    /// True while `stream` is a real stream (an HTTP callback).
    pub(crate) stream_loaded: bool,
    pub(crate) memory: Option<Memory>,
    pub(crate) malloc: Option<Rc<TypedFunc<u32, u32>>>,
    pub(crate) vm_id: String,
    pub(crate) vm_config: Vec<u8>,
    pub(crate) roots: Vec<RootInfo>,
    /// Context id to the index of its root in `roots` (roots map to themselves).
    pub(crate) contexts: FxHashMap<u32, usize>,
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
    /// Registered shared queues: id to the root context that registered it.
    pub(crate) queues: FxHashMap<u32, u32>,
    pub(crate) resumed: Vec<HttpId>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    /// A reused buffer (property paths).
    pub(crate) scratch: Vec<u8>,
    /// The instance's memory and table caps (the store's `ResourceLimiter`).
    pub(crate) limiter: crate::limits::Limiter,
}

impl State {
    pub(crate) fn new(
        host: Rc<dyn Host>,
        vm_id: &str,
        vm_config: &[u8],
        limiter: crate::limits::Limiter,
    ) -> State {
        State {
            host,
            limiter,
            stream: Stream::default(),
            stream_loaded: false,
            memory: None,
            malloc: None,
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
            queues: FxHashMap::default(),
            resumed: Vec::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub(crate) fn add_root(&mut self, id: u32, plugin_name: &str, configuration: &[u8]) {
        self.roots.push(RootInfo {
            id,
            plugin_name: plugin_name.to_owned(),
            configuration: configuration.to_vec(),
            tick_ms: 0,
        });
        let index = self.roots.len().saturating_sub(1);
        self.contexts.insert(id, index);
    }

    /// Forgets a root whose creation failed (its slot in `roots` stays, renamed, so indexes
    /// of other roots remain valid).
    pub(crate) fn remove_root(&mut self, id: u32) {
        self.contexts.remove(&id);
        self.queues.retain(|_, root| *root != id);
        self.calls.retain(|_, ctx| *ctx != id);
        if let Some(r) = self.roots.iter_mut().find(|r| r.id == id) {
            r.configuration = Vec::new();
            r.tick_ms = 0;
        }
    }

    pub(crate) fn add_http(&mut self, id: u32, root: u32) {
        if let Some(&index) = self.contexts.get(&root) {
            self.contexts.insert(id, index);
        }
    }

    pub(crate) fn is_root(&self, id: u32) -> bool {
        match self.contexts.get(&id) {
            Some(&index) => self.roots.get(index).is_some_and(|r| r.id == id),
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

    fn root(&self) -> Option<&RootInfo> {
        self.roots.get(self.root_index)
    }

    pub(crate) fn plugin_name(&self) -> &str {
        self.root().map_or("", |r| r.plugin_name.as_str())
    }

    fn log(&self, level: LogLevel, message: &[u8]) {
        if level >= self.host.log_level() {
            self.host
                .log(level, self.plugin_name(), &String::from_utf8_lossy(message));
        }
    }

    /// Appends WASI stdout (fd 1) or stderr (fd 2) output, logging each complete line
    /// (Info for stdout, Error for stderr). Lines longer than 64 KiB are cut.
    pub(crate) fn stdio(&mut self, fd: u32, bytes: &[u8]) {
        let level = if fd == 1 {
            LogLevel::Info
        } else {
            LogLevel::Error
        };
        let mut buf = std::mem::take(if fd == 1 {
            &mut self.stdout
        } else {
            &mut self.stderr
        });
        for part in bytes.split_inclusive(|b| *b == b'\n') {
            if let Some(line) = part.strip_suffix(b"\n") {
                if buf.is_empty() {
                    self.log(level, line);
                } else {
                    buf.extend_from_slice(line);
                    self.log(level, &buf);
                    buf.clear();
                }
            } else {
                buf.extend_from_slice(part);
                if buf.len() > 65536 {
                    self.log(level, &buf);
                    buf.clear();
                }
            }
        }
        *(if fd == 1 {
            &mut self.stdout
        } else {
            &mut self.stderr
        }) = buf;
    }

    /// Logs what is left of stdout/stderr (after a trap: often a panic message).
    pub(crate) fn flush_stdio(&mut self) {
        let out = std::mem::take(&mut self.stdout);
        if !out.is_empty() {
            self.log(LogLevel::Info, &out);
        }
        let err = std::mem::take(&mut self.stderr);
        if !err.is_empty() {
            self.log(LogLevel::Error, &err);
        }
    }

    fn map(&self, t: u32) -> Option<&HeaderMap> {
        match t {
            0 => Some(&self.stream.request_headers),
            1 => Some(&self.stream.request_trailers),
            2 => Some(&self.stream.response_headers),
            3 => Some(&self.stream.response_trailers),
            6 => self.call_response.as_ref().map(|r| &r.headers),
            7 => self.call_response.as_ref().map(|r| &r.trailers),
            _ => None,
        }
    }

    /// Map `t` for writing, marked changed. `Err(NOT_FOUND)` for a map type the host has no
    /// map for; `Err(BAD_ARGUMENT)` for a map the stream does not have (Envoy's status when a
    /// trailer map does not exist at that point).
    fn map_mut(&mut self, t: u32) -> Result<&mut HeaderMap, u32> {
        if self.map_unavailable(t) {
            return Err(BAD_ARGUMENT);
        }
        let s = &mut self.stream;
        match t {
            0 => {
                s.request_headers_changed = true;
                Ok(&mut s.request_headers)
            }
            1 => {
                s.request_trailers_changed = true;
                Ok(&mut s.request_trailers)
            }
            2 => {
                s.response_headers_changed = true;
                Ok(&mut s.response_headers)
            }
            3 => {
                s.response_trailers_changed = true;
                Ok(&mut s.response_trailers)
            }
            6 => self
                .call_response
                .as_mut()
                .map(|r| &mut r.headers)
                .ok_or(NOT_FOUND),
            7 => self
                .call_response
                .as_mut()
                .map(|r| &mut r.trailers)
                .ok_or(NOT_FOUND),
            _ => Err(NOT_FOUND),
        }
    }

    /// True for a map the embedding said the stream never has (reads see it empty).
    fn map_unavailable(&self, t: u32) -> bool {
        t == 1 && self.stream.request_trailers_unavailable
    }

    fn buffer(&self, t: u32) -> Option<&[u8]> {
        match t {
            0 => Some(&self.stream.request_body),
            1 => Some(&self.stream.response_body),
            4 => self.call_response.as_ref().map(|r| r.body.as_slice()),
            6 => Some(&self.vm_config),
            7 => self.root().map(|r| r.configuration.as_slice()),
            _ => None,
        }
    }

    fn buffer_mut(&mut self, t: u32) -> Option<&mut Vec<u8>> {
        let s = &mut self.stream;
        match t {
            0 => {
                s.request_body_changed = true;
                Some(&mut s.request_body)
            }
            1 => {
                s.response_body_changed = true;
                Some(&mut s.response_body)
            }
            _ => None,
        }
    }

    /// The host's own properties: `plugin_name`, `plugin_root_id` (the plugin name too) and
    /// `plugin_vm_id`.
    fn builtin_property(&self, path: &[u8]) -> Option<Builtin> {
        match path {
            b"plugin_name" | b"plugin_root_id" => Some(Builtin::PluginName),
            b"plugin_vm_id" => Some(Builtin::VmId),
            _ => None,
        }
    }

    fn builtin(&self, which: Builtin) -> &[u8] {
        match which {
            Builtin::PluginName => self.plugin_name().as_bytes(),
            Builtin::VmId => self.vm_id.as_bytes(),
        }
    }
}

#[derive(Clone, Copy)]
enum Builtin {
    PluginName,
    VmId,
}

pub(crate) type C<'a> = Caller<'a, State>;
pub(crate) type R = wasmtime::Result<u32>;

/// The guest memory and the state, borrowed together.
pub(crate) fn ms<'a>(caller: &'a mut C<'_>) -> Option<(&'a mut [u8], &'a mut State)> {
    let memory = caller.data().memory?;
    Some(memory.data_and_store_mut(caller))
}

fn eq_name(a: &[u8], b: &[u8]) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Returns `len` bytes to the guest: allocates them with the guest's allocator, lets `fill`
/// write them (from the state), and stores the pointer and size at `ret_ptr` / `ret_size`.
/// A zero length returns a null pointer without allocating (as Envoy does). The allocator is
/// guest code and may call the host first, changing what `fill` copies (the header, property,
/// effective root...): `fill` then returns `None` (see [`mem::copy`]), and so does this
/// (`InternalFailure`), rather than copying something of another length.
fn return_with(
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

/// Returns owned bytes to the guest (see [`return_with`]).
fn return_bytes(caller: &mut C<'_>, ret_ptr: u32, ret_size: u32, bytes: &[u8]) -> R {
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
fn return_u32(caller: &mut C<'_>, ptr: u32, v: u32) -> u32 {
    if put(caller, ptr, &v.to_le_bytes()) {
        OK
    } else {
        INVALID_MEMORY_ACCESS
    }
}

/// Writes a `u64` result; `InvalidMemoryAccess` when out of bounds.
fn return_u64(caller: &mut C<'_>, ptr: u32, v: u64) -> u32 {
    if put(caller, ptr, &v.to_le_bytes()) {
        OK
    } else {
        INVALID_MEMORY_ACCESS
    }
}

/// A guest string (lossy UTF-8 is not accepted: names must be UTF-8).
fn guest_str(caller: &mut C<'_>, ptr: u32, len: u32) -> Result<String, u32> {
    let (mem, _) = ms(caller).ok_or(INTERNAL_FAILURE)?;
    let b = mem::slice(mem, ptr, len).ok_or(INVALID_MEMORY_ACCESS)?;
    String::from_utf8(b.to_vec()).map_err(|_| BAD_ARGUMENT)
}

fn status_of(r: Result<(), Status>) -> u32 {
    match r {
        Ok(()) => OK,
        Err(s) => code(s),
    }
}

/// `Some(BadArgument)` (logged at warn, the bytes escaped) when a guest may not write the
/// field `k: v` (see [`valid`]); `None` when it may.
fn refused_field(state: &State, func: &str, k: &[u8], v: &[u8]) -> Option<u32> {
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
fn refused_map(state: &State, func: &str, m: &HeaderMap) -> Option<u32> {
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
fn refused_growth(state: &State, func: &str, current: usize, extra: usize) -> Option<u32> {
    if current.saturating_add(extra) <= valid::MAX_MAP_BYTES {
        return None;
    }
    let msg = format!("{func}: refused: more than {} bytes", valid::MAX_MAP_BYTES);
    state.log(LogLevel::Warn, msg.as_bytes());
    Some(BAD_ARGUMENT)
}

/// Records defined names, to link the other imports of `env` to stubs.
pub(crate) struct Def<'a> {
    linker: &'a mut Linker<State>,
    names: HashSet<(&'static str, &'static str)>,
}

impl Def<'_> {
    fn env<Params, Args>(
        &mut self,
        name: &'static str,
        f: impl wasmtime::IntoFunc<State, Params, Args>,
    ) -> Result<(), Error> {
        self.module("env", name, f)
    }

    fn module<Params, Args>(
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

/// The linker for `module`: the host functions of `env` and `wasi_snapshot_preview1`, plus
/// stubs for the other imports of those two modules (`Unimplemented` / `ENOSYS`). An import
/// from any other module is an error.
pub(crate) fn linker(engine: &Engine, module: &wasmtime::Module) -> Result<Linker<State>, Error> {
    let mut linker = Linker::new(engine);
    let mut def = Def {
        linker: &mut linker,
        names: HashSet::new(),
    };
    define_env(&mut def)?;
    crate::wasi::define(&mut def)?;
    let names = def.names;
    for import in module.imports() {
        let (m, n) = (import.module(), import.name());
        if names.iter().any(|(dm, dn)| *dm == m && *dn == n) {
            continue;
        }
        let stub_code: i32 = match m {
            "env" => UNIMPLEMENTED as i32,
            "wasi_snapshot_preview1" => i32::from(crate::wasi::ENOSYS),
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

impl Def<'_> {
    pub(crate) fn wasi_func<Params, Args>(
        &mut self,
        name: &'static str,
        f: impl wasmtime::IntoFunc<State, Params, Args>,
    ) -> Result<(), Error> {
        self.module("wasi_snapshot_preview1", name, f)
    }
}

#[allow(clippy::too_many_lines)]
fn define_env(d: &mut Def<'_>) -> Result<(), Error> {
    // Logging and time.
    d.env(
        "proxy_log",
        |mut c: C<'_>, level: u32, ptr: u32, len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            match mem::slice(mem, ptr, len) {
                Some(msg) => {
                    state.log(LogLevel::from_u32(level), msg);
                    OK
                }
                None => INVALID_MEMORY_ACCESS,
            }
        },
    )?;
    d.env("proxy_get_log_level", |mut c: C<'_>, ret: u32| -> u32 {
        let level = c.data().host.log_level() as u32;
        return_u32(&mut c, ret, level)
    })?;
    d.env(
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: u32| -> u32 { return_u64(&mut c, ret, realtime_ns()) },
    )?;
    d.env(
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, period: u32| -> u32 {
            let state = c.data_mut();
            let index = state.root_index;
            match state.roots.get_mut(index) {
                Some(root) => {
                    root.tick_ms = period;
                    OK
                }
                None => BAD_ARGUMENT,
            }
        },
    )?;

    // Properties.
    d.env(
        "proxy_get_property",
        |mut c: C<'_>, path_ptr: u32, path_len: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(path) = mem::slice(mem, path_ptr, path_len) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            // Set by a filter: copied straight from the state (the path is kept in a reused
            // buffer while the guest allocates).
            if let Some(len) = state.stream.properties.get(path).map(Vec::len) {
                let mut key = std::mem::take(&mut state.scratch);
                key.clear();
                key.extend_from_slice(path);
                let r = return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                    mem::copy(dst, s.stream.properties.get(&key)?)
                });
                c.data_mut().scratch = key;
                return r;
            }
            if let Some(which) = state.builtin_property(path) {
                let len = state.builtin(which).len();
                return return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                    mem::copy(dst, s.builtin(which))
                });
            }
            let value = match &state.stream.property_source {
                Some(source) => source.property(path),
                None => None,
            };
            match value {
                Some(v) => return_bytes(&mut c, ret_ptr, ret_size, &v),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    d.env(
        "proxy_set_property",
        |mut c: C<'_>, path_ptr: u32, path_len: u32, val_ptr: u32, val_len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(path), Some(value)) = (
                mem::slice(mem, path_ptr, path_len),
                mem::slice(mem, val_ptr, val_len),
            ) else {
                return INVALID_MEMORY_ACCESS;
            };
            let held = state.stream.properties.iter().fold(0usize, |n, (k, v)| {
                n.saturating_add(k.len()).saturating_add(v.len())
            });
            let extra = path.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, "proxy_set_property", held, extra) {
                return code;
            }
            match state.stream.properties.get_mut(path) {
                Some(v) => {
                    v.clear();
                    v.extend_from_slice(value);
                }
                None => {
                    state
                        .stream
                        .properties
                        .insert(path.to_vec(), value.to_vec());
                }
            }
            OK
        },
    )?;

    // Header maps.
    d.env(
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, t: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some(map) = c.data().map(t) else {
                return Ok(NOT_FOUND);
            };
            let Some(size) = mem::serialized_size(map) else {
                return Ok(INTERNAL_FAILURE);
            };
            return_with(&mut c, ret_ptr, ret_size, size, |dst, s| {
                mem::serialize_into(s.map(t)?, dst)
            })
        },
    )?;
    d.env(
        "proxy_get_header_map_size",
        |mut c: C<'_>, t: u32, ret_size: u32| -> u32 {
            let Some(map) = c.data().map(t) else {
                return NOT_FOUND;
            };
            match mem::serialized_size(map).and_then(|s| u32::try_from(s).ok()) {
                Some(size) => return_u32(&mut c, ret_size, size),
                None => INTERNAL_FAILURE,
            }
        },
    )?;
    d.env(
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, t: u32, ptr: u32, len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(bytes) = mem::slice(mem, ptr, len) else {
                return INVALID_MEMORY_ACCESS;
            };
            let Some(new) = mem::deserialize(bytes, true) else {
                return BAD_ARGUMENT;
            };
            if let Some(code) = refused_map(state, "proxy_set_header_map_pairs", &new) {
                return code;
            }
            match state.map_mut(t) {
                Ok(map) => {
                    *map = new;
                    OK
                }
                Err(code) => code,
            }
        },
    )?;
    d.env(
        "proxy_get_header_map_value",
        |mut c: C<'_>, t: u32, key_ptr: u32, key_len: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(key) = mem::slice(mem, key_ptr, key_len) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(map) = state.map(t) else {
                return Ok(NOT_FOUND);
            };
            let Some(index) = map.iter().position(|(k, _)| eq_name(k, key)) else {
                return Ok(NOT_FOUND);
            };
            let len = map.get(index).map_or(0, |(_, v)| v.len());
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, &s.map(t)?.get(index)?.1)
            })
        },
    )?;
    d.env(
        "proxy_add_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            const F: &str = "proxy_add_header_map_value";
            if let Some(code) = refused_field(state, F, key, value) {
                return code;
            }
            let held = state.map(t).map_or(0, valid::map_bytes);
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, held, extra) {
                return code;
            }
            match state.map_mut(t) {
                Ok(map) => {
                    map.push((key.to_ascii_lowercase(), value.to_vec()));
                    OK
                }
                Err(code) => code,
            }
        },
    )?;
    d.env(
        "proxy_replace_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            const F: &str = "proxy_replace_header_map_value";
            if let Some(code) = refused_field(state, F, key, value) {
                return code;
            }
            let held = state.map(t).map_or(0, valid::map_bytes);
            let extra = key.len().saturating_add(value.len());
            if let Some(code) = refused_growth(state, F, held, extra) {
                return code;
            }
            let map = match state.map_mut(t) {
                Ok(map) => map,
                Err(code) => return code,
            };
            // Envoy's setCopy: the first entry takes the value, later duplicates go.
            let mut found = false;
            map.retain_mut(|(k, v)| {
                if !eq_name(k, key) {
                    return true;
                }
                if found {
                    return false;
                }
                found = true;
                v.clear();
                v.extend_from_slice(value);
                true
            });
            if !found {
                map.push((key.to_ascii_lowercase(), value.to_vec()));
            }
            OK
        },
    )?;
    d.env(
        "proxy_remove_header_map_value",
        |mut c: C<'_>, t: u32, kp: u32, kl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(key) = mem::slice(mem, kp, kl) else {
                return INVALID_MEMORY_ACCESS;
            };
            if state.map_unavailable(t) {
                return BAD_ARGUMENT;
            }
            // Only a real change marks the map changed.
            let present = state.map(t).map(|m| m.iter().any(|(k, _)| eq_name(k, key)));
            match present {
                None => NOT_FOUND,
                Some(false) => OK,
                Some(true) => {
                    if let Ok(map) = state.map_mut(t) {
                        map.retain(|(k, _)| !eq_name(k, key));
                    }
                    OK
                }
            }
        },
    )?;

    // Buffers.
    let get_buffer =
        |mut c: C<'_>, t: u32, start: u32, max: u32, ret_ptr: u32, ret_size: u32| -> R {
            let Some(buf) = c.data().buffer(t) else {
                return Ok(NOT_FOUND);
            };
            let (Ok(start), Ok(max)) = (usize::try_from(start), usize::try_from(max)) else {
                return Ok(BAD_ARGUMENT);
            };
            if start > buf.len() {
                return Ok(BAD_ARGUMENT);
            }
            let end = start.saturating_add(max).min(buf.len());
            let len = end.saturating_sub(start);
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, s.buffer(t)?.get(start..end)?)
            })
        };
    d.env("proxy_get_buffer_bytes", get_buffer)?;
    d.env("proxy_get_buffer", get_buffer)?;
    let set_buffer = |mut c: C<'_>, t: u32, start: u32, size: u32, ptr: u32, len: u32| -> u32 {
        let Some((mem, state)) = ms(&mut c) else {
            return INTERNAL_FAILURE;
        };
        let Some(data) = mem::slice(mem, ptr, len) else {
            return INVALID_MEMORY_ACCESS;
        };
        if state.buffer(t).is_none() {
            return NOT_FOUND;
        }
        let Some(buf) = state.buffer_mut(t) else {
            return BAD_ARGUMENT;
        };
        let (Ok(start), Ok(size)) = (usize::try_from(start), usize::try_from(size)) else {
            return BAD_ARGUMENT;
        };
        // Envoy: start 0 replaces the first `size` bytes, start >= length appends.
        if start >= buf.len() {
            buf.extend_from_slice(data);
        } else {
            let end = start.saturating_add(size).min(buf.len());
            buf.splice(start..end, data.iter().copied());
        }
        OK
    };
    d.env("proxy_set_buffer_bytes", set_buffer)?;
    d.env("proxy_set_buffer", set_buffer)?;
    d.env(
        "proxy_get_buffer_status",
        |mut c: C<'_>, t: u32, ret_len: u32, ret_flags: u32| -> u32 {
            let Some(len) = c.data().buffer(t).map(<[u8]>::len) else {
                return NOT_FOUND;
            };
            let Ok(len) = u32::try_from(len) else {
                return INTERNAL_FAILURE;
            };
            if put(&mut c, ret_len, &len.to_le_bytes()) && put(&mut c, ret_flags, &[0; 4]) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            }
        },
    )?;
    d.env(
        "proxy_get_configuration",
        |mut c: C<'_>, ret_ptr: u32, ret_size: u32| -> R {
            let len = c.data().buffer(7).map_or(0, <[u8]>::len);
            return_with(&mut c, ret_ptr, ret_size, len, |dst, s| {
                mem::copy(dst, s.buffer(7)?)
            })
        },
    )?;

    // Stream control.
    // `proxy_send_http_response` is the same function's later name (ngx_wasm_module).
    let send = |mut c: C<'_>,
                status: u32,
                dp: u32,
                dl: u32,
                bp: u32,
                bl: u32,
                hp: u32,
                hl: u32,
                _grpc_status: i32|
     -> u32 {
        let Some((mem, state)) = ms(&mut c) else {
            return INTERNAL_FAILURE;
        };
        let (Some(details), Some(body), Some(headers)) = (
            mem::slice(mem, dp, dl),
            mem::slice(mem, bp, bl),
            mem::slice(mem, hp, hl),
        ) else {
            return INVALID_MEMORY_ACCESS;
        };
        let Some(headers) = mem::deserialize(headers, true) else {
            return BAD_ARGUMENT;
        };
        if let Some(code) = refused_map(state, "proxy_send_local_response", &headers) {
            return code;
        }
        state.stream.local_response = Some(LocalResponse {
            status,
            details: details.to_vec(),
            body: body.to_vec(),
            headers,
        });
        OK
    };
    d.env("proxy_send_local_response", send)?;
    d.env("proxy_send_http_response", send)?;
    let resume = |c: &mut C<'_>| -> u32 {
        let state = c.data_mut();
        let target = state.effective;
        if state.stream_loaded && target == state.current {
            state.stream.resumed = true;
            return OK;
        }
        if state.is_root(target) || !state.contexts.contains_key(&target) {
            return BAD_ARGUMENT;
        }
        if !state.resumed.iter().any(|h| h.0 == target) {
            state.resumed.push(HttpId(target));
        }
        OK
    };
    d.env(
        "proxy_continue_stream",
        move |mut c: C<'_>, _t: u32| -> u32 { resume(&mut c) },
    )?;
    d.env("proxy_continue_request", move |mut c: C<'_>| -> u32 {
        resume(&mut c)
    })?;
    d.env("proxy_continue_response", move |mut c: C<'_>| -> u32 {
        resume(&mut c)
    })?;
    d.env("proxy_close_stream", |mut c: C<'_>, _t: u32| -> u32 {
        let state = c.data_mut();
        if state.stream_loaded && state.effective == state.current {
            state.stream.closed = true;
            OK
        } else {
            BAD_ARGUMENT
        }
    })?;
    d.env("proxy_clear_route_cache", |_c: C<'_>| -> u32 { OK })?;
    d.env("proxy_done", |_c: C<'_>| -> u32 { OK })?;
    d.env(
        "proxy_set_effective_context",
        |mut c: C<'_>, id: u32| -> u32 {
            let state = c.data_mut();
            match state.contexts.get(&id) {
                Some(&index) => {
                    state.effective = id;
                    state.root_index = index;
                    OK
                }
                None => BAD_ARGUMENT,
            }
        },
    )?;

    // Shared data.
    d.env(
        "proxy_get_shared_data",
        |mut c: C<'_>, kp: u32, kl: u32, ret_ptr: u32, ret_size: u32, ret_cas: u32| -> R {
            let Some((mem, state)) = ms(&mut c) else {
                return Ok(INTERNAL_FAILURE);
            };
            let Some(key) = mem::slice(mem, kp, kl) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            match state.host.get_shared_data(key) {
                Ok((value, cas)) => {
                    let s = return_bytes(&mut c, ret_ptr, ret_size, &value)?;
                    if s != OK {
                        return Ok(s);
                    }
                    Ok(return_u32(&mut c, ret_cas, cas))
                }
                Err(s) => Ok(code(s)),
            }
        },
    )?;
    d.env(
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: u32, kl: u32, vp: u32, vl: u32, cas: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(key), Some(value)) = (mem::slice(mem, kp, kl), mem::slice(mem, vp, vl))
            else {
                return INVALID_MEMORY_ACCESS;
            };
            status_of(state.host.set_shared_data(key, value, cas))
        },
    )?;

    // Shared queues.
    d.env(
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: u32, nl: u32, ret_id: u32| -> u32 {
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let state = c.data_mut();
            let root = state.root().map(|r| r.id);
            match state.host.register_shared_queue(&name) {
                Ok(id) => {
                    if let Some(root) = root {
                        state.queues.insert(id, root);
                    }
                    return_u32(&mut c, ret_id, id)
                }
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vp: u32, vl: u32, np: u32, nl: u32, ret_id: u32| -> u32 {
            let vm_id = match guest_str(&mut c, vp, vl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            match c.data().host.resolve_shared_queue(&vm_id, &name) {
                Ok(id) => return_u32(&mut c, ret_id, id),
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: u32, vp: u32, vl: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let Some(value) = mem::slice(mem, vp, vl) else {
                return INVALID_MEMORY_ACCESS;
            };
            status_of(state.host.enqueue_shared_queue(id, value))
        },
    )?;
    d.env(
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: u32, ret_ptr: u32, ret_size: u32| -> R {
            match c.data().host.dequeue_shared_queue(id) {
                Ok(v) => return_bytes(&mut c, ret_ptr, ret_size, &v),
                Err(s) => Ok(code(s)),
            }
        },
    )?;

    // HTTP calls.
    d.env(
        "proxy_http_call",
        |mut c: C<'_>,
         up: u32,
         ul: u32,
         hp: u32,
         hl: u32,
         bp: u32,
         bl: u32,
         tp: u32,
         tl: u32,
         timeout_ms: u32,
         ret_token: u32|
         -> u32 {
            let upstream = match guest_str(&mut c, up, ul) {
                Ok(n) => n,
                Err(s) => return s,
            };
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            let (Some(headers), Some(body), Some(trailers)) = (
                mem::slice(mem, hp, hl),
                mem::slice(mem, bp, bl),
                mem::slice(mem, tp, tl),
            ) else {
                return INVALID_MEMORY_ACCESS;
            };
            let (Some(headers), Some(trailers)) = (
                mem::deserialize(headers, true),
                mem::deserialize(trailers, true),
            ) else {
                return BAD_ARGUMENT;
            };
            const F: &str = "proxy_http_call";
            if let Some(code) =
                refused_map(state, F, &headers).or_else(|| refused_map(state, F, &trailers))
            {
                return code;
            }
            // Envoy refuses a call without :method, :path and :authority.
            let has = |name: &[u8]| headers.iter().any(|(k, _)| k == name);
            if !has(b":method") || !has(b":path") || !has(b":authority") {
                return BAD_ARGUMENT;
            }
            if mem::slice(mem, ret_token, 4).is_none() {
                return INVALID_MEMORY_ACCESS;
            }
            if state.calls.len() >= valid::MAX_PENDING_CALLS {
                let msg = format!(
                    "{F}: refused: {} calls of this instance are pending",
                    valid::MAX_PENDING_CALLS
                );
                state.log(LogLevel::Warn, msg.as_bytes());
                return INTERNAL_FAILURE;
            }
            let token = state.next_token;
            state.next_token = token.checked_add(1).unwrap_or(1);
            let call = HttpCall {
                token,
                upstream,
                headers,
                body: body.to_vec(),
                trailers,
                timeout_ms,
            };
            if let Err(s) = state.host.dispatch_http_call(call) {
                return code(s);
            }
            let ctx = state.effective;
            state.calls.insert(token, ctx);
            if mem::write_u32(mem, ret_token, token) {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            }
        },
    )?;

    // Metrics.
    d.env(
        "proxy_define_metric",
        |mut c: C<'_>, kind: u32, np: u32, nl: u32, ret_id: u32| -> u32 {
            let kind = match kind {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return BAD_ARGUMENT,
            };
            let name = match guest_str(&mut c, np, nl) {
                Ok(n) => n,
                Err(s) => return s,
            };
            match c.data().host.define_metric(kind, &name) {
                Ok(id) => return_u32(&mut c, ret_id, id),
                Err(s) => code(s),
            }
        },
    )?;
    d.env(
        "proxy_increment_metric",
        |c: C<'_>, id: u32, delta: i64| -> u32 {
            status_of(c.data().host.increment_metric(id, delta))
        },
    )?;
    d.env(
        "proxy_record_metric",
        |c: C<'_>, id: u32, value: u64| -> u32 {
            status_of(c.data().host.record_metric(id, value))
        },
    )?;
    d.env(
        "proxy_get_metric",
        |mut c: C<'_>, id: u32, ret: u32| -> u32 {
            match c.data().host.get_metric(id) {
                Ok(v) => return_u64(&mut c, ret, v),
                Err(s) => code(s),
            }
        },
    )?;

    // Foreign functions: none.
    d.env(
        "proxy_call_foreign_function",
        |_c: C<'_>, _np: u32, _nl: u32, _ap: u32, _al: u32, _rp: u32, _rs: u32| -> u32 {
            NOT_FOUND
        },
    )?;
    Ok(())
}

/// Wall clock, nanoseconds since the Unix epoch.
pub(crate) fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
