//! Hostile arguments: inputs placed in the guest's memory then, with the configured
//! probability, pointed at or sized wrongly (null, straddling or past the end of memory, huge,
//! overlapping another input or result); result slots likewise; enum values out of range;
//! names, values, maps and property paths from vocabularies of valid, edge and invalid items.

use crate::arena::{memory_end, BIG, BIG_SIZE};
use crate::Fuzz;

/// A byte buffer on the stack (pushes past its capacity are cut).
pub struct Buf {
    b: [u8; 2048],
    n: usize,
}

impl Buf {
    pub fn new() -> Buf {
        Buf { b: [0; 2048], n: 0 }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        for &x in bytes {
            if let Some(slot) = self.b.get_mut(self.n) {
                *slot = x;
                self.n += 1;
            }
        }
    }

    pub fn u32(&mut self, v: u32) {
        self.push(&v.to_le_bytes());
    }

    pub fn bytes(&self) -> &[u8] {
        self.b.get(..self.n).unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.n
    }

    /// Overwrites the `u32` at `at` (ignored past the end).
    pub fn set_u32(&mut self, at: usize, v: u32) {
        for (i, x) in v.to_le_bytes().iter().enumerate() {
            if let Some(slot) = self.b.get_mut(at + i).filter(|_| at + i < self.n) {
                *slot = *x;
            }
        }
    }

    pub fn truncate(&mut self, n: usize) {
        self.n = self.n.min(n);
    }
}

pub const NAMES: &[&[u8]] = &[
    b":path",
    b":method",
    b":authority",
    b":status",
    b":scheme",
    b"host",
    b"content-length",
    b"content-type",
    b"transfer-encoding",
    b"connection",
    b"x-a",
    b"X-Upper",
    b"x-fuzz",
    b"cookie",
    b"te",
    b"set-cookie",
    b"",
    b"bad name",
    b"x\r\ninjected",
    b"x\0nul",
    b":",
    b"::p",
    b"\xc3\xa9",
];

pub const VALUES: &[&[u8]] = &[
    b"",
    b"1",
    b"0",
    b"GET",
    b"POST",
    b"/",
    b"/fuzz?x=1",
    b"127.0.0.1",
    b"chunked",
    b"close",
    b"keep-alive",
    b"text/plain",
    b"a\r\nx-injected: yes",
    b"\0",
    b"-1",
    b"18446744073709551616",
    b"99999999999999999999",
    b"  200  ",
    b"gzip, chunked",
    b"\xff\xfe",
];

pub const PROPERTIES: &[&[u8]] = &[
    b"plugin_name",
    b"plugin_root_id",
    b"plugin_vm_id",
    b"request\0path",
    b"request\0url_path",
    b"request\0host",
    b"request\0method",
    b"request\0headers\0host",
    b"request\0headers\0x-fuzz",
    b"request\0id",
    b"request\0time",
    b"request\0size",
    b"request\0total_size",
    b"response\0code",
    b"response\0code_details",
    b"response\0size",
    b"response\0total_size",
    b"source\0address",
    b"source\0port",
    b"destination\0address",
    b"connection\0id",
    b"connection\0mtls",
    b"node\0id",
    b"upstream\0address",
    b"ngx.request_body",
    b"ngx.upstream_addr",
    b"ngx.upstream_status",
    b"ngx.request_time",
    b"ngx.realpath_root",
    b"ngx.cookie_a",
    b"ngx.arg_x",
    b"ngx.http_host",
    b"ngx.sent_http_content_type",
    b"ngx.content_length",
    b"ngx.binary_remote_addr",
    b"ngx.body_bytes_sent",
    b"ngx.request_completion",
    b"ngx.limit_rate",
    b"ngx.nope",
    b"ngx\0uri",
    b"ngx\0",
    b"ngx.",
    b"wasmx.fuzz",
    b"fuzz\0prop",
    b"fuzz.prop",
    b"",
    b"\0",
    b"a\0\0b",
];

pub const KEYS: &[&[u8]] = &[
    b"k0",
    b"k1",
    b"k2",
    b"fuzz/k",
    b"nozone/k",
    b"",
    b"\0",
    b"\xff",
];

pub const METRIC_NAMES: &[&[u8]] = &[
    b"fuzz_counter",
    b"fuzz_gauge",
    b"fuzz_histogram",
    b"fuzz_total{a=\"b\"}",
    b"",
    b"\xff\xfe",
    b"a b",
];

/// What `BIG` holds (it is rebuilt when another kind is asked for).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum BigKind {
    /// Unset: zeros.
    None,
    /// A serialized map of as many `a: ` entries as fit.
    ManyPairs,
    /// `x` bytes, no newline.
    Text,
    /// `line\n` repeated.
    Lines,
    /// Written by the host (an allocation or `random_get`): rebuilt before any other use.
    Dirty,
}

impl Fuzz {
    /// An enum value: mostly `0..valid`, sometimes just past it or garbage.
    pub fn enum_val(&self, valid: u32) -> u32 {
        match self.rng.below(10) {
            0 => valid + self.rng.below(4),
            1 => self.rng.pick(&[u32::MAX, 0x8000_0000, 255, 256], u32::MAX),
            _ => self.rng.below(valid),
        }
    }

    /// Places `bytes` in `ARGS` and returns a pointer and length that are, with the configured
    /// probability, hostile.
    pub fn input(&self, bytes: &[u8]) -> (u32, u32) {
        let (p, l) = self.cur.arg(bytes);
        self.hostile(p, l)
    }

    /// `(p, l)` unchanged, or (with the configured probability) a hostile variant of it.
    pub fn hostile(&self, p: u32, l: u32) -> (u32, u32) {
        let last = self.last_input.replace(p);
        if !self.rng.percent(self.cfg.bad_ptr.get()) {
            return (p, l);
        }
        let end = memory_end();
        let r = &self.rng;
        match r.below(10) {
            0 => (0, l),
            // Straddles the end of memory (or ends exactly there).
            1 => (end.wrapping_sub(r.below(l.max(1))), l.max(1)),
            2 => (end, l.max(1)),
            3 => (u32::MAX - r.below(8), l.max(1)),
            4 => (r.u32(), l.max(1)),
            5 => (p, u32::MAX - r.below(4)),
            6 => (p, end),
            7 => (p, l.wrapping_add(1 + r.below(64))),
            8 => (last, l),
            _ => (p, 0),
        }
    }

    /// A result slot: a fresh 8-byte slot, or (with the configured probability) null, past or
    /// straddling the end of memory, unaligned, or the same as the last slot or input.
    pub fn ret(&self) -> u32 {
        let s = self.cur.slot();
        let last = self.last_ret.replace(s);
        if !self.rng.percent(self.cfg.bad_ptr.get()) {
            return s;
        }
        let end = memory_end();
        let r = &self.rng;
        match r.below(8) {
            0 => 0,
            1 => end.wrapping_sub(1 + r.below(7)),
            2 => end,
            3 => u32::MAX - r.below(8),
            4 => r.u32(),
            5 => s + 1 + r.below(3),
            6 => last,
            _ => self.last_input.get(),
        }
    }

    fn random_bytes(&self, b: &mut Buf, max: u32) {
        for _ in 0..self.rng.below(max + 1) {
            b.push(&[self.rng.u32() as u8]);
        }
    }

    pub fn name(&self, b: &mut Buf) {
        if self.rng.percent(10) {
            self.random_bytes(b, 12);
        } else {
            b.push(self.rng.pick(NAMES, b"x-a"));
        }
    }

    pub fn value(&self, b: &mut Buf) {
        match self.rng.below(20) {
            0 => self.random_bytes(b, 40),
            1 => {
                for _ in 0..self.rng.below(1500) {
                    b.push(b"v");
                }
            }
            _ => b.push(self.rng.pick(VALUES, b"")),
        }
    }

    pub fn property(&self, b: &mut Buf) {
        if self.rng.percent(10) {
            self.random_bytes(b, 16);
        } else {
            b.push(self.rng.pick(PROPERTIES, b"plugin_name"));
        }
    }

    pub fn key(&self, b: &mut Buf) {
        if self.rng.percent(10) {
            self.random_bytes(b, 16);
        } else {
            b.push(self.rng.pick(KEYS, b"k0"));
        }
    }

    /// Payloads (bodies, shared data and queue values, log messages): small, or a slice of `BIG`.
    pub fn payload(&self) -> (u32, u32) {
        if self.rng.percent(4) {
            let kind = self.rng.pick(
                &[BigKind::Text, BigKind::Lines, BigKind::None],
                BigKind::Text,
            );
            let len = self.rng.below(BIG_SIZE as u32 + 1);
            return self.hostile(self.big(kind), len);
        }
        let mut b = Buf::new();
        match self.rng.below(4) {
            0 => {}
            1 => self.value(&mut b),
            2 => self.random_bytes(&mut b, 200),
            _ => b.push(b"fuzz payload\nsecond line\n"),
        }
        self.input(b.bytes())
    }

    /// The address of `BIG` holding `kind` (rebuilt when it held another kind).
    pub fn big(&self, kind: BigKind) -> u32 {
        if self.big_kind.replace(kind) != kind {
            match kind {
                BigKind::None | BigKind::Dirty => BIG.fill(0, BIG_SIZE, 0),
                BigKind::Text => BIG.fill(0, BIG_SIZE, b'x'),
                BigKind::Lines => {
                    let mut at = 0;
                    while at < BIG_SIZE {
                        at += BIG.put(at, b"line\n");
                    }
                }
                BigKind::ManyPairs => {
                    // count, then (1, 0) sizes, then "a\0\0" per entry: 11 bytes an entry.
                    let n = (BIG_SIZE - 4) / 11;
                    BIG.put(0, &(n as u32).to_le_bytes());
                    let mut at = 4;
                    for _ in 0..n {
                        at += BIG.put(at, &[1, 0, 0, 0, 0, 0, 0, 0]);
                    }
                    for _ in 0..n {
                        at += BIG.put(at, b"a\0\0");
                    }
                }
            }
        }
        BIG.base()
    }

    /// A serialized header map: valid (0-5 entries from the vocabularies) or corrupted (count
    /// or sizes wrong, truncated, a NUL missing), or the many-entry map of `BIG`.
    pub fn map(&self) -> (u32, u32) {
        if self.rng.percent(3) {
            let n = (BIG_SIZE - 4) / 11;
            return self.hostile(self.big(BigKind::ManyPairs), (4 + n * 11) as u32);
        }
        let mut entries: [(Buf, Buf); 5] = std::array::from_fn(|_| (Buf::new(), Buf::new()));
        let n = self.rng.below(6) as usize;
        for (k, v) in entries.iter_mut().take(n) {
            self.name(k);
            self.value(v);
        }
        let mut b = Buf::new();
        b.u32(n as u32);
        for (k, v) in entries.iter().take(n) {
            b.u32(k.len() as u32);
            b.u32(v.len() as u32);
        }
        for (k, v) in entries.iter().take(n) {
            b.push(k.bytes());
            b.push(&[0]);
            b.push(v.bytes());
            b.push(&[0]);
        }
        if self.rng.percent(15) {
            let len = b.len();
            match self.rng.below(5) {
                0 => b.set_u32(0, self.rng.pick(&[u32::MAX, n as u32 + 1, 0x1999_9999], 7)),
                1 => b.set_u32(4, u32::MAX - self.rng.below(2)),
                2 => b.truncate(len.saturating_sub(1 + self.rng.below(8) as usize)),
                3 => b.set_u32(8, 0x7fff_ffff),
                _ => {
                    if len > 0 {
                        b.truncate(len - 1);
                        b.push(b"x");
                    }
                }
            }
        }
        self.input(b.bytes())
    }
}
