//! Small helpers over nginx's C types: strings, configuration arguments, logging, pool copies.

use std::ffi::c_char;

use ngx::ffi::{
    ngx_array_t, ngx_conf_t, ngx_log_t, ngx_pnalloc, ngx_pool_t, ngx_str_t, ngx_uint_t,
};

/// `NGX_CONF_ERROR` (`(char *) -1`).
pub const CONF_ERROR: *mut c_char = ngx::core::NGX_CONF_ERROR;
/// `NGX_CONF_OK` (`NULL`).
pub const CONF_OK: *mut c_char = ngx::core::NGX_CONF_OK;

/// nginx log levels (`NGX_LOG_*`).
pub mod level {
    use ngx::ffi::ngx_uint_t;
    pub const EMERG: ngx_uint_t = 1;
    pub const ALERT: ngx_uint_t = 2;
    pub const CRIT: ngx_uint_t = 3;
    pub const ERR: ngx_uint_t = 4;
    pub const WARN: ngx_uint_t = 5;
    pub const NOTICE: ngx_uint_t = 6;
    pub const INFO: ngx_uint_t = 7;
    pub const DEBUG: ngx_uint_t = 8;
}

/// The bytes of an `ngx_str_t` (empty for a null pointer).
pub fn bytes(s: &ngx_str_t) -> &[u8] {
    if s.data.is_null() || s.len == 0 {
        return &[];
    }
    // SAFETY: nginx strings point to `len` readable bytes for as long as their owner lives;
    // the returned slice borrows `s`, which cannot outlive it.
    unsafe { std::slice::from_raw_parts(s.data, s.len) }
}

/// An `ngx_str_t` as a (lossy) Rust string, for messages.
pub fn lossy(s: &ngx_str_t) -> String {
    String::from_utf8_lossy(bytes(s)).into_owned()
}

/// A path argument made absolute as nginx makes its own (`ngx_conf_full_name`: relative to the
/// `-p` prefix); `None` when it is empty or nginx cannot join it.
///
/// # Safety
/// `cf` must be the live `ngx_conf_t` of the directive being parsed, `arg` one of its arguments.
pub unsafe fn full_path(cf: *mut ngx_conf_t, arg: &ngx_str_t) -> Option<std::path::PathBuf> {
    if arg.len == 0 {
        return None;
    }
    let mut full: ngx_str_t = *arg;
    // SAFETY: see the function's contract; nginx allocates the joined name in the cycle pool.
    if unsafe { ngx::ffi::ngx_conf_full_name((*cf).cycle, &mut full, 0) } != 0 {
        return None;
    }
    Some(std::path::PathBuf::from(lossy(&full)))
}

/// The arguments of the directive being parsed (`cf->args`), name first.
///
/// # Safety
/// `cf` must be the `ngx_conf_t` nginx passed to a directive handler.
pub unsafe fn conf_args<'a>(cf: *mut ngx_conf_t) -> &'a [ngx_str_t] {
    // SAFETY: during a directive handler `cf->args` is an array of `nelts` ngx_str_t.
    unsafe {
        let args: *mut ngx_array_t = (*cf).args;
        if args.is_null() || (*args).elts.is_null() {
            return &[];
        }
        std::slice::from_raw_parts((*args).elts.cast::<ngx_str_t>(), (*args).nelts)
    }
}

/// Writes `msg` to `log` at `lvl` (no-op for a null log or a level above the log's).
pub(crate) fn log(lvl: ngx_uint_t, log: *mut ngx_log_t, msg: &str) {
    if log.is_null() {
        return;
    }
    // SAFETY: `log` is a live nginx log (the cycle's, a connection's or the configuration's).
    unsafe {
        if lvl > (*log).log_level {
            return;
        }
        ngx::log::log_error(lvl, log, 0, msg.as_bytes());
    }
}

/// Logs `msg` with the configuration file and line (`ngx_conf_log_error`).
///
/// # Safety
/// `cf` must be a live `ngx_conf_t`.
pub unsafe fn conf_log(lvl: ngx_uint_t, cf: *mut ngx_conf_t, msg: &str) {
    // SAFETY: see the function's contract; "%*s" takes a length and a pointer.
    unsafe {
        ngx::ffi::ngx_conf_log_error(lvl, cf, 0, c"%*s".as_ptr(), msg.len(), msg.as_ptr());
    }
}

/// Logs `msg` as an emergency with the file and line, and returns `NGX_CONF_ERROR`.
///
/// # Safety
/// `cf` must be a live `ngx_conf_t`.
pub unsafe fn conf_error(cf: *mut ngx_conf_t, msg: &str) -> *mut c_char {
    // SAFETY: forwarded contract.
    unsafe { conf_log(level::EMERG, cf, msg) };
    CONF_ERROR
}

/// The cycle's log (`ngx_cycle->log`).
pub fn cycle_log() -> *mut ngx_log_t {
    // SAFETY: `ngx_cycle` is set by nginx before any module code runs.
    unsafe {
        let cycle = ngx::ffi::ngx_cycle;
        if cycle.is_null() {
            return std::ptr::null_mut();
        }
        (*cycle).log
    }
}

/// Copies `data` into `pool` as an `ngx_str_t` (NUL-terminated for convenience).
///
/// # Safety
/// `pool` must be a live pool.
pub unsafe fn pool_str(pool: *mut ngx_pool_t, data: &[u8]) -> Option<ngx_str_t> {
    // SAFETY: the allocation has `len + 1` bytes; we write exactly that many.
    unsafe {
        let p = ngx_pnalloc(pool, data.len().saturating_add(1)).cast::<u8>();
        if p.is_null() {
            return None;
        }
        std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
        *p.add(data.len()) = 0;
        Some(ngx_str_t {
            len: data.len(),
            data: p,
        })
    }
}

/// Lower-case ASCII copy.
pub fn lower(b: &[u8]) -> Vec<u8> {
    b.to_ascii_lowercase()
}
