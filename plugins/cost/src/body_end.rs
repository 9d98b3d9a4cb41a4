//! When a response body is complete as far as the client can tell, so that spend is booked
//! before the byte that completes it leaves the filter.
//!
//! The hosts signal the end of a body (`end_of_stream`) only once they know it, which can be
//! after its last byte has gone to the client. In nginx, a proxied response with a
//! `Content-Length` sends its bytes as they arrive and passes the last buffer (`last_buf`, the
//! filters' end of stream) only when the upstream request is finalized, in a later call of the
//! body filter: a client that has read `Content-Length` bytes can already send its next request
//! (to another worker) before that call. The filter therefore counts the bytes it passes and
//! treats the body as complete when they reach the announced length (RFC 9110 section 8.6: the
//! body is exactly that many bytes).
//!
//! A body without a valid `Content-Length` (chunked, or close-delimited) ends, for the client,
//! with the host's own end marker (the last chunk), which follows the filter's end-of-stream
//! call in both hosts; streams also end with their own final event (see `sse`).

/// Bytes of a response body seen so far against its `Content-Length`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyEnd {
    /// The announced length (bytes), if the header was a valid one.
    expected: Option<u64>,
    /// Bytes seen (saturating).
    seen: u64,
}

/// A `Content-Length` field value (RFC 9110 section 8.6): decimal digits, optional
/// whitespace around them; a comma-separated list of identical values is one value (section
/// 8.6 allows a recipient to accept it). Anything else: `None` (no length known).
pub fn content_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for part in value.split(|&b| b == b',') {
        let digits = part.trim_ascii();
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u64 = tollgate_common::bytes::utf8(digits).ok()?.parse().ok()?;
        match length {
            Some(m) if m != n => return None,
            _ => length = Some(n),
        }
    }
    length
}

impl BodyEnd {
    /// Tracking for a body whose `Content-Length` header is `header` (`None`: absent).
    pub fn new(header: Option<&[u8]>) -> BodyEnd {
        BodyEnd {
            expected: header.and_then(content_length),
            seen: 0,
        }
    }

    /// Counts `n` more bytes; returns whether the body is now complete (its announced length
    /// reached). Always `false` when no length was announced.
    pub fn feed(&mut self, n: usize) -> bool {
        self.seen = self
            .seen
            .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        self.complete()
    }

    /// Whether the announced length has been reached.
    pub fn complete(&self) -> bool {
        self.expected.is_some_and(|len| self.seen >= len)
    }

    /// Bytes seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_values() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b" 1540 "), Some(1540));
        assert_eq!(content_length(b"42, 42"), Some(42));
        for bad in [
            &b""[..],
            b"-1",
            b"+5",
            b"1e3",
            b"42, 43",
            b"42,",
            b"99999999999999999999",
            b"0x10",
        ] {
            assert_eq!(
                content_length(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn completes_exactly_at_the_announced_length() {
        let mut end = BodyEnd::new(Some(b"10"));
        assert!(!end.feed(4));
        assert!(!end.feed(5));
        assert!(end.feed(1), "the chunk that completes the body");
        let mut none = BodyEnd::new(None);
        assert!(!none.feed(1 << 30));
        let mut bad = BodyEnd::new(Some(b"ten"));
        assert!(!bad.feed(10));
        assert_eq!(bad.seen(), 10);
    }
}
