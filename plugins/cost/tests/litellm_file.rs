//! LiteLLM's real price file, as a user gives it: a committed excerpt of litellm 1.109.1's
//! `model_prices_and_context_window_backup.json` (testdata/litellm_excerpt.json, entries copied
//! verbatim), and the whole file when the e2e set-up has fetched it from PyPI
//! (`.cache/litellm/1.109.1/model_prices_and_context_window_backup.json`, see
//! tests/e2e/litellm.py).

use std::path::PathBuf;

use tollgate_cost::price_table::{IncrementalParse, PriceTable, Step};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_excerpt_loads_as_litellm_prices_it() {
    let json = std::fs::read(root().join("plugins/cost/testdata/litellm_excerpt.json")).unwrap();
    let loaded = PriceTable::parse(&json, "prices").unwrap();
    let t = &loaded.table;
    // Values as written in the file, in atto-USD per token.
    let p = t.get("gpt-4o-mini").unwrap();
    assert_eq!(
        (p.input, p.output, p.cache_read),
        (150_000_000_000, 600_000_000_000, Some(75_000_000_000))
    );
    // The dated snapshot has its own entry, and it differs from the undated one's.
    assert_eq!(t.get("gpt-4o-2024-05-13").unwrap().input, 5_000_000_000_000);
    assert_eq!(t.get("gpt-4o").unwrap().input, 2_500_000_000_000);
    // Floating-point noise in the file, rounded to the nearest atto-USD.
    let noisy = t.get("databricks/databricks-claude-sonnet-4-1").unwrap();
    assert_eq!(
        (noisy.input, noisy.output),
        (2_999_990_000_000, 15_000_020_000_000)
    );
    assert!(loaded
        .skipped
        .to_string()
        .contains("1 schema_example (e.g. sample_spec)"));
    assert!(t.get("sample_spec").is_none());
}

#[test]
fn the_whole_file_loads_when_fetched() {
    let path = root().join(".cache/litellm/1.109.1/model_prices_and_context_window_backup.json");
    let Ok(json) = std::fs::read(&path) else {
        eprintln!(
            "skipped: {} not fetched (tests/e2e/litellm.py fetches it)",
            path.display()
        );
        return;
    };
    let started = std::time::Instant::now();
    let loaded = PriceTable::parse(&json, "prices").unwrap();
    let elapsed = started.elapsed();
    let entries = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&json)
        .unwrap()
        .len();
    assert_eq!(entries, 4553);
    assert_eq!(loaded.table.len() + loaded.skipped.total(), entries);
    assert!(loaded.table.len() > 3600, "{}", loaded.summary("the file"));
    eprintln!(
        "{} ({} bytes parsed natively in {elapsed:?})",
        loaded.summary("the file"),
        json.len()
    );
    // Read 256 KiB at a time (as the filter reads a remote table): the same table.
    let mut p = IncrementalParse::new(json.clone(), "prices");
    let mut steps = 0;
    let parts = loop {
        steps += 1;
        if let Step::Done(r) = p.step(256 << 10) {
            break r.unwrap();
        }
    };
    assert_eq!(parts.table, loaded.table);
    assert_eq!(parts.skipped, loaded.skipped);
    assert!(steps >= json.len() / (256 << 10), "{steps}");
}
