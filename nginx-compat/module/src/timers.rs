//! The worker's timers and wake-ups: the eventfd handler that delivers completed HTTP and gRPC
//! calls ([`wake_handler`], `wake.rs`), the poll timer of shared queues (and of calls when the
//! worker has no eventfd) ([`kick_calls`], [`poll_handler`]), each filter's `on_tick` timer
//! ([`tick_handler`]); and [`run_chain`], which runs a step of a request's chain and then arms
//! the poll timer.

use ngx::ffi::{ngx_event_t, ngx_msec_t};

use crate::request::callbacks::Outcome;
use crate::request::resume::resume_all;
use crate::util::{level, log};
use crate::worker::{with_worker, TickTimer, Worker};

/// Runs one step of a request's filter chain with the worker state (`Failed` when it is not
/// available), then arms the poll timer for any HTTP call the filters dispatched.
pub fn run_chain(step: impl FnOnce(&mut Worker) -> Outcome) -> Outcome {
    with_worker(|w| {
        let out = step(w);
        kick(w);
        out
    })
    .unwrap_or(Outcome::Failed)
}

/// Follows the root contexts' tick periods ([`Worker::sync_ticks`]), then arms the worker's
/// poll timer: every 2 ms while calls are pending and the worker has no
/// eventfd to be woken by (`wake::active`), every
/// [`crate::worker_host::QUEUE_POLL_MS`] while a root context of the worker has registered a shared
/// queue (`on_queue_ready`, not in an exiting worker); not at all otherwise.
pub fn kick_calls() {
    with_worker(kick);
}

/// [`kick_calls`] with the worker in hand.
fn kick(w: &mut Worker) {
    // A root context may have asked for another tick period meanwhile (Envoy re-arms at
    // once): every path that runs guest code ends here.
    w.sync_ticks(tick_handler);
    // SAFETY: reading nginx's process-wide exit flags (this worker's own memory).
    let exiting = unsafe { nginx_sys::ngx_exiting != 0 || nginx_sys::ngx_quit != 0 };
    let delay: ngx::ffi::ngx_msec_t = if crate::calls::inflight(w) && !crate::wake::active() {
        // Requests may be waiting for these answers, exiting or not.
        2
    } else if w.has_queues() && !exiting {
        crate::worker_host::QUEUE_POLL_MS
    } else {
        return;
    };
    // SAFETY: the worker's own timer event.
    unsafe {
        if w.poll.timer_set() == 0 {
            nginx_sys::ngx_add_timer(&mut *w.poll, delay);
        }
    }
}

pub unsafe extern "C" fn poll_handler(_ev: *mut ngx_event_t) {
    let resumed = with_worker(|w| {
        let mut resumed = crate::calls::poll(w);
        resumed.extend(crate::grpc_calls::poll(w));
        resumed.extend(w.poll_queues());
        resumed
    })
    .unwrap_or_default();
    resume_all(resumed);
    kick_calls();
}

/// The worker's eventfd is readable: a background thread completed an HTTP or gRPC call.
/// Drains it first (a completion queued after this still wakes the worker again), then
/// delivers every completed call and resumes the requests their callbacks resumed.
pub unsafe extern "C" fn wake_handler(ev: *mut ngx_event_t) {
    // SAFETY: `ev` is the eventfd connection's read event (wake::open registered us on it).
    unsafe { crate::wake::drain(ev) };
    let resumed = with_worker(|w| {
        let mut resumed = crate::calls::poll(w);
        resumed.extend(crate::grpc_calls::poll(w));
        resumed
    })
    .unwrap_or_default();
    resume_all(resumed);
    kick_calls();
}

/// A filter's `on_tick` timer fired: calls it, re-arms it with the period the root context
/// asks for now, and resumes the requests it resumed.
pub unsafe extern "C" fn tick_handler(ev: *mut ngx_event_t) {
    // SAFETY: `ev` is the first field of a `repr(C)` TickTimer (see arm_ticks).
    let (filter, tp) = unsafe {
        let t = ev.cast::<TickTimer>();
        ((*t).filter, t)
    };
    let resumed = with_worker(|w| {
        let Some(f) = w.filters.get(filter).cloned() else {
            return (Vec::new(), 0);
        };
        let root = w.roots.get(filter).copied().flatten();
        let mut period = 0;
        if let (Some(root), Some(vm)) = (root, w.vms.get_mut(f.module).and_then(|s| s.vm.as_mut()))
        {
            if let Err(e) = vm.on_tick(root) {
                log(
                    level::ERR,
                    w.log,
                    &format!("tollgate: filter \"{}\": on_tick: {}", f.name, e.0),
                );
            }
            period = vm.tick_period_ms(root);
        }
        w.check_poisoned(f.module);
        if let (Some(root), Some(vm)) = (
            w.roots.get(filter).copied().flatten(),
            w.vms.get(f.module).and_then(|s| s.vm.as_ref()),
        ) {
            period = vm.tick_period_ms(root);
        }
        let resumed = w.take_resumed(f.module);
        (resumed, period)
    });
    let Some((resumed, period)) = resumed else {
        return;
    };
    // SAFETY: re-arming our own timer; exiting workers skip it (cancelable).
    unsafe {
        (*tp).period = period;
        if period > 0
            && (*tp).ev.timer_set() == 0
            && nginx_sys::ngx_exiting == 0
            && nginx_sys::ngx_quit == 0
        {
            nginx_sys::ngx_add_timer(
                &mut (*tp).ev,
                ngx_msec_t::try_from(period).unwrap_or(ngx_msec_t::MAX),
            );
        }
    }
    resume_all(resumed);
    kick_calls();
}
