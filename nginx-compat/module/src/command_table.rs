//! How the directive tables of this crate's modules are built (the tables are with their
//! handlers: `wasm_block/mod.rs`, `kong_directives/mod.rs`, `directives.rs`): an entry in a
//! const context (`command!`, `loc_command!`), the levels a directive is allowed at (the http
//! levels, inside `wasm {}`), and two tables joined with nginx's terminating entry.

use ngx::ffi::{ngx_command_t, ngx_uint_t, NGX_DIRECT_CONF};
/// The `cmd_type` of the directives inside `wasm {}` (the value other blocks' own directives
/// use, `NGX_HTTP_MAIN_CONF`/`NGX_EVENT_CONF`; no core module uses it for its directives).
pub const TOLLGATE_WASM_CONF: ngx_uint_t = 0x0200_0000;

/// The `type` of a directive inside `wasm {}` (its `conf` is its core module's configuration).
pub(crate) const IN_WASM: u32 = TOLLGATE_WASM_CONF as u32 | NGX_DIRECT_CONF;
/// A directive entry (`ngx_command_t`) in a const context.
macro_rules! command {
    ($name:literal, $type:expr, $set:expr) => {
        ngx_command_t {
            name: ngx_string!($name),
            type_: $type as ngx_uint_t,
            set: Some($set),
            conf: 0,
            offset: 0,
            post: std::ptr::null_mut(),
        }
    };
}
pub(crate) use command;

/// The http{}, server{} and location{} levels: a directive allowed at each of them.
pub(crate) const ANY_LEVEL: u32 =
    ngx::ffi::NGX_HTTP_MAIN_CONF | ngx::ffi::NGX_HTTP_SRV_CONF | ngx::ffi::NGX_HTTP_LOC_CONF;
/// A directive entry's `conf` for the location configuration (merged from http{} and server{}).
pub(crate) const LOC_OFFSET: ngx_uint_t = nginx_sys::NGX_HTTP_LOC_CONF_OFFSET as ngx_uint_t;

/// A directive entry (`ngx_command_t`) on the location configuration, in a const context.
macro_rules! loc_command {
    ($name:literal, $type:expr, $set:expr) => {
        ngx_command_t {
            conf: $crate::command_table::LOC_OFFSET,
            ..$crate::command_table::command!($name, $type, $set)
        }
    };
}
pub(crate) use loc_command;

/// `a` then `b` then nginx's terminating empty command, as one table (`N` = A + B + 1).
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)] // Evaluated at compile time: an index out of range or an overflow fails the build.
pub(crate) const fn command_table<const A: usize, const B: usize, const N: usize>(
    a: [ngx_command_t; A],
    b: [ngx_command_t; B],
) -> [ngx_command_t; N] {
    let mut out = [ngx_command_t::empty(); N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < B {
        out[A + j] = b[j];
        j += 1;
    }
    out
}
