//! The typed `ngx_table_elt_t *` fields nginx keeps for known header names in `headers_in` and
//! `headers_out` ([`IN_FIELDS`], [`OUT_FIELDS`]), by lower-case name: what `headers.rs` links a
//! new or moved element to.

use std::mem::offset_of;

use ngx::ffi::{ngx_http_headers_in_t, ngx_http_headers_out_t};

/// Typed `ngx_table_elt_t *` fields of `headers_in`, by lower-case header name.
pub(crate) const IN_FIELDS: &[(&[u8], usize)] = &[
    (b"host", offset_of!(ngx_http_headers_in_t, host)),
    (b"connection", offset_of!(ngx_http_headers_in_t, connection)),
    (
        b"if-modified-since",
        offset_of!(ngx_http_headers_in_t, if_modified_since),
    ),
    (
        b"if-unmodified-since",
        offset_of!(ngx_http_headers_in_t, if_unmodified_since),
    ),
    (b"if-match", offset_of!(ngx_http_headers_in_t, if_match)),
    (
        b"if-none-match",
        offset_of!(ngx_http_headers_in_t, if_none_match),
    ),
    (b"user-agent", offset_of!(ngx_http_headers_in_t, user_agent)),
    (b"referer", offset_of!(ngx_http_headers_in_t, referer)),
    (
        b"content-length",
        offset_of!(ngx_http_headers_in_t, content_length),
    ),
    (
        b"content-range",
        offset_of!(ngx_http_headers_in_t, content_range),
    ),
    (
        b"content-type",
        offset_of!(ngx_http_headers_in_t, content_type),
    ),
    (b"range", offset_of!(ngx_http_headers_in_t, range)),
    (b"if-range", offset_of!(ngx_http_headers_in_t, if_range)),
    (
        b"transfer-encoding",
        offset_of!(ngx_http_headers_in_t, transfer_encoding),
    ),
    (b"te", offset_of!(ngx_http_headers_in_t, te)),
    (b"expect", offset_of!(ngx_http_headers_in_t, expect)),
    (b"upgrade", offset_of!(ngx_http_headers_in_t, upgrade)),
    (
        b"accept-encoding",
        offset_of!(ngx_http_headers_in_t, accept_encoding),
    ),
    (b"via", offset_of!(ngx_http_headers_in_t, via)),
    (
        b"authorization",
        offset_of!(ngx_http_headers_in_t, authorization),
    ),
    (b"keep-alive", offset_of!(ngx_http_headers_in_t, keep_alive)),
    (b"x-real-ip", offset_of!(ngx_http_headers_in_t, x_real_ip)),
    (b"accept", offset_of!(ngx_http_headers_in_t, accept)),
    (
        b"accept-language",
        offset_of!(ngx_http_headers_in_t, accept_language),
    ),
    (b"depth", offset_of!(ngx_http_headers_in_t, depth)),
    (
        b"destination",
        offset_of!(ngx_http_headers_in_t, destination),
    ),
    (b"overwrite", offset_of!(ngx_http_headers_in_t, overwrite)),
    (b"date", offset_of!(ngx_http_headers_in_t, date)),
];

/// For each name length, the set of [`IN_FIELDS`] entries of that length (bit `i`: entry `i`),
/// so that [`in_field`] compares at most three names instead of scanning the list.
const IN_FIELDS_BY_LEN: [u32; 20] = by_length(IN_FIELDS);

/// [`IN_FIELDS_BY_LEN`] of `fields`. Evaluated at compile time: more than 32 entries, or a
/// name of 20 bytes or more, fails the build.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
const fn by_length(fields: &[(&[u8], usize)]) -> [u32; 20] {
    let mut out = [0u32; 20];
    let mut rest = fields;
    let mut i = 0u32;
    while let [(name, _), tail @ ..] = rest {
        out[name.len()] |= 1 << i;
        i += 1;
        rest = tail;
    }
    out
}

/// The offset in `headers_in` of the typed pointer of field `name` (lower-case), if it has one.
pub(crate) fn in_field(name: &[u8]) -> Option<usize> {
    let mut set = IN_FIELDS_BY_LEN.get(name.len()).copied().unwrap_or(0);
    while set != 0 {
        match IN_FIELDS.get(set.trailing_zeros() as usize) {
            Some((n, offset)) if *n == name => return Some(*offset),
            _ => set &= set.wrapping_sub(1),
        }
    }
    None
}

/// Typed `ngx_table_elt_t *` fields of `headers_out`.
pub(crate) const OUT_FIELDS: &[(&[u8], usize)] = &[
    (b"server", offset_of!(ngx_http_headers_out_t, server)),
    (b"date", offset_of!(ngx_http_headers_out_t, date)),
    (
        b"content-length",
        offset_of!(ngx_http_headers_out_t, content_length),
    ),
    (
        b"content-encoding",
        offset_of!(ngx_http_headers_out_t, content_encoding),
    ),
    (b"location", offset_of!(ngx_http_headers_out_t, location)),
    (b"refresh", offset_of!(ngx_http_headers_out_t, refresh)),
    (
        b"last-modified",
        offset_of!(ngx_http_headers_out_t, last_modified),
    ),
    (
        b"content-range",
        offset_of!(ngx_http_headers_out_t, content_range),
    ),
    (
        b"accept-ranges",
        offset_of!(ngx_http_headers_out_t, accept_ranges),
    ),
    (
        b"www-authenticate",
        offset_of!(ngx_http_headers_out_t, www_authenticate),
    ),
    (b"expires", offset_of!(ngx_http_headers_out_t, expires)),
    (b"etag", offset_of!(ngx_http_headers_out_t, etag)),
];
