//! One fuzz step: a randomly chosen import called with hostile arguments (see `args.rs`),
//! sometimes several times in a row (a burst, to push the host's caps: map and property bytes,
//! pending calls, body sizes, queue contents).

use crate::arena::{ARGS, BIG_SIZE};
use crate::args::{BigKind, Buf, METRIC_NAMES};
use crate::imports as abi;
use crate::reenter::Outer;
use crate::Fuzz;

/// Calls `$e` (an import) `burst` times within the callback's budget, counting each call.
macro_rules! call {
    ($f:expr, $e:expr) => {{
        let n = $f.burst();
        for _ in 0..n {
            if !$f.spend() {
                break;
            }
            // SAFETY: a host import taking plain integers: any value is allowed (checking
            // them is the host's job, and what this fuzzer tests).
            let _ = unsafe { $e };
        }
    }};
}

/// How many steps `step` chooses from.
const STEPS: u32 = 59;

impl Fuzz {
    /// 1, or (5%) a burst of 2-64 identical calls.
    fn burst(&self) -> u32 {
        if self.rng.percent(5) {
            2 + self.rng.below(63)
        } else {
            1
        }
    }

    /// Takes one call from the callback's budget; false when it is spent.
    pub fn spend(&self) -> bool {
        let left = self.left.get();
        if left == 0 {
            return false;
        }
        self.left.set(left - 1);
        self.made.set(self.made.get().saturating_add(1));
        true
    }

    fn number(&self) -> u32 {
        self.rng.pick(
            &[
                0,
                1,
                2,
                10,
                100,
                4096,
                0x7fff_ffff,
                0x8000_0000,
                u32::MAX,
                self.rng.u32(),
            ],
            0,
        )
    }

    /// A context id: one the guest saw created, the running one, a root, 0 or garbage.
    fn context(&self) -> u32 {
        match self.rng.below(6) {
            0 | 1 => {
                let i = self.rng.below(self.seen.len() as u32) as usize;
                self.seen.get(i).map_or(0, std::cell::Cell::get)
            }
            2 => self.current.get(),
            3 => self.rng.below(4),
            4 => self.current.get().wrapping_add(1),
            _ => self.rng.pick(&[u32::MAX, 0x8000_0000, self.rng.u32()], 0),
        }
    }

    fn bytes_input(&self, fill: impl FnOnce(&mut Buf)) -> (u32, u32) {
        let mut b = Buf::new();
        fill(&mut b);
        self.input(b.bytes())
    }

    /// The headers of an HTTP call: mostly a valid call to the configured upstream's `/plain`.
    fn call_headers(&self) -> (u32, u32) {
        if self.rng.percent(30) {
            return self.map();
        }
        let pairs: [(&[u8], &[u8]); 4] = [
            (
                b":method",
                self.rng.pick(&[&b"GET"[..], b"POST", b"HEAD"], b"GET"),
            ),
            (
                b":path",
                self.rng.pick(&[&b"/plain"[..], b"/", b"/plain?x=1"], b"/"),
            ),
            (b":authority", b"fuzz"),
            (b"x-fuzz", b"call"),
        ];
        let n = 3 + self.rng.below(2) as usize;
        let mut b = Buf::new();
        b.u32(n as u32);
        for (k, v) in pairs.iter().take(n) {
            b.u32(k.len() as u32);
            b.u32(v.len() as u32);
        }
        for (k, v) in pairs.iter().take(n) {
            b.push(k);
            b.push(&[0]);
            b.push(v);
            b.push(&[0]);
        }
        self.input(b.bytes())
    }

    /// An iovec array for `fd_write`: a few small vectors, or many vectors over all of `BIG`.
    fn iovecs(&self) -> (u32, u32) {
        let many = self.rng.percent(5);
        let n = if many {
            1 + self.rng.below(4096)
        } else {
            self.rng.below(5)
        };
        let at = self.cur.reserve_args(n as usize * 8);
        let big = if many { self.big(BigKind::Text) } else { 0 };
        for i in 0..n as usize {
            let (p, l) = if many {
                (big, BIG_SIZE as u32)
            } else {
                self.bytes_input(|b| {
                    b.push(self.rng.pick(
                        &[
                            &b"out\n"[..],
                            b"no newline ",
                            b"",
                            b"two\nlines\n",
                            b"\xff\xfe\n",
                        ],
                        b"",
                    ))
                })
            };
            ARGS.put(at + i * 8, &p.to_le_bytes());
            ARGS.put(at + i * 8 + 4, &l.to_le_bytes());
        }
        let p = ARGS.base().wrapping_add(at as u32);
        let (p, _) = self.hostile(p, n * 8);
        let len = if self.rng.percent(10) {
            self.rng.pick(&[u32::MAX, n + 1, 0x2000_0000], n)
        } else {
            n
        };
        (p, len)
    }

    /// One step: a randomly chosen import with hostile arguments.
    pub fn step(&self) {
        match self.rng.below(STEPS) {
            k @ 0..=12 => self.step_maps(k),
            k @ 13..=24 => self.step_buffers(k),
            k @ 25..=34 => self.step_shared(k),
            k @ 35..=46 => self.step_metrics(k),
            k => self.step_wasi(k),
        }
    }

    /// Steps 0 to 12: logging, time, properties and header maps.
    fn step_maps(&self, k: u32) {
        let r = &self.rng;
        match k {
            0 => {
                let level = self.enum_val(6);
                let (p, l) = self.payload();
                call!(self, abi::proxy_log(level, p, l));
            }
            1 => {
                let ret = self.ret();
                call!(self, abi::proxy_get_log_level(ret));
            }
            2 => {
                let ret = self.ret();
                call!(self, abi::proxy_get_current_time_nanoseconds(ret));
            }
            3 => {
                let period = r.pick(&[0, 1, 5, 50, 1000, u32::MAX, r.u32()], 0);
                call!(self, abi::proxy_set_tick_period_milliseconds(period));
            }
            4 => {
                let (pp, pl) = self.bytes_input(|b| self.property(b));
                let (rp, rs) = (self.ret(), self.ret());
                let outer = if r.percent(50) {
                    Outer::Root
                } else {
                    Outer::Property { pp, pl }
                };
                call!(
                    self,
                    self.reading(outer, || abi::proxy_get_property(pp, pl, rp, rs))
                );
            }
            5 => {
                let (pp, pl) = self.bytes_input(|b| self.property(b));
                let (vp, vl) = self.payload();
                call!(self, abi::proxy_set_property(pp, pl, vp, vl));
            }
            6 => {
                let t = self.enum_val(8);
                let (kp, kl) = self.bytes_input(|b| self.name(b));
                let (rp, rs) = (self.ret(), self.ret());
                let outer = Outer::Map { t, kp, kl };
                call!(
                    self,
                    self.reading(outer, || abi::proxy_get_header_map_pairs(t, rp, rs))
                );
            }
            7 => {
                let t = self.enum_val(8);
                let rs = self.ret();
                call!(self, abi::proxy_get_header_map_size(t, rs));
            }
            8 => {
                let t = self.enum_val(8);
                let (p, l) = self.map();
                call!(self, abi::proxy_set_header_map_pairs(t, p, l));
            }
            9 => {
                let t = self.enum_val(8);
                let (kp, kl) = self.bytes_input(|b| self.name(b));
                let (rp, rs) = (self.ret(), self.ret());
                let outer = Outer::Map { t, kp, kl };
                call!(
                    self,
                    self.reading(outer, || abi::proxy_get_header_map_value(t, kp, kl, rp, rs))
                );
            }
            10 | 11 => {
                let t = self.enum_val(8);
                let (kp, kl) = self.bytes_input(|b| self.name(b));
                let (vp, vl) = self.bytes_input(|b| self.value(b));
                if r.percent(50) {
                    call!(self, abi::proxy_add_header_map_value(t, kp, kl, vp, vl));
                } else {
                    call!(self, abi::proxy_replace_header_map_value(t, kp, kl, vp, vl));
                }
            }
            12 => {
                let t = self.enum_val(8);
                let (kp, kl) = self.bytes_input(|b| self.name(b));
                call!(self, abi::proxy_remove_header_map_value(t, kp, kl));
            }
            _ => {}
        }
    }

    /// Steps 13 to 24: configuration, buffers, stream control and local responses.
    fn step_buffers(&self, k: u32) {
        let r = &self.rng;
        match k {
            13 | 14 => {
                let t = self.enum_val(9);
                let (start, max) = (self.number(), self.number());
                let (rp, rs) = (self.ret(), self.ret());
                let outer = if t == 6 || t == 7 {
                    Outer::Root
                } else {
                    Outer::Buffer { t }
                };
                if r.percent(50) {
                    call!(
                        self,
                        self.reading(outer, || abi::proxy_get_buffer_bytes(t, start, max, rp, rs))
                    );
                } else {
                    call!(
                        self,
                        self.reading(outer, || abi::proxy_get_buffer(t, start, max, rp, rs))
                    );
                }
            }
            15 | 16 => {
                let t = self.enum_val(9);
                let (start, size) = (self.number(), self.number());
                let (p, l) = self.payload();
                if r.percent(50) {
                    call!(self, abi::proxy_set_buffer_bytes(t, start, size, p, l));
                } else {
                    call!(self, abi::proxy_set_buffer(t, start, size, p, l));
                }
            }
            17 => {
                let t = self.enum_val(9);
                let (rl, rf) = (self.ret(), self.ret());
                call!(self, abi::proxy_get_buffer_status(t, rl, rf));
            }
            18 => {
                let (rp, rs) = (self.ret(), self.ret());
                call!(
                    self,
                    self.reading(Outer::Root, || abi::proxy_get_configuration(rp, rs))
                );
            }
            19 | 20 => {
                let status = r.pick(&[200, 204, 403, 500, 0, 99, 1000, u32::MAX, r.u32()], 200);
                let (dp, dl) = self.bytes_input(|b| self.value(b));
                let (bp, bl) = self.payload();
                let (hp, hl) = self.map();
                let grpc = r.u32() as i32;
                if r.percent(50) {
                    call!(
                        self,
                        abi::proxy_send_local_response(status, dp, dl, bp, bl, hp, hl, grpc)
                    );
                } else {
                    call!(
                        self,
                        abi::proxy_send_http_response(status, dp, dl, bp, bl, hp, hl, grpc)
                    );
                }
            }
            21 => {
                let t = self.enum_val(3);
                call!(self, abi::proxy_continue_stream(t));
            }
            22 => call!(self, abi::proxy_continue_request()),
            23 => call!(self, abi::proxy_continue_response()),
            24 if self.cfg.close.get() => {
                let t = self.enum_val(3);
                call!(self, abi::proxy_close_stream(t));
            }
            _ => {}
        }
    }

    /// Steps 25 to 34: effective context, shared data, shared queues and HTTP calls.
    fn step_shared(&self, k: u32) {
        let r = &self.rng;
        match k {
            25 => call!(self, abi::proxy_clear_route_cache()),
            26 => call!(self, abi::proxy_done()),
            27 => {
                let id = self.context();
                if self.spend() {
                    // SAFETY: as in `call!`.
                    if unsafe { abi::proxy_set_effective_context(id) } == 0 {
                        self.effective.set(id);
                    }
                }
            }
            28 => {
                let (kp, kl) = self.bytes_input(|b| self.key(b));
                let (rp, rs, rc) = (self.ret(), self.ret(), self.ret());
                let outer = Outer::Shared { kp, kl };
                call!(
                    self,
                    self.reading(outer, || abi::proxy_get_shared_data(kp, kl, rp, rs, rc))
                );
            }
            29 => {
                let (kp, kl) = self.bytes_input(|b| self.key(b));
                let (vp, vl) = self.payload();
                let cas = r.pick(&[0, 1, 2, 3, u32::MAX, r.u32()], 0);
                call!(self, abi::proxy_set_shared_data(kp, kl, vp, vl, cas));
            }
            30 => {
                let (np, nl) = self.bytes_input(|b| self.queue_name(b));
                let ret = self.ret();
                call!(self, abi::proxy_register_shared_queue(np, nl, ret));
            }
            31 => {
                let (vp, vl) = self
                    .bytes_input(|b| b.push(r.pick(&[&b"abi_fuzz"[..], b"vm", b"", b"\xff"], b"")));
                let (np, nl) = self.bytes_input(|b| self.queue_name(b));
                let ret = self.ret();
                call!(self, abi::proxy_resolve_shared_queue(vp, vl, np, nl, ret));
            }
            32 => {
                let id = r.pick(&[0, 1, 2, 3, u32::MAX, r.u32()], 1);
                let (vp, vl) = self.payload();
                call!(self, abi::proxy_enqueue_shared_queue(id, vp, vl));
            }
            33 => {
                let id = r.pick(&[0, 1, 2, 3, u32::MAX, r.u32()], 1);
                let (rp, rs) = (self.ret(), self.ret());
                call!(
                    self,
                    self.reading(Outer::Queue { id }, || abi::proxy_dequeue_shared_queue(
                        id, rp, rs
                    ))
                );
            }
            34 => self.http_call(),
            _ => {}
        }
    }

    /// Steps 35 to 46: gRPC, metrics, foreign functions and the first WASI imports.
    fn step_metrics(&self, k: u32) {
        let r = &self.rng;
        match k {
            35 => {
                let kind = self.enum_val(3);
                let (np, nl) = self.bytes_input(|b| {
                    if r.percent(10) {
                        b.push(&r.u32().to_le_bytes());
                    } else {
                        b.push(r.pick(METRIC_NAMES, b"fuzz_counter"));
                    }
                });
                let ret = self.ret();
                call!(self, abi::proxy_define_metric(kind, np, nl, ret));
            }
            36 => {
                let id = self.metric_id();
                let delta = r.pick(&[1, -1, 0, i64::MAX, i64::MIN, r.next() as i64], 1);
                call!(self, abi::proxy_increment_metric(id, delta));
            }
            37 => {
                let id = self.metric_id();
                let v = r.pick(&[0, 1, u64::MAX, 1 << 63, r.next()], 1);
                call!(self, abi::proxy_record_metric(id, v));
            }
            38 => {
                let id = self.metric_id();
                let ret = self.ret();
                call!(self, abi::proxy_get_metric(id, ret));
            }
            39 => {
                let (np, nl) = self.bytes_input(|b| {
                    b.push(r.pick(
                        &[
                            &b"compress"[..],
                            b"",
                            b"declare_property",
                            b"tollgate.get_values",
                        ],
                        b"",
                    ))
                });
                let (ap, al) = self.payload();
                let (rp, rs) = (self.ret(), self.ret());
                call!(
                    self,
                    abi::proxy_call_foreign_function(np, nl, ap, al, rp, rs)
                );
            }
            40 => {
                let (sp, sl) = self.payload();
                let ret = self.ret();
                call!(
                    self,
                    abi::proxy_grpc_call(sp, sl, sp, sl, sp, sl, sp, sl, sp, sl, 10, ret)
                );
            }
            41 => {
                let (a, b, c) = (self.ret(), self.ret(), self.ret());
                call!(self, abi::proxy_get_status(a, b, c));
            }
            42 => {
                let fd = r.pick(&[1, 2, 1, 2, 0, 3, u32::MAX], 1);
                let (iovs, n) = self.iovecs();
                let ret = self.ret();
                call!(self, abi::fd_write(fd, iovs, n, ret));
            }
            43 => {
                let (a, b) = (self.ret(), self.ret());
                call!(self, abi::environ_sizes_get(a, b));
            }
            44 => {
                let (a, b) = (self.ret(), self.ret());
                call!(self, abi::args_sizes_get(a, b));
            }
            45 => {
                let (a, b) = (self.ret(), self.ret());
                call!(self, abi::environ_get(a, b));
            }
            46 => {
                let (a, b) = (self.ret(), self.ret());
                call!(self, abi::args_get(a, b));
            }
            47 => {
                let id = self.enum_val(4);
                let (precision, ret) = (r.next(), self.ret());
                call!(self, abi::clock_time_get(id, precision, ret));
            }
            _ => {}
        }
    }

    /// Steps 47 and above: the other WASI imports.
    fn step_wasi(&self, k: u32) {
        let r = &self.rng;
        match k {
            48 => {
                let id = self.enum_val(4);
                let ret = self.ret();
                call!(self, abi::clock_res_get(id, ret));
            }
            49 => {
                let (p, l) = if r.percent(5) {
                    let big = self.big(BigKind::Dirty);
                    self.hostile(big, r.below(BIG_SIZE as u32 + 1))
                } else {
                    let at = self.cur.reserve_args(64);
                    self.hostile(ARGS.base().wrapping_add(at as u32), r.below(65))
                };
                call!(self, abi::random_get(p, l));
            }
            50 => {
                let exit = self.cfg.exit.get();
                // `exit` is per 10,000 steps: this step is one in STEPS.
                if !self.startup.get()
                    && r.below(10_000) < exit.saturating_mul(STEPS)
                    && self.spend()
                {
                    // SAFETY: as in `call!` (the host traps the instance: the point).
                    unsafe { abi::proc_exit(r.below(3)) };
                }
            }
            51 => {
                let fd = r.pick(&[0, 1, 2, 3, u32::MAX], 3);
                call!(self, abi::fd_close(fd));
            }
            52 => {
                let fd = r.pick(&[0, 1, 2, 3, u32::MAX], 3);
                let (offset, whence, ret) = (r.next() as i64, self.enum_val(3), self.ret());
                call!(self, abi::fd_seek(fd, offset, whence, ret));
            }
            53 => {
                let fd = r.pick(&[0, 1, 2, 3, u32::MAX], 3);
                let ret = self.ret();
                call!(self, abi::fd_fdstat_get(fd, ret));
            }
            54 => {
                let fd = r.pick(&[0, 1, 2, 3, u32::MAX], 3);
                let ret = self.ret();
                call!(self, abi::fd_prestat_get(fd, ret));
            }
            55 => {
                let fd = r.pick(&[0, 1, 2, 3, u32::MAX], 3);
                let (p, l) = self.payload();
                call!(self, abi::fd_prestat_dir_name(fd, p, l));
            }
            56 => call!(self, abi::sched_yield()),
            57 => {
                let (a, b, c, n) = (self.ret(), self.ret(), self.ret(), self.number());
                call!(self, abi::poll_oneoff(a, b, n, c));
            }
            _ => {
                let (p, l) = self.payload();
                let ret = self.ret();
                call!(
                    self,
                    abi::path_open(3, 0, p, l, 0, u64::MAX, u64::MAX, 0, ret)
                );
            }
        }
    }

    fn queue_name(&self, b: &mut Buf) {
        if self.rng.percent(70) {
            let (q, n) = self.cfg.queue();
            b.push(q.get(..n).unwrap_or(&[]));
        } else {
            b.push(self.rng.pick(&[&b"nope"[..], b"", b"\xff"], b""));
        }
    }

    fn metric_id(&self) -> u32 {
        self.rng
            .pick(&[0, 1, 2, 3, 4, 1000, u32::MAX, self.rng.u32()], 1)
    }

    /// `proxy_http_call` to the configured upstream (or garbage); in a stream callback, a
    /// successful dispatch for the running context lets it pause (`pause=1`).
    fn http_call(&self) {
        let r = &self.rng;
        let (up, ul) = if r.percent(85) {
            let (u, n) = self.cfg.upstream();
            self.input(u.get(..n).unwrap_or(&[]))
        } else {
            self.bytes_input(|b| {
                b.push(r.pick(&[&b""[..], b"nope", b"127.0.0.1:99999", b":", b"\xff"], b""))
            })
        };
        let (hp, hl) = self.call_headers();
        let (bp, bl) = if r.percent(50) {
            (0, 0)
        } else {
            self.payload()
        };
        let (tp, tl) = if r.percent(80) { (0, 0) } else { self.map() };
        let timeout = r.pick(&[0, 1, 50, 1000, 5000, u32::MAX], 1000);
        let ret = self.ret();
        for _ in 0..self.burst() {
            if !self.spend() {
                break;
            }
            // SAFETY: as in `call!`.
            let s = unsafe { abi::proxy_http_call(up, ul, hp, hl, bp, bl, tp, tl, timeout, ret) };
            if s == 0 && self.effective.get() == self.current.get() {
                self.dispatched.set(true);
            }
        }
    }
}
