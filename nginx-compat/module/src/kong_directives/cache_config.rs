//! `wasmtime { cache_config FILE; }`: the `[cache] directory` of a Wasmtime cache configuration
//! as this host's compiled-code cache (what `tollgate_compiled_cache DIR;` sets).

use std::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t};

use super::handlers::{directive_name, handler, on_core};
use super::slot_values::{once, raw_arg};
handler!(
/// `cache_config FILE;` in `wasmtime{}`: Wasmtime's cache configuration (TOML, which Kong's
/// module hands to `wasmtime_config_cache_config_load`). Its `[cache]` table's `directory` (an
/// absolute path) is this host's compiled-code cache, as `tollgate_compiled_cache DIR;` would
/// set it (which wins when both are given); `enabled = false` leaves the cache off; a file
/// without `directory` is accepted with a warning, and no cache.
cache_config, |cf, conf, name| on_core(cf, conf, |c| {
    once(&mut c.tuning, name)?;
    let Some(file) = raw_arg(cf, 1) else {
        return Err(format!("tollgate: {name} FILE;"));
    };
    let (path, text) = crate::conf_file::read(cf, file).map_err(|e| format!("tollgate: {name}: {e}"))?;
    match cache_directory(&text) {
        Ok(Some(dir)) => {
            // Kept with the `wasm{}` block's own configuration, which compiles the modules.
            let Some(core) = crate::wasm_block::core_conf::core_conf((*cf).cycle) else {
                return Err("tollgate: no wasm configuration".to_string());
            };
            core.kong_cache_config = Some(tollgate_host::CompiledCache::new(dir));
        }
        Ok(None) => {}
        Err(CacheConfigError::NoDirectory) => crate::util::conf_log(
            crate::util::level::WARN,
            cf,
            &format!(
                "tollgate: {name} \"{}\" names no [cache] directory: no compiled-code cache \
                 (tollgate_compiled_cache DIR; sets one)",
                path.display()
            ),
        ),
        Err(CacheConfigError::Invalid(e)) => {
            return Err(format!("tollgate: {name} \"{}\": {e}", path.display()))
        }
    }
    Ok(())
}));

/// Why a Wasmtime cache configuration gives no directory.
#[derive(Debug, PartialEq)]
enum CacheConfigError {
    /// Valid, without `[cache] directory`.
    NoDirectory,
    /// Not TOML, or a field of the wrong type (the message names it).
    Invalid(String),
}

/// The compiled-code directory of a Wasmtime cache configuration: `[cache] directory`, `None`
/// when `[cache] enabled = false`.
fn cache_directory(text: &[u8]) -> Result<Option<std::path::PathBuf>, CacheConfigError> {
    let invalid = |m: &str| CacheConfigError::Invalid(m.to_string());
    let text = std::str::from_utf8(text).map_err(|_| invalid("not UTF-8"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| invalid(e.message()))?;
    let Some(cache) = table.get("cache") else {
        return Err(CacheConfigError::NoDirectory);
    };
    let cache = cache
        .as_table()
        .ok_or_else(|| invalid("cache is not a table"))?;
    match cache.get("enabled").map(toml::Value::as_bool) {
        Some(Some(false)) => return Ok(None),
        Some(None) => return Err(invalid("cache.enabled is not a boolean")),
        _ => {}
    }
    let Some(dir) = cache.get("directory") else {
        return Err(CacheConfigError::NoDirectory);
    };
    let dir = dir
        .as_str()
        .ok_or_else(|| invalid("cache.directory is not a string"))?;
    let dir = std::path::PathBuf::from(dir);
    if !dir.is_absolute() {
        return Err(invalid("cache.directory is not an absolute path"));
    }
    Ok(Some(dir))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{cache_directory, CacheConfigError};

    #[test]
    fn a_wasmtime_cache_configuration_names_the_directory() {
        let dir = |t: &str| cache_directory(t.as_bytes());
        // Wasmtime's documented form (docs/cli-cache.md).
        assert_eq!(
            dir("[cache]\nenabled = true\ndirectory = \"/var/cache/wasm\"\ncleanup-interval = \"30m\"\n"),
            Ok(Some("/var/cache/wasm".into()))
        );
        assert_eq!(dir("[cache]\ndirectory = \"/c\"\n"), Ok(Some("/c".into())));
        assert_eq!(
            dir("[cache]\nenabled = false\ndirectory = \"/c\"\n"),
            Ok(None)
        );
        assert_eq!(
            dir("[cache]\nenabled = true\n"),
            Err(CacheConfigError::NoDirectory)
        );
        assert_eq!(dir(""), Err(CacheConfigError::NoDirectory));
        for bad in [
            "[cache\n",
            "cache = 1\n",
            "[cache]\nenabled = \"yes\"\n",
            "[cache]\ndirectory = 7\n",
            "[cache]\ndirectory = \"relative/dir\"\n",
        ] {
            assert!(
                matches!(dir(bad), Err(CacheConfigError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            cache_directory(b"\xff"),
            Err(CacheConfigError::Invalid(_))
        ));
    }
}
