//! The subset of WASI preview 1 (`wasi_snapshot_preview1`) that Rust's std needs in a
//! proxy-wasm filter: stdout/stderr to [`crate::embedder::Host::log`], clocks, random bytes, an empty
//! environment and argument list, and `proc_exit` as a trap. No files: descriptors other than
//! 0-2 are `EBADF`, no preopens. Other WASI imports are linked to a stub returning `ENOSYS`
//! (see `link::linker`). Spec: <https://github.com/WebAssembly/WASI/blob/main/legacy/preview1/docs.md>.

use std::sync::OnceLock;
use std::time::Instant;

use crate::abi::store::{ms, put, realtime_ns, Def, State, C};
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

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat};
    use crate::testing::MemoryHost;
    use crate::{LogLevel, Vm};

    #[test]
    fn wasi_stdout_is_logged_and_proc_exit_traps() {
        let m = compile(&wat(
            "0_2_1",
            r#"(import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
               (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
               (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))"#,
            r#"(data (i32.const 100) "hello\nwor")
               (data (i32.const 200) "ld\n")
               ;; iovecs at 300: (100, 9), (200, 3)
               (data (i32.const 300) "\64\00\00\00\09\00\00\00\c8\00\00\00\03\00\00\00")
               (func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (drop (call $write (i32.const 2) (i32.const 300) (i32.const 2) (i32.const 400)))
                 ;; 12 bytes written, and an unknown WASI function is ENOSYS (52)
                 (i32.and
                   (i32.eq (i32.load (i32.const 400)) (i32.const 12))
                   (i32.eq (call $read (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)) (i32.const 52))))
               (func (export "proxy_on_tick") (param i32)
                 (call $exit (i32.const 3)))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        let root = vm.create_root("p", b"").unwrap();
        {
            let logs = host.logs.borrow();
            let lines: Vec<_> = logs.iter().map(|l| (l.level, l.message.as_str())).collect();
            assert_eq!(
                lines,
                [(LogLevel::Error, "hello"), (LogLevel::Error, "world")]
            );
        }
        let err = vm.on_tick(root).unwrap_err();
        assert!(err.0.contains("proc_exit(3)"), "{err}");
        assert!(vm.is_poisoned());
    }
    #[test]
    fn one_fd_write_is_a_short_write_of_at_most_64_kib() {
        // 4096 iovecs naming the whole 64 KiB page: 256 MiB asked for in one call. The host takes
        // 64 KiB (a short write, as WASI and POSIX writev allow) and says so; it used to copy and
        // log all of it (a guest with a few MiB of memory held the host for seconds per call).
        let m = compile(&wat(
            "0_2_1",
            r#"(import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
               (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))"#,
            r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (local $i i32)
                 (loop $fill
                   (i32.store (i32.mul (local.get $i) (i32.const 8)) (i32.const 0))
                   (i32.store (i32.add (i32.mul (local.get $i) (i32.const 8)) (i32.const 4)) (i32.const 65536))
                   (local.set $i (i32.add (local.get $i) (i32.const 1)))
                   (br_if $fill (i32.lt_u (local.get $i) (i32.const 4096))))
                 (drop (call $write (i32.const 1) (i32.const 0) (i32.const 4096) (i32.const 65528)))
                 ;; Report the count written as a 4-byte message (the page's last bytes).
                 (i32.store (i32.const 65532) (i32.load (i32.const 65528)))
                 (drop (call $log (i32.const 5) (i32.const 65532) (i32.const 4)))
                 (i32.const 1))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        // Only the Critical report reaches the log, not the written bytes (Info).
        host.level.set(LogLevel::Critical);
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        let start = std::time::Instant::now();
        vm.create_root("p", b"").unwrap();
        let logs = host.logs.borrow();
        let written =
            u32::from_le_bytes(logs[0].message.as_bytes().try_into().unwrap_or([0xff; 4]));
        assert_eq!(written, 64 << 10, "bytes written by one fd_write");
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }
}
