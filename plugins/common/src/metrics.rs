//! Metric naming shared by the filters.
//!
//! The proxy-wasm metrics ABI (`proxy_define_metric`) carries a name and no labels, so labels are
//! encoded in the name as `<family>.<label>.<value>...` and turned back into Prometheus labels by
//! the host (Envoy: `stats_config.stats_tags` in `envoy/`). Values are reduced to
//! `[a-z0-9_-]` so that they cannot break that encoding.

use std::borrow::Cow;

/// Every label name Tollgate's metric families use. Envoy restores them from the metric names
/// with one `stats_tags` rule each (`plugins/metrics/stats_tags.json`); the nginx host's
/// exposition (`nginx-compat/services`) restores exactly these, so both show the same labels.
pub const LABELS: [&str; 12] = [
    "method",
    "status_class",
    "route",
    "tenant",
    "result",
    "rule",
    "outcome",
    "model",
    "type",
    "reason",
    "on_error",
    "filter",
];

/// `family` followed by `.label.value` for each label, values sanitised.
pub fn metric_name(family: &str, labels: &[(&str, &str)]) -> String {
    let mut name = String::new();
    push_metric_name(&mut name, family, labels);
    name
}

/// [`metric_name`] with the `scope` labels before `labels` (see [`counters!`]).
pub fn scoped_metric_name(family: &str, scope: &[(&str, &str)], labels: &[(&str, &str)]) -> String {
    let all: Vec<(&str, &str)> = scope.iter().chain(labels).copied().collect();
    metric_name(family, &all)
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
        buf.extend(value.chars().map(label_char));
    }
}

/// One character of a label value as [`metric_name`] writes it: `[a-z0-9_-]` kept, ASCII
/// letters lower-cased, any other character (a multi-byte one included) `_`.
pub fn label_char(c: char) -> char {
    match c {
        'a'..='z' | '0'..='9' | '_' | '-' => c,
        'A'..='Z' => c.to_ascii_lowercase(),
        _ => '_',
    }
}

/// Whether the name encoding keeps byte `b` as it is (`[a-z0-9_-]`).
const fn keeps(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')
}

/// [`keeps`] of every byte, by value: one load a byte where the label values are checked.
static CLEAN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0u8;
    loop {
        // `b` is a u8: always within the table's 256 entries.
        #[allow(clippy::indexing_slicing)]
        {
            table[b as usize] = keeps(b);
        }
        if b == u8::MAX {
            break table;
        }
        b = b.wrapping_add(1);
    }
};

/// Whether the name encoding keeps byte `b` as it is.
fn is_clean(b: u8) -> bool {
    CLEAN.get(usize::from(b)).copied().unwrap_or(false)
}

/// A value as the name encoding writes it ([`label_char`]): ASCII
/// letters lower-cased, `[a-z0-9_-]` kept, any other character (a multi-byte one included) `_`.
/// Borrowed, without allocating, when the value is already in that form (the usual case: the
/// other filters' signals and most tenants).
pub fn sanitize(value: &str) -> Cow<'_, str> {
    if value.bytes().all(is_clean) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(sanitize_chars(value))
}

/// The encoding of [`sanitize`] char by char, always allocating: the path for values that are
/// not already clean, and the reference its borrowed fast path is tested against (unit tests,
/// the `metrics_series` fuzz target).
pub fn sanitize_chars(value: &str) -> String {
    value.chars().map(label_char).collect()
}

/// [`sanitize`] of bytes read as UTF-8 with each invalid sequence replaced by U+FFFD (as
/// `String::from_utf8_lossy`), so that each becomes one `_`.
pub fn sanitize_bytes(value: &[u8]) -> Cow<'_, str> {
    match crate::bytes::utf8(value) {
        Ok(text) => sanitize(text),
        // The lossy text holds U+FFFD, never clean: straight to the char-by-char encoding.
        Err(_) => Cow::Owned(sanitize_chars(&String::from_utf8_lossy(value))),
    }
}

/// Declares a filter's counters once, in one list (as Envoy's `ALL_<FILTER>_STATS(COUNTER)`
/// macros do): the struct of metric ids, the function that defines them through
/// `proxy_define_metric`, and [`CounterList`] for the test that the README lists them.
///
/// ```ignore
/// tollgate_common::counters! {
///     /// One rule's counters.
///     pub(crate) struct RuleCounters(rule) {
///         allowed: "tollgate_rate_limit_requests_total" [decision = "allowed"],
///         cas_retries: "tollgate_rate_limit_cas_retries_total",
///     }
///     /// One series per value of an enum: `(Reason::ALL, Reason::as_str)`.
///     per_value {
///         unpriced: "tollgate_cost_unpriced_total" [reason: Reason = Reason::ALL, Reason::label],
///     }
/// }
/// ```
///
/// A plain field is an `Option<u32>` metric id (`None`: the host refused the definition, logged
/// by [`crate::host_calls::define_metric`]); a `per_value` field is a [`PerValue`]. The names in
/// parentheses are scope labels, arguments of `define` put before every counter's own labels:
/// `define(rule)` gives `tollgate_rate_limit_requests_total.rule.<rule>.decision.allowed`.
#[macro_export]
macro_rules! counters {
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident $( ( $($scope:ident),+ ) )? {
            $(
                $(#[$fattr:meta])*
                $field:ident: $family:literal $( [ $($label:ident = $value:literal),+ ] )?
            ),* $(,)?
        }
        $(
            per_value {
                $(
                    $(#[$pattr:meta])*
                    $pfield:ident: $pfamily:literal
                        [ $plabel:ident: $ptype:ty = $pall:expr, $pname:path ]
                ),* $(,)?
            }
        )?
    ) => {
        $(#[$attr])*
        // Built by `define`, which needs the host (the filters' wasm32 build).
        #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
        $vis struct $name {
            $( $(#[$fattr])* pub $field: Option<u32>, )*
            $($( $(#[$pattr])* pub $pfield: $crate::metrics::PerValue<$ptype>, )*)?
        }

        impl $name {
            /// Defines every counter of the list (`proxy_define_metric`, once per root
            /// context), with the scope labels first.
            #[cfg(target_arch = "wasm32")]
            pub fn define($($($scope: &str),+)?) -> Self {
                let scope: &[(&str, &str)] = &[$($( (stringify!($scope), $scope) ),+)?];
                Self {
                    $(
                        $field: $crate::host_calls::define_counter(&$crate::metrics::scoped_metric_name(
                            $family,
                            scope,
                            &[ $($( (stringify!($label), $value) ),+)? ],
                        )),
                    )*
                    $($(
                        $pfield: $crate::metrics::PerValue::new(&$pall, |value| {
                            $crate::host_calls::define_counter(&$crate::metrics::scoped_metric_name(
                                $pfamily,
                                scope,
                                &[(stringify!($plabel), $pname(*value))],
                            ))
                        }),
                    )*)?
                }
            }
        }

        impl $crate::metrics::CounterList for $name {
            const COUNTERS: &'static [(&'static str, &'static [(&'static str, &'static str)])] = &[
                $( ($family, &[ $($( (stringify!($label), $value), )+)? ]), )*
                $($( ($pfamily, &[]), )*)?
            ];

            fn per_value_labels() -> Vec<(&'static str, &'static str, &'static str)> {
                #[allow(unused_mut)]
                let mut out = Vec::new();
                $($(
                    for value in $pall.iter() {
                        out.push(($pfamily, stringify!($plabel), $pname(*value)));
                    }
                )*)?
                out
            }
        }
    };
}

/// Counter ids of one family, one per value of an enum (declared in [`counters!`]'s
/// `per_value`). Looked up by a linear scan of the enum's few values (at most a few dozen).
#[derive(Debug, Clone)]
pub struct PerValue<E> {
    ids: Vec<(E, Option<u32>)>,
}

impl<E: Copy + PartialEq> PerValue<E> {
    /// `define(value)` for each of `all`, in order.
    pub fn new(all: &[E], define: impl Fn(&E) -> Option<u32>) -> Self {
        PerValue {
            ids: all.iter().map(|e| (*e, define(e))).collect(),
        }
    }

    /// The counter of `value` (`None`: not defined).
    pub fn id(&self, value: E) -> Option<u32> {
        self.ids
            .iter()
            .find(|(e, _)| *e == value)
            .and_then(|(_, id)| *id)
    }
}

/// What [`counters!`] declares, for tests: every counter as its family and its static labels,
/// and the values of its `per_value` labels (scope labels are not listed).
pub trait CounterList {
    /// `(family, [(label, value)...])` in declaration order.
    const COUNTERS: &'static [(&'static str, &'static [(&'static str, &'static str)])];

    /// `(family, label, value)` for every value of every `per_value` family.
    fn per_value_labels() -> Vec<(&'static str, &'static str, &'static str)>;

    /// The families and label values that `doc` never mentions, for a test that the README
    /// lists every counter: a family by its name, a static label value by its text, a
    /// `per_value` label value in backquotes (`` `expired` ``), as a list of values reads.
    fn undocumented(doc: &str) -> Vec<String> {
        let mut missing = Vec::new();
        for (family, labels) in Self::COUNTERS {
            if !doc.contains(family) {
                missing.push((*family).to_string());
            }
            for (label, value) in *labels {
                if !doc.contains(value) {
                    missing.push(format!("{family}.{label}.{value}"));
                }
            }
        }
        for (family, label, value) in Self::per_value_labels() {
            if !doc.contains(&format!("`{value}`")) {
                missing.push(format!("{family}.{label}.{value}"));
            }
        }
        missing
    }

    /// The families without a `# HELP` text in [`crate::metric_help::HELP`], for a test that
    /// every counter the list declares has one.
    fn without_help() -> Vec<&'static str> {
        let mut missing: Vec<&'static str> = Self::COUNTERS
            .iter()
            .map(|(family, _)| *family)
            .filter(|family| crate::metric_help::help(family).is_none())
            .collect();
        missing.dedup();
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_agrees_with_the_char_by_char_encoding() {
        let samples = [
            "",
            "ok",
            "per-user",
            "bad_signature",
            "Acme",
            "a.b",
            "a b",
            "caf\u{e9}",
            "\u{1f600}x",
            "x\u{0}y",
            "ALLOWED",
            "--__09az",
            "z{",
            "`a",
            "/",
            ":",
            "@",
            "[",
            "\u{7f}",
        ];
        for s in samples {
            assert_eq!(sanitize(s), sanitize_chars(s), "{s:?}");
        }
        // Every single byte that is a character, and every pair of ASCII bytes.
        for a in 0u8..128 {
            let one = (a as char).to_string();
            assert_eq!(sanitize(&one), sanitize_chars(&one), "{a}");
            for b in 0u8..128 {
                let two: String = [a as char, b as char].iter().collect();
                assert_eq!(sanitize(&two), sanitize_chars(&two), "{a} {b}");
            }
        }
        assert!(matches!(sanitize("per-user_1"), Cow::Borrowed(_)));
        assert!(matches!(sanitize("Per-user"), Cow::Owned(_)));
    }

    #[test]
    fn sanitize_bytes_replaces_each_invalid_sequence_once() {
        for raw in [
            &b"acme"[..],
            b"Acme.Corp",
            b"\xff",
            b"a\xff\xfeb",
            b"caf\xc3\xa9",
            b"x\xc3",
            b"\xe2\x82",
        ] {
            assert_eq!(
                sanitize_bytes(raw),
                sanitize_chars(&String::from_utf8_lossy(raw)),
                "{raw:?}"
            );
        }
        assert!(matches!(sanitize_bytes(b"acme-1"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_table_is_the_predicate() {
        for b in 0..=u8::MAX {
            assert_eq!(is_clean(b), keeps(b), "{b}");
            assert_eq!(
                keeps(b),
                sanitize_chars(&(b as char).to_string()) == (b as char).to_string() && b < 128
            );
        }
    }

    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Why {
        A,
        B,
    }

    fn why_label(w: Why) -> &'static str {
        match w {
            Why::A => "a",
            Why::B => "b",
        }
    }

    crate::counters! {
        /// A list as a filter declares one.
        struct Example(rule) {
            allowed: "x_requests_total" [decision = "allowed"],
            limited: "x_requests_total" [decision = "limited"],
            retries: "x_retries_total",
        }
        per_value {
            unpriced: "x_unpriced_total" [reason: Why = [Why::A, Why::B], why_label],
        }
    }

    #[test]
    fn per_value_ids_follow_the_enum() {
        let ids = PerValue::new(&[Why::A, Why::B], |w| (*w == Why::B).then_some(7));
        assert_eq!(ids.id(Why::A), None);
        assert_eq!(ids.id(Why::B), Some(7));
        assert_eq!(why_label(Why::A), "a");
    }

    #[test]
    fn a_counter_list_is_declared_once_and_checked_against_its_doc() {
        assert_eq!(
            Example::COUNTERS,
            &[
                ("x_requests_total", &[("decision", "allowed")][..]),
                ("x_requests_total", &[("decision", "limited")][..]),
                ("x_retries_total", &[][..]),
                ("x_unpriced_total", &[][..]),
            ]
        );
        assert_eq!(
            Example::per_value_labels(),
            vec![
                ("x_unpriced_total", "reason", "a"),
                ("x_unpriced_total", "reason", "b")
            ]
        );
        let doc = "`x_requests_total.rule.<r>.decision.{allowed,limited}`, `x_retries_total`";
        assert_eq!(
            Example::undocumented(doc),
            vec![
                "x_unpriced_total",
                "x_unpriced_total.reason.a",
                "x_unpriced_total.reason.b"
            ]
        );
        assert_eq!(
            Example::undocumented("x_requests_total x_unpriced_total allowed `a` b"),
            vec![
                "x_requests_total.decision.limited",
                "x_retries_total",
                "x_unpriced_total.reason.b"
            ]
        );
    }

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
