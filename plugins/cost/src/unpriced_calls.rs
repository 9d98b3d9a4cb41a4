//! Requests that start billable LLM work the filter cannot price, recognised by their path (and,
//! for a background response, by the body's `background`: `crate::request`), so that a tenant
//! whose requests must be read is refused them (README, "Calls the filter cannot price").
//!
//! Their work is billed later, outside the response of the request that starts it:
//! - OpenAI Batches: `POST /v1/batches` (API reference, "Create batch");
//! - Anthropic Message Batches: `POST /v1/messages/batches` (API reference, "Create a Message
//!   Batch");
//! - OpenAI Assistants runs: `POST /v1/threads/runs` ("Create thread and run"),
//!   `POST /v1/threads/{thread_id}/runs` ("Create run") and
//!   `POST /v1/threads/{thread_id}/runs/{run_id}/submit_tool_outputs` ("Submit tool outputs to
//!   run": the run goes on, billed);
//! - OpenAI Responses with `"background": true` (`POST /v1/responses`, "background": answered
//!   `queued`, the model runs after the response).
//!
//! Listing, retrieving and cancelling (`GET`, `DELETE`, `POST …/cancel`) start nothing and pass.
//!
//! A path is compared in a normal form, so that a spelling an upstream may route to the same
//! endpoint is not missed (failing closed: a spelling no upstream routes there is at worst
//! refused for such a tenant): the query and fragment cut off, percent-encoded octets decoded
//! once (`%2F` too), ASCII letters lowered, `\` read as `/`, empty and `.` segments dropped, `..`
//! removing the segment before it, and a segment's `;` parameters cut off (RFC 3986 sections
//! 2.1, 3.3 and 5.2.4). The endpoints are matched on the path's last segments, so that a prefix
//! (`/openai/v1/batches`) is covered.

use std::borrow::Cow;

use serde::Deserialize;

/// An endpoint whose call starts billable work the filter cannot price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// OpenAI `…/batches`.
    Batches,
    /// Anthropic `…/messages/batches`.
    MessageBatches,
    /// OpenAI `…/threads/runs` (a thread and its run).
    ThreadRuns,
    /// OpenAI `…/threads/{thread_id}/runs`.
    Runs,
    /// OpenAI `…/threads/{thread_id}/runs/{run_id}/submit_tool_outputs`.
    SubmitToolOutputs,
    /// OpenAI `…/responses` with `"background": true` (found in the body).
    BackgroundResponse,
}

impl Endpoint {
    /// The endpoint in words, for the refusal's message and the log.
    pub fn describe(self) -> &'static str {
        match self {
            Endpoint::Batches => "batches (/v1/batches)",
            Endpoint::MessageBatches => "message batches (/v1/messages/batches)",
            Endpoint::ThreadRuns => "assistants thread runs (/v1/threads/runs)",
            Endpoint::Runs => "assistants runs (/v1/threads/{thread_id}/runs)",
            Endpoint::SubmitToolOutputs => {
                "assistants tool outputs (/v1/threads/{thread_id}/runs/{run_id}/submit_tool_outputs)"
            }
            Endpoint::BackgroundResponse => "background responses (/v1/responses, background: true)",
        }
    }
}

/// What a request path is, for this check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Billable work the filter cannot price, unless the method only reads or cancels
    /// ([`starts_work`]).
    Unpriced(Endpoint),
    /// `…/responses`: unpriced when its body sets `background` (checked with the body).
    Responses,
    /// Anything else.
    Other,
}

/// `unpriced_calls`: what a tenant whose requests must be read gets for such a call.
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnpricedCalls {
    /// Refused before the upstream, 403 `unpriced_endpoint` (default).
    #[default]
    Refuse,
    /// Passed on, counted (fail-open: the budget never sees that work).
    Allow,
}

/// Whether a request with method `method` to an [`Target::Unpriced`] path may start its work:
/// every method but `GET`, `HEAD`, `DELETE` and `OPTIONS` (RFC 9110 section 9.3: the methods
/// that read, remove or describe). Methods are case-sensitive (RFC 9110 section 9.1): `post` is
/// not one of them, so it is taken as starting work.
pub fn starts_work(method: &[u8]) -> bool {
    !matches!(method, b"GET" | b"HEAD" | b"DELETE" | b"OPTIONS")
}

/// Classifies a request target (`:path`, with its query): see the module documentation. An
/// encoded `/` (`%2F`, or `%5C` for `\`) is read both ways, as a separator and as a character of
/// its segment (servers differ), and the target is unpriced when either reading is.
pub fn classify(target: &[u8]) -> Target {
    let path = target
        .get(..memchr::memchr2(b'?', b'#', target).unwrap_or(target.len()))
        .unwrap_or_default();
    if is_own_normal_form(path) {
        // Its own normal form, read the same both ways (no `%`), every segment kept as it is
        // (no `.` or `;`): the usual API path, in one pass over its bytes and one back over its
        // last segment.
        return if ends_in_an_endpoint_name(path) {
            classify_segments(path)
        } else {
            Target::Other
        };
    }
    match classify_normal(&normal_form(target, true)) {
        // The second reading differs from the first only where a `/` or `\` is encoded.
        Target::Other if encodes_a_separator(target) => {
            classify_normal(&normal_form(target, false))
        }
        found => found,
    }
}

/// Whether a path (no query or fragment) has none of the bytes [`normal_form`] changes (`%`,
/// `\`, capital letters) or [`segments`] looks at beyond `/` (`.`, `;`). Every byte is looked
/// at, with no branch (the compiler makes it 16 bytes a step with SIMD).
fn is_own_normal_form(path: &[u8]) -> bool {
    !path.iter().fold(false, |found, &b| {
        found | matches!(b, b'%' | b'\\' | b'A'..=b'Z' | b'.' | b';')
    })
}

/// Whether `target` holds `%2F` or `%5C` (either case): the octets that [`normal_form`]
/// decodes or keeps depending on `decode_slash`.
fn encodes_a_separator(target: &[u8]) -> bool {
    let mut rest = target;
    while let Some(at) = rest.iter().position(|&b| b == b'%') {
        let tail = rest.get(at..).unwrap_or_default();
        if matches!(
            tail,
            [_, b'2', b'f' | b'F', ..] | [_, b'5', b'c' | b'C', ..]
        ) {
            return true;
        }
        rest = tail.get(1..).unwrap_or_default();
    }
    false
}

fn classify_normal(normal: &[u8]) -> Target {
    // Without `.` or `;` every non-empty segment is kept as it is, so the last one is the path's
    // last non-empty run: most paths (`/v1/chat/completions`) end in none of the endpoints'
    // names and need no list of segments.
    if !normal.contains(&b'.') && !normal.contains(&b';') && !ends_in_an_endpoint_name(normal) {
        return Target::Other;
    }
    classify_segments(normal)
}

/// Whether the last non-empty run between `/`s of `path` is an endpoint's last segment
/// (`classify_segments`' list).
fn ends_in_an_endpoint_name(path: &[u8]) -> bool {
    let last = path.rsplit(|&b| b == b'/').find(|s| !s.is_empty());
    matches!(
        last,
        Some(b"batches" | b"runs" | b"responses" | b"submit_tool_outputs")
    )
}

/// [`classify_normal`] from the path's list of segments. Every endpoint's last segment here is
/// also in `classify_normal`'s rejection list: a new endpoint goes into both, and its segments
/// into the pieces of `the_last_segment_rejects_only_what_the_segments_reject`, which then
/// compares the two.
fn classify_segments(normal: &[u8]) -> Target {
    let segments = segments(normal);
    let last = |n: usize| -> Option<&[u8]> {
        segments
            .len()
            .checked_sub(n)
            .and_then(|at| segments.get(at))
            .copied()
    };
    match (last(1), last(2)) {
        (Some(b"batches"), Some(b"messages")) => return Target::Unpriced(Endpoint::MessageBatches),
        (Some(b"batches"), _) => return Target::Unpriced(Endpoint::Batches),
        (Some(b"runs"), Some(b"threads")) => return Target::Unpriced(Endpoint::ThreadRuns),
        (Some(b"responses"), _) => return Target::Responses,
        _ => {}
    }
    if last(1) == Some(b"runs") && last(3) == Some(b"threads") {
        return Target::Unpriced(Endpoint::Runs);
    }
    if last(1) == Some(b"submit_tool_outputs")
        && last(3) == Some(b"runs")
        && last(5) == Some(b"threads")
    {
        return Target::Unpriced(Endpoint::SubmitToolOutputs);
    }
    Target::Other
}

/// The path of `target` without its query and fragment, percent-decoded once (an encoded `/` or
/// `\` only when `decode_slash`), ASCII letters lowered, `\` turned to `/`. Borrowed when
/// that changes nothing (no `%`, `\` or capital letter: the usual API path).
fn normal_form(target: &[u8], decode_slash: bool) -> Cow<'_, [u8]> {
    // One pass: where the path ends, and whether it holds a byte the normal form changes.
    let mut end = target.len();
    let mut plain = true;
    for (at, &b) in target.iter().enumerate() {
        match b {
            b'?' | b'#' => {
                end = at;
                break;
            }
            b'%' | b'\\' | b'A'..=b'Z' => plain = false,
            _ => {}
        }
    }
    let path = target.get(..end).unwrap_or_default();
    if plain {
        return Cow::Borrowed(path);
    }
    Cow::Owned(decoded(path, decode_slash))
}

/// [`normal_form`] of a path (no query or fragment), built byte by byte.
fn decoded(path: &[u8], decode_slash: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut rest = path;
    while let [first, tail @ ..] = rest {
        let encoded = match rest {
            [b'%', hi, lo, after @ ..] => hex(*hi)
                .zip(hex(*lo))
                .map(|(hi, lo)| (hi << 4 | lo, after))
                .filter(|&(d, _)| decode_slash || (d != b'/' && d != b'\\')),
            _ => None,
        };
        let (byte, after) = encoded.unwrap_or((*first, tail));
        rest = after;
        out.push(match byte {
            b'\\' => b'/',
            other => other.to_ascii_lowercase(),
        });
    }
    out
}

/// The value of a hexadecimal digit.
fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// The segments of a normal-form path: empty and `.` ones dropped, `..` removing the one before,
/// `;` parameters cut off.
fn segments(path: &[u8]) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = Vec::new();
    for segment in path.split(|&b| b == b'/') {
        let segment = segment.split(|&b| b == b';').next().unwrap_or_default();
        match segment {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpriced(path: &str) -> Option<Endpoint> {
        match classify(path.as_bytes()) {
            Target::Unpriced(e) => Some(e),
            _ => None,
        }
    }

    #[test]
    fn the_providers_paths() {
        use Endpoint::*;
        assert_eq!(unpriced("/v1/batches"), Some(Batches));
        assert_eq!(unpriced("/v1/messages/batches"), Some(MessageBatches));
        assert_eq!(unpriced("/v1/threads/runs"), Some(ThreadRuns));
        assert_eq!(unpriced("/v1/threads/thread_abc123/runs"), Some(Runs));
        assert_eq!(
            unpriced("/v1/threads/thread_abc/runs/run_abc/submit_tool_outputs"),
            Some(SubmitToolOutputs)
        );
        // Behind a prefix (Azure OpenAI: /openai/batches), with a query.
        assert_eq!(
            unpriced("/openai/batches?api-version=2024-10-21"),
            Some(Batches)
        );
        assert_eq!(classify(b"/v1/responses"), Target::Responses);
        assert_eq!(classify(b"/v1/responses?x=1"), Target::Responses);
    }

    #[test]
    fn reading_cancelling_and_other_calls_are_not_unpriced() {
        for path in [
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/embeddings",
            "/v1/batches/batch_abc",
            "/v1/batches/batch_abc/cancel",
            "/v1/messages/batches/msgbatch_abc/cancel",
            "/v1/messages/batches/msgbatch_abc/results",
            "/v1/threads",
            "/v1/threads/thread_abc",
            "/v1/threads/thread_abc/messages",
            "/v1/threads/thread_abc/runs/run_abc",
            "/v1/threads/thread_abc/runs/run_abc/cancel",
            "/v1/responses/resp_abc",
            "/v1/responses/resp_abc/cancel",
            "/v1/files",
            "/",
            "",
            "?/v1/batches",
        ] {
            assert_eq!(classify(path.as_bytes()), Target::Other, "{path}");
        }
        assert!(starts_work(b"POST"));
        assert!(starts_work(b"PUT"));
        assert!(starts_work(b"post"));
        for method in ["GET", "HEAD", "DELETE", "OPTIONS"] {
            assert!(!starts_work(method.as_bytes()), "{method}");
        }
    }

    /// Spellings an upstream may route to the same endpoint (servers that merge slashes, drop a
    /// trailing one, decode before routing, match without case, read `\` as `/`, resolve dot
    /// segments or strip `;` parameters).
    #[test]
    fn hostile_spellings_are_recognised() {
        for path in [
            "/v1//batches",
            "//v1/batches",
            "/v1/batches/",
            "/v1/batches//",
            "/v1/%62atches",
            "/v1/%62ATCHES",
            "/v1%2Fbatches",
            "/v1%2fbatches",
            "/V1/Batches",
            "/v1/BATCHES?limit=1",
            "/v1/batches#x",
            "/v1\\batches",
            "/v1/./batches",
            "/v1/x/../batches",
            "/v1/batches;v=1",
            "/v1/batches/.",
        ] {
            assert_eq!(unpriced(path), Some(Endpoint::Batches), "{path}");
        }
        assert_eq!(
            unpriced("/v1/Messages//Batches/"),
            Some(Endpoint::MessageBatches)
        );
        // Read both ways: a thread id with an encoded slash, or two segments.
        assert_eq!(unpriced("/v1/threads/t%2Fx/runs"), Some(Endpoint::Runs));
        assert_eq!(unpriced("/v1/threads%2Fruns"), Some(Endpoint::ThreadRuns));
        assert_eq!(unpriced("/v1/THREADS/t1/RUNS/"), Some(Endpoint::Runs));
        assert_eq!(classify(b"/v1/Responses/"), Target::Responses);
        assert_eq!(classify(b"/v1/respons%65s"), Target::Responses);
        // Not a batch: the last segment is something else, or an encoding that is not one.
        assert_eq!(unpriced("/v1/batches/x"), None);
        assert_eq!(unpriced("/v1/batches%"), None);
        assert_eq!(unpriced("/v1/batches%zz"), None);
        assert_eq!(unpriced("/v1/batches/.."), None);
        assert_eq!(unpriced("/v1/batche"), None);
    }

    /// The borrowed path [`normal_form`] returns when nothing needs changing is what decoding
    /// it byte by byte gives, on every target of the pieces below.
    #[test]
    fn the_borrowed_normal_form_is_the_decoded_one() {
        let pieces = [
            "/v1",
            "/Chat",
            "%2f",
            "%41",
            "\\x",
            "/completions",
            "?Q=%2F",
            "#F",
            "/a.b",
        ];
        let mut borrowed = 0;
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let target = format!("{a}{b}{c}");
                    let path = target.split(['?', '#']).next().unwrap_or_default();
                    for slash in [true, false] {
                        let fast = normal_form(target.as_bytes(), slash);
                        assert_eq!(*fast, decoded(path.as_bytes(), slash), "{target}");
                        borrowed += usize::from(matches!(fast, Cow::Borrowed(_)));
                    }
                }
            }
        }
        assert!(borrowed > 100, "{borrowed}");
    }

    /// Calls `check` with every concatenation of four of `pieces` (repeats allowed).
    fn each_of_four(pieces: &[&str], mut check: impl FnMut(String)) {
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    for d in pieces {
                        check(format!("{a}{b}{c}{d}"));
                    }
                }
            }
        }
    }

    /// The rejection on the last segment never changes a result: every normal form built from
    /// these pieces is classified as its list of segments classifies it.
    #[test]
    fn the_last_segment_rejects_only_what_the_segments_reject() {
        let pieces = [
            "/v1",
            "/",
            "/batches",
            "/runs",
            "/threads",
            "/messages",
            "/responses",
            "/.",
            "/..",
            ";p",
            "/submit_tool_outputs",
            "/x",
            "batches",
            ".",
        ];
        let mut rejected = 0;
        each_of_four(&pieces, |path| {
            let fast = classify_normal(path.as_bytes());
            assert_eq!(fast, classify_segments(path.as_bytes()), "{path}");
            rejected += usize::from(fast == Target::Other);
        });
        assert!(rejected > 1000, "{rejected}");
    }

    /// `classify` reads a target a second time only when it encodes a separator, and a target
    /// that is its own normal form (`is_own_normal_form`) by its last segment alone: every target built
    /// from these pieces is classified as reading its normal form both ways always would.
    #[test]
    fn one_reading_suffices_without_an_encoded_separator() {
        let both = |t: &[u8]| match classify_normal(&normal_form(t, true)) {
            Target::Other => classify_normal(&normal_form(t, false)),
            found => found,
        };
        let pieces = [
            "/v1",
            "/threads",
            "/t%2fx",
            "/t%5Cx",
            "%2F",
            "%5c",
            "/runs",
            "/batches",
            "%25",
            "/messages",
            "/x",
            "/..",
            "%2e",
            "/submit_tool_outputs",
            "/responses",
            "?a=%2f",
            "/Batches",
            ";p",
            "/.",
            "#f",
        ];
        let mut checked = 0;
        each_of_four(&pieces, |target| {
            assert_eq!(
                classify(target.as_bytes()),
                both(target.as_bytes()),
                "{target}"
            );
            checked += 1;
        });
        assert_eq!(checked, pieces.len().pow(4));
        assert_eq!(unpriced("/v1/threads/t%5cx/runs"), Some(Endpoint::Runs));
    }
}
