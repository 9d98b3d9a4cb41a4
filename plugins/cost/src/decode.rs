//! Decoding of compressed response bodies (`Content-Encoding`, RFC 9110 section 8.4.1), so that
//! a compressed response is priced like any other.
//!
//! The filter first asks the upstream for `Accept-Encoding: identity` (see the filter); an
//! upstream that compresses anyway is decoded here, incrementally and in bounded memory: input
//! is fed to `flate2` in slices of [`STEP`] bytes and each slice's output is handed on and
//! dropped at once, so a slice can never expand beyond about 1 032 times its size (deflate's
//! largest ratio) plus `flate2`'s 32 KiB window. The total output is bounded too
//! (`max_decoded_bytes`): a decompression bomb stops being read there, and the response counts
//! as unpriced (`decode_limit`), governed by the filter's `unpriced_charge`.
//!
//! Codings: `gzip` and `x-gzip` (RFC 1952, several members allowed), `deflate` (the zlib format,
//! RFC 1950, as RFC 9110 section 8.4.1.2 defines it). Anything else (`br`, `zstd`, `compress`, a
//! list of codings) is [`Coding::Unsupported`]. The client receives the body as the upstream sent
//! it; only the filter's copy is decoded.

use std::io::Write;

use flate2::write::{MultiGzDecoder, ZlibDecoder};

/// Input bytes decoded at a time (see the module documentation).
pub const STEP: usize = 256;

/// A `Content-Encoding`, as the filter handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// No coding (`identity`, or no header).
    Identity,
    /// `gzip` / `x-gzip`.
    Gzip,
    /// `deflate` (zlib).
    Deflate,
    /// A coding this filter cannot decode.
    Unsupported,
}

impl Coding {
    /// The coding of a `Content-Encoding` field value (`None`: absent).
    pub fn of(value: Option<&[u8]>) -> Coding {
        let Some(value) = value else {
            return Coding::Identity;
        };
        let value = value.trim_ascii();
        if value.is_empty() || value.eq_ignore_ascii_case(b"identity") {
            Coding::Identity
        } else if value.eq_ignore_ascii_case(b"gzip") || value.eq_ignore_ascii_case(b"x-gzip") {
            Coding::Gzip
        } else if value.eq_ignore_ascii_case(b"deflate") {
            Coding::Deflate
        } else {
            Coding::Unsupported
        }
    }
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Not valid data of its coding.
    Corrupt,
    /// More than `max_decoded_bytes` of output.
    TooLarge,
}

enum Inner {
    Gzip(MultiGzDecoder<Vec<u8>>),
    Deflate(ZlibDecoder<Vec<u8>>),
}

impl Inner {
    fn write_all(&mut self, input: &[u8]) -> std::io::Result<()> {
        match self {
            Inner::Gzip(d) => d.write_all(input),
            Inner::Deflate(d) => d.write_all(input),
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Inner::Gzip(d) => d.try_finish(),
            Inner::Deflate(d) => d.try_finish(),
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Inner::Gzip(d) => d.get_mut(),
            Inner::Deflate(d) => d.get_mut(),
        }
    }
}

/// An incremental, bounded decoder of one response body.
pub struct Decoder {
    inner: Inner,
    decoded: u64,
    max: u64,
    error: Option<DecodeError>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("decoded", &self.decoded)
            .field("error", &self.error)
            .finish()
    }
}

impl Decoder {
    /// A decoder for `coding` (`None` for identity and unsupported codings), whose output is
    /// bounded by `max_decoded_bytes`.
    pub fn new(coding: Coding, max_decoded_bytes: u64) -> Option<Decoder> {
        let inner = match coding {
            Coding::Gzip => Inner::Gzip(MultiGzDecoder::new(Vec::new())),
            Coding::Deflate => Inner::Deflate(ZlibDecoder::new(Vec::new())),
            Coding::Identity | Coding::Unsupported => return None,
        };
        Some(Decoder {
            inner,
            decoded: 0,
            max: max_decoded_bytes,
            error: None,
        })
    }

    /// The error that stopped decoding, if any.
    pub fn error(&self) -> Option<DecodeError> {
        self.error
    }

    /// Decodes `input`, handing the output to `out` piece by piece.
    pub fn feed(&mut self, input: &[u8], out: &mut dyn FnMut(&[u8])) {
        for step in input.chunks(STEP) {
            if self.error.is_some() {
                return;
            }
            let written = self.inner.write_all(step);
            self.drain(out);
            if written.is_err() {
                self.error.get_or_insert(DecodeError::Corrupt);
            }
        }
    }

    /// Ends the body: the last output, and whether the compressed data was complete.
    pub fn finish(&mut self, out: &mut dyn FnMut(&[u8])) {
        if self.error.is_some() {
            return;
        }
        let done = self.inner.finish();
        self.drain(out);
        if done.is_err() {
            self.error.get_or_insert(DecodeError::Corrupt);
        }
    }

    fn drain(&mut self, out: &mut dyn FnMut(&[u8])) {
        let buf = std::mem::take(self.inner.output());
        if buf.is_empty() {
            return;
        }
        self.decoded = self
            .decoded
            .saturating_add(u64::try_from(buf.len()).unwrap_or(u64::MAX));
        if self.decoded > self.max {
            self.error = Some(DecodeError::TooLarge);
            return;
        }
        out(&buf);
        // Give the (emptied) buffer back, keeping its capacity.
        let mut buf = buf;
        buf.clear();
        *self.inner.output() = buf;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::{GzEncoder, ZlibEncoder};
    use flate2::Compression;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn decode(coding: Coding, chunks: &[&[u8]], max: u64) -> (Vec<u8>, Option<DecodeError>) {
        let mut d = Decoder::new(coding, max).unwrap();
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut |b| out.extend_from_slice(b));
        }
        d.finish(&mut |b| out.extend_from_slice(b));
        (out, d.error())
    }

    #[test]
    fn codings() {
        assert_eq!(Coding::of(None), Coding::Identity);
        assert_eq!(Coding::of(Some(b" GZip ")), Coding::Gzip);
        assert_eq!(Coding::of(Some(b"x-gzip")), Coding::Gzip);
        assert_eq!(Coding::of(Some(b"deflate")), Coding::Deflate);
        assert_eq!(Coding::of(Some(b"identity")), Coding::Identity);
        for other in [&b"br"[..], b"zstd", b"gzip, br", b"compress"] {
            assert_eq!(Coding::of(Some(other)), Coding::Unsupported);
        }
    }

    #[test]
    fn gzip_and_deflate_split_anywhere() {
        let text: Vec<u8> = (0..20_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let gz = [gzip(&text[..30_000]), gzip(&text[30_000..])].concat();
        for at in [0, 1, 10, 255, 256, 257, gz.len() / 2, gz.len()] {
            let (a, b) = gz.split_at(at);
            assert_eq!(decode(Coding::Gzip, &[a, b], 1 << 20), (text.clone(), None));
        }
        let mut z = ZlibEncoder::new(Vec::new(), Compression::best());
        z.write_all(&text).unwrap();
        let z = z.finish().unwrap();
        assert_eq!(decode(Coding::Deflate, &[&z], 1 << 20), (text, None));
    }

    #[test]
    fn bombs_corruption_and_truncation_stop_decoding() {
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        e.write_all(&vec![0u8; 10 << 20]).unwrap();
        let bomb = e.finish().unwrap();
        assert!(bomb.len() < 20_000, "{}", bomb.len());
        let mut peak = 0usize;
        let mut d = Decoder::new(Coding::Gzip, 1 << 20).unwrap();
        d.feed(&bomb, &mut |b| peak = peak.max(b.len()));
        assert_eq!(d.error(), Some(DecodeError::TooLarge));
        assert!(peak <= 512 * 1024, "one step's output stays small: {peak}");
        let gz = gzip(b"{\"usage\":{}}");
        let (_, e) = decode(Coding::Gzip, &[&gz[..gz.len() - 4]], 1 << 20);
        assert_eq!(e, Some(DecodeError::Corrupt), "truncated");
        let (_, e) = decode(Coding::Gzip, &[b"not gzip at all"], 1 << 20);
        assert_eq!(e, Some(DecodeError::Corrupt));
        assert!(Decoder::new(Coding::Identity, 1).is_none());
    }
}
