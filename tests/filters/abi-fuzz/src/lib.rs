//! Test-only hostile proxy-wasm guest (never shipped), written without the SDK: it exports the
//! proxy-wasm 0.2.1 callbacks itself and imports every `env` and `wasi_snapshot_preview1`
//! function the nginx host defines (plus a few it only stubs). In every callback a seeded PRNG
//! makes a bounded number of calls to randomly chosen imports with hostile arguments (`args.rs`,
//! `calls.rs`); `proxy_on_memory_allocate` sometimes re-enters the host (bounded depth) and
//! sometimes returns garbage (null, out of bounds, near the end of memory, overlapping a live
//! buffer). A host passes when it answers every call with a status: the in-process driver
//! (nginx-compat/host/tests/abi_fuzz.rs) checks that no call crashes, hangs or leaks.
//!
//! At the end of each callback the guest logs, at Info, `abi-fuzz: N host calls in <callback>`
//! (that line is not counted), so that drivers can total the calls made.
//!
//! Configuration (the plugin configuration, and the VM configuration read first; text,
//! `key=value` separated by spaces or commas, every key optional, unknown keys ignored):
//! - `seed` (0): the PRNG's seed (mixed with the root context id);
//! - `calls` (32): most host calls per callback (each callback makes 1..=calls);
//! - `depth` (2): most nested re-entries from `proxy_on_memory_allocate`;
//! - `bad` (25): percent of pointers, lengths and result slots made hostile;
//! - `garbage` (10): percent of allocations answered with garbage;
//! - `reenter` (20): percent of allocations that first call the host;
//! - `exit` (0): chance per 10,000 steps of a `proc_exit` (never at start-up);
//! - `close` (1): 0 leaves `proxy_close_stream` out;
//! - `pause` (0): 1 lets a stream callback that dispatched an HTTP call for its own context
//!   return `Pause` (its `on_http_call_response` resumes it first);
//! - `upstream` (`127.0.0.1:1`): the upstream of `proxy_http_call`;
//! - `queue` (`fuzzq`): the shared queue name most registrations use.
#![allow(unsafe_code)] // Raw imports and exports: hostile arguments are the point.
#![allow(clippy::cast_possible_truncation)]

use std::cell::Cell;

mod arena;
mod args;
mod calls;
mod imports;
mod reenter;
mod rng;

use arena::{Cursors, ARGS, BIG, BIG_SIZE, OUT, OUT_SIZE};
use args::BigKind;
use reenter::Outer;
use rng::Rng;

/// The configuration (see the crate docs), in `Cell`s: the state is shared with re-entrant
/// calls.
pub struct Config {
    calls: Cell<u32>,
    depth: Cell<u32>,
    bad_ptr: Cell<u32>,
    garbage: Cell<u32>,
    reenter: Cell<u32>,
    exit: Cell<u32>,
    close: Cell<bool>,
    pause: Cell<bool>,
    upstream: Cell<[u8; 64]>,
    upstream_len: Cell<usize>,
    queue: Cell<[u8; 32]>,
    queue_len: Cell<usize>,
}

fn fixed<const N: usize>(s: &[u8]) -> ([u8; N], usize) {
    let mut b = [0u8; N];
    let n = s.len().min(N);
    if let (Some(dst), Some(src)) = (b.get_mut(..n), s.get(..n)) {
        dst.copy_from_slice(src);
    }
    (b, n)
}

impl Config {
    const fn new() -> Config {
        let mut up = [0u8; 64];
        let mut i = 0;
        let d = b"127.0.0.1:1";
        while i < d.len() {
            up[i] = d[i];
            i += 1;
        }
        let mut q = [0u8; 32];
        q[0] = b'f';
        q[1] = b'u';
        q[2] = b'z';
        q[3] = b'z';
        q[4] = b'q';
        Config {
            calls: Cell::new(32),
            depth: Cell::new(2),
            bad_ptr: Cell::new(25),
            garbage: Cell::new(10),
            reenter: Cell::new(20),
            exit: Cell::new(0),
            close: Cell::new(true),
            pause: Cell::new(false),
            upstream: Cell::new(up),
            upstream_len: Cell::new(d.len()),
            queue: Cell::new(q),
            queue_len: Cell::new(5),
        }
    }

    /// The configured upstream: bytes and length.
    pub fn upstream(&self) -> ([u8; 64], usize) {
        (self.upstream.get(), self.upstream_len.get())
    }

    /// The configured queue name: bytes and length.
    pub fn queue(&self) -> ([u8; 32], usize) {
        (self.queue.get(), self.queue_len.get())
    }

    /// Applies `key=value` pairs; returns the seed (0 when absent).
    fn parse(&self, text: &[u8]) -> u64 {
        let mut seed = 0u64;
        for item in text.split(|b| *b == b' ' || *b == b',' || *b == b'\n') {
            let Some(eq) = item.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (key, value) = (
                item.get(..eq).unwrap_or(&[]),
                item.get(eq + 1..).unwrap_or(&[]),
            );
            let num = value.iter().try_fold(0u64, |n, b| {
                b.is_ascii_digit()
                    .then(|| n.wrapping_mul(10).wrapping_add(u64::from(b - b'0')))
            });
            let small = num.map(|n| n.min(u64::from(u32::MAX)) as u32);
            match (key, small) {
                (b"seed", _) => seed = num.unwrap_or(0),
                (b"calls", Some(n)) => self.calls.set(n.max(1)),
                (b"depth", Some(n)) => self.depth.set(n),
                (b"bad", Some(n)) => self.bad_ptr.set(n),
                (b"garbage", Some(n)) => self.garbage.set(n),
                (b"reenter", Some(n)) => self.reenter.set(n),
                (b"exit", Some(n)) => self.exit.set(n),
                (b"close", Some(n)) => self.close.set(n != 0),
                (b"pause", Some(n)) => self.pause.set(n != 0),
                (b"upstream", _) => {
                    let (b, n) = fixed(value);
                    self.upstream.set(b);
                    self.upstream_len.set(n);
                }
                (b"queue", _) => {
                    let (b, n) = fixed(value);
                    self.queue.set(b);
                    self.queue_len.set(n);
                }
                _ => {}
            }
        }
        seed
    }
}

/// The guest's state.
pub struct Fuzz {
    rng: Rng,
    cur: Cursors,
    cfg: Config,
    /// Calls left in the running callback.
    left: Cell<u32>,
    /// Calls made in the running callback (re-entrant ones included).
    made: Cell<u32>,
    /// Nesting of `proxy_on_memory_allocate` re-entries.
    depth: Cell<u32>,
    /// The guest reads its own configuration: allocations are honest and do not re-enter.
    honest: Cell<bool>,
    /// In `on_vm_start` / `on_configure`: no `proc_exit`.
    startup: Cell<bool>,
    last_input: Cell<u32>,
    last_ret: Cell<u32>,
    last_alloc: Cell<u32>,
    big_kind: Cell<BigKind>,
    /// What the call in progress reads (see `reenter.rs`).
    outer: Cell<Outer>,
    /// Root context ids seen created (a ring).
    roots: [Cell<u32>; 4],
    roots_at: Cell<usize>,
    /// Context ids seen created (a ring).
    seen: [Cell<u32>; 16],
    seen_at: Cell<usize>,
    current: Cell<u32>,
    effective: Cell<u32>,
    /// An HTTP call was dispatched for the running context in this callback.
    dispatched: Cell<bool>,
}

struct Global(Fuzz);

// SAFETY: wasm32-wasip1 guests are single-threaded.
unsafe impl Sync for Global {}

static FUZZ: Global = Global(Fuzz {
    rng: Rng::new(),
    cur: Cursors::new(),
    cfg: Config::new(),
    left: Cell::new(0),
    made: Cell::new(0),
    depth: Cell::new(0),
    honest: Cell::new(false),
    startup: Cell::new(false),
    last_input: Cell::new(0),
    last_ret: Cell::new(0),
    last_alloc: Cell::new(0),
    big_kind: Cell::new(BigKind::None),
    outer: Cell::new(Outer::None),
    roots: [const { Cell::new(0) }; 4],
    roots_at: Cell::new(0),
    seen: [const { Cell::new(0) }; 16],
    seen_at: Cell::new(0),
    current: Cell::new(0),
    effective: Cell::new(0),
    dispatched: Cell::new(false),
});

fn fuzz() -> &'static Fuzz {
    &FUZZ.0
}

impl Fuzz {
    /// Runs a callback's steps: 1..=`calls` host calls for context `ctx`, then the count line.
    fn run(&self, callback: &str, ctx: u32) {
        self.current.set(ctx);
        self.effective.set(ctx);
        self.dispatched.set(false);
        self.made.set(0);
        self.left.set(1 + self.rng.below(self.cfg.calls.get()));
        while self.left.get() > 0 {
            self.step();
        }
        self.report(callback);
    }

    /// Logs `abi-fuzz: N host calls in <callback>` (Info) with honest arguments.
    fn report(&self, callback: &str) {
        let mut line = args::Buf::new();
        line.push(b"abi-fuzz: ");
        let mut digits = [0u8; 10];
        let mut n = self.made.get();
        let mut i = digits.len();
        loop {
            i -= 1;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || i == 0 {
                break;
            }
        }
        line.push(digits.get(i..).unwrap_or(&[]));
        line.push(b" host calls in ");
        line.push(callback.as_bytes());
        let (p, l) = self.cur.arg(line.bytes());
        // SAFETY: a message in ARGS.
        unsafe { imports::proxy_log(2, p, l) };
    }

    /// Reads buffer `t` (the VM or plugin configuration) with honest allocations.
    fn read_buffer(&self, t: u32, size: u32, into: &mut args::Buf) {
        self.honest.set(true);
        let (rp, rs) = (self.cur.slot(), self.cur.slot());
        // SAFETY: honest arguments: two result slots in ARGS.
        let status = unsafe { imports::proxy_get_buffer_bytes(t, 0, size, rp, rs) };
        self.honest.set(false);
        if status != 0 {
            return;
        }
        let ptr = ARGS.u32_at(rp.wrapping_sub(ARGS.base()) as usize);
        let len = ARGS.u32_at(rs.wrapping_sub(ARGS.base()) as usize);
        let off = ptr.wrapping_sub(OUT.base()) as usize;
        let mut chunk = [0u8; 64];
        let mut at = 0usize;
        while at < len as usize && at < 2048 {
            let n = OUT.copy_out(off + at, &mut chunk);
            if n == 0 {
                break;
            }
            into.push(chunk.get(..n.min(len as usize - at)).unwrap_or(&[]));
            at += n;
        }
    }

    /// `proxy_on_memory_allocate`: maybe re-enter the host first, then an honest block of
    /// `OUT` (or `BIG`), or garbage.
    fn allocate(&self, size: u32) -> u32 {
        if !self.honest.get() {
            let depth = self.depth.get();
            if depth < self.cfg.depth.get()
                && self.left.get() > 0
                && self.rng.percent(self.cfg.reenter.get())
            {
                self.depth.set(depth + 1);
                // Half the time, first change what the host is about to return.
                if self.rng.percent(50) {
                    self.conflict();
                }
                // Then unrelated calls (each records what it reads itself).
                let outer = self.outer.replace(Outer::None);
                for _ in 0..self.rng.below(3) {
                    self.step();
                }
                self.outer.set(outer);
                self.depth.set(depth);
            }
            if self.rng.percent(self.cfg.garbage.get()) {
                let end = arena::memory_end();
                let r = &self.rng;
                let g = match r.below(9) {
                    0 => 0,
                    1 => 1,
                    2 => end.wrapping_sub(r.below(size.saturating_add(8))),
                    3 => end,
                    4 => u32::MAX - r.below(16),
                    5 => self.last_alloc.get(),
                    6 => self.last_input.get(),
                    7 => self.last_ret.get(),
                    _ => r.u32(),
                };
                self.last_alloc.set(g);
                return g;
            }
        }
        let p = if size as usize <= OUT_SIZE {
            self.cur.out(size as usize)
        } else if size as usize <= BIG_SIZE {
            self.big_kind.set(BigKind::Dirty);
            BIG.base()
        } else {
            0
        };
        self.last_alloc.set(p);
        p
    }

    fn stream_action(&self) -> u32 {
        if self.cfg.pause.get() && self.dispatched.get() {
            return self.rng.pick(&[1, 1, 2, u32::MAX], 1);
        }
        0
    }
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: u32) -> u32 {
    fuzz().allocate(size)
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(ctx: u32, root: u32) {
    let f = fuzz();
    let at = f.seen_at.get();
    if let Some(slot) = f.seen.get(at % f.seen.len()) {
        slot.set(ctx);
    }
    f.seen_at.set(at.wrapping_add(1));
    if root == 0 {
        let at = f.roots_at.get();
        if let Some(slot) = f.roots.get(at % f.roots.len()) {
            slot.set(ctx);
        }
        f.roots_at.set(at.wrapping_add(1));
    }
    // A root context is created before its configuration is read: start-up rules (no exit).
    f.startup.set(root == 0);
    f.run("proxy_on_context_create", ctx);
    f.startup.set(false);
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(root: u32, size: u32) -> u32 {
    let f = fuzz();
    let mut text = args::Buf::new();
    f.read_buffer(6, size, &mut text);
    let seed = f.cfg.parse(text.bytes());
    f.rng.seed(seed);
    f.startup.set(true);
    f.run("proxy_on_vm_start", root);
    f.startup.set(false);
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root: u32, size: u32) -> u32 {
    let f = fuzz();
    let mut text = args::Buf::new();
    f.read_buffer(7, size, &mut text);
    let seed = f.cfg.parse(text.bytes());
    f.rng.seed(seed ^ u64::from(root).rotate_left(32));
    f.startup.set(true);
    f.run("proxy_on_configure", root);
    f.startup.set(false);
    1
}

macro_rules! stream_callback {
    ($name:ident $(, $arg:ident)*) => {
        #[no_mangle]
        pub extern "C" fn $name(ctx: u32 $(, $arg: u32)*) -> u32 {
            $(let _ = $arg;)*
            let f = fuzz();
            f.run(stringify!($name), ctx);
            f.stream_action()
        }
    };
}

stream_callback!(proxy_on_request_headers, headers, end_of_stream);
stream_callback!(proxy_on_request_body, size, end_of_stream);
stream_callback!(proxy_on_request_trailers, trailers);
stream_callback!(proxy_on_response_headers, headers, end_of_stream);
stream_callback!(proxy_on_response_body, size, end_of_stream);
stream_callback!(proxy_on_response_trailers, trailers);

#[no_mangle]
pub extern "C" fn proxy_on_done(ctx: u32) -> u32 {
    fuzz().run("proxy_on_done", ctx);
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(ctx: u32) {
    fuzz().run("proxy_on_log", ctx);
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(ctx: u32) {
    fuzz().run("proxy_on_delete", ctx);
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root: u32) {
    fuzz().run("proxy_on_tick", root);
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(root: u32, queue: u32) {
    let _ = queue;
    fuzz().run("proxy_on_queue_ready", root);
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(ctx: u32, token: u32, h: u32, b: u32, t: u32) {
    let _ = (token, h, b, t);
    let f = fuzz();
    if f.cfg.pause.get() {
        // A request paused for this call goes on (a no-op status otherwise; not counted).
        // SAFETY: no pointer argument.
        unsafe { imports::proxy_continue_stream(0) };
    }
    f.run("proxy_on_http_call_response", ctx);
}
