//! The byte layouts the proxy-wasm ABI (0.2.1) uses to pass header maps and property paths
//! between host and guest, encoded and decoded without trapping on what a host hands back.
//! Host-free, so that the layouts are unit-tested natively; `raw` makes the calls.
//!
//! - A header map: `u32 LE` count N, then N pairs of `u32 LE` (name length, value length), then
//!   for each pair the name's bytes, a NUL, the value's bytes, a NUL (the ABI's
//!   `proxy_get_header_map_pairs` / `proxy_dispatch_http_call` layout).
//! - A property path: its segments joined by NUL (`proxy_get_property`, `proxy_set_property`).

use std::borrow::Cow;

/// Encodes `pairs` as a proxy-wasm header map. `None` when a count or length does not fit in a
/// `u32` (the layout's limit; not reachable with real headers).
pub fn encode_map(pairs: &[(&str, &[u8])]) -> Option<Vec<u8>> {
    let mut size = 4usize;
    for (name, value) in pairs {
        size = size
            .checked_add(name.len())?
            .checked_add(value.len())?
            .checked_add(10)?;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&u32::try_from(pairs.len()).ok()?.to_le_bytes());
    for (name, value) in pairs {
        out.extend_from_slice(&u32::try_from(name.len()).ok()?.to_le_bytes());
        out.extend_from_slice(&u32::try_from(value.len()).ok()?.to_le_bytes());
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    Some(out)
}

/// Calls `f` with each (name, value) of a proxy-wasm header map, in order, borrowed from `bytes`
/// (nothing is allocated). `None` when the bytes are not a well-formed map (a count or a length
/// past the end; `f` may have seen the entries before the fault): the caller treats it as a host
/// error. An empty buffer is an empty map.
pub fn for_each_entry<'a>(bytes: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8])) -> Option<()> {
    if bytes.is_empty() {
        return Some(());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let word = bytes.get(at..at.checked_add(4)?)?;
        usize::try_from(u32::from_le_bytes(word.try_into().ok()?)).ok()
    };
    let count = u32_at(0)?;
    let mut data = count.checked_mul(8)?.checked_add(4)?;
    if data > bytes.len() {
        return None;
    }
    for n in 0..count {
        let sizes = n.checked_mul(8)?.checked_add(4)?;
        let (name_len, value_len) = (u32_at(sizes)?, u32_at(sizes.checked_add(4)?)?);
        let name = bytes.get(data..data.checked_add(name_len)?)?;
        data = data.checked_add(name_len)?.checked_add(1)?;
        let value = bytes.get(data..data.checked_add(value_len)?)?;
        data = data.checked_add(value_len)?.checked_add(1)?;
        f(name, value);
    }
    Some(())
}

/// Decodes a proxy-wasm header map into (name, value) pairs; names that are not UTF-8 become
/// U+FFFD-replaced text (a client controls them in some hosts). `None` when the bytes are not a
/// well-formed map ([`for_each_entry`]).
pub fn decode_map(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut pairs = Vec::new();
    for_each_entry(bytes, |name, value| {
        pairs.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
    })?;
    Some(pairs)
}

/// A header map as the host encoded it (`proxy_get_header_map_pairs`), read in place: one
/// allocation for the whole map, none per lookup.
pub struct HeaderList {
    bytes: Vec<u8>,
}

impl HeaderList {
    /// The map in `bytes`; `None` when they are not a well-formed map ([`for_each_entry`]).
    pub fn new(bytes: Vec<u8>) -> Option<HeaderList> {
        for_each_entry(&bytes, |_, _| {})?;
        Some(HeaderList { bytes })
    }

    /// The value of the first entry named `name` (ASCII case-insensitive), as the ABI's
    /// `proxy_get_header_map_value` answers.
    pub fn first(&self, name: &str) -> Option<&[u8]> {
        let mut found = None;
        // Well-formed: checked by `new`.
        let _ = for_each_entry(&self.bytes, |n, v| {
            if found.is_none() && n.eq_ignore_ascii_case(name.as_bytes()) {
                found = Some(v);
            }
        });
        found
    }

    /// The values of the entries named `name` or a spelling of it that CGI-style upstreams read
    /// as it (`crate::http::cgi_fold`), in order.
    pub fn values(&self, name: &str) -> Vec<&[u8]> {
        let folded = crate::http::cgi_fold(name.as_bytes());
        let mut values = Vec::new();
        let _ = for_each_entry(&self.bytes, |n, v| {
            if crate::http::reads_as(n, &folded) {
                values.push(v);
            }
        });
        values
    }

    /// The names of the entries that are spellings of one of `folded` (each a
    /// [`crate::http::cgi_fold`]) other than its case (`crate::http::is_cgi_alias`), in order.
    pub fn cgi_aliases(&self, folded: &[Vec<u8>]) -> Vec<&[u8]> {
        let mut aliases = Vec::new();
        let _ = for_each_entry(&self.bytes, |n, _| {
            if folded.iter().any(|f| crate::http::is_cgi_alias(n, f)) {
                aliases.push(n);
            }
        });
        aliases
    }
}

/// A header value (or any host bytes) as text: non-UTF-8 sequences (obs-text, RFC 9110 section
/// 5.5) become U+FFFD. Valid UTF-8, nearly every value, keeps its buffer: no second allocation
/// and copy, which `String::from_utf8_lossy(..).into_owned()` always makes.
pub fn text(bytes: Vec<u8>) -> String {
    crate::bytes::utf8_owned(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Encodes a property path (`["request", "path"]` → `request\0path`). A one-segment path is
/// its own bytes, borrowed: most property calls (the filters' signals) allocate nothing.
pub fn encode_path<'a>(path: &[&'a str]) -> Cow<'a, [u8]> {
    if let [one] = path {
        return Cow::Borrowed(one.as_bytes());
    }
    let len = path
        .iter()
        .fold(0usize, |n, p| n.saturating_add(p.len()).saturating_add(1));
    let mut out = Vec::with_capacity(len);
    for (i, part) in path.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(part.as_bytes());
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lists_are_read_in_place() {
        let pairs: [(&str, &[u8]); 5] = [
            (":path", b"/x"),
            ("Authorization", b"Bearer t"),
            ("x_jwt_sub", b"admin"),
            ("authorization", b"Bearer u"),
            ("X.Jwt-Sub", b"root"),
        ];
        let list = HeaderList::new(encode_map(&pairs).unwrap()).unwrap();
        assert_eq!(list.first("authorization"), Some(&b"Bearer t"[..]));
        assert_eq!(list.first(":path"), Some(&b"/x"[..]));
        assert_eq!(list.first("cookie"), None);
        let folds = [crate::http::cgi_fold(b"x-jwt-sub")];
        assert_eq!(list.cgi_aliases(&folds), [&b"x_jwt_sub"[..], b"X.Jwt-Sub"]);
        assert_eq!(list.values("x-jwt-sub"), [&b"admin"[..], b"root"]);
        assert_eq!(
            list.values("authorization"),
            [&b"Bearer t"[..], b"Bearer u"]
        );
        assert!(HeaderList::new(vec![9, 0, 0, 0]).is_none());
        assert!(HeaderList::new(Vec::new()).is_some());
    }

    #[test]
    fn text_replaces_only_what_is_not_utf8() {
        assert_eq!(text(b"Bearer abc".to_vec()), "Bearer abc");
        assert_eq!(text("caf\u{e9}".as_bytes().to_vec()), "caf\u{e9}");
        // obs-text: a Latin-1 byte and a truncated sequence, each one U+FFFD.
        assert_eq!(text(b"caf\xe9 x\xc3".to_vec()), "caf\u{fffd} x\u{fffd}");
    }

    #[test]
    fn maps_round_trip_in_the_abi_layout() {
        let pairs: [(&str, &[u8]); 2] = [(":path", b"/a"), ("x", b"\xff")];
        let bytes = encode_map(&pairs).unwrap();
        // Written out by hand from the ABI's description (proxy-wasm spec, "header maps").
        let mut expected = vec![2, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0];
        expected.extend_from_slice(b":path\0/a\0x\0\xff\0");
        assert_eq!(bytes, expected);
        let back = decode_map(&bytes).unwrap();
        assert_eq!(
            back,
            vec![
                (":path".to_string(), b"/a".to_vec()),
                ("x".to_string(), b"\xff".to_vec())
            ]
        );
        assert_eq!(decode_map(&[]), Some(vec![]));
        assert_eq!(&*encode_path(&["request", "path"]), b"request\0path");
        assert_eq!(&*encode_path(&["x"]), b"x");
        assert_eq!(&*encode_path(&[]), b"");
        // One segment (every signal between filters): no copy.
        assert!(matches!(encode_path(&["x"]), Cow::Borrowed(_)));
    }

    #[test]
    fn malformed_maps_from_a_host_are_refused_not_trapped_on() {
        let good = encode_map(&[("name", b"value")]).unwrap();
        for cut in 0..good.len() - 1 {
            assert_eq!(decode_map(&good[..cut.max(1)]), None, "cut at {cut}");
        }
        // A count far past the buffer, a length past the end.
        assert_eq!(decode_map(&[0xff, 0xff, 0xff, 0xff]), None);
        let mut long = good.clone();
        long[4] = 200;
        assert_eq!(decode_map(&long), None);
        // A name that is not UTF-8 is replaced, not a trap.
        let odd = encode_map(&[("a", b"v")]).unwrap();
        let mut odd = odd;
        let at = odd.len() - 4;
        odd[at] = 0xfe;
        assert_eq!(decode_map(&odd).unwrap()[0].0, "\u{fffd}");
    }
}
