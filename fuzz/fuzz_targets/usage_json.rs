//! The incremental JSON scanner and the usage readers (`tollgate_cost::json_scan`, `usage`) on
//! arbitrary response bodies, fed in chunks cut where the input's first byte says, against
//! `serde_json` reading the whole body. Properties: no panic; every body `serde_json` accepts is
//! accepted by the scanner, with the same usage read from it (so no body is unpriced, or priced
//! differently, for being read incrementally); the cost of a usage agrees with an independent
//! u128 reference (exact, rounded half up once; refused only when the counts contradict each
//! other or it exceeds u64 nano-USD); and booking it in the ledger adds exactly it to the day,
//! month and total: spend never decreases, never goes negative, never loses a booking.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../chunks.rs"]
mod chunks;
use chunks::chunks;
use tollgate_common::shared_data::{MemoryStore, Semantics};
use tollgate_cost::json_scan::JsonScan;
use tollgate_cost::ledger::Ledger;
use tollgate_cost::period::Periods;
use tollgate_cost::price::{cost_nano, ModelPrice};
use tollgate_cost::usage::{parse_json_body, scanned_body_usage, Usage};

const PRICE: ModelPrice = ModelPrice {
    input: 150_000_000_000,
    output: 600_000_000_000,
    cache_read: Some(75_000_000_000),
    cache_creation: Some(187_500_000_001),
    reasoning: None,
    tier: None,
    max_output_tokens: None,
};

/// The cost in nano-USD computed apart: parts in u128, rounded half up once.
fn reference(u: &Usage, p: &ModelPrice) -> Option<u64> {
    let uncached = u
        .input_tokens
        .checked_sub(u.cached_input_tokens)?
        .checked_sub(u.cache_creation_input_tokens)?;
    let plain = u.output_tokens.checked_sub(u.reasoning_tokens)?;
    let parts = [
        (uncached, p.input),
        (u.cached_input_tokens, p.cache_read.unwrap_or(p.input)),
        (
            u.cache_creation_input_tokens,
            p.cache_creation.unwrap_or(p.input),
        ),
        (plain, p.output),
        (u.reasoning_tokens, p.reasoning.unwrap_or(p.output)),
    ];
    let mut atto = 0u128;
    for (tokens, unit) in parts {
        atto = atto.checked_add(u128::from(tokens) * u128::from(unit))?;
    }
    let (q, r) = (atto / 1_000_000_000, atto % 1_000_000_000);
    u64::try_from(q + u128::from(r >= 500_000_000)).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let mut scan = JsonScan::new(1 << 20);
    for piece in chunks(body, seed) {
        scan.feed(piece);
    }
    let scanned = scan.finish();
    if serde_json::from_slice::<serde_json::Value>(body).is_ok() {
        assert!(
            scanned.is_ok(),
            "serde_json accepts it, the scanner says {scanned:?}"
        );
    }
    let whole = parse_json_body(body, Some("request-model"));
    if whole.is_some() {
        let incremental = scanned
            .as_ref()
            .ok()
            .and_then(|c| scanned_body_usage(c, Some("request-model")));
        assert_eq!(incremental, whole);
    }
    let Some(usage) = whole else {
        return;
    };
    let nano = cost_nano(&usage, &PRICE).ok();
    assert_eq!(nano, reference(&usage, &PRICE), "{usage:?}");
    let Some(nano) = nano else {
        return;
    };
    let store = MemoryStore::new(if seed & 1 == 0 {
        Semantics::Envoy
    } else {
        Semantics::NgxWasm
    });
    let ledger = Ledger::new("fuzz", 4, 10);
    ledger.ensure(&store, std::iter::empty(), 0).unwrap();
    let key = ledger.key("t");
    let now_ms = 1_700_000_000_000;
    let now = Periods::at(now_ms / 1000);
    let mut want = 0u64;
    for _ in 0..3 {
        ledger.book(&store, &key, now_ms, nano, None).unwrap();
        want = want.saturating_add(nano);
        let s = ledger.spend(&store, &key, &now).unwrap().spend;
        assert_eq!((s.day, s.month, s.total), (want, want, want));
    }
});
