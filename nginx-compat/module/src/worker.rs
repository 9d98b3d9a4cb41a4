//! Per-worker state: one `Vm` per module (isolation `none`), the root context of every
//! `proxy_wasm` filter in it, their `on_tick` timers, and the poll timer of HTTP calls.
//!
//! nginx workers are single-threaded: the state is a thread-local `RefCell`. nginx is never
//! called while it is borrowed (a re-entrant borrow is refused, logged, and fails the request
//! rather than aliasing).

use std::cell::RefCell;
use std::rc::Rc;

use ngx::ffi::{ngx_event_t, ngx_log_t, ngx_msec_t};
use tollgate_host::{HttpId, RootId, Vm};

use crate::conf::FilterDef;
use crate::util::{level, log};
use crate::worker_host::{VmHost, WorkerHost};

/// A compiled module, as the worker needs it.
#[derive(Clone)]
pub struct ModuleRt {
    /// Name (VM id).
    pub name: String,
    /// VM configuration (`on_vm_start`).
    pub vm_config: Vec<u8>,
    /// The compiled module.
    pub module: tollgate_host::Module,
    /// Deadlines and memory cap of its instances (`tollgate_guest_deadline`,
    /// `tollgate_guest_memory`).
    pub limits: tollgate_host::GuestLimits,
}

/// The shared `Vm` of a module in this worker.
pub struct VmSlot {
    /// `None` while being replaced, or when it could not be instantiated.
    pub vm: Option<Vm>,
    /// Bumped when the `Vm` is replaced after a trap; HTTP contexts of an older generation
    /// are gone.
    pub generation: u32,
}

/// A request waiting in the worker (its HTTP contexts can be resumed by `take_resumed`): to
/// the worker an opaque handle, which only `request/context.rs` turns back into the request's
/// context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHandle(*mut std::ffi::c_void);

impl RequestHandle {
    /// The handle of the context at `p`.
    pub fn new(p: *mut std::ffi::c_void) -> RequestHandle {
        RequestHandle(p)
    }

    /// The context's address.
    pub fn as_ptr(self) -> *mut std::ffi::c_void {
        self.0
    }
}

/// What the worker does with the requests in flight when it replaced module `module`'s
/// instance: those with an HTTP context in the old one lost it (`request::resume::orphaned`:
/// refuse them).
pub type OrphanedHook = fn(module: usize, in_flight: &[RequestHandle]);

/// The worker's state.
pub struct Worker {
    /// The worker's services.
    pub host: Rc<WorkerHost>,
    /// Modules by index.
    pub modules: Vec<ModuleRt>,
    /// Filters by index (the `proxy_wasm` directives).
    pub filters: Vec<FilterDef>,
    /// One slot per module.
    pub vms: Vec<VmSlot>,
    /// Root context of each filter in its module's shared `Vm` (`None`: not available).
    pub roots: Vec<Option<RootId>>,
    /// Requests by (module, http context), to route `take_resumed` and call answers: those a
    /// filter paused or dispatched a call from (the only ones ever looked for by context).
    pub live: rustc_hash::FxHashMap<(usize, u32), RequestHandle>,
    /// Every request in flight with a chain (in no order; each knows its place), for the
    /// refusal of those whose contexts a replaced instance held ([`OrphanedHook`]).
    pub in_flight: crate::request::in_flight::InFlight<RequestHandle>,
    /// Tick timers, one per filter that asked for one (boxed: nginx keeps the address).
    pub ticks: Vec<Box<TickTimer>>,
    /// [`tollgate_host::tick_generation`] when the periods were last followed
    /// ([`Worker::sync_ticks`]); `None` before that.
    pub ticks_seen: Option<u64>,
    /// The HTTP call poll timer.
    pub poll: Box<ngx_event_t>,
    /// The worker's log.
    pub log: *mut ngx_log_t,
    /// Advances the engine's epoch: the clock of every guest deadline (stopped with the worker).
    pub ticker: Option<tollgate_host::EpochTicker>,
    /// Called with the requests that lost a module's HTTP contexts (see [`OrphanedHook`]).
    pub orphaned: OrphanedHook,
}

/// A filter's `on_tick` timer. `repr(C)` with the event first: the handler finds the timer
/// from its event's address (the event's `data` must be a connection, see [`timer_data`]).
#[repr(C)]
pub struct TickTimer {
    /// The nginx event.
    pub ev: ngx_event_t,
    /// The filter.
    pub filter: usize,
    /// The period the timer was last armed with (ms; 0: not armed).
    pub period: u32,
}

/// What the module's timer events carry as `data`: nginx's debug log reads `ev->data` as a
/// connection (`ngx_event_ident`: its `fd`) whenever a timer is added, deleted or expires, so
/// `data` must be a connection, as nginx's own connection-less timers do (`ngx_cycle.c`'s
/// `dumb` connection of the shutdown event). A process-wide zeroed connection with `fd` -1.
pub fn timer_data() -> *mut std::ffi::c_void {
    static DUMB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let addr = *DUMB.get_or_init(|| {
        // SAFETY: a zeroed ngx_connection_t is nginx's own initial state (ngx_pcalloc); it is
        // leaked on purpose: timers may refer to it until the process exits.
        let mut c: Box<ngx::ffi::ngx_connection_t> = Box::new(unsafe { std::mem::zeroed() });
        c.fd = -1;
        Box::into_raw(c) as usize
    });
    addr as *mut std::ffi::c_void
}

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Runs `f` with the worker state; `None` if there is none (master) or it is already borrowed.
pub fn with_worker<R>(f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
    WORKER.with(|w| {
        let mut guard = match w.try_borrow_mut() {
            Ok(g) => g,
            Err(_) => {
                log(
                    level::ALERT,
                    crate::util::cycle_log(),
                    "tollgate: re-entrant use of the worker state refused",
                );
                return None;
            }
        };
        guard.as_mut().map(f)
    })
}

/// Installs the worker state (init_process).
pub fn install(worker: Worker) {
    WORKER.with(|w| {
        if let Ok(mut g) = w.try_borrow_mut() {
            *g = Some(worker);
        }
    });
}

/// Drops the worker state (exit_process).
pub fn uninstall() {
    let old = WORKER.with(|w| w.try_borrow_mut().ok().and_then(|mut g| g.take()));
    if let Some(mut w) = old {
        // SAFETY: timers of this worker; removed before their memory is freed.
        unsafe {
            for t in &mut w.ticks {
                if t.ev.timer_set() != 0 {
                    nginx_sys::ngx_del_timer(&mut t.ev);
                }
            }
            if w.poll.timer_set() != 0 {
                nginx_sys::ngx_del_timer(&mut *w.poll);
            }
        }
        drop(w);
    }
}

impl Worker {
    /// Instantiates every module used by a filter and creates the filters' root contexts.
    pub fn new(
        modules: Vec<ModuleRt>,
        filters: Vec<FilterDef>,
        log_ptr: *mut ngx_log_t,
        host: WorkerHost,
        orphaned: OrphanedHook,
    ) -> Worker {
        let host = Rc::new(host);
        // SAFETY: a zeroed ngx_event_t is nginx's own initial state (ngx_pcalloc).
        let poll: Box<ngx_event_t> = Box::new(unsafe { std::mem::zeroed() });
        let mut w = Worker {
            host,
            vms: modules
                .iter()
                .map(|_| VmSlot {
                    vm: None,
                    generation: 0,
                })
                .collect(),
            roots: vec![None; filters.len()],
            modules,
            filters,
            live: rustc_hash::FxHashMap::default(),
            in_flight: Default::default(),
            ticks: Vec::new(),
            ticks_seen: None,
            poll,
            log: log_ptr,
            ticker: None,
            orphaned,
        };
        for m in 0..w.modules.len() {
            if w.filters.iter().any(|f| f.module == m) {
                w.instantiate(m);
            }
        }
        w
    }

    /// A fresh `Vm` of module `m` with the root contexts of its filters (after a trap too).
    pub fn instantiate(&mut self, m: usize) {
        let Some(module) = self.modules.get(m).cloned() else {
            return;
        };
        let generation = self.vms.get(m).map_or(0, |s| s.generation.wrapping_add(1));
        let host = Rc::new(VmHost {
            worker: self.host.clone(),
            vm_slot: m,
            generation,
            vm_id: module.name.clone(),
        });
        // The filters' root contexts of the old instance are gone with it.
        for (i, f) in self.filters.iter().enumerate() {
            if f.module == m {
                if let Some(r) = self.roots.get_mut(i) {
                    *r = None;
                }
            }
        }
        let vm = match Vm::new_with_limits(
            &module.module,
            host,
            &module.name,
            &module.vm_config,
            &module.limits,
        ) {
            Ok(mut vm) => {
                for (i, f) in self.filters.iter().enumerate() {
                    if f.module != m {
                        continue;
                    }
                    match vm.create_root(&f.name, &f.config) {
                        Ok(root) => {
                            if let Some(r) = self.roots.get_mut(i) {
                                *r = Some(root);
                            }
                        }
                        Err(e) => log(
                            level::ERR,
                            self.log,
                            &format!("tollgate: filter \"{}\": {}", f.name, e.0),
                        ),
                    }
                }
                Some(vm)
            }
            Err(e) => {
                log(
                    level::ERR,
                    self.log,
                    &format!("tollgate: module \"{}\": {}", module.name, e.0),
                );
                None
            }
        };
        if let Some(slot) = self.vms.get_mut(m) {
            slot.vm = vm;
            slot.generation = generation;
        }
        // Requests of the old generation lose their contexts: the request layer refuses them.
        self.live.retain(|&(module, _), _| module != m);
        (self.orphaned)(m, self.in_flight.as_slice());
    }

    /// `proxy_on_done` for every filter's root context, as the worker exits (on a reload or a
    /// stop too): what a root context holds reaches the host before its VM is gone (the metrics
    /// filter's counters). A failure is logged; the others still run.
    pub fn done_roots(&mut self) {
        for (i, f) in self.filters.iter().enumerate() {
            let (Some(root), Some(vm)) = (
                self.roots.get(i).copied().flatten(),
                self.vms.get_mut(f.module).and_then(|s| s.vm.as_mut()),
            ) else {
                continue;
            };
            if let Err(e) = vm.on_root_done(root) {
                log(
                    level::ERR,
                    self.log,
                    &format!("tollgate: filter \"{}\": on_done: {}", f.name, e.0),
                );
            }
        }
    }

    /// Arms the tick timers asked for by the root contexts (`proxy_set_tick_period_milliseconds`).
    pub fn arm_ticks(&mut self, handler: unsafe extern "C" fn(*mut ngx_event_t)) {
        for i in 0..self.filters.len() {
            let Some(f) = self.filters.get(i) else {
                continue;
            };
            let period = match (
                self.vms.get(f.module).and_then(|s| s.vm.as_ref()),
                self.roots.get(i).copied().flatten(),
            ) {
                (Some(vm), Some(root)) => vm.tick_period_ms(root),
                _ => 0,
            };
            if period == 0 || self.ticks.iter().any(|t| t.filter == i) {
                continue;
            }
            // SAFETY: zeroed event initialised like nginx's ngx_pcalloc'ed ones.
            let mut t = Box::new(TickTimer {
                ev: unsafe { std::mem::zeroed() },
                filter: i,
                period,
            });
            t.ev.handler = Some(handler);
            t.ev.data = timer_data();
            t.ev.log = self.log;
            t.ev.set_cancelable(1);
            // SAFETY: the event lives in a Box owned by the worker until uninstall().
            unsafe {
                nginx_sys::ngx_add_timer(
                    &mut t.ev,
                    ngx_msec_t::try_from(period).unwrap_or(ngx_msec_t::MAX),
                )
            };
            self.ticks.push(t);
        }
    }

    /// Follows the tick periods the root contexts asked for since their timers were armed, as
    /// Envoy's `Wasm::setTickPeriod` (source/extensions/common/wasm/wasm.cc) does at once: a
    /// root that asked for a tick for the first time gets its timer ([`Worker::arm_ticks`]), a
    /// changed period re-arms the timer from now, 0 stops it. (Envoy also restarts the timer
    /// when the same period is set again; here only a change is seen.)
    /// Walks the roots only when a period may have changed ([`tollgate_host::tick_generation`]
    /// moved), so that the requests, which end here, do not pay a walk over every filter.
    pub fn sync_ticks(&mut self, handler: unsafe extern "C" fn(*mut ngx_event_t)) {
        let generation = tollgate_host::tick_generation();
        if self.ticks_seen == Some(generation) {
            return;
        }
        self.ticks_seen = Some(generation);
        self.arm_ticks(handler);
        for t in &mut self.ticks {
            let period = match (
                self.filters.get(t.filter).map(|f| f.module),
                self.roots.get(t.filter).copied().flatten(),
            ) {
                (Some(m), Some(root)) => self
                    .vms
                    .get(m)
                    .and_then(|s| s.vm.as_ref())
                    .map_or(0, |vm| vm.tick_period_ms(root)),
                _ => 0,
            };
            if period == t.period {
                continue;
            }
            t.period = period;
            // SAFETY: the worker's own timer event (boxed, alive until uninstall()).
            unsafe {
                if t.ev.timer_set() != 0 {
                    nginx_sys::ngx_del_timer(&mut t.ev);
                }
                if period > 0 {
                    nginx_sys::ngx_add_timer(
                        &mut t.ev,
                        ngx_msec_t::try_from(period).unwrap_or(ngx_msec_t::MAX),
                    );
                }
            }
        }
    }

    /// Requests resumed by a `Vm` since the last call (`take_resumed`).
    pub fn take_resumed(&mut self, m: usize) -> Vec<RequestHandle> {
        let ids: Vec<HttpId> = self
            .vms
            .get_mut(m)
            .and_then(|s| s.vm.as_mut())
            .map(|vm| vm.take_resumed())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.live.get(&(m, id.0)).copied())
            .collect()
    }

    /// Delivers `proxy_on_queue_ready` for the shared queues registered in this worker whose
    /// sequence number moved since the last look: once per new message (at most
    /// [`crate::worker_host::QUEUE_READY_BURST`] a poll), to every `Vm` (a `Vm` that did not register
    /// the queue ignores it), stopping when the queue is empty. Returns the requests resumed
    /// meanwhile. Called from the poll timer.
    pub fn poll_queues(&mut self) -> Vec<RequestHandle> {
        let mut due: Vec<(u32, u64)> = Vec::new();
        if let Ok(mut reg) = self.host.registered.try_borrow_mut() {
            for r in reg.iter_mut() {
                let Some(q) = self.host.queue(r.id) else {
                    continue;
                };
                let seq = q.sequence();
                if seq != r.seen {
                    due.push((r.id, seq.wrapping_sub(r.seen)));
                    r.seen = seq;
                }
            }
        }
        let mut resumed = Vec::new();
        for (id, new) in due {
            let burst = new.min(crate::worker_host::QUEUE_READY_BURST);
            for m in 0..self.vms.len() {
                for _ in 0..burst {
                    if self.host.queue(id).is_none_or(|q| q.is_empty()) {
                        break;
                    }
                    let Some(vm) = self
                        .vms
                        .get_mut(m)
                        .and_then(|s| s.vm.as_mut())
                        .filter(|vm| vm.has_queue(id))
                    else {
                        break;
                    };
                    if let Err(e) = vm.on_queue_ready(id) {
                        log(
                            level::ERR,
                            self.log,
                            &format!("tollgate: on_queue_ready: {}", e.0),
                        );
                        break;
                    }
                }
                self.check_poisoned(m);
                resumed.extend(self.take_resumed(m));
            }
        }
        resumed
    }

    /// Whether a root context of this worker registered a shared queue (the poll timer keeps
    /// running to deliver `on_queue_ready`).
    pub fn has_queues(&self) -> bool {
        self.host
            .registered
            .try_borrow()
            .is_ok_and(|r| !r.is_empty())
    }

    /// Replaces a poisoned `Vm` (after a trap).
    pub fn check_poisoned(&mut self, m: usize) {
        let poisoned = self
            .vms
            .get(m)
            .and_then(|s| s.vm.as_ref())
            .is_some_and(|vm| vm.is_poisoned());
        if poisoned {
            log(
                level::ERR,
                self.log,
                &format!(
                    "tollgate: module \"{}\" trapped: replacing its instance",
                    self.modules.get(m).map_or("?", |x| x.name.as_str())
                ),
            );
            self.instantiate(m);
        }
    }
}
