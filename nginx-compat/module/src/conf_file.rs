//! Plugin and VM configurations read from files, for configurations of any size: nginx's
//! configuration parser refuses an argument longer than its buffer (about 4 KB, "too long
//! parameter"), so a large `proxy_wasm NAME 'CONFIG'` cannot be written inline.
//!
//! Tollgate's own directives (ngx_wasm_module has no equivalent, and a prefix inside `CONFIG`
//! could clash with a configuration that starts with it):
//! - `tollgate_proxy_wasm_file NAME FILE;` (http, server, location): exactly `proxy_wasm NAME
//!   CONFIG;` with `CONFIG` the contents of `FILE`;
//! - `tollgate_module_file NAME PATH FILE;` (in `wasm {}`): `module NAME PATH CONFIG;` with the
//!   VM configuration read from `FILE`.
//!
//! `FILE` is read when the directive is parsed (by `nginx -t`, at start and on reload, in the
//! master), resolved against nginx's prefix (`-p`) when relative, as `module`'s `PATH` is. It
//! must be a regular file of 1 byte to [`MAX_CONFIG_FILE_BYTES`]; errors name the file, and the
//! configuration line that names it (nginx's `in FILE:LINE`). A filter that refuses the
//! configuration fails `nginx -t` with its message and the file's name.

use std::io::Read;
use std::path::PathBuf;

use ngx::ffi::{ngx_conf_t, ngx_str_t};

use crate::util::{full_path, lossy};

/// Largest configuration file (bytes).
pub const MAX_CONFIG_FILE_BYTES: u64 = 64 << 20;

/// Reads the configuration file named by the directive argument `arg`: its absolute path and
/// contents, or a message naming the file.
///
/// # Safety
/// `cf` must be the live `ngx_conf_t` of the directive being parsed, `arg` one of its arguments.
pub unsafe fn read(cf: *mut ngx_conf_t, arg: &ngx_str_t) -> Result<(PathBuf, Vec<u8>), String> {
    if arg.len == 0 {
        return Err("an empty file name".to_string());
    }
    // SAFETY: see the function's contract.
    let Some(path) = (unsafe { full_path(cf, arg) }) else {
        return Err(format!("cannot resolve the file name \"{}\"", lossy(arg)));
    };
    let fail = |what: &str| format!("configuration file \"{}\": {what}", path.display());
    let file = std::fs::File::open(&path).map_err(|e| fail(&e.to_string()))?;
    let meta = file.metadata().map_err(|e| fail(&e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file"));
    }
    if meta.len() > MAX_CONFIG_FILE_BYTES {
        return Err(fail(&format!(
            "{} bytes, over the {MAX_CONFIG_FILE_BYTES} bytes allowed",
            meta.len()
        )));
    }
    let mut contents = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_CONFIG_FILE_BYTES.saturating_add(1))
        .read_to_end(&mut contents)
        .map_err(|e| fail(&e.to_string()))?;
    if u64::try_from(contents.len()).unwrap_or(u64::MAX) > MAX_CONFIG_FILE_BYTES {
        return Err(fail("grew past the size allowed while read"));
    }
    if contents.is_empty() {
        return Err(fail("empty"));
    }
    Ok((path, contents))
}
