//! `module NAME PATH [CONFIG];` and `tollgate_module_file NAME PATH FILE;`: a module's `.wasm`
//! read (relative to the prefix) with its VM configuration, kept to be compiled when the block
//! ends (`compile.rs`).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use super::core_conf::{CoreConf, PendingModule};
use crate::util::{bytes, conf_args, conf_error, full_path, lossy, CONF_OK};
pub(super) unsafe extern "C" fn module_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_module(cf, conf, false) }
}

pub(super) unsafe extern "C" fn module_file_directive(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx's contract for directive handlers.
    unsafe { add_module(cf, conf, true) }
}

/// `module NAME PATH [CONFIG];`, or with `from_file`, `tollgate_module_file NAME PATH FILE;`.
unsafe fn add_module(cf: *mut ngx_conf_t, conf: *mut c_void, from_file: bool) -> *mut c_char {
    // SAFETY: `conf` is our CoreConf (NGX_DIRECT_CONF); `cf` is live during the handler.
    unsafe {
        let Some(conf) = conf.cast::<CoreConf>().as_mut() else {
            return conf_error(cf, "tollgate: no wasm configuration");
        };
        let args = conf_args(cf);
        let (Some(name), Some(path)) = (args.get(1), args.get(2)) else {
            return conf_error(cf, "tollgate: module NAME PATH [CONFIG];");
        };
        let name_s = lossy(name);
        if name_s.is_empty() || path.len == 0 {
            return conf_error(cf, "tollgate: invalid module name or path");
        }
        if conf.module(&name_s).is_some() || conf.pending.iter().any(|p| p.name == name_s) {
            return conf_error(
                cf,
                &format!("tollgate: \"{name_s}\" module already defined"),
            );
        }
        // Relative paths are relative to the prefix (-p), like ngx_wasm_module's.
        let Some(path_buf) = full_path(cf, path) else {
            return conf_error(cf, "tollgate: cannot resolve the module path");
        };
        let wasm = match std::fs::read(&path_buf) {
            Ok(w) => w,
            Err(e) => {
                return conf_error(
                    cf,
                    &format!(
                        "tollgate: module \"{name_s}\": cannot load \"{}\": cannot read it: {e}",
                        path_buf.display()
                    ),
                )
            }
        };
        let vm_config = match (from_file, args.get(3)) {
            (false, arg) => arg.map(|c| bytes(c).to_vec()).unwrap_or_default(),
            (true, Some(arg)) => match crate::conf_file::read(cf, arg) {
                Ok((_, contents)) => contents,
                Err(e) => {
                    return conf_error(cf, &format!("tollgate: tollgate_module_file {name_s}: {e}"))
                }
            },
            (true, None) => {
                return conf_error(cf, "tollgate: tollgate_module_file NAME PATH FILE;")
            }
        };
        conf.pending.push(PendingModule {
            name: name_s,
            path: path_buf,
            vm_config,
            wasm,
        });
        CONF_OK
    }
}
