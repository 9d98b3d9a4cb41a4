//! Waking the worker when a background call completes: one eventfd per worker process (created
//! in `init_process`, after fork), registered with nginx's event loop as the read event of a
//! connection of its own (`ngx_get_connection`, `ngx_handle_read_event`). The call runners'
//! threads write it after queuing a completion ([`tollgate_services::grpc_client::Waker`]); its
//! read handler (`timers::wake_handler`) drains it with [`drain`], then collects the
//! completions. This replaces polling the runners every 2 ms while calls are pending: a
//! completion is delivered on the event loop's next turn instead of at the next timer tick.
//!
//! Shutdown: [`close`] first disables the writers (under the lock they write with), then closes
//! the connection, so a thread finishing a call late never writes to a closed (or reused)
//! descriptor.

use std::cell::Cell;
use std::sync::{Arc, Mutex, PoisonError};

use ngx::ffi::{ngx_connection_t, ngx_cycle_t, ngx_event_t};
use tollgate_services::grpc_client::Waker;

/// The descriptor the writers use; -1 once closed.
type Shared = Arc<Mutex<i32>>;

thread_local! {
    /// This worker's eventfd connection and the writers' descriptor.
    static WAKE: Cell<Option<(*mut ngx_connection_t, Option<Shared>)>> = const { Cell::new(None) };
}

/// Creates the eventfd, registers `handler` as its read handler and returns the waker the
/// runners' threads call. `Err` with the reason (the caller falls back to polling).
///
/// # Safety
/// A worker's main thread, with `cycle` its live cycle.
pub unsafe fn open(
    cycle: *mut ngx_cycle_t,
    handler: unsafe extern "C" fn(*mut ngx_event_t),
) -> Result<Waker, String> {
    // SAFETY: plain syscall; the descriptor is ours until `close`.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the cycle is live; nginx owns the connection from here (ngx_close_connection).
    unsafe {
        let c = nginx_sys::ngx_get_connection(fd, (*cycle).log);
        if c.is_null() {
            libc::close(fd);
            return Err("no free connection for the eventfd (worker_connections)".into());
        }
        let rev = (*c).read;
        (*rev).handler = Some(handler);
        (*rev).log = (*cycle).log;
        (*(*c).write).log = (*cycle).log;
        if nginx_sys::ngx_handle_read_event(rev, 0) != 0 {
            nginx_sys::ngx_close_connection(c);
            return Err("cannot add the eventfd to the event loop".into());
        }
        let shared: Shared = Arc::new(Mutex::new(fd));
        let writer = Arc::clone(&shared);
        WAKE.with(|w| w.set(Some((c, Some(shared)))));
        Ok(Arc::new(move || {
            let fd = writer.lock().unwrap_or_else(PoisonError::into_inner);
            if *fd >= 0 {
                let one: u64 = 1;
                // SAFETY: writing 8 bytes from a local to our eventfd (open while locked).
                // EAGAIN (the counter at its maximum) still leaves the event readable.
                let _ = libc::write(*fd, (&raw const one).cast(), 8);
            }
        }))
    }
}

/// Whether this worker has its eventfd (otherwise calls are polled by a timer).
pub fn active() -> bool {
    WAKE.with(|w| {
        let v = w.take();
        let active = v.is_some();
        w.set(v);
        active
    })
}

/// Empties the eventfd of the event `ev` (edge-triggered: read until it would block) and
/// re-arms it.
///
/// # Safety
/// `ev` is the read event of the connection [`open`] registered.
pub unsafe fn drain(ev: *mut ngx_event_t) {
    // SAFETY: the event's data is its connection (nginx's convention), whose fd is the eventfd.
    unsafe {
        let c = (*ev).data.cast::<ngx_connection_t>();
        if c.is_null() {
            return;
        }
        let mut buf = [0u8; 8];
        while libc::read((*c).fd, buf.as_mut_ptr().cast(), 8) == 8 {}
        (*ev).set_ready(0);
        let _ = nginx_sys::ngx_handle_read_event(ev, 0);
    }
}

/// Disables the writers and closes the eventfd's connection (exit_process).
///
/// # Safety
/// A worker's main thread.
pub unsafe fn close() {
    let Some((c, shared)) = WAKE.with(Cell::take) else {
        return;
    };
    if let Some(shared) = shared {
        let mut fd = shared.lock().unwrap_or_else(PoisonError::into_inner);
        *fd = -1;
        // SAFETY: the connection `open` made; its fd is closed by nginx here, after the
        // writers were disabled under the lock.
        unsafe { nginx_sys::ngx_close_connection(c) };
    }
}
