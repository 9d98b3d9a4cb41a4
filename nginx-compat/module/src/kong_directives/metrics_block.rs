//! `metrics { slab_size SIZE; max_metric_name_length N; }` of `wasm{}`: validated as Kong's
//! module validates them, no effect here (this host sizes its metrics zone itself).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use ngx::ffi::ngx_uint_t;

use super::handlers::{block, directive_name, handler, on_core};
use super::slot_values::{arg, once, raw_arg, size_of};
use crate::util::CONF_OK;
/// `cmd_type` inside `wasm { metrics {} }`.
pub(super) const METRICS_CONF: ngx_uint_t = 0x1000_0000;

/// The smallest metrics slab of Kong's module: `3 * pagesize` (`NGX_WA_SHM_MIN_SIZE`).
const MIN_SLAB_BYTES: usize = 3 * 4096;

handler!(metrics_block, |cf, conf, name| {
    let first = on_core(cf, conf, |c| {
        if std::mem::replace(&mut c.metrics_block, true) {
            return Err(format!("tollgate: \"{name}\" directive is duplicate"));
        }
        Ok(())
    });
    if first != CONF_OK {
        return first;
    }
    block(cf, METRICS_CONF)
});

handler!(slab_size, |cf, conf, name| on_core(cf, conf, |c| {
    let v = arg(cf, 1);
    let Some(bytes) = raw_arg(cf, 1).and_then(|a| size_of(a)) else {
        return Err(format!("tollgate: {name}: invalid shm size \"{v}\""));
    };
    if bytes < MIN_SLAB_BYTES {
        return Err(format!(
            "tollgate: {name}: shm size of {bytes} bytes is too small, minimum required is \
             {MIN_SLAB_BYTES} bytes"
        ));
    }
    if bytes % 4096 != 0 {
        return Err(format!(
            "tollgate: {name}: shm size of {bytes} bytes is not page-aligned, must be a \
             multiple of 4096"
        ));
    }
    once(&mut c.tuning, name)
}));

handler!(max_metric_name_length, |cf, conf, name| on_core(
    cf,
    conf,
    |c| {
        let v = arg(cf, 1);
        match v.parse::<usize>() {
            Ok(n) if n >= 6 => once(&mut c.tuning, name),
            Ok(_) => Err(format!(
                "tollgate: invalid value \"{v}\" in \"{name}\": value too small (min: 6)"
            )),
            Err(_) => Err(format!(
                "tollgate: invalid value \"{v}\" in \"{name}\": a number of bytes"
            )),
        }
    }
));
