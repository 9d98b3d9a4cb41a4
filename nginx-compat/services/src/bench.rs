//! Micro-benchmarks of the shared-memory services (`cargo test --release -p tollgate-services
//! -- --ignored --nocapture costs`).

use crate::kv::{Eviction, KvZone};
use crate::metrics_zone::{MetricKind, MetricsConfig, MetricsLayout, MetricsZone};
use crate::shm::SharedRegion;
use crate::zone::Init;

/// Rough costs, for the record: `cargo test -p tollgate-services --release -- --ignored --nocapture`.
#[test]
#[ignore]
fn costs() {
    let z = KvZone::attach(
        SharedRegion::anonymous(1 << 20).unwrap(),
        "*",
        Init::Fresh,
        Eviction::Lru,
    )
    .unwrap();
    for i in 0..1000 {
        z.set(
            format!("ratelimit/rule/tenant-{i}").as_bytes(),
            &[0u8; 24],
            0,
        )
        .unwrap();
    }
    let n = 1_000_000;
    let t = std::time::Instant::now();
    for i in 0..n {
        let key = format!("ratelimit/rule/tenant-{}", i % 1000);
        let (v, cas) = z.get(key.as_bytes()).unwrap();
        z.set(key.as_bytes(), &v, cas).unwrap();
    }
    eprintln!("kv get+set: {:?} per pair", t.elapsed() / n);
    let l = MetricsLayout::new(1024, 2, 4096).unwrap();
    let m = MetricsZone::attach(
        SharedRegion::anonymous(l.bytes().unwrap()).unwrap(),
        &l,
        Init::Fresh,
        0,
        MetricsConfig::default(),
    )
    .unwrap();
    let c = m.define(MetricKind::Counter, "c_total").unwrap();
    let h = m.define(MetricKind::Histogram, "h").unwrap();
    let t = std::time::Instant::now();
    for i in 0..n {
        m.increment(c, 1).unwrap();
        m.record(h, u64::from(i) * 7).unwrap();
    }
    eprintln!("metrics increment+record: {:?} per pair", t.elapsed() / n);
}
