//! Running a stream callback over the request's filters, in order, fail closed (a filter that
//! cannot run fails the request, logged naming it), and how the run ended ([`Outcome`]: on,
//! paused, a local response, failed, closed); then `on_log`, `on_done`, `on_delete` when the
//! request ends.

use tollgate_host::{Action, LocalResponse, StreamCallback};

use super::context::{from_handle, RequestCtx, VmRef};
use crate::util::{level, log};
use crate::worker::Worker;
/// How a run of callbacks ended.
pub enum Outcome {
    /// All filters continued.
    Continue,
    /// Paused before filter `n` (0-based index of the next one).
    Paused(usize),
    /// A filter asked for a local response.
    Local(LocalResponse),
    /// A filter trapped, failed or could not run.
    Failed,
    /// A filter closed the stream.
    Closed,
}

impl RequestCtx {
    /// Removes this request from the worker's list of requests in flight and from its live map:
    /// each entry it made there, when the entry is still its own (after a module's instance was
    /// replaced, a newer request may hold the same context id there).
    pub fn unregister(&mut self, w: &mut Worker) {
        let me = self.handle();
        if let Some(at) = self.in_flight_at.take() {
            if let Some((moved, to)) = w.in_flight.remove(me, at) {
                // SAFETY: the list holds live contexts only (each leaves it here, before it is
                // freed).
                if let Some(c) = unsafe { from_handle(moved) } {
                    c.in_flight_at = Some(to);
                }
            }
        }
        for s in &mut self.slots {
            if let (true, VmRef::Shared { module, .. }, Some(h)) =
                (std::mem::take(&mut s.registered), s.vm, s.http)
            {
                if w.live.get(&(module, h.0)) == Some(&me) {
                    w.live.remove(&(module, h.0));
                }
            }
        }
    }

    /// Puts filter `i`'s HTTP context in the worker's live map (see `Slot::registered`).
    fn register(&mut self, w: &mut Worker, i: usize) {
        let me = self.handle();
        if let Some(s) = self.slots.get_mut(i) {
            if let (false, VmRef::Shared { module, .. }, Some(h)) = (s.registered, s.vm, s.http) {
                w.live.insert((module, h.0), me);
                s.registered = true;
            }
        }
    }

    /// Calls `cb` of filter `i`. `Err` (logged, naming the filter and the callback) when the
    /// filter cannot run: it failed before, its context or instance is gone, or it trapped.
    fn call(
        &mut self,
        w: &mut Worker,
        i: usize,
        cb: StreamCallback,
        eos: bool,
    ) -> Result<Action, ()> {
        let Some(slot) = self.slots.get(i) else {
            return Ok(Action::Continue);
        };
        let filter = slot.filter;
        let failed = slot.failed;
        if failed {
            // Logged when it failed; the error response of a refused request goes out without
            // it, anything else is refused.
            return if self.refused {
                Ok(Action::Continue)
            } else {
                Err(())
            };
        }
        let target = match (slot.http, slot.vm) {
            (None, _) | (_, VmRef::None) => Err("it has no HTTP context".to_owned()),
            (Some(id), VmRef::Shared { module, generation }) => match w.vms.get_mut(module) {
                Some(s) if s.generation == generation => match s.vm.as_mut() {
                    Some(vm) => Ok((vm, id, Some(module))),
                    None => Err("its instance is gone".to_owned()),
                },
                _ => Err("its instance was replaced after a trap".to_owned()),
            },
            (Some(id), VmRef::Owned(k)) => match self.own_vms.get_mut(k) {
                Some(vm) => Ok((vm, id, None)),
                None => Err("its instance is gone".to_owned()),
            },
        };
        let (res, module, dispatched) = match target {
            Ok((vm, id, module)) => {
                // Calls the filter makes take this request's location's directives.
                let _entered = w.host.enter_request(self.r);
                let calls = vm.calls_dispatched();
                let res = vm.on_stream(cb, id, &mut self.stream, eos).map_err(|e| e.0);
                let dispatched = vm.calls_dispatched() != calls;
                (res, module, dispatched)
            }
            Err(e) => (Err(e), None, false),
        };
        match res {
            Ok(a) => {
                // Only a paused request, or one whose filter awaits an answer, is ever looked
                // for by its context (`Worker::live`): the others never enter the map.
                if a == Action::Pause || dispatched {
                    self.register(w, i);
                }
                Ok(a)
            }
            Err(e) => {
                let name = w
                    .filters
                    .get(filter)
                    .map_or("?", |f| f.name.as_str())
                    .to_owned();
                let module_name = w
                    .filters
                    .get(filter)
                    .and_then(|f| w.modules.get(f.module))
                    .map_or("?", |m| m.name.as_str())
                    .to_owned();
                log(
                    level::ERR,
                    self.log(w),
                    &format!(
                        "tollgate: filter \"{name}\" (module \"{module_name}\") failed in {}: {e}",
                        cb.name()
                    ),
                );
                if let Some(s) = self.slots.get_mut(i) {
                    s.http = None;
                    s.failed = true;
                }
                if let Some(m) = module {
                    w.check_poisoned(m);
                }
                Err(())
            }
        }
    }

    fn run(
        &mut self,
        w: &mut Worker,
        cb: StreamCallback,
        from: usize,
        upto: usize,
        eos: bool,
    ) -> Outcome {
        for i in from..upto {
            if cb == StreamCallback::RequestHeaders {
                self.started = self.started.max(i.saturating_add(1));
            }
            if cb == StreamCallback::RequestBody {
                self.body_done = self.body_done.max(i.saturating_add(1));
            }
            let step = self.call(w, i, cb, eos);
            if let Some(lr) = self.stream.local_response.take() {
                return Outcome::Local(lr);
            }
            if self.stream.closed {
                return Outcome::Closed;
            }
            match step {
                Err(()) => return Outcome::Failed,
                Ok(Action::Pause)
                    if matches!(
                        cb,
                        StreamCallback::RequestHeaders | StreamCallback::RequestBody
                    ) =>
                {
                    // Resumed from inside the callback itself (e.g. a call answered at once).
                    if std::mem::take(&mut self.stream.resumed) {
                        continue;
                    }
                    return Outcome::Paused(i.saturating_add(1));
                }
                Ok(Action::Pause) if cb == StreamCallback::ResponseBody && !eos => {
                    self.resp_buffering = true;
                    return Outcome::Paused(i.saturating_add(1));
                }
                Ok(_) => {}
            }
        }
        Outcome::Continue
    }

    /// `on_request_headers` from filter `from`.
    pub fn request_headers(&mut self, w: &mut Worker, from: usize, eos: bool) -> Outcome {
        let n = self.slots.len();
        self.run(w, StreamCallback::RequestHeaders, from, n, eos)
    }

    /// `on_request_body` (whole body, end of stream) from filter `from` to the started ones.
    pub fn request_body(&mut self, w: &mut Worker, from: usize) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::RequestBody, from, n, true)
    }

    /// `on_response_headers` for the started filters.
    pub fn response_headers(&mut self, w: &mut Worker, eos: bool) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseHeaders, 0, n, eos)
    }

    /// `on_response_body` for the started filters; `Paused` means: buffer until the end.
    pub fn response_body(&mut self, w: &mut Worker, eos: bool) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseBody, 0, n, eos)
    }

    /// `on_response_trailers` for the started filters (the map is `stream.response_trailers`).
    pub fn response_trailers(&mut self, w: &mut Worker) -> Outcome {
        let n = self.started;
        self.run(w, StreamCallback::ResponseTrailers, 0, n, true)
    }

    /// `on_log`, `on_done`, `on_delete` for every filter with a context.
    pub fn finish(&mut self, w: &mut Worker) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.unregister(w);
        let req_log = self.log(w);
        for i in 0..self.slots.len() {
            let Some(slot) = self.slots.get_mut(i) else {
                continue;
            };
            let Some(id) = slot.http.take() else { continue };
            let filter = slot.filter;
            let vm = match slot.vm {
                VmRef::Shared { module, generation } => w
                    .vms
                    .get_mut(module)
                    .filter(|s| s.generation == generation)
                    .and_then(|s| s.vm.as_mut()),
                VmRef::Owned(k) => self.own_vms.get_mut(k),
                VmRef::None => None,
            };
            let Some(vm) = vm else { continue };
            if let Err(e) = vm.on_log_and_delete(id, &mut self.stream) {
                let name = w
                    .filters
                    .get(filter)
                    .map_or("?", |f| f.name.as_str())
                    .to_owned();
                log(
                    level::ERR,
                    req_log,
                    &format!("tollgate: filter \"{name}\" failed in on_log: {}", e.0),
                );
                if let VmRef::Shared { module, .. } = slot.vm {
                    w.check_poisoned(module);
                }
            }
        }
        self.own_vms.clear();
    }
}
