//! Compiled code kept across starts and reloads: [`CompiledCache`], a directory of wasmtime's
//! serialized modules (`Module::serialize`), so that a module that did not change since the
//! last start is not compiled again.
//!
//! An entry is named by what it was compiled from and with: the SHA-256 of the `.wasm` and a
//! digest of the engine's settings (`Engine::precompile_compatibility_hash`: wasmtime's version,
//! the compiler and its flags, epoch interruption...), `<wasm sha256>-<engine digest>.cwasm`. A
//! change of either is another name, so a stale entry is never even opened. The file holds
//! [`MAGIC`], the SHA-256 of the serialized module, then the module.
//!
//! Nothing is trusted: deserializing is loading native code, so an entry is used only when
//! - the directory and the file belong to this process's effective user and nobody else can
//!   write them (mode without group or other write), the file a regular file (no symbolic link);
//! - every directory above, on the path as configured and as resolved through symbolic links,
//!   belongs to root or to this user and nobody else can write it, or it is sticky (`/tmp`), so
//!   that nobody else can put another directory in the path (OpenSSH's `StrictModes` rule);
//! - its checksum matches (a truncated write, a disk error, a copy from elsewhere);
//! - wasmtime accepts it for this engine (its own header check).
//!
//! Otherwise the module is compiled, the reason is returned for the log ([`CacheNote`]), and
//! the entry is written anew (to a temporary file renamed into place, so a reader never sees
//! half of one). A directory that fails the ownership checks is not written either.

use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first bytes of an entry (format version 1).
pub const MAGIC: &[u8; 8] = b"TGCWASM1";

/// Bytes of [`MAGIC`] and the checksum before the serialized module.
const HEADER: usize = 8 + 32;

/// A directory of compiled modules (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledCache {
    dir: PathBuf,
}

/// What the cache did for one module, for the log: `reused` tells whether compiled code was
/// loaded (no compilation); `message` says what happened and why (a missing, stale, corrupt or
/// untrusted entry, a failed write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheNote {
    pub reused: bool,
    /// Whether the log line is a warning (something was wrong with the cache), not information.
    pub warning: bool,
    pub message: String,
}

impl CompiledCache {
    /// A cache in `dir` (an absolute path; created on first write if missing, mode 0700).
    pub fn new(dir: impl Into<PathBuf>) -> CompiledCache {
        CompiledCache { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's path for `wasm` compiled by `engine`.
    pub fn entry_path(&self, engine: &wasmtime::Engine, wasm: &[u8]) -> PathBuf {
        let mut h = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let name = format!("{}-{:016x}.cwasm", hex(&Sha256::digest(wasm)), h.finish());
        self.dir.join(name)
    }

    /// The module of `wasm`: from the cache when its entry is there and trusted, else compiled
    /// (and stored). Errors: `wasm` does not compile (wasmtime's message).
    pub fn load_or_compile(
        &self,
        engine: &wasmtime::Engine,
        wasm: &[u8],
    ) -> Result<(wasmtime::Module, CacheNote), wasmtime::Error> {
        let path = self.entry_path(engine, wasm);
        let why = match self.load(engine, &path) {
            Ok(module) => {
                let message = format!("compiled code reused from {}", path.display());
                let note = CacheNote {
                    reused: true,
                    warning: false,
                    message,
                };
                return Ok((module, note));
            }
            Err(why) => why,
        };
        let module = wasmtime::Module::new(engine, wasm)?;
        let stored = match why {
            Refused::UntrustedDir(_) => Err("not written there".to_string()),
            _ => self.store(&module, &path),
        };
        let (warning, mut message) = match &why {
            Refused::Missing => (false, format!("compiled; no entry {}", path.display())),
            Refused::UntrustedDir(w)
            | Refused::Untrusted(w)
            | Refused::Corrupt(w)
            | Refused::Stale(w) => (
                true,
                format!("entry {} not used ({w}): compiled again", path.display()),
            ),
        };
        let warning = match stored {
            Ok(()) => {
                message.push_str("; stored");
                warning
            }
            Err(e) => {
                message.push_str("; ");
                message.push_str(&e);
                true
            }
        };
        Ok((
            module,
            CacheNote {
                reused: false,
                warning,
                message,
            },
        ))
    }

    /// The entry at `path`, checked as the module documentation says.
    fn load(&self, engine: &wasmtime::Engine, path: &Path) -> Result<wasmtime::Module, Refused> {
        let dir = match std::fs::metadata(&self.dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Refused::Missing),
            Err(e) => return Err(Refused::UntrustedDir(format!("directory: {e}"))),
        };
        if !dir.is_dir() {
            return Err(Refused::UntrustedDir("not a directory".into()));
        }
        trusted(&dir).map_err(|w| Refused::UntrustedDir(format!("the directory {w}")))?;
        trusted_above(&self.dir).map_err(Refused::UntrustedDir)?;
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Refused::Missing),
            Err(e) => return Err(Refused::Untrusted(format!("cannot open: {e}"))),
        };
        let meta = file
            .metadata()
            .map_err(|e| Refused::Untrusted(e.to_string()))?;
        if !meta.is_file() {
            return Err(Refused::Untrusted("not a regular file".into()));
        }
        trusted(&meta).map_err(|w| Refused::Untrusted(format!("file {w}")))?;
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|e| Refused::Corrupt(format!("cannot read: {e}")))?;
        let (Some(magic), Some(sum), Some(body)) =
            (bytes.get(..8), bytes.get(8..HEADER), bytes.get(HEADER..))
        else {
            return Err(Refused::Corrupt("too short".into()));
        };
        if magic != MAGIC {
            return Err(Refused::Corrupt("not an entry of this format".into()));
        }
        if Sha256::digest(body).as_slice() != sum {
            return Err(Refused::Corrupt("checksum mismatch".into()));
        }
        // SAFETY: `body` is what `Module::serialize` wrote for an engine with these settings
        // (the name), unchanged since (the checksum), in a file only this user can have written
        // (`trusted`); wasmtime checks its own header against this engine too.
        unsafe { wasmtime::Module::deserialize(engine, body) }
            .map_err(|e| Refused::Stale(format!("wasmtime refused it: {e}")))
    }

    /// Writes `module`'s entry at `path`: a temporary file in the directory, renamed.
    fn store(&self, module: &wasmtime::Module, path: &Path) -> Result<(), String> {
        let body = module
            .serialize()
            .map_err(|e| format!("not written: cannot serialize: {e}"))?;
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
        {
            return Err(format!("not written: cannot create the directory: {e}"));
        }
        let dir = std::fs::metadata(&self.dir).map_err(|e| format!("not written: {e}"))?;
        trusted(&dir).map_err(|w| format!("not written: the directory {w}"))?;
        trusted_above(&self.dir).map_err(|w| format!("not written: {w}"))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f: File = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&Sha256::digest(&body))?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("not written: {e}")
        })
    }
}

/// Why an entry was not used.
enum Refused {
    Missing,
    /// The directory: nothing in it is read or written.
    UntrustedDir(String),
    /// The entry (a symbolic link, another owner, writable by others): replaced.
    Untrusted(String),
    Corrupt(String),
    Stale(String),
}

/// `Ok` when `meta` belongs to this process's effective user and neither its group nor others
/// may write it; else what is wrong.
fn trusted(meta: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(format!("belongs to uid {}, not {euid}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "is writable by its group or others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// `Ok` when every directory above `dir` belongs to root or to this process's effective user
/// and is writable by nobody else, or is sticky; else which one is not.
/// Both the path as configured and the path it resolves to: a symbolic link on the way is only
/// as safe as the directory holding it.
fn trusted_above(dir: &Path) -> Result<(), String> {
    let real = std::fs::canonicalize(dir).map_err(|e| format!("the directory: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    for above in dir.ancestors().skip(1).chain(real.ancestors().skip(1)) {
        if above.as_os_str().is_empty() {
            continue; // a relative path's end
        }
        let meta = std::fs::metadata(above).map_err(|e| format!("{}: {e}", above.display()))?;
        let owner_ok = meta.uid() == 0 || meta.uid() == euid;
        let sticky = meta.mode() & 0o1000 != 0;
        if !owner_ok || (meta.mode() & 0o022 != 0 && !sticky) {
            return Err(format!(
                "{} above it belongs to uid {} with mode {:o}: others could replace the directory",
                above.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn engine() -> wasmtime::Engine {
        wasmtime::Engine::default()
    }

    /// An engine whose settings differ from [`engine`]'s (epoch interruption).
    fn other_engine() -> wasmtime::Engine {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        wasmtime::Engine::new(&config).unwrap()
    }

    fn wasm(n: i32) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(module (memory (export "memory") 1) (func (export "f") (result i32) (i32.const {n})))"#
        ))
        .unwrap()
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tollgate-cc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn call(engine: &wasmtime::Engine, m: &wasmtime::Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        let i = wasmtime::Instance::new(&mut store, m, &[]).unwrap();
        let f = i.get_typed_func::<(), i32>(&mut store, "f").unwrap();
        f.call(&mut store, ()).unwrap()
    }

    #[test]
    fn a_module_is_compiled_once_then_reused() {
        let (e, dir) = (engine(), tmpdir("reuse"));
        let cache = CompiledCache::new(&dir);
        let (m, note) = cache.load_or_compile(&e, &wasm(7)).unwrap();
        assert!(!note.reused && !note.warning, "{note:?}");
        assert_eq!(call(&e, &m), 7);
        let (m, note) = cache.load_or_compile(&e, &wasm(7)).unwrap();
        assert!(note.reused, "{note:?}");
        assert_eq!(call(&e, &m), 7);
        // Another module, another entry.
        let (m, note) = cache.load_or_compile(&e, &wasm(8)).unwrap();
        assert!(!note.reused);
        assert_eq!(call(&e, &m), 8);
        let meta = std::fs::metadata(cache.entry_path(&e, &wasm(7))).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A cache inside a directory others can write (not sticky): they could swap it.
    #[test]
    fn a_directory_under_one_others_can_write_is_not_used() {
        let e = engine();
        let open = tmpdir("open-parent");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let cache = CompiledCache::new(open.join("cache"));
        let (_, note) = cache.load_or_compile(&e, &wasm(4)).unwrap();
        assert!(
            note.warning && note.message.contains("others could replace"),
            "{note:?}"
        );
        assert!(!cache.entry_path(&e, &wasm(4)).exists());
        // A link to a trusted directory, held by the open one: the link could be replaced.
        let trusted = tmpdir("link-target");
        std::fs::create_dir_all(&trusted).unwrap();
        std::fs::set_permissions(&trusted, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&trusted, open.join("link")).unwrap();
        let linked = CompiledCache::new(open.join("link"));
        let (_, note) = linked.load_or_compile(&e, &wasm(4)).unwrap();
        assert!(
            note.warning && note.message.contains("others could replace"),
            "{note:?}"
        );
        assert_eq!(std::fs::read_dir(&trusted).unwrap().count(), 0);
        std::fs::remove_dir_all(&trusted).unwrap();
        // Sticky, as /tmp: used.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(!cache.load_or_compile(&e, &wasm(4)).unwrap().1.warning);
        assert!(cache.load_or_compile(&e, &wasm(4)).unwrap().1.reused);
        std::fs::remove_dir_all(&open).unwrap();
    }

    #[test]
    fn another_engine_setting_is_another_entry() {
        let dir = tmpdir("engine");
        let cache = CompiledCache::new(&dir);
        let (a, b) = (engine(), other_engine());
        assert_ne!(
            cache.entry_path(&a, &wasm(1)),
            cache.entry_path(&b, &wasm(1))
        );
        cache.load_or_compile(&a, &wasm(1)).unwrap();
        let (_, note) = cache.load_or_compile(&b, &wasm(1)).unwrap();
        assert!(!note.reused);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An entry changed after it was written, in each way: compiled again, with a warning that
    /// says why, and the entry written anew.
    #[test]
    fn a_corrupt_entry_is_never_loaded() {
        let (e, dir) = (engine(), tmpdir("corrupt"));
        let cache = CompiledCache::new(&dir);
        let path = cache.entry_path(&e, &wasm(3));
        cache.load_or_compile(&e, &wasm(3)).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        // A module serialized for another engine, with a valid checksum: wasmtime refuses it.
        let foreign = wasmtime::Module::new(&other_engine(), wasm(3))
            .unwrap()
            .serialize()
            .unwrap();
        let mut resealed = MAGIC.to_vec();
        resealed.extend_from_slice(&Sha256::digest(&foreign));
        resealed.extend_from_slice(&foreign);
        for (bad, why) in [
            (flipped, "checksum mismatch"),
            (good[..20].to_vec(), "too short"),
            (b"TGCWASM0".repeat(10), "not an entry"),
            (resealed, "wasmtime refused it"),
        ] {
            std::fs::write(&path, &bad).unwrap();
            let (m, note) = cache.load_or_compile(&e, &wasm(3)).unwrap();
            assert!(!note.reused && note.warning, "{note:?}");
            assert!(note.message.contains(why), "{why}: {note:?}");
            assert!(note.message.contains("stored"), "{note:?}");
            assert_eq!(call(&e, &m), 3);
            assert_eq!(std::fs::read(&path).unwrap(), good);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An entry or directory others can write, and a symbolic link: not loaded, and the
    /// untrusted directory not written.
    #[test]
    fn an_entry_others_can_write_is_never_loaded() {
        let (e, dir) = (engine(), tmpdir("perm"));
        let cache = CompiledCache::new(&dir);
        let path = cache.entry_path(&e, &wasm(5));
        cache.load_or_compile(&e, &wasm(5)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let (_, note) = cache.load_or_compile(&e, &wasm(5)).unwrap();
        assert!(!note.reused && note.warning, "{note:?}");
        assert!(note.message.contains("writable"), "{note:?}");
        // Written anew (mode 0600) by that compilation: reused now.
        assert!(cache.load_or_compile(&e, &wasm(5)).unwrap().1.reused);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (_, note) = cache.load_or_compile(&e, &wasm(5)).unwrap();
        assert!(!note.reused && note.warning, "{note:?}");
        assert!(note.message.contains("directory is writable"), "{note:?}");
        assert!(note.message.contains("not written"), "{note:?}");
        assert!(!note.message.contains("stored"), "{note:?}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();

        let real = dir.join("elsewhere.cwasm");
        std::fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        let (_, note) = cache.load_or_compile(&e, &wasm(5)).unwrap();
        assert!(!note.reused && note.warning, "{note:?}");
        assert!(note.message.contains("cannot open"), "{note:?}");
        // The link itself was replaced by an entry.
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert!(cache.load_or_compile(&e, &wasm(5)).unwrap().1.reused);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
