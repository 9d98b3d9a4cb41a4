//! The SSE parser and the streaming usage reader (`tollgate_cost::sse`) on arbitrary streams,
//! fed whole and in chunks cut where the input's first byte says. Properties: no panic; the
//! chunking changes nothing (the same events, payload heads, JSON scans, usage, final-event flag);
//! each event ends right after a line end (or, for a CRLF split between chunks, one byte before
//! the LF that ends up in the next chunk); a stream with usage has ended or still awaits its
//! final event, and one whose usage payload could not be read is never priced.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../chunks.rs"]
mod chunks;
use chunks::chunks;
use tollgate_cost::json_scan::{Captured, ScanError};
use tollgate_cost::sse::{SseParser, StreamUsage};
use tollgate_cost::usage::Usage;

type Seen = (Vec<u8>, bool, Vec<u8>, bool, Result<Captured, ScanError>);

/// What one pass over the stream gives: the events, their end offsets in the stream, and the
/// usage reader's result, final-event flag and poisoned flag.
type Run = (Vec<Seen>, Vec<usize>, Option<Usage>, bool, bool);

fn run(pieces: &[&[u8]]) -> Run {
    let mut parser = SseParser::new(4096);
    let mut usage = StreamUsage::default();
    let (mut seen, mut ends, mut base) = (Vec::new(), Vec::new(), 0usize);
    for piece in pieces {
        parser.feed(piece, &mut |end, e| {
            assert!(end <= piece.len());
            ends.push(base + end);
            usage.on_event(&e);
            seen.push((
                e.kind.to_vec(),
                e.done,
                e.head.to_vec(),
                e.mentions_usage,
                e.json.cloned(),
            ));
        });
        base += piece.len();
    }
    let priced = usage.finish(Some("request-model"));
    (seen, ends, priced, usage.ended(), usage.poisoned())
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let pieces = chunks(stream, seed);
    let whole = run(&[stream]);
    let split = run(&pieces);
    assert_eq!(
        (&whole.0, &whole.2, whole.3, whole.4),
        (&split.0, &split.2, split.3, split.4)
    );
    for (&w, &s) in whole.1.iter().zip(&split.1) {
        assert!(
            w > 0 && matches!(stream[w - 1], b'\n' | b'\r'),
            "an event ends after a line end"
        );
        assert!(
            w == s || (s + 1 == w && stream[s] == b'\n' && stream[s - 1] == b'\r'),
            "{w} vs {s}"
        );
    }
    if whole.4 {
        assert!(whole.2.is_none(), "a poisoned stream is unpriced");
    }
});
