//! The tuning directives (`socket_buffer_*`, `socket_large_buffers`, `tls_*` of `wasm{}`;
//! `wasm_socket_buffer_*`, `wasm_socket_large_buffers`, `wasm_response_body_buffers` of the http
//! levels): validated as ngx_wasm_module validates them, no effect here.

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use super::handlers::{directive_name, handler, on_core, on_loc};
use super::slot_values::{arg, bufs, flag, once, size};
handler!(core_flag_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    flag(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(core_size_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    size(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(core_bufs_tuning, |cf, conf, name| on_core(cf, conf, |c| {
    bufs(cf, name)?;
    once(&mut c.tuning, name)
}));

handler!(tls_trusted_certificate, |cf, conf, name| on_core(
    cf,
    conf,
    |c| {
        if arg(cf, 1).is_empty() {
            return Err(format!(
                "tollgate: invalid value \"\" in \"{name}\": a PEM file"
            ));
        }
        once(&mut c.tuning, name)
    }
));

handler!(loc_flag_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    flag(cf, name)?;
    once(&mut l.tuning, name)
}));

handler!(loc_size_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    size(cf, name)?;
    once(&mut l.tuning, name)
}));

handler!(loc_bufs_tuning, |cf, conf, name| on_loc(cf, conf, |l| {
    bufs(cf, name)?;
    once(&mut l.tuning, name)
}));
