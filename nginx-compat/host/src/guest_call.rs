//! One call into a guest ([`enter`]): the context it runs for, its deadline, the request's
//! stream lent to the store for its length, and a trap turned into an error that names the
//! callback and poisons the instance.

use wasmtime::Store;

use crate::abi::store::{LentStream, State};
use crate::combined_calls::Combined;
use crate::error::Error;
use crate::limits::{CallKind, GuestLimits};
use crate::stream::Stream;

/// A call into the guest: the export's name, its deadline (and in epoch ticks) and the context
/// it runs for; for a call through the callbacks' adapter, the adapter (which names the callback
/// a trap happened in).
pub(crate) struct Guest<'a> {
    name: &'static str,
    deadline: std::time::Duration,
    ticks: u64,
    ctx: u32,
    combined: Option<&'a Combined>,
}

impl<'a> Guest<'a> {
    pub(crate) fn new(
        name: &'static str,
        limits: &GuestLimits,
        ticks: (u64, u64),
        kind: CallKind,
        ctx: u32,
    ) -> Guest<'a> {
        let (deadline, ticks) = match kind {
            CallKind::Startup => (limits.configure_deadline, ticks.1),
            CallKind::Call => (limits.call_deadline, ticks.0),
        };
        Guest {
            name,
            deadline,
            ticks,
            ctx,
            combined: None,
        }
    }

    /// The same call made through the callbacks' adapter.
    pub(crate) fn through(self, combined: &'a Combined) -> Guest<'a> {
        Guest {
            combined: Some(combined),
            ..self
        }
    }

    /// The export that failed, after a failed call.
    fn failed_export(&self, store: &mut Store<State>) -> &'static str {
        match self.combined {
            Some(c) => c.stage_name(store),
            None => self.name,
        }
    }
}

pub(crate) fn poisoned_error() -> Error {
    Error("the Vm trapped before and is poisoned: instantiate a new one".into())
}

/// Why a call failed, for the error log: the deadline, a refused growth, or wasmtime's trap.
pub(crate) fn trap_reason(
    store: &mut Store<State>,
    deadline: std::time::Duration,
    e: &wasmtime::Error,
) -> String {
    if e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
        return format!(
            "deadline of {} ms exceeded (the guest was interrupted)",
            deadline.as_millis()
        );
    }
    let mut msg = Error::wasm("wasm trap", e).0;
    if let Some(refused) = store.data_mut().limiter.refused.take() {
        msg.push_str(" (");
        msg.push_str(&refused);
        msg.push(')');
    }
    msg
}

/// Runs one guest callback: loads `stream` into the store (or an empty one), sets the current
/// and effective context and the epoch deadline, calls, moves the stream back, and turns a trap
/// into `Err` naming the callback (poisoning the `Vm`). Inlined: it is most of the cost of a
/// call into the guest besides wasmtime's.
#[inline(always)]
pub(crate) fn enter<R>(
    store: &mut Store<State>,
    poisoned: &mut bool,
    guest: &Guest,
    stream: Option<&mut Stream>,
    call: impl FnOnce(&mut Store<State>) -> wasmtime::Result<R>,
) -> Result<R, Error> {
    if *poisoned {
        return Err(poisoned_error());
    }
    let data = store.data_mut();
    if !data.set_effective(guest.ctx) {
        return Err(Error(format!("unknown context {}", guest.ctx)));
    }
    data.current = guest.ctx;
    if !cfg!(feature = "unbounded-guests") {
        store.set_epoch_deadline(guest.ticks);
    }
    let result = match stream {
        Some(stream) => {
            // Lent for the call, not moved: no stream is built, copied or dropped per callback.
            let lent = LentStream::new(store, stream);
            call(&mut *lent.store)
        }
        None => {
            let result = call(&mut *store);
            // A root callback may have written into the idle stream: clear it.
            store.data_mut().idle_stream = Stream::default();
            result
        }
    };
    let data = store.data_mut();
    data.current = 0;
    data.effective = 0;
    result.map_err(|e| {
        *poisoned = true;
        store.data_mut().flush_stdio();
        let why = trap_reason(store, guest.deadline, &e);
        Error(format!("{}: {why}", guest.failed_export(store)))
    })
}
