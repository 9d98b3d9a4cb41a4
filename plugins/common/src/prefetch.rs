//! Several values of the running callback (request or response headers, properties, the clock)
//! read in one host call where the host offers it, else one plain call each, only as they are
//! asked for.
//!
//! Tollgate's nginx host answers the foreign function [`GET_VALUES`]
//! (`proxy_call_foreign_function("tollgate.get_values", ...)`, nginx-compat/host's
//! `abi/foreign_functions.rs`) with every value of a list, each the one
//! `proxy_get_header_map_value` or `proxy_get_property` gives in the same place. A callback that
//! reads five values then makes one host call instead of five, and the host one trip into the
//! guest's allocator instead of five. The host lists the function in its property
//! [`FOREIGN_FUNCTIONS`], which a VM reads once, before its first call ([`HostReader`]): Kong's
//! ngx_wasm_module traps a filter that calls a foreign function it does not know, Envoy answers
//! `NotFound`. Where the property is absent every value is read with its plain call, only when
//! [`Prefetched`] is asked for it, so on those hosts a filter makes the calls it made before
//! (and one property read per VM).
//!
//! Encoding ([`encode`], [`decode`]): the argument holds the reads back to back, each
//! `kind: u8` (0 property, 1 header, 2 the clock), `map: u8` (a header's `proxy_map_type_t`,
//! else 0), `len: u32` little-endian and the path or name (none for the clock); the answer
//! holds, for each read in order, `len: u32` little-endian and the value, or `u32::MAX` alone
//! for none. A host error on one
//! value reads as none, as the plain calls' wrappers read it (`crate::host_calls`).

use std::borrow::Cow;

use crate::bytes::same_bytes;
use crate::clock::UnixNanos;
use crate::identity::{IdentitySource, IdentityView};

/// The foreign function's name.
pub const GET_VALUES: &str = "tollgate.get_values";
/// The property (path in the ABI's encoding) in which a host lists the foreign functions it
/// answers, comma-separated. A filter reads it before calling one: Kong's ngx_wasm_module traps
/// a filter that calls a name it does not know, Envoy answers `NotFound`.
pub const FOREIGN_FUNCTIONS: &[u8] = b"tollgate\0foreign_functions";
/// Most reads the host answers in one call.
pub const MAX_READS: usize = 32;
/// The answer's length for a read without a value.
const ABSENT: u32 = u32::MAX;

/// One value to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read<'a> {
    /// A request header, by name (any case).
    RequestHeader(&'a str),
    /// A response header, by name (any case).
    ResponseHeader(&'a str),
    /// A property, by its path in the ABI's encoding (segments joined by NUL; a one-segment
    /// path, such as a signal's name, is its own bytes).
    Property(&'a [u8]),
    /// The host's wall clock: Unix nanoseconds, 8 bytes little-endian, as
    /// `proxy_get_current_time_nanoseconds` gives it (read with the other values, or when asked
    /// for on a host without [`GET_VALUES`]); [`Prefetched::clock`] decodes it.
    Clock,
}

impl Read<'_> {
    /// Whether `self` and `other` read the same value (`==`, word by word: the names are the
    /// filters' own and their configuration's).
    fn same(&self, other: &Read<'_>) -> bool {
        let same_kind = matches!(
            (self, other),
            (Read::Property(_), Read::Property(_))
                | (Read::RequestHeader(_), Read::RequestHeader(_))
                | (Read::ResponseHeader(_), Read::ResponseHeader(_))
                | (Read::Clock, Read::Clock)
        );
        same_kind && same_bytes(self.key(), other.key())
    }

    /// The property's path or the header's name.
    fn key(&self) -> &[u8] {
        match self {
            Read::Property(path) => path,
            Read::RequestHeader(name) | Read::ResponseHeader(name) => name.as_bytes(),
            Read::Clock => &[],
        }
    }

    /// What `source` reads first ([`IdentitySource::read`]): its verified property, or its
    /// header (a credential's header is read whole, by its own call).
    pub fn of_identity(source: &IdentitySource) -> Read<'_> {
        match source {
            IdentitySource::Verified { property, .. } => Read::Property(property.as_bytes()),
            IdentitySource::Unverified { header } | IdentitySource::Credential { header } => {
                Read::RequestHeader(header)
            }
        }
    }
}

/// Where values come from: the host (`HostReader`), or a test's table.
pub trait Reader {
    /// Whether [`Reader::get_values`] is worth asking (false once the host said it does not
    /// offer it).
    fn offered(&self) -> bool {
        true
    }
    /// The answer of [`GET_VALUES`] to `argument`; `None` when the host does not offer it or
    /// refuses the call.
    fn get_values(&self, argument: &[u8]) -> Option<Vec<u8>>;
    /// One value by its plain call (`None` when absent or on a host error).
    fn read(&self, read: Read<'_>) -> Option<Vec<u8>>;
    /// Every value of request header `name` and of its CGI spellings
    /// ([`IdentityView::header_values`]).
    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>>;
    /// The clock by its plain call (Unix nanoseconds; `None` on a host error). By default the
    /// [`Read::Clock`] read decoded; a host answers it without allocating.
    fn clock_nanos(&self) -> Option<u64> {
        let bytes = self.read(Read::Clock)?;
        Some(u64::from_le_bytes(
            <[u8; 8]>::try_from(bytes.as_slice()).ok()?,
        ))
    }
}

/// Writes `reads` as [`GET_VALUES`]' argument into `out` (cleared first); false when there are
/// more than [`MAX_READS`] or a name longer than `u32::MAX` bytes.
pub fn encode(reads: &[Read<'_>], out: &mut Vec<u8>) -> bool {
    out.clear();
    if reads.len() > MAX_READS {
        return false;
    }
    out.reserve(reads.iter().map(|r| r.key().len().saturating_add(6)).sum());
    for read in reads {
        let (kind, map) = match read {
            Read::Property(_) => (0u8, 0u8),
            // proxy_map_type_t: 0 request headers, 2 response headers.
            Read::RequestHeader(_) => (1u8, 0u8),
            Read::ResponseHeader(_) => (1u8, 2u8),
            Read::Clock => (2u8, 0u8),
        };
        let key = read.key();
        let Ok(len) = u32::try_from(key.len()) else {
            return false;
        };
        out.extend_from_slice(&[kind, map]);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(key);
    }
    true
}

/// Where each of `N` values lies in an answer: `(start, end)`, or `None` when absent.
pub type Spans<const N: usize> = [Option<(usize, usize)>; N];

/// The spans of an answer to `N` reads; `None` when it does not hold exactly `N` entries.
pub fn decode<const N: usize>(answer: &[u8]) -> Option<Spans<N>> {
    let mut spans: Spans<N> = [None; N];
    let mut at = 0usize;
    for span in &mut spans {
        let len = answer.get(at..at.checked_add(4)?)?;
        let len = u32::from_le_bytes(<[u8; 4]>::try_from(len).ok()?);
        at = at.checked_add(4)?;
        if len != ABSENT {
            let end = at.checked_add(usize::try_from(len).ok()?)?;
            if end > answer.len() {
                return None;
            }
            *span = Some((at, end));
            at = end;
        }
    }
    (at == answer.len()).then_some(spans)
}

/// A fixed list of `N` reads (a callback's, from the filter's code and configuration), with
/// [`GET_VALUES`]' argument encoded once: build it when the configuration loads, [`fetch`] it
/// per request.
///
/// [`fetch`]: ReadList::fetch
#[derive(Debug, Clone)]
pub struct ReadList<const N: usize> {
    reads: [OwnedRead; N],
    /// Empty when the list cannot be encoded (more than [`MAX_READS`]): then never batched.
    argument: Vec<u8>,
}

/// A [`Read`] that owns its name or path.
#[derive(Debug, Clone)]
enum OwnedRead {
    RequestHeader(String),
    ResponseHeader(String),
    Property(Vec<u8>),
    Clock,
}

impl OwnedRead {
    fn as_read(&self) -> Read<'_> {
        match self {
            OwnedRead::RequestHeader(name) => Read::RequestHeader(name),
            OwnedRead::ResponseHeader(name) => Read::ResponseHeader(name),
            OwnedRead::Property(path) => Read::Property(path),
            OwnedRead::Clock => Read::Clock,
        }
    }
}

impl<const N: usize> ReadList<N> {
    /// The list of `reads`, in this order.
    pub fn new(reads: [Read<'_>; N]) -> ReadList<N> {
        let mut argument = Vec::new();
        if !encode(&reads, &mut argument) {
            argument.clear();
        }
        ReadList {
            reads: reads.map(|read| match read {
                Read::RequestHeader(name) => OwnedRead::RequestHeader(name.to_owned()),
                Read::ResponseHeader(name) => OwnedRead::ResponseHeader(name.to_owned()),
                Read::Property(path) => OwnedRead::Property(path.to_vec()),
                Read::Clock => OwnedRead::Clock,
            }),
            argument,
        }
    }

    /// The values of this callback: in one call where `reader` offers it.
    pub fn fetch<R: Reader>(&self, reader: R) -> Prefetched<'_, R, N> {
        let answer = if reader.offered() && (N == 0 || !self.argument.is_empty()) {
            reader.get_values(&self.argument).and_then(|answer| {
                let spans = decode::<N>(&answer)?;
                Some((answer, spans))
            })
        } else {
            None
        };
        Prefetched {
            reader,
            reads: self.reads.each_ref().map(OwnedRead::as_read),
            answer,
        }
    }
}

/// The values of a [`ReadList`] for one callback (see the module documentation).
pub struct Prefetched<'a, R: Reader, const N: usize> {
    reader: R,
    reads: [Read<'a>; N],
    /// The host's answer and where each value lies in it; `None`: read one by one.
    answer: Option<(Vec<u8>, Spans<N>)>,
}

impl<R: Reader, const N: usize> Prefetched<'_, R, N> {
    /// Whether the values came in one call.
    pub fn batched(&self) -> bool {
        self.answer.is_some()
    }

    /// Value `index` of the list (`None` when absent, or for an index past it): borrowed from
    /// the answer, or read now by its plain call.
    pub fn get(&self, index: usize) -> Option<Cow<'_, [u8]>> {
        let read = *self.reads.get(index)?;
        match &self.answer {
            Some((answer, spans)) => {
                let (start, end) = (*spans.get(index)?)?;
                answer.get(start..end).map(Cow::Borrowed)
            }
            None => self.reader.read(read).map(Cow::Owned),
        }
    }

    /// The clock read at `index` of the list ([`Read::Clock`]); `None` when the host gave no
    /// clock, or the value there is not 8 bytes.
    pub fn clock(&self, index: usize) -> Option<UnixNanos> {
        if self.answer.is_none() && matches!(self.reads.get(index), Some(Read::Clock)) {
            return self.reader.clock_nanos().map(UnixNanos);
        }
        let bytes = self.get(index)?;
        Some(UnixNanos(u64::from_le_bytes(
            <[u8; 8]>::try_from(&*bytes).ok()?,
        )))
    }

    /// The value of `read`: from the list when it is there, else by its plain call.
    pub fn value(&self, read: Read<'_>) -> Option<Cow<'_, [u8]>> {
        match self.reads.iter().position(|r| r.same(&read)) {
            Some(index) => self.get(index),
            None => self.reader.read(read).map(Cow::Owned),
        }
    }
}

/// An identity source reads its property or header from the list when it is there.
impl<R: Reader, const N: usize> IdentityView for Prefetched<'_, R, N> {
    fn property(&self, name: &str) -> Option<Vec<u8>> {
        self.value(Read::Property(name.as_bytes()))
            .map(Cow::into_owned)
    }

    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.value(Read::RequestHeader(name)).map(Cow::into_owned)
    }

    fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
        self.reader.header_values(name)
    }
}

/// The host: [`GET_VALUES`] until it answers with an error status once, then the plain calls.
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Clone, Copy, Default)]
pub struct HostReader;

#[cfg(target_arch = "wasm32")]
mod host {
    use std::sync::atomic::{AtomicU8, Ordering};

    use proxy_wasm::types::MapType;

    use super::{HostReader, Read, Reader, FOREIGN_FUNCTIONS, GET_VALUES};

    /// Whether the host answers [`GET_VALUES`]: unknown until the first list is fetched, then
    /// yes or no for the VM's life, from the host's property [`FOREIGN_FUNCTIONS`].
    static OFFERED: AtomicU8 = AtomicU8::new(UNKNOWN);
    const UNKNOWN: u8 = 0;
    const YES: u8 = 1;
    const NO: u8 = 2;

    impl Reader for HostReader {
        fn offered(&self) -> bool {
            match OFFERED.load(Ordering::Relaxed) {
                YES => true,
                NO => false,
                _ => {
                    let names = crate::host_calls::property_encoded(FOREIGN_FUNCTIONS);
                    let offered = names.is_some_and(|names| {
                        names
                            .split(|&b| b == b',')
                            .any(|name| name == GET_VALUES.as_bytes())
                    });
                    OFFERED.store(if offered { YES } else { NO }, Ordering::Relaxed);
                    offered
                }
            }
        }

        fn get_values(&self, argument: &[u8]) -> Option<Vec<u8>> {
            match crate::raw::call_foreign_function(GET_VALUES, argument) {
                Ok(answer) => Some(answer),
                Err(status) => {
                    log::debug!("{GET_VALUES}: host status {status}");
                    None
                }
            }
        }

        fn read(&self, read: Read<'_>) -> Option<Vec<u8>> {
            match read {
                Read::RequestHeader(name) => {
                    crate::host_calls::header_bytes(MapType::HttpRequestHeaders, name)
                }
                Read::ResponseHeader(name) => {
                    crate::host_calls::header_bytes(MapType::HttpResponseHeaders, name)
                }
                Read::Property(path) => crate::host_calls::property_encoded(path),
                Read::Clock => crate::raw::current_time_nanos()
                    .ok()
                    .map(|ns| ns.to_le_bytes().to_vec()),
            }
        }

        fn header_values(&self, name: &str) -> Option<Vec<Vec<u8>>> {
            crate::host_calls::request_header_values(name).ok()
        }

        fn clock_nanos(&self) -> Option<u64> {
            crate::raw::current_time_nanos().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A host with a table of values, counting its calls; `offered`: it answers
    /// [`GET_VALUES`] (as the nginx host's `get_values` does, from the same table).
    struct Table {
        values: Vec<(Read<'static>, &'static [u8])>,
        offered: bool,
        calls: Cell<usize>,
    }

    impl Table {
        fn new(offered: bool) -> Table {
            Table {
                values: vec![
                    (Read::RequestHeader(":path"), b"/v1/chat"),
                    (Read::ResponseHeader(":status"), b"200"),
                    (Read::Property(b"wasmx.tollgate.cost"), b"outcome=ok"),
                    (Read::Property(b"empty"), b""),
                    (Read::Clock, &CLOCK),
                ],
                offered,
                calls: Cell::new(0),
            }
        }

        fn lookup(&self, read: Read<'_>) -> Option<&'static [u8]> {
            self.values
                .iter()
                .find(|(r, _)| *r == read)
                .map(|(_, v)| *v)
        }
    }

    impl Reader for &Table {
        fn get_values(&self, mut argument: &[u8]) -> Option<Vec<u8>> {
            self.calls.set(self.calls.get().saturating_add(1));
            if !self.offered {
                return None;
            }
            let mut answer = Vec::new();
            while let [kind, map, a, b, c, d, rest @ ..] = argument {
                let len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
                let (key, rest) = rest.split_at(len);
                argument = rest;
                let read = match (kind, map) {
                    (0, _) => Read::Property(key),
                    (1, 0) => Read::RequestHeader(std::str::from_utf8(key).unwrap()),
                    (1, 2) => Read::ResponseHeader(std::str::from_utf8(key).unwrap()),
                    (2, 0) if key.is_empty() => Read::Clock,
                    _ => panic!("unexpected read"),
                };
                match self.lookup(read) {
                    Some(v) => {
                        answer.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        answer.extend_from_slice(v);
                    }
                    None => answer.extend_from_slice(&ABSENT.to_le_bytes()),
                }
            }
            Some(answer)
        }

        fn read(&self, read: Read<'_>) -> Option<Vec<u8>> {
            self.calls.set(self.calls.get().saturating_add(1));
            self.lookup(read).map(<[u8]>::to_vec)
        }

        fn header_values(&self, _name: &str) -> Option<Vec<Vec<u8>>> {
            None
        }
    }

    /// The test host's clock: Unix nanoseconds, little-endian.
    const CLOCK: [u8; 8] = 1_764_460_800_123_456_789u64.to_le_bytes();

    const READS: [Read<'static>; 5] = [
        Read::RequestHeader(":path"),
        Read::RequestHeader("x-missing"),
        Read::ResponseHeader(":status"),
        Read::Property(b"wasmx.tollgate.cost"),
        Read::Property(b"empty"),
    ];

    fn values(p: &Prefetched<'_, &Table, 5>) -> Vec<Option<Vec<u8>>> {
        (0..5).map(|i| p.get(i).map(Cow::into_owned)).collect()
    }

    #[test]
    fn a_host_that_offers_it_answers_every_value_in_one_call() {
        let table = Table::new(true);
        let list = ReadList::new(READS);
        let p = list.fetch(&table);
        assert!(p.batched());
        let expected = vec![
            Some(b"/v1/chat".to_vec()),
            None,
            Some(b"200".to_vec()),
            Some(b"outcome=ok".to_vec()),
            Some(Vec::new()),
        ];
        assert_eq!(values(&p), expected);
        assert_eq!(p.get(5), None);
        assert_eq!(table.calls.get(), 1);
        // Asked by what it reads, and through an identity view.
        assert_eq!(p.value(READS[3]).as_deref(), Some(&b"outcome=ok"[..]));
        assert_eq!(
            IdentityView::property(&p, "wasmx.tollgate.cost"),
            Some(b"outcome=ok".to_vec())
        );
        assert_eq!(
            IdentityView::header(&p, ":path"),
            Some(b"/v1/chat".to_vec())
        );
        assert_eq!(table.calls.get(), 1);
        // A value outside the list is read by its plain call.
        assert_eq!(IdentityView::property(&p, "empty2"), None);
        assert_eq!(table.calls.get(), 2);
    }

    #[test]
    fn another_host_gets_the_plain_calls_only_for_what_is_asked() {
        let table = Table::new(false);
        let list = ReadList::new(READS);
        let p = list.fetch(&table);
        assert!(!p.batched());
        assert_eq!(table.calls.get(), 1, "the one attempt");
        assert_eq!(p.get(2).as_deref(), Some(&b"200"[..]));
        assert_eq!(table.calls.get(), 2);
        let batched = Table::new(true);
        assert_eq!(values(&p), values(&list.fetch(&batched)));
    }

    #[test]
    fn a_list_past_the_bound_is_read_one_by_one() {
        let table = Table::new(true);
        let list = ReadList::new([Read::Property(b"wasmx.tollgate.cost"); MAX_READS + 1]);
        let p = list.fetch(&table);
        assert!(!p.batched());
        assert_eq!(table.calls.get(), 0);
        assert_eq!(p.get(MAX_READS).as_deref(), Some(&b"outcome=ok"[..]));
    }

    #[test]
    fn the_clock_comes_with_the_other_values_or_by_its_own_call() {
        let reads = [Read::ResponseHeader(":status"), Read::Clock];
        let list = ReadList::new(reads);
        for offered in [true, false] {
            let table = Table::new(offered);
            let p = list.fetch(&table);
            assert_eq!(p.batched(), offered);
            assert_eq!(p.clock(1), Some(UnixNanos(1_764_460_800_123_456_789)));
            assert_eq!(p.value(Read::Clock).as_deref(), Some(&CLOCK[..]));
            // Not a clock's 8 bytes: none.
            assert_eq!(p.clock(0), None);
            assert_eq!(table.calls.get(), if offered { 1 } else { 4 });
        }
        let mut argument = Vec::new();
        assert!(encode(&reads, &mut argument));
        assert_eq!(
            argument,
            [&[1, 2, 7, 0, 0, 0][..], b":status", &[2, 0, 0, 0, 0, 0]].concat()
        );
    }

    #[test]
    fn encoding_and_its_bounds() {
        let mut argument = vec![9];
        assert!(encode(
            &[Read::Property(b"ab"), Read::ResponseHeader("C")],
            &mut argument
        ));
        assert_eq!(
            argument,
            [&[0, 0, 2, 0, 0, 0][..], b"ab", &[1, 2, 1, 0, 0, 0], b"C"].concat()
        );
        let many = [Read::Property(b"x"); MAX_READS + 1];
        assert!(!encode(&many, &mut argument));
        assert!(encode(&many[..MAX_READS], &mut argument));
    }

    #[test]
    fn an_answer_that_does_not_match_the_reads_is_not_used() {
        let one = [&3u32.to_le_bytes()[..], b"abc"].concat();
        let absent = ABSENT.to_le_bytes().to_vec();
        assert_eq!(decode::<1>(&one), Some([Some((4, 7))]));
        assert_eq!(decode::<1>(&absent), Some([None]));
        // Too few, too many, cut short, a length past the end.
        assert_eq!(decode::<2>(&one), None);
        assert_eq!(decode::<1>(&[one.clone(), absent].concat()), None);
        assert_eq!(decode::<1>(&one[..6]), None);
        assert_eq!(decode::<1>(&9u32.to_le_bytes()), None);
        assert_eq!(decode::<0>(&[]), Some([]));
    }
}
