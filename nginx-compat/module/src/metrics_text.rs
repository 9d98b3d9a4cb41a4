//! What a `tollgate_metrics` location answers, nginx-free (the handler in
//! `metrics_endpoint.rs` reads the request and the zones, then sends this): the choice of
//! format from the URI and query, the `filter=REGEX` argument, and Envoy's `/stats` text.
//!
//! Formats: Prometheus text (exposition format 0.0.4) by default; Envoy's admin `/stats` text
//! (`name: value` lines, `wasmcustom.` before the filters' metrics, as Envoy names them) when
//! the location's URI ends with `/stats` or the query has `format=envoy`. `filter=REGEX` keeps
//! the names the regex matches anywhere, like Envoy's `/stats?filter=`.

use tollgate_services::exposition::Value;
use tollgate_services::metrics_zone::MetricSnapshot;

/// What the request asked for.
#[derive(Debug)]
pub struct Query {
    /// Envoy's `/stats` text rather than Prometheus text.
    pub envoy: bool,
    /// `filter=`, percent-decoded, when present and not empty: the regex, or why it is not one
    /// (answered with 400).
    pub filter: Option<Result<regex_lite::Regex, regex_lite::Error>>,
}

/// The [`Query`] of a request for `uri` with query string `args` (without `?`).
pub fn query(uri: &[u8], args: &[u8]) -> Query {
    let envoy =
        uri.ends_with(b"/stats") || args.split(|b| *b == b'&').any(|a| a == b"format=envoy");
    let filter = args
        .split(|b| *b == b'&')
        .find_map(|a| a.strip_prefix(b"filter="))
        .map(|f| String::from_utf8_lossy(&unescape(f)).into_owned())
        .filter(|f| !f.is_empty())
        .map(|f| regex_lite::Regex::new(&f));
    Query { envoy, filter }
}

/// Percent-decoding of a query argument (`+` is a space; a `%` not followed by two hex digits
/// stays as it is).
pub fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        let hex = |o: usize| {
            s.get(i.saturating_add(o))
                .and_then(|c| (*c as char).to_digit(16))
        };
        match (b, hex(1), hex(2)) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h.saturating_mul(16).saturating_add(l)).unwrap_or(b'?'));
                i = i.saturating_add(3);
            }
            (b'+', _, _) => {
                out.push(b' ');
                i = i.saturating_add(1);
            }
            _ => {
                out.push(b);
                i = i.saturating_add(1);
            }
        }
    }
    out
}

/// Envoy's `/stats` text: `listener.nginx.worker_<i>.downstream_cx_total` for each worker
/// with requests (`workers`: (index, requests)), `tollgate.metrics_overflow`, then every
/// metric as `wasmcustom.<name>` (a histogram as Envoy prints one with no quantiles: its count
/// and sum), keeping the names `filter` matches.
pub fn envoy_stats(
    workers: &[(usize, u64)],
    overflow: u32,
    metrics: &[MetricSnapshot],
    filter: Option<&regex_lite::Regex>,
) -> String {
    let keep = |name: &str| filter.is_none_or(|f| f.is_match(name));
    let mut out = String::new();
    for (i, n) in workers {
        let name = format!("listener.nginx.worker_{i}.downstream_cx_total");
        if *n > 0 && keep(&name) {
            out.push_str(&format!("{name}: {n}\n"));
        }
    }
    let name = "tollgate.metrics_overflow";
    if keep(name) {
        out.push_str(&format!("{name}: {overflow}\n"));
    }
    for m in metrics {
        let name = format!("wasmcustom.{}", m.name);
        if !keep(&name) {
            continue;
        }
        match &m.value {
            Value::Counter(v) => out.push_str(&format!("{name}: {v}\n")),
            Value::Gauge(v) => out.push_str(&format!("{name}: {v}\n")),
            Value::Histogram { counts, sum, .. } => {
                let n: u64 = counts.iter().fold(0u64, |a, c| a.saturating_add(*c));
                out.push_str(&format!("{name}: P0(nan,nan) count={n} sum={sum}\n"));
            }
        }
    }
    out
}

/// The host's own series in the Prometheus text: `tollgate_metrics_overflow_total`, the
/// metric definitions refused because the metrics zone was full (the filters carry on without
/// them; the first refusal in each worker is logged).
pub fn overflow_exposition(overflow: u32) -> String {
    format!(
        "# HELP tollgate_metrics_overflow_total Metric definitions refused because the metrics zone was full.\n\
         # TYPE tollgate_metrics_overflow_total counter\n\
         tollgate_metrics_overflow_total {overflow}\n"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use tollgate_services::metrics_zone::MetricKind;

    fn metric(name: &str, kind: MetricKind, value: Value) -> MetricSnapshot {
        MetricSnapshot {
            id: 0,
            name: name.to_string(),
            kind,
            value,
        }
    }

    #[test]
    fn the_format_and_filter_come_from_the_uri_and_query() {
        let q = query(b"/metrics", b"");
        assert!(!q.envoy && q.filter.is_none());
        assert!(query(b"/gateway/stats", b"").envoy);
        assert!(!query(b"/gateway/statsx", b"").envoy);
        let q = query(b"/metrics", b"x=1&format=envoy&filter=cost%5Ftotal");
        assert!(q.envoy);
        let f = q.filter.unwrap().unwrap();
        assert!(f.is_match("wasmcustom.tollgate_cost_total"));
        assert!(!f.is_match("wasmcustom.tollgate_costXtotal"));
        // An empty filter keeps everything; a bad regex is reported (the handler's 400).
        assert!(query(b"/stats", b"filter=").filter.is_none());
        assert!(query(b"/stats", b"filter=%5Bunclosed")
            .filter
            .unwrap()
            .is_err());
    }

    #[test]
    fn a_hostile_filter_is_refused_or_linear() {
        // regex-lite has no backtracking; a pattern that would compile to a huge program is
        // refused by its size limit instead of costing the worker time or memory.
        let huge = query(b"/stats", b"filter=(((a{100}){100}){100})")
            .filter
            .unwrap();
        assert!(huge.is_err());
        let nested = query(b"/stats", b"filter=(a*)*b").filter.unwrap().unwrap();
        let long = "a".repeat(100_000);
        assert!(!nested.is_match(&long));
    }

    #[test]
    fn unescape_decodes_percent_and_plus_and_keeps_the_rest() {
        assert_eq!(unescape(b"a+b%41%7e"), b"a bA~");
        assert_eq!(unescape(b"%zz%4%"), b"%zz%4%");
        assert_eq!(unescape(b"%00"), b"\0");
        assert_eq!(unescape(b""), b"");
    }

    #[test]
    fn envoy_stats_text() {
        let metrics = [
            metric(
                "tollgate_cost_requests_total.outcome.priced",
                MetricKind::Counter,
                Value::Counter(7),
            ),
            metric("inflight", MetricKind::Gauge, Value::Gauge(-3)),
            metric(
                "latency",
                MetricKind::Histogram,
                Value::Histogram {
                    bounds: vec![1, 10],
                    counts: vec![1, 2, 3],
                    sum: 40,
                },
            ),
        ];
        let text = envoy_stats(&[(0, 5), (1, 0), (2, 9)], 2, &metrics, None);
        assert_eq!(
            text,
            "listener.nginx.worker_0.downstream_cx_total: 5\n\
             listener.nginx.worker_2.downstream_cx_total: 9\n\
             tollgate.metrics_overflow: 2\n\
             wasmcustom.tollgate_cost_requests_total.outcome.priced: 7\n\
             wasmcustom.inflight: -3\n\
             wasmcustom.latency: P0(nan,nan) count=6 sum=40\n"
        );
        let only_cost = regex_lite::Regex::new("cost").unwrap();
        assert_eq!(
            envoy_stats(&[(0, 5)], 2, &metrics, Some(&only_cost)),
            "wasmcustom.tollgate_cost_requests_total.outcome.priced: 7\n"
        );
        assert!(overflow_exposition(3).ends_with("\ntollgate_metrics_overflow_total 3\n"));
    }
}
