//! A request entering a location's chain: the filters not run on it yet are added (all of them
//! at first, the new ones after an internal redirect), and their HTTP contexts created, in the
//! worker's instances (isolation `none`) or in instances the request owns (`stream`, `filter`).
//! A filter whose context cannot be created is marked failed: the request will be refused.

use std::rc::Rc;

use tollgate_host::{HttpId, StreamCallback, Vm};

use super::context::{Phase, RequestCtx, Slot, VmRef};
use crate::conf::Isolation;
use crate::util::{level, log};
use crate::worker::Worker;

impl RequestCtx {
    /// Adds the filters of the location chain `chain` that have not run on this request
    /// (all of them for a fresh context; after an internal redirect into a location with a
    /// different chain, those not run yet), creates their HTTP contexts and points the request
    /// side at the first of them. Returns whether filters were added. A filter whose context
    /// cannot be created is marked failed (the request will be refused).
    pub fn enter_chain(
        &mut self,
        w: &mut Worker,
        chain: &Vec<usize>,
        isolation: Isolation,
    ) -> bool {
        if std::ptr::eq(self.chain, chain) {
            return false;
        }
        self.chain = chain;
        let first = self.slots.len();
        for &f in chain {
            let ran = self.slots.iter().any(|s| {
                s.filter == f
                    || w.filters
                        .get(s.filter)
                        .zip(w.filters.get(f))
                        .is_some_and(|(a, b)| a == b)
            });
            if !ran {
                self.slots.push(Slot {
                    filter: f,
                    vm: VmRef::None,
                    http: None,
                    failed: false,
                    registered: false,
                });
            }
        }
        if self.slots.len() == first {
            return false;
        }
        if self.in_flight_at.is_none() {
            let me = self.handle();
            self.in_flight_at = Some(w.in_flight.add(me));
        }
        self.create_contexts(w, isolation, first);
        self.phase = Phase::Headers(first);
        true
    }

    /// Creates the HTTP contexts of the slots from `first` on (and the request's own instances
    /// for `stream`/`filter`).
    fn create_contexts(&mut self, w: &mut Worker, isolation: Isolation, first: usize) {
        let req_log = self.log(w);
        for i in first..self.slots.len() {
            let Some(filter) = self.slots.get(i).map(|s| s.filter) else {
                continue;
            };
            let Some(module) = w.filters.get(filter).map(|d| d.module) else {
                continue;
            };
            let created: Result<(VmRef, HttpId), String> = match isolation {
                Isolation::None => {
                    let root = w.roots.get(filter).copied().flatten();
                    let r = match w.vms.get_mut(module) {
                        None => Err("no instance of its module".to_owned()),
                        Some(slot) => {
                            let generation = slot.generation;
                            match (slot.vm.as_mut(), root) {
                                (None, _) => Err("its module has no instance in this worker (see the error log at worker start)".to_owned()),
                                (Some(_), None) => Err("it has no root context in this worker (on_vm_start or on_configure failed, see the error log)".to_owned()),
                                (Some(vm), Some(root)) => vm
                                    .create_http(root)
                                    .map(|h| (VmRef::Shared { module, generation }, h))
                                    .map_err(|e| e.0),
                            }
                        }
                    };
                    if r.is_err() {
                        w.check_poisoned(module);
                    }
                    r
                }
                Isolation::Stream | Isolation::Filter => self.create_owned(w, isolation, i, filter),
            };
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            match created {
                Ok((vm_ref, http)) => {
                    s.vm = vm_ref;
                    s.http = Some(http);
                    let vm = match vm_ref {
                        VmRef::Shared { module, .. } => {
                            w.vms.get(module).and_then(|s| s.vm.as_ref())
                        }
                        VmRef::Owned(k) => self.own_vms.get(k),
                        VmRef::None => None,
                    };
                    if let Some(vm) = vm {
                        self.wants_request_body |= vm.exports_callback(StreamCallback::RequestBody);
                        self.wants_response_body |= vm
                            .exports_callback(StreamCallback::ResponseBody)
                            || vm.exports_callback(StreamCallback::ResponseTrailers);
                        self.wants_response_headers |=
                            vm.exports_callback(StreamCallback::ResponseHeaders);
                    }
                }
                Err(e) => {
                    s.failed = true;
                    let name = w.filters.get(filter).map_or("?", |d| d.name.as_str());
                    log(
                        level::ERR,
                        req_log,
                        &format!("tollgate: filter \"{name}\" cannot run on this request: {e}; refusing it"),
                    );
                }
            }
        }
    }

    /// An HTTP context in an instance of the filter's module owned by this request (isolation
    /// `stream`: one per module, shared by the request's filters of that module; `filter`: one
    /// per filter).
    fn create_owned(
        &mut self,
        w: &mut Worker,
        isolation: Isolation,
        i: usize,
        filter: usize,
    ) -> Result<(VmRef, HttpId), String> {
        let def = w
            .filters
            .get(filter)
            .cloned()
            .ok_or_else(|| "no such filter".to_owned())?;
        let reuse = if isolation == Isolation::Stream {
            self.slots.iter().take(i).find_map(|s| match s.vm {
                VmRef::Owned(k)
                    if w.filters
                        .get(s.filter)
                        .is_some_and(|f| f.module == def.module) =>
                {
                    Some(k)
                }
                _ => None,
            })
        } else {
            None
        };
        let k = match reuse {
            Some(k) => k,
            None => {
                let m = w
                    .modules
                    .get(def.module)
                    .ok_or_else(|| "no such module".to_owned())?;
                let host = Rc::new(crate::worker_host::VmHost {
                    worker: w.host.clone(),
                    vm_slot: usize::MAX,
                    generation: 0,
                    vm_id: m.name.clone(),
                });
                let vm = Vm::new_with_limits(&m.module, host, &m.name, &m.vm_config, &m.limits)
                    .map_err(|e| format!("module \"{}\": {}", m.name, e.0))?;
                self.own_vms.push(vm);
                self.own_vms.len().saturating_sub(1)
            }
        };
        let vm = self
            .own_vms
            .get_mut(k)
            .ok_or_else(|| "no instance".to_owned())?;
        let root = vm.create_root(&def.name, &def.config).map_err(|e| e.0)?;
        let http = vm.create_http(root).map_err(|e| e.0)?;
        Ok((VmRef::Owned(k), http))
    }
}
