//! The price table reader (`tollgate_cost::price_table`) on arbitrary documents, as a remote
//! table or a configuration's `prices` could carry them. The first byte picks the step size of
//! the incremental reader (1 to 256 bytes, or whole). Properties: no panic; the incremental read
//! (a slice per proxy-wasm callback) gives the same table and skip counts as the one-pass read,
//! or both refuse; every loaded price prices a usage without panicking; lookups of the models'
//! names (and of dated, prefixed variants) never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_cost::price::cost_nano;
use tollgate_cost::price_table::{IncrementalParse, PriceTable, Step};
use tollgate_cost::usage::Usage;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, doc)) = data.split_first() else {
        return;
    };
    let whole = PriceTable::parse(doc, "prices");
    let step = if seed == 0 {
        usize::MAX
    } else {
        usize::from(seed)
    };
    let mut reader = IncrementalParse::new(doc.to_vec(), "prices");
    let mut steps = 0usize;
    let parts = loop {
        steps += 1;
        assert!(steps <= doc.len() + 2, "the incremental read must progress");
        if let Step::Done(r) = reader.step(step) {
            break r;
        }
    };
    match (&whole, &parts) {
        (Ok(w), Ok(p)) => {
            assert_eq!(w.table, p.table);
            assert_eq!(w.skipped, p.skipped);
            let usage = Usage {
                input_tokens: 300_000,
                output_tokens: 7,
                cached_input_tokens: 100,
                cache_creation_input_tokens: 5,
                reasoning_tokens: 3,
                ..Usage::default()
            };
            for price in w.table.prices() {
                let _ = cost_nano(&usage, price);
            }
            let _ = w.summary("fuzz");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("one-pass and incremental reads disagree: {whole:?} vs {parts:?}"),
    }
    if let Ok(w) = &whole {
        for name in [
            "gpt-4o-mini",
            "openai/gpt-4o-mini-2024-07-18",
            "anthropic/x-20250101",
            "",
            "-2024-01-01",
        ] {
            let _ = w.table.get(name);
        }
        let _ = w.table.get(&String::from_utf8_lossy(doc));
    }
});
