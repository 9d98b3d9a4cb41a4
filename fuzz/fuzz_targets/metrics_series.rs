//! metrics' label encoding and series keys (`tollgate_metrics::labels`, `::series`, `::record`)
//! on arbitrary values. Input: `0xff`-separated fields, each a published signal value (a word),
//! also read as a tenant value and a decimal signal. Properties: no panic; `sanitize`,
//! `sanitize_bytes`, `signal_label` and `decimal` equal the straightforward references (the
//! character-by-character encoding of the lossy UTF-8 text; `str::trim` then `u64::from_str`);
//! and the series cache, fed every field as a word of two families (one label, and two labels
//! with a route), returns for each lookup the id of the encoded name of its labels: the host
//! below gives one id per name, as Envoy's define does, and every name is defined once, whether
//! the word was numbered, keyed by its text (past the first 16) or sanitised first.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use tollgate_common::metrics::metric_name;
use tollgate_metrics::labels::{
    sanitize, sanitize_bytes, sanitize_chars, signal_label, Label, MAX_SIGNAL_BYTES,
};
use tollgate_metrics::record::decimal;
use tollgate_metrics::series::{Family, SeriesCache, Value};

fuzz_target!(|data: &[u8]| {
    let mut cache = SeriesCache::new(1_000);
    let mut host: HashMap<String, u32> = HashMap::new();
    let mut defined = 0usize;
    for (i, field) in data.split(|b| *b == 0xff).take(64).enumerate() {
        let lossy = String::from_utf8_lossy(field);
        assert_eq!(sanitize_bytes(field), sanitize_chars(&lossy));
        assert_eq!(
            decimal(field),
            std::str::from_utf8(field)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        );
        let Ok(word) = std::str::from_utf8(field) else {
            continue;
        };
        assert_eq!(sanitize(word), sanitize_chars(word));
        let label = if word.is_empty() || word.len() > MAX_SIGNAL_BYTES {
            "other".to_string()
        } else {
            sanitize_chars(word)
        };
        assert_eq!(signal_label(word), label);
        let route = Label::nth(i % 3, ["a", "b", "c"][i % 3]);
        for labels in [
            vec![("result", Value::Word(word))],
            vec![
                ("route", Value::Set(route)),
                ("decision", Value::Word(word)),
            ],
        ] {
            let family = if labels.len() == 1 {
                Family::Auth
            } else {
                Family::RateLimit
            };
            let texts: Vec<(&str, &str)> = labels
                .iter()
                .map(|(n, v)| match v {
                    Value::Word(_) => (*n, label.as_str()),
                    Value::Set(l) => (*n, l.text),
                })
                .collect();
            let want = metric_name(family.name(), &texts);
            let got = cache.id(family, &labels, |_, name| {
                defined += 1;
                let next = u32::try_from(host.len()).unwrap_or(u32::MAX);
                Some(*host.entry(name.to_string()).or_insert(next))
            });
            assert_eq!(got, host.get(&want).copied(), "{want}");
        }
    }
    assert_eq!(defined, host.len(), "a name defined twice");
    assert_eq!(cache.len(), host.len());
});
