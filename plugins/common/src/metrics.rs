//! Metric naming shared by the filters.
//!
//! The proxy-wasm metrics ABI (`proxy_define_metric`) carries a name and no labels, so labels are
//! encoded in the name as `<family>.<label>.<value>...` and turned back into Prometheus labels by
//! the host (Envoy: `stats_config.stats_tags` in `envoy/`). Values are reduced to
//! `[a-z0-9_-]` so that they cannot break that encoding.

/// Every label name Tollgate's metric families use. Envoy restores them from the metric names
/// with one `stats_tags` rule each (`plugins/metrics/stats_tags.json`); the nginx host's
/// exposition (`nginx-compat/services`) restores exactly these, so both show the same labels.
pub const LABELS: [&str; 11] = [
    "method",
    "status_class",
    "route",
    "tenant",
    "result",
    "rule",
    "decision",
    "model",
    "type",
    "status",
    "reason",
];

/// `family` followed by `.label.value` for each label, values sanitised.
pub fn metric_name(family: &str, labels: &[(&str, &str)]) -> String {
    let mut name = String::new();
    push_metric_name(&mut name, family, labels);
    name
}

/// [`metric_name`] written into `buf` (cleared first), so that a caller can reuse one buffer and
/// look names up without allocating.
pub fn push_metric_name(buf: &mut String, family: &str, labels: &[(&str, &str)]) {
    buf.clear();
    buf.push_str(family);
    for (label, value) in labels {
        buf.push('.');
        buf.push_str(label);
        buf.push('.');
        buf.extend(value.chars().map(|c| match c {
            'a'..='z' | '0'..='9' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_labels_in_the_name() {
        assert_eq!(
            metric_name(
                "tollgate_jwt_auth_requests_total",
                &[("result", "Expired.Token")]
            ),
            "tollgate_jwt_auth_requests_total.result.expired_token"
        );
        assert_eq!(metric_name("x", &[]), "x");
        let mut buf = String::from("stale");
        push_metric_name(&mut buf, "f", &[("a", "B c")]);
        assert_eq!(buf, "f.a.b_c");
    }
}
