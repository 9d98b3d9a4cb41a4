//! Unit tests of metrics zones (on ordinary memory).

use super::layout::{H_VERSION, VERSION};
use super::*;
use crate::exposition::{LabelPolicy, Value};
use crate::shm::SharedRegion;
use crate::zone::{AttachError, Init};
use std::sync::atomic::Ordering;

fn layout() -> MetricsLayout {
    MetricsLayout::new(64, 2, 256).unwrap()
}

/// Two workers' handles on one zone.
fn zone_pair(config: MetricsConfig) -> (MetricsZone, MetricsZone) {
    let l = layout();
    let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
    let w0 = MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, config.clone()).unwrap();
    let w1 = MetricsZone::attach(region, &l, Init::Existing, 1, config).unwrap();
    (w0, w1)
}

#[test]
fn worker_slices_sum() {
    let (w0, w1) = zone_pair(MetricsConfig::default());
    let a = w0.define(MetricKind::Counter, "c").unwrap();
    // The other worker gets the same id for the same name.
    assert_eq!(w1.define(MetricKind::Counter, "c").unwrap(), a);
    let b = w1.define(MetricKind::Counter, "d").unwrap();
    assert_ne!(a, b);
    w0.increment(a, 5).unwrap();
    w1.increment(a, 7).unwrap();
    w1.record(a, 1).unwrap();
    assert_eq!(w0.get(a).unwrap(), 13);
    assert_eq!(w1.get(a).unwrap(), 13);
    assert_eq!(w0.get(b).unwrap(), 0);
    // Each worker wrote only its own slice.
    assert_eq!(w0.slot(0, 0).unwrap().load(Ordering::Relaxed), 5);
    assert_eq!(w0.slot(1, 0).unwrap().load(Ordering::Relaxed), 8);
}

#[test]
fn envoy_call_semantics() {
    let (w0, w1) = zone_pair(MetricsConfig::default());
    let c = w0.define(MetricKind::Counter, "c").unwrap();
    let g = w0.define(MetricKind::Gauge, "g").unwrap();
    let h = w0.define(MetricKind::Histogram, "h").unwrap();
    assert_eq!(w0.increment(c, 0), Err(MetricsError::BadArgument));
    assert_eq!(w0.increment(c, -1), Err(MetricsError::BadArgument));
    assert_eq!(w0.increment(h, 1), Err(MetricsError::BadArgument));
    assert_eq!(w0.get(h), Err(MetricsError::BadArgument));
    assert_eq!(w0.get(99), Err(MetricsError::NotFound));
    assert_eq!(w0.increment(99, 1), Err(MetricsError::NotFound));
    assert_eq!(w0.record(99, 1), Err(MetricsError::NotFound));
    // Gauges are global: set replaces, increments from any worker add.
    w0.record(g, 10).unwrap();
    w1.increment(g, -4).unwrap();
    w0.increment(g, 1).unwrap();
    assert_eq!(w1.get(g).unwrap(), 7);
    w1.record(g, 2).unwrap();
    assert_eq!(w0.get(g).unwrap(), 2);
    // Same name, other kind: refused.
    assert_eq!(
        w1.define(MetricKind::Gauge, "c"),
        Err(MetricsError::BadArgument)
    );
    assert_eq!(
        w1.define(MetricKind::Counter, ""),
        Err(MetricsError::BadArgument)
    );
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    assert_eq!(
        w1.define(MetricKind::Counter, &long),
        Err(MetricsError::BadArgument)
    );
    assert!(w1
        .define(MetricKind::Counter, &"x".repeat(MAX_NAME_BYTES))
        .is_ok());
}

#[test]
fn runs_out_of_definitions_and_slots() {
    let l = MetricsLayout::new(4, 1, 20).unwrap();
    let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
    let z = MetricsZone::attach(region, &l, Init::Fresh, 0, MetricsConfig::default()).unwrap();
    // A default histogram takes 13 + 2 slots, a counter 1: 20 slots hold one of each + 4.
    z.define(MetricKind::Histogram, "h").unwrap();
    assert_eq!(
        z.define(MetricKind::Histogram, "h2"),
        Err(MetricsError::NoSpace)
    );
    for i in 0..3 {
        z.define(MetricKind::Counter, &format!("c{i}")).unwrap();
    }
    assert_eq!(
        z.define(MetricKind::Counter, "c3"),
        Err(MetricsError::NoSpace)
    );
    assert_eq!(z.usage(), (4, 18));
    // Existing names still resolve, and are no overflow.
    assert_eq!(z.define(MetricKind::Counter, "c1").unwrap(), 2);
    assert_eq!(z.overflow(), 2, "the two refused definitions are counted");
    assert_eq!(
        z.define(MetricKind::Counter, "c4"),
        Err(MetricsError::NoSpace)
    );
    assert_eq!(z.overflow(), 3);
}

#[test]
fn sentinel_mismatch_refuses_to_attach() {
    let l = layout();
    let region = SharedRegion::anonymous(l.bytes().unwrap() * 2).unwrap();
    let cfg = MetricsConfig::default();
    MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, cfg.clone()).unwrap();
    let more_workers = MetricsLayout::new(64, 3, 256).unwrap();
    assert!(matches!(
        MetricsZone::attach(
            region.clone(),
            &more_workers,
            Init::Existing,
            0,
            cfg.clone()
        ),
        Err(AttachError::Mismatch {
            field: "zone size",
            ..
        })
    ));
    assert_eq!(
        MetricsZone::attach(region.clone(), &l, Init::Existing, 2, cfg.clone()).unwrap_err(),
        AttachError::WorkerOutOfRange {
            worker: 2,
            workers: 2
        }
    );
    let blank = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
    assert_eq!(
        MetricsZone::attach(blank, &l, Init::Existing, 0, cfg.clone()).unwrap_err(),
        AttachError::NotInitialized
    );
    region
        .u32_at(H_VERSION)
        .unwrap()
        .store(VERSION + 1, Ordering::Relaxed);
    assert!(matches!(
        MetricsZone::attach(region, &l, Init::Existing, 0, cfg),
        Err(AttachError::Mismatch {
            field: "layout version",
            ..
        })
    ));
}

#[test]
fn forked_workers_count_exactly() {
    let l = MetricsLayout::new(16, 3, 64).unwrap();
    let region = SharedRegion::anonymous(l.bytes().unwrap()).unwrap();
    let cfg = MetricsConfig::default();
    let master = MetricsZone::attach(region.clone(), &l, Init::Fresh, 0, cfg.clone()).unwrap();
    let codes = crate::shm::fork_children(3, |w| {
        let Ok(z) = master.for_worker(w as u32) else {
            return false;
        };
        // Every worker defines the same names concurrently.
        let (Ok(c), Ok(h)) = (
            z.define(MetricKind::Counter, "tollgate_x_total"),
            z.define(
                MetricKind::Histogram,
                "tollgate_request_duration_microseconds",
            ),
        ) else {
            return false;
        };
        (0..10_000u64).all(|i| z.increment(c, 1).is_ok() && z.record(h, i).is_ok())
    });
    assert_eq!(codes, vec![0, 0, 0]);
    assert_eq!(master.usage().0, 2);
    assert_eq!(master.get(0).unwrap(), 30_000);
    let snap = master.snapshot().unwrap();
    let Value::Histogram { counts, sum, .. } = &snap[1].value else {
        panic!()
    };
    assert_eq!(counts.iter().sum::<u64>(), 30_000);
    assert_eq!(*sum, 3 * (0..10_000u64).sum::<u64>());
    // 0..=1000 in the first bucket, per worker.
    assert_eq!(counts[0], 3 * 1001);
}

const EXPECTED: &str = "\
# HELP tollgate_auth_total Requests by jwt-auth outcome, as the metrics filter saw them.
# TYPE tollgate_auth_total counter
tollgate_auth_total{result=\"ok\"} 4
# HELP tollgate_body_bytes proxy-wasm metric tollgate_body_bytes.
# TYPE tollgate_body_bytes histogram
tollgate_body_bytes_bucket{le=\"10\"} 1
tollgate_body_bytes_bucket{le=\"100\"} 2
tollgate_body_bytes_bucket{le=\"+Inf\"} 3
tollgate_body_bytes_sum 555
tollgate_body_bytes_count 3
# HELP tollgate_inflight proxy-wasm metric tollgate_inflight.
# TYPE tollgate_inflight gauge
tollgate_inflight 3
# HELP tollgate_request_duration_seconds Time from the request headers to the end of the stream, in seconds.
# TYPE tollgate_request_duration_seconds histogram
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.001\"} 2
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.0025\"} 2
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.005\"} 2
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.01\"} 2
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.025\"} 2
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.05\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.1\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.25\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.5\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"1\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"2.5\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"5\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"10\"} 3
tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"+Inf\"} 4
tollgate_request_duration_seconds_sum{route=\"chat\"} 20.031999
tollgate_request_duration_seconds_count{route=\"chat\"} 4
# HELP tollgate_requests_total Requests by method, status class, route and tenant (as configured).
# TYPE tollgate_requests_total counter
tollgate_requests_total{method=\"get\",status_class=\"2xx\",route=\"chat\",tenant=\"acme\"} 3
tollgate_requests_total{method=\"get\",status_class=\"4xx\",route=\"chat\",tenant=\"acme\"} 1
";

fn sample() -> MetricsZone {
    let config = MetricsConfig {
        buckets: HistogramBuckets::default()
            .rule("tollgate_body", vec![10, 100])
            .unwrap(),
        labels: LabelPolicy::tollgate(),
    };
    let (w0, w1) = zone_pair(config);
    let ok = "tollgate_requests_total.method.get.status_class.2xx.route.chat.tenant.acme";
    let bad = "tollgate_requests_total.method.get.status_class.4xx.route.chat.tenant.acme";
    let dur = "tollgate_request_duration_microseconds.route.chat";
    // Defined in an order unlike the output's.
    let h = w1.define(MetricKind::Histogram, dur).unwrap();
    let r4 = w1.define(MetricKind::Counter, bad).unwrap();
    let r2 = w0.define(MetricKind::Counter, ok).unwrap();
    let g = w0.define(MetricKind::Gauge, "tollgate_inflight").unwrap();
    let a = w0
        .define(MetricKind::Counter, "tollgate_auth_total.result.ok")
        .unwrap();
    let b = w1
        .define(MetricKind::Histogram, "tollgate_body_bytes")
        .unwrap();
    w0.increment(r2, 2).unwrap();
    w1.increment(r2, 1).unwrap();
    w1.increment(r4, 1).unwrap();
    w0.record(g, 5).unwrap();
    w1.increment(g, -2).unwrap();
    w0.increment(a, 4).unwrap();
    for (w, v) in [(&w0, 999), (&w1, 1000), (&w0, 30_000), (&w1, 20_000_000)] {
        w.record(h, v).unwrap();
    }
    for v in [5, 50, 500] {
        w0.record(b, v).unwrap();
    }
    w0
}

#[test]
fn exposition_matches_expected_text() {
    assert_eq!(sample().render().unwrap(), EXPECTED);
}

/// `promtool check metrics` (Debian package `prometheus`) accepts the output: exit 0, or 3
/// with lint findings only, and only those Envoy's output draws too (tests/e2e/test_metrics.py).
#[test]
fn exposition_passes_promtool() {
    let text = sample().render().unwrap();
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed: skipped (apt-get install prometheus)");
        return;
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(code == Some(0) || code == Some(3), "{code:?}: {report}");
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.ends_with(" no help text")
                || line.ends_with(" use base unit \"seconds\" instead of \"microseconds\""),
            "unexpected promtool finding: {line}"
        );
    }
}

#[test]
fn bucket_configuration_is_checked() {
    assert!(HistogramBuckets::with_default(vec![]).is_err());
    assert!(HistogramBuckets::with_default(vec![2, 2]).is_err());
    assert!(HistogramBuckets::with_default((1..=32).collect()).is_err());
    let b = HistogramBuckets::with_default(vec![1, 2])
        .unwrap()
        .rule("a", vec![5])
        .unwrap()
        .rule("ab", vec![7])
        .unwrap();
    // First matching rule wins, as in Envoy's histogram_bucket_settings.
    assert_eq!(b.for_name("abc"), &[5]);
    assert_eq!(b.for_name("x"), &[1, 2]);
}
