//! Prometheus text exposition format 0.0.4 of proxy-wasm metrics whose names carry their labels
//! (`family.label.value.label.value`, `tollgate_common::metrics::metric_name`), rendered as
//! Envoy renders them with Tollgate's `stats_tags` rules (`envoy/metrics.yaml`,
//! `plugins/metrics/stats_tags.json`): `family{label="value",...}`.
//!
//! Splitting a name: the first `.`-separated segment starts the family; the rest is read as
//! `label.value` pairs from the left. A pair becomes a label when the label name is a valid
//! Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__`-prefixed, not `le` on histograms),
//! allowed by the [`LabelPolicy`], not already taken by an earlier pair, and the value is not
//! empty; otherwise (and for an odd last segment) it stays in the family name, as a pair Envoy's
//! rules do not match stays in the stat name. The family name is then sanitised like Envoy's
//! `/stats/prometheus` does: every character outside `[a-zA-Z0-9_:]` becomes `_`, and a leading
//! digit gets a `_` prefix. Labels keep the order they have in the name (the filters encode
//! them in the order of the `stats_tags` rules, the order Envoy prints).
//!
//! Output: families sorted by name, each with a `# HELP` line (the text of
//! `tollgate_common::metric_help::HELP`; a family not in it, another filter's, gets
//! `proxy-wasm metric <family>.`: the ABI carries no description, and Envoy's
//! `/stats/prometheus` writes no `# HELP` at all) and a `# TYPE` line, the series of a family
//! sorted by their label text.
//!
//! Base units: a histogram family whose name ends in `_microseconds` is written in seconds, the
//! unit Prometheus' naming conventions ask for (<https://prometheus.io/docs/practices/naming/>):
//! named `<base>_seconds`, its bounds and sum divided by 10^6 and written as exact decimals
//! (`le="0.0025"`). The ABI records integers (`proxy_record_metric` takes a `u64`), so the
//! filters record durations in microseconds and name them so; Envoy cannot rescale them (it
//! defines every Wasm histogram with `Unit::Unspecified`), which is why its exposition keeps
//! the `_microseconds` name (plugins/metrics/README.md, "Seconds"). Counters are printed as defined (the filters'
//! counter families already end in `_total`), gauges as signed integers, histograms as
//! cumulative `_bucket{...,le="B"}` lines (bounds as integers, then `le="+Inf"`), `_sum` and
//! `_count`. A series whose family already has another type, or whose family and labels equal an
//! earlier series' (two raw names that sanitise to the same), is left out: the first one (in
//! definition order) wins, so the output always parses.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Which `label.value` pairs of a name become labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelPolicy {
    /// Any valid label name.
    AnyValid,
    /// Only these label names (like Envoy, which extracts only the names of its `stats_tags`).
    Only(Vec<String>),
}

impl LabelPolicy {
    /// The label names of Tollgate's `stats_tags` rules (`tollgate_common::metrics::LABELS`),
    /// so nginx gives exactly Envoy's labels.
    pub fn tollgate() -> LabelPolicy {
        LabelPolicy::Only(
            tollgate_common::metrics::LABELS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    }

    fn allows(&self, label: &str) -> bool {
        match self {
            LabelPolicy::AnyValid => true,
            LabelPolicy::Only(names) => names.iter().any(|n| n == label),
        }
    }
}

/// A metric's value at one instant, summed over the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Counter total.
    Counter(u64),
    /// Gauge value (two's complement of the ABI's `u64`).
    Gauge(i64),
    /// Histogram: upper bounds (inclusive, ascending), per-bucket counts (not cumulative;
    /// `counts.len() == bounds.len() + 1`, the last one above every bound), sum of the values.
    Histogram {
        /// Bucket upper bounds.
        bounds: Vec<u64>,
        /// Observations per bucket, the last for `+Inf`.
        counts: Vec<u64>,
        /// Sum of the observed values.
        sum: u64,
    },
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Counter(_) => "counter",
            Value::Gauge(_) => "gauge",
            Value::Histogram { .. } => "histogram",
        }
    }
}

/// One metric: its raw (encoded) name and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Name as defined through `proxy_define_metric`.
    pub name: String,
    /// Value.
    pub value: Value,
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    !s.starts_with("__") && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A Prometheus metric name from any string (Envoy's sanitisation, see the module docs).
pub fn sanitize_metric_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len().saturating_add(1));
    if s.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(s.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            c
        } else {
            '_'
        }
    }));
    out
}

fn escape_label_value(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Splits an encoded name into the (sanitised) family and its labels (module docs).
pub fn split_name(
    name: &str,
    policy: &LabelPolicy,
    histogram: bool,
) -> (String, Vec<(String, String)>) {
    let mut segments = name.split('.');
    let mut family = segments.next().unwrap_or_default().to_string();
    let mut labels: Vec<(String, String)> = Vec::new();
    while let Some(label) = segments.next() {
        let Some(value) = segments.next() else {
            family.push('.');
            family.push_str(label);
            break;
        };
        let ok = valid_label_name(label)
            && policy.allows(label)
            && !value.is_empty()
            && !(histogram && label == "le")
            && !labels.iter().any(|(l, _)| l == label);
        if ok {
            labels.push((label.to_string(), value.to_string()));
        } else {
            family.push('.');
            family.push_str(label);
            family.push('.');
            family.push_str(value);
        }
    }
    (sanitize_metric_name(&family), labels)
}

fn label_text(labels: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (l, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(l);
        out.push_str("=\"");
        escape_label_value(v, &mut out);
        out.push('"');
    }
    out
}

fn braces(labels: &str, extra: Option<&str>) -> String {
    match (labels.is_empty(), extra) {
        (true, None) => String::new(),
        (true, Some(e)) => format!("{{{e}}}"),
        (false, None) => format!("{{{labels}}}"),
        (false, Some(e)) => format!("{{{labels},{e}}}"),
    }
}

/// The suffix of a histogram recorded in microseconds (module docs, "Base units").
const MICROSECONDS: &str = "_microseconds";

/// `micros` microseconds as an exact decimal number of seconds: `2500` -> `0.0025`,
/// `3_000_000` -> `3`.
pub fn micros_as_seconds(micros: u64) -> String {
    let whole = micros / 1_000_000;
    let frac = micros % 1_000_000;
    if frac == 0 {
        return whole.to_string();
    }
    let text = format!("{whole}.{frac:06}");
    text.trim_end_matches('0').to_string()
}

/// Renders `series` (in definition order) as Prometheus text format 0.0.4 (module docs).
pub fn render(series: &[Series], policy: &LabelPolicy) -> String {
    struct Family<'a> {
        type_name: &'static str,
        /// Recorded in microseconds, written in seconds (module docs).
        micros: bool,
        series: BTreeMap<String, &'a Value>,
    }
    let mut families: BTreeMap<String, Family<'_>> = BTreeMap::new();
    for s in series {
        let histogram = matches!(s.value, Value::Histogram { .. });
        let (family, labels) = split_name(&s.name, policy, histogram);
        let (family, micros) = match family.strip_suffix(MICROSECONDS) {
            Some(base) if histogram => (format!("{base}_seconds"), true),
            _ => (family, false),
        };
        let entry = families.entry(family).or_insert_with(|| Family {
            type_name: s.value.type_name(),
            micros,
            series: BTreeMap::new(),
        });
        if entry.type_name != s.value.type_name() || entry.micros != micros {
            continue;
        }
        entry.series.entry(label_text(&labels)).or_insert(&s.value);
    }
    let mut out = String::new();
    for (name, family) in &families {
        match tollgate_common::metric_help::help(name) {
            Some(text) => {
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            None => {
                let _ = writeln!(out, "# HELP {name} proxy-wasm metric {name}.");
            }
        }
        let _ = writeln!(out, "# TYPE {name} {}", family.type_name);
        for (labels, value) in &family.series {
            match value {
                Value::Counter(v) => {
                    let _ = writeln!(out, "{name}{} {v}", braces(labels, None));
                }
                Value::Gauge(v) => {
                    let _ = writeln!(out, "{name}{} {v}", braces(labels, None));
                }
                Value::Histogram {
                    bounds,
                    counts,
                    sum,
                } => {
                    let scaled = |v: u64| {
                        if family.micros {
                            micros_as_seconds(v)
                        } else {
                            v.to_string()
                        }
                    };
                    let mut cumulative = 0u64;
                    for (i, bound) in bounds.iter().enumerate() {
                        cumulative = cumulative.wrapping_add(counts.get(i).copied().unwrap_or(0));
                        let le = format!("le=\"{}\"", scaled(*bound));
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {cumulative}",
                            braces(labels, Some(&le))
                        );
                    }
                    let total = counts.iter().fold(0u64, |a, c| a.wrapping_add(*c));
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {total}",
                        braces(labels, Some("le=\"+Inf\""))
                    );
                    let sum = scaled(*sum);
                    let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels, None));
                    let _ = writeln!(out, "{name}_count{} {total}", braces(labels, None));
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn splits_names_like_envoy_stats_tags() {
        let p = LabelPolicy::tollgate();
        assert_eq!(
            split_name(
                "tollgate_requests_total.method.get.status_class.2xx.route.chat.tenant.acme",
                &p,
                false
            ),
            (
                "tollgate_requests_total".to_string(),
                vec![
                    ("method".into(), "get".into()),
                    ("status_class".into(), "2xx".into()),
                    ("route".into(), "chat".into()),
                    ("tenant".into(), "acme".into())
                ]
            )
        );
        // A value equal to a label name does not confuse the pairing.
        assert_eq!(
            split_name(
                "tollgate_requests_total.route.tenant.tenant.route",
                &p,
                false
            )
            .1,
            vec![
                ("route".into(), "tenant".into()),
                ("tenant".into(), "route".into())
            ]
        );
        // Unknown labels stay in the name; known ones after them are still extracted.
        assert_eq!(
            split_name("tollgate_x.shard.a1.rule.r", &p, false),
            (
                "tollgate_x_shard_a1".to_string(),
                vec![("rule".into(), "r".into())]
            )
        );
        // Odd trailing segment, empty value, names that need sanitising.
        assert_eq!(
            split_name("a.b.c.route", &p, false),
            ("a_b_c_route".to_string(), vec![])
        );
        assert_eq!(
            split_name("9lives.route.", &LabelPolicy::AnyValid, false),
            ("_9lives_route_".to_string(), vec![])
        );
        assert_eq!(
            split_name("h.le.5.x.y", &LabelPolicy::AnyValid, true),
            ("h_le_5".to_string(), vec![("x".into(), "y".into())])
        );
        assert_eq!(sanitize_metric_name(""), "_");
    }

    #[test]
    fn microsecond_histograms_are_written_in_seconds() {
        for (us, text) in [
            (0, "0"),
            (1, "0.000001"),
            (2_500, "0.0025"),
            (1_000_000, "1"),
            (10_000_000, "10"),
            (20_031_999, "20.031999"),
            (u64::MAX, "18446744073709.551615"),
        ] {
            assert_eq!(micros_as_seconds(us), text);
        }
        let s = [
            Series {
                name: "tollgate_request_duration_microseconds.route.chat".into(),
                value: Value::Histogram {
                    bounds: vec![2_500, 1_000_000],
                    counts: vec![1, 1, 1],
                    sum: 3_002_000,
                },
            },
            // Only histograms: a counter keeps its name.
            Series {
                name: "x_microseconds".into(),
                value: Value::Counter(5),
            },
        ];
        let text = render(&s, &LabelPolicy::tollgate());
        assert_eq!(
            text,
            "# HELP tollgate_request_duration_seconds Time from the request headers to the end of \
             the stream, in seconds.\n\
             # TYPE tollgate_request_duration_seconds histogram\n\
             tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"0.0025\"} 1\n\
             tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"1\"} 2\n\
             tollgate_request_duration_seconds_bucket{route=\"chat\",le=\"+Inf\"} 3\n\
             tollgate_request_duration_seconds_sum{route=\"chat\"} 3.002\n\
             tollgate_request_duration_seconds_count{route=\"chat\"} 3\n\
             # HELP x_microseconds proxy-wasm metric x_microseconds.\n\
             # TYPE x_microseconds counter\n\
             x_microseconds 5\n"
        );
    }

    #[test]
    fn escapes_label_values() {
        let s = [Series {
            name: "f.k.a\"b\\c\nd".into(),
            value: Value::Gauge(-3),
        }];
        assert_eq!(
            render(&s, &LabelPolicy::AnyValid),
            "# HELP f proxy-wasm metric f.\n# TYPE f gauge\nf{k=\"a\\\"b\\\\c\\nd\"} -3\n"
        );
    }

    #[test]
    fn conflicting_types_and_duplicates_keep_the_first() {
        let s = [
            Series {
                name: "f.k.v".into(),
                value: Value::Counter(1),
            },
            Series {
                name: "f.k.w".into(),
                value: Value::Gauge(2),
            },
            Series {
                name: "f.k.v".into(),
                value: Value::Counter(3),
            },
        ];
        assert_eq!(
            render(&s, &LabelPolicy::AnyValid),
            "# HELP f proxy-wasm metric f.\n# TYPE f counter\nf{k=\"v\"} 1\n"
        );
    }
}
