//! The subset of WASI preview 1 (`wasi_snapshot_preview1`) that Rust's std needs in a
//! proxy-wasm filter: stdout/stderr to [`crate::embedder::Host::log`], clocks, random bytes, an empty
//! environment and argument list, and `proc_exit` as a trap. No files: descriptors other than
//! 0-2 are `EBADF`, no preopens. Other WASI imports are linked to a stub returning `ENOSYS`
//! (see `link::linker`). Spec: <https://github.com/WebAssembly/WASI/blob/main/legacy/preview1/docs.md>.

use std::sync::OnceLock;
use std::time::Instant;

use crate::abi::core::{ms, put, realtime_ns, Def, State, C};
use crate::embedder::LogLevel;
use crate::error::Error;
use crate::mem;

const SUCCESS: u16 = 0;
const EBADF: u16 = 8;
const EFAULT: u16 = 21;
const EINVAL: u16 = 28;
const EIO: u16 = 29;
pub(crate) const ENOSYS: u16 = 52;
const ESPIPE: u16 = 70;

fn e(v: u16) -> i32 {
    i32::from(v)
}

/// Monotonic clock: nanoseconds since the first use in this process.
fn monotonic_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Most bytes one `fd_write` takes, and most iovecs it reads (POSIX's `IOV_MAX`): beyond them
/// it writes less than asked and says how much, a short write that WASI allows as POSIX
/// `writev` does (Rust's `write_all` and wasi-libc's stdio write the rest with the next call).
/// Without them one call over a few MiB of memory (thousands of iovecs naming the same
/// buffer) kept the host copying and logging gigabytes.
const MAX_WRITE_BYTES: u32 = 64 << 10;
const MAX_IOVS: u32 = 1024;

pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.wasi_func(
        "fd_write",
        |mut c: C<'_>, fd: u32, iovs: u32, iovs_len: u32, ret_written: u32| -> i32 {
            if fd != 1 && fd != 2 {
                return e(EBADF);
            }
            let Some((memory, state)) = ms(&mut c) else {
                return e(EIO);
            };
            let mut written: u32 = 0;
            let mut at = iovs;
            for _ in 0..iovs_len.min(MAX_IOVS) {
                let (Some(ptr), Some(len)) = (
                    mem::read_u32(memory, at),
                    at.checked_add(4).and_then(|p| mem::read_u32(memory, p)),
                ) else {
                    return e(EFAULT);
                };
                if mem::slice(memory, ptr, len).is_none() {
                    return e(EFAULT);
                }
                let take = len.min(MAX_WRITE_BYTES.saturating_sub(written));
                let Some(bytes) = mem::slice(memory, ptr, take) else {
                    return e(EFAULT);
                };
                state.stdio(fd, bytes);
                written = written.saturating_add(take);
                if written >= MAX_WRITE_BYTES {
                    break;
                }
                let Some(next) = at.checked_add(8) else {
                    return e(EFAULT);
                };
                at = next;
            }
            if mem::write_u32(memory, ret_written, written) {
                e(SUCCESS)
            } else {
                e(EFAULT)
            }
        },
    )?;
    // Empty environment and arguments: zero entries, zero bytes.
    let sizes = |mut c: C<'_>, ret_count: u32, ret_size: u32| -> i32 {
        if put(&mut c, ret_count, &[0; 4]) && put(&mut c, ret_size, &[0; 4]) {
            e(SUCCESS)
        } else {
            e(EFAULT)
        }
    };
    d.wasi_func("environ_sizes_get", sizes)?;
    d.wasi_func("args_sizes_get", sizes)?;
    let get = |_c: C<'_>, _ptrs: u32, _buf: u32| -> i32 { e(SUCCESS) };
    d.wasi_func("environ_get", get)?;
    d.wasi_func("args_get", get)?;
    d.wasi_func(
        "clock_time_get",
        |mut c: C<'_>, id: u32, _precision: u64, ret: u32| -> i32 {
            let now = match id {
                0 => realtime_ns(),
                1 => monotonic_ns(),
                _ => return e(EINVAL),
            };
            if put(&mut c, ret, &now.to_le_bytes()) {
                e(SUCCESS)
            } else {
                e(EFAULT)
            }
        },
    )?;
    d.wasi_func("clock_res_get", |mut c: C<'_>, id: u32, ret: u32| -> i32 {
        if id > 1 {
            return e(EINVAL);
        }
        if put(&mut c, ret, &1u64.to_le_bytes()) {
            e(SUCCESS)
        } else {
            e(EFAULT)
        }
    })?;
    d.wasi_func("random_get", |mut c: C<'_>, ptr: u32, len: u32| -> i32 {
        let Some((m, _)) = ms(&mut c) else {
            return e(EIO);
        };
        let Ok(len) = usize::try_from(len) else {
            return e(EFAULT);
        };
        match mem::slice_mut(m, ptr, len) {
            Some(dst) => match getrandom::getrandom(dst) {
                Ok(()) => e(SUCCESS),
                Err(_) => e(EIO),
            },
            None => e(EFAULT),
        }
    })?;
    d.wasi_func(
        "proc_exit",
        |mut c: C<'_>, code: u32| -> wasmtime::Result<()> {
            c.data_mut().flush_stdio();
            Err(wasmtime::format_err!("the module called proc_exit({code})"))
        },
    )?;
    d.wasi_func("fd_close", |_c: C<'_>, _fd: u32| -> i32 { e(EBADF) })?;
    d.wasi_func(
        "fd_seek",
        |_c: C<'_>, fd: u32, _offset: i64, _whence: u32, _ret: u32| -> i32 {
            if fd <= 2 {
                e(ESPIPE)
            } else {
                e(EBADF)
            }
        },
    )?;
    d.wasi_func("fd_fdstat_get", |mut c: C<'_>, fd: u32, ret: u32| -> i32 {
        if fd > 2 {
            return e(EBADF);
        }
        // fdstat: u8 filetype (2 = character device), u16 flags, u64 rights base and
        // inheriting (fd_write = bit 6 for stdout/stderr, none for stdin): 24 bytes.
        let mut st = [0u8; 24];
        st[0] = 2;
        if fd > 0 {
            st[8] = 1 << 6;
        }
        if put(&mut c, ret, &st) {
            e(SUCCESS)
        } else {
            e(EFAULT)
        }
    })?;
    d.wasi_func("fd_prestat_get", |_c: C<'_>, _fd: u32, _ret: u32| -> i32 {
        e(EBADF)
    })?;
    d.wasi_func(
        "fd_prestat_dir_name",
        |_c: C<'_>, _fd: u32, _ptr: u32, _len: u32| -> i32 { e(EBADF) },
    )?;
    d.wasi_func("sched_yield", |_c: C<'_>| -> i32 { e(SUCCESS) })?;
    d.wasi_func(
        "poll_oneoff",
        |_c: C<'_>, _in: u32, _out: u32, _n: u32, _ret: u32| -> i32 { e(ENOSYS) },
    )?;
    Ok(())
}

impl State {
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
}
