//! Logging and time: `proxy_log`, `proxy_get_log_level`,
//! `proxy_get_current_time_nanoseconds`, `proxy_set_tick_period_milliseconds`.

use crate::abi::store::{
    ms, realtime_ns, return_u32, return_u64, Def, BAD_ARGUMENT, C, INTERNAL_FAILURE,
    INVALID_MEMORY_ACCESS, OK,
};
use crate::embedder::LogLevel;
use crate::error::Error;
use crate::mem;

/// Defines this area's functions of module `env`.
pub(crate) fn define(d: &mut Def<'_>) -> Result<(), Error> {
    d.env(
        "proxy_log",
        |mut c: C<'_>, level: u32, ptr: u32, len: u32| -> u32 {
            let Some((mem, state)) = ms(&mut c) else {
                return INTERNAL_FAILURE;
            };
            match mem::slice(mem, ptr, len) {
                Some(msg) => {
                    state.log(LogLevel::from_u32(level), msg);
                    OK
                }
                None => INVALID_MEMORY_ACCESS,
            }
        },
    )?;
    d.env("proxy_get_log_level", |mut c: C<'_>, ret: u32| -> u32 {
        let level = c.data().host.log_level() as u32;
        return_u32(&mut c, ret, level)
    })?;
    d.env(
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: u32| -> u32 { return_u64(&mut c, ret, realtime_ns()) },
    )?;
    d.env(
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, period: u32| -> u32 {
            let state = c.data_mut();
            let index = state.root_index;
            match state.roots.get_mut(index) {
                Some(root) => {
                    if root.tick_ms != period {
                        root.tick_ms = period;
                        crate::abi::store::tick_periods_changed();
                    }
                    OK
                }
                None => BAD_ARGUMENT,
            }
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Hand-written modules (WAT) on the edges of this part of the ABI.
    use std::rc::Rc;

    use crate::testing::wat_fixtures::{compile, wat, LOG};
    use crate::testing::MemoryHost;
    use crate::Vm;

    #[test]
    fn out_of_bounds_pointers_are_invalid_memory_access() {
        // on_configure returns whether proxy_log with a pointer past the memory returned 6.
        let m = compile(&wat(
            "0_2_1",
            LOG,
            r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
                 (i32.and
                   (i32.eq (call $log (i32.const 2) (i32.const 65530) (i32.const 100)) (i32.const 6))
                   (i32.eq (call $log (i32.const 2) (i32.const -1) (i32.const 2)) (i32.const 6))))"#,
        ))
        .unwrap();
        let host = Rc::new(MemoryHost::new());
        let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
        vm.create_root("p", b"").unwrap();
        assert!(host.logs.borrow().is_empty());
    }
}
