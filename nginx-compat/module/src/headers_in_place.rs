//! nginx's request and response header lists read in place as the filters' header maps
//! ([`RequestSource`], [`ResponseSource`]: `tollgate_host::HeaderSource`), and the filters'
//! edits applied to those lists in place ([`apply_request_edits`], [`apply_response_edits`]).
//!
//! The maps they stand for are exactly those of `headers.rs` ([`crate::headers::request_map`],
//! [`crate::headers::response_map`]), which also builds them when a filter writes the whole map;
//! a read of the whole map lists the same entries from the list (`for_each_entry`). Edits are
//! applied in place where that gives the list what the full write-back of the built map would
//! give it (the same fields in the same order, values and typed pointers): an added field goes
//! last, a replaced one takes the value in its first element, a removed one's elements go.
//! Names nginx keeps outside the list or treats with its own meaning (`host`, the hop-by-hop
//! fields, the response's typed fields and framing) and a subrequest's list (shared with its
//! parent) answer "not in place", and the caller builds the map and writes all of it back.
//!
//! # Two ways back to nginx, and when each is taken
//! The filters' changes of a header map reach nginx's list in one of two ways, chosen by
//! [`write_back`] (called after `on_request_headers` in `phases.rs` and after
//! `on_response_headers` in `response_filters.rs`, only when the map was changed):
//! - **edited in place** (this file): the edits the deferred map kept are applied to nginx's
//!   list as they are, nothing built. Taken when the map is still deferred and every edit can
//!   be applied in place (above). This path exists for speed: most filters read a few fields
//!   and write one or two, and building the whole map, freeing it and rebuilding nginx's list
//!   from it cost more than the filters' own header work (`host/src/deferred_headers.rs`).
//! - **rebuilt and relinked** (`headers.rs`: [`crate::headers::apply_request_map`],
//!   [`crate::headers::apply_response_map`]): the whole map, built, replaces nginx's list, and
//!   the typed pointers nginx keeps for known fields (`headers_in.host`, `.cookies`, ...) are
//!   linked again. This path exists because it writes any map faithfully. Taken when the map
//!   is no longer deferred: a filter wrote the whole map (`proxy_set_header_map_pairs`), or the
//!   edits outgrew `tollgate_host::MAX_EDITS`, or the request had hop-by-hop fields, so its map
//!   was built at once ([`crate::headers::plain_request_count`]; written back whole when it
//!   hides some that must not reach the upstream); and when the edits cannot be applied in place
//!   (a name nginx keeps outside the list or reads with its own meaning, a subrequest's list).
//!   A local response and the metrics endpoint's answer, whole new maps, are written this way.
//!
//! Where both could be taken they give nginx the same fields (above): the in-place path only
//! saves the building.

use std::cell::OnceCell;

use ngx::ffi::{
    ngx_http_request_t, ngx_list_part_t, ngx_list_t, ngx_pool_t, ngx_table_elt_t, ngx_uint_t,
};
use tollgate_host::{HeaderEdit, HeaderMap, HeaderSource, Stream};

use crate::decimal::Decimal;
use crate::headers::{
    authority, link_request_field, link_response_field, push_elt, relink_request_fields,
    request_map, request_target, response_map,
};
use crate::table_elts::table_elts;
use crate::util::{bytes, pool_str};

/// The request map's pseudo-headers, in [`request_map`]'s order.
const PSEUDO: [&[u8]; 4] = [b":authority", b":path", b":method", b":scheme"];

/// The request's header map read in place: for a request without hop-by-hop fields only
/// ([`crate::headers::plain_request_count`] gave `len`), whose map hides nothing.
pub struct RequestSource {
    r: *mut ngx_http_request_t,
    /// The entry count: given at first, counted from the list after the edits are applied.
    len: OnceCell<usize>,
    /// `:path` when nginx changed the URI (escaped again): computed on first use.
    path: OnceCell<Vec<u8>>,
    bytes: OnceCell<usize>,
}

impl RequestSource {
    /// # Safety
    /// `r` must be a live request without hop-by-hop fields, with `len` its map's entry count,
    /// and must outlive the source (the stream holding it lives in the request's context, freed
    /// with its pool).
    pub unsafe fn new(r: *mut ngx_http_request_t, len: usize) -> RequestSource {
        RequestSource {
            r,
            len: OnceCell::from(len),
            path: OnceCell::new(),
            bytes: OnceCell::new(),
        }
    }

    /// A pseudo-header's value (`None`: not a pseudo-header of the map).
    fn pseudo(&self, name: &[u8]) -> Option<&[u8]> {
        let r = self.r;
        // SAFETY: the live request (`new`'s contract).
        unsafe {
            match name {
                b":authority" => Some(authority(r)),
                b":path" if (*r).valid_unparsed_uri() != 0 => Some(bytes(&(*r).unparsed_uri)),
                b":path" => Some(self.path.get_or_init(|| request_target(r))),
                b":method" => Some(bytes(&(*r).method_name)),
                b":scheme" => {
                    let c = (*r).connection;
                    Some(if !c.is_null() && !(*c).ssl.is_null() {
                        b"https"
                    } else {
                        b"http"
                    })
                }
                _ => None,
            }
        }
    }

    /// The list's entries of the map (not removed, not `host`, which is `:authority`).
    fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        // SAFETY: the live request's header list, unchanged while the source reads it.
        unsafe { listed(&raw mut (*self.r).headers_in.headers) }
            .filter(|(k, _)| !(k.len() == 4 && k.eq_ignore_ascii_case(b"host")))
    }
}

impl HeaderSource for RequestSource {
    fn len(&self) -> usize {
        // After in-place edits the list has no hop-by-hop field either (those are not edited
        // in place): the pseudo-headers and the entries.
        *self
            .len
            .get_or_init(|| PSEUDO.len().saturating_add(self.entries().count()))
    }

    fn first(&self, name: &[u8]) -> Option<&[u8]> {
        if name.first() == Some(&b':') {
            return self.pseudo(name);
        }
        if name == b"host" {
            return None;
        }
        // SAFETY: the live request's list; the value lives as long as the request.
        unsafe { named(&raw mut (*self.r).headers_in.headers, name).next() }
            .map(|h| unsafe { bytes(&(*h).value) })
    }

    fn count(&self, name: &[u8]) -> usize {
        if name.first() == Some(&b':') {
            return usize::from(self.pseudo(name).is_some());
        }
        if name == b"host" {
            return 0;
        }
        // SAFETY: the live request's list.
        unsafe { named(&raw mut (*self.r).headers_in.headers, name) }.count()
    }

    fn edits_applied(&mut self) {
        self.len = OnceCell::new();
        self.path = OnceCell::new();
        self.bytes = OnceCell::new();
    }

    fn bytes(&self) -> usize {
        *self.bytes.get_or_init(|| {
            let pseudo = PSEUDO.into_iter().map(|n| {
                n.len()
                    .saturating_add(self.pseudo(n).map_or(0, <[u8]>::len))
            });
            pseudo
                .chain(self.entries().map(|(k, v)| k.len().saturating_add(v.len())))
                .fold(0usize, usize::saturating_add)
        })
    }

    fn build(&self) -> HeaderMap {
        // SAFETY: the live request.
        unsafe { request_map(self.r).0 }
    }

    /// [`request_map`]'s entries from the request and its list, names as the client sent them.
    fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for n in PSEUDO {
            if let Some(v) = self.pseudo(n) {
                f(n, v);
            }
        }
        for (k, v) in self.entries() {
            f(k, v);
        }
    }
}

/// The response's header map read in place (in the header filter and after it).
pub struct ResponseSource {
    r: *mut ngx_http_request_t,
    /// The entry count ([`crate::headers::response_count`]), counted on first use.
    len: OnceCell<usize>,
    status: OnceCell<Decimal>,
    /// `content-type` when nginx's charset is appended to it (else it is read in place).
    content_type: OnceCell<Option<Vec<u8>>>,
    content_length: OnceCell<Option<Decimal>>,
    bytes: OnceCell<usize>,
}

impl ResponseSource {
    /// # Safety
    /// `r` must be a live request in its header filter, and must outlive the source.
    pub unsafe fn new(r: *mut ngx_http_request_t) -> ResponseSource {
        ResponseSource {
            r,
            len: OnceCell::new(),
            status: OnceCell::new(),
            content_type: OnceCell::new(),
            content_length: OnceCell::new(),
            bytes: OnceCell::new(),
        }
    }

    /// `:status`, and `content-type` / `content-length` from nginx's own fields, as
    /// [`response_map`] puts them first (`None` for the last two when nginx has none).
    fn fields(&self) -> [(&'static [u8], Option<&[u8]>); 3] {
        // SAFETY: the live request (`new`'s contract).
        let out = unsafe { &(*self.r).headers_out };
        let status = self
            .status
            .get_or_init(|| Decimal::new(u64::try_from(out.status).unwrap_or(0)));
        let content_type = (out.content_type.len > 0).then(|| {
            match self
                .content_type
                .get_or_init(|| crate::headers::content_type_with_charset(out))
            {
                Some(with_charset) => with_charset.as_slice(),
                None => bytes(&out.content_type),
            }
        });
        let content_length = self.content_length.get_or_init(|| {
            (out.content_length.is_null() && out.content_length_n >= 0)
                .then(|| Decimal::new(u64::try_from(out.content_length_n).unwrap_or(0)))
        });
        [
            (b":status", Some(status.as_bytes())),
            (b"content-type", content_type),
            (
                b"content-length",
                content_length.as_ref().map(Decimal::as_bytes),
            ),
        ]
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        // SAFETY: the live request's response header list.
        unsafe { listed(&raw mut (*self.r).headers_out.headers) }
    }
}

impl HeaderSource for ResponseSource {
    fn len(&self) -> usize {
        // SAFETY: the live request (`new`'s contract).
        *self
            .len
            .get_or_init(|| unsafe { crate::headers::response_count(self.r) })
    }

    fn first(&self, name: &[u8]) -> Option<&[u8]> {
        let own = self.fields().into_iter().find(|(n, _)| *n == name);
        match own {
            Some((_, Some(v))) => Some(v),
            Some((b":status", None)) => None,
            _ if name.first() == Some(&b':') => None,
            // SAFETY: the live request's list; the value lives as long as the request.
            _ => unsafe { named(&raw mut (*self.r).headers_out.headers, name).next() }
                .map(|h| unsafe { bytes(&(*h).value) }),
        }
    }

    fn count(&self, name: &[u8]) -> usize {
        let own = self
            .fields()
            .into_iter()
            .filter(|(n, v)| *n == name && v.is_some())
            .count();
        if name.first() == Some(&b':') {
            return own;
        }
        // SAFETY: the live request's list.
        own.saturating_add(unsafe { named(&raw mut (*self.r).headers_out.headers, name) }.count())
    }

    fn edits_applied(&mut self) {
        self.len = OnceCell::new();
        self.bytes = OnceCell::new();
    }

    fn bytes(&self) -> usize {
        *self.bytes.get_or_init(|| {
            let own = self
                .fields()
                .into_iter()
                .filter_map(|(n, v)| v.map(|v| n.len().saturating_add(v.len())));
            own.chain(self.entries().map(|(k, v)| k.len().saturating_add(v.len())))
                .fold(0usize, usize::saturating_add)
        })
    }

    fn build(&self) -> HeaderMap {
        // SAFETY: the live request in its header filter.
        unsafe { response_map(self.r) }
    }

    /// [`response_map`]'s entries: nginx's own fields, then its list (names as they are there).
    fn for_each_entry(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (n, v) in self.fields() {
            if let Some(v) = v {
                f(n, v);
            }
        }
        for (k, v) in self.entries() {
            f(k, v);
        }
    }
}

/// The (name, value) pairs of an nginx header list, removed ones (`hash` 0) skipped.
///
/// # Safety
/// `list` must be a live, initialised header list that is not changed while the iterator and
/// the slices it gives are in use.
unsafe fn listed<'a>(list: *mut ngx_list_t) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    // SAFETY: the caller's live list; its strings live as long as the request.
    unsafe { table_elts(list) }.filter_map(|h| {
        // SAFETY: an element of the live list.
        let h = unsafe { &*h };
        (h.hash != 0).then(|| (bytes(&h.key), bytes(&h.value)))
    })
}

/// The elements of `list` named `name` (any case), not removed.
///
/// # Safety
/// As [`listed`].
unsafe fn named(
    list: *mut ngx_list_t,
    name: &[u8],
) -> impl Iterator<Item = *mut ngx_table_elt_t> + use<'_> {
    // Inlined: a call per element was most of a lookup's cost.
    // SAFETY: the caller's live list.
    unsafe { table_elts(list) }.filter(
        #[inline(always)]
        move |h| {
            // SAFETY: an element of the live list.
            let h = unsafe { &**h };
            // The length first: most fields are told apart by it alone.
            h.key.len == name.len() && h.hash != 0 && bytes(&h.key).eq_ignore_ascii_case(name)
        },
    )
}

/// Makes `edits` on `list` in order: a new element for an added field (and a replaced one
/// without one), the first element's value for a replaced one, whose later elements are marked
/// removed (`hash` 0), as are every element of a removed one. `link` links each new element
/// where nginx keeps typed access to it. Returns whether an element was marked removed.
///
/// # Safety
/// `list` must be a live request's header list, `pool` its pool.
unsafe fn edit_list(
    list: *mut ngx_list_t,
    pool: *mut ngx_pool_t,
    edits: &[HeaderEdit],
    ignored: impl Fn(&[u8]) -> bool,
    link: impl Fn(&[u8], *mut ngx_table_elt_t),
) -> Result<bool, String> {
    let mut removed = false;
    // SAFETY: the caller's live list; new strings and elements come from the request's pool.
    unsafe {
        for e in edits.iter().filter(|e| !ignored(e.name())) {
            let (name, value, keep_first) = match e {
                HeaderEdit::Add(k, v) => {
                    let h = push_elt(list, pool, k, v).ok_or("out of memory")?;
                    link(k, h);
                    continue;
                }
                HeaderEdit::Replace(k, v) => (k, Some(v), true),
                HeaderEdit::Remove(k) => (k, None, false),
            };
            let mut first = keep_first;
            for h in named(list, name) {
                if first {
                    if let Some(v) = value {
                        (*h).value = pool_str(pool, v).ok_or("out of memory")?;
                    }
                    first = false;
                } else {
                    (*h).hash = 0;
                    removed = true;
                }
            }
            if let (true, Some(v)) = (first, value) {
                // Replaced, and not present: added.
                let h = push_elt(list, pool, name, v).ok_or("out of memory")?;
                link(name, h);
            }
        }
    }
    Ok(removed)
}

/// Removes the elements marked removed (`hash` 0) from `list`, moving the later ones up (parts
/// left empty are unlinked), so that every reader of the list, including those that do not
/// look at `hash` (nginx 1.22's proxy module), sees the fields as they are. Element addresses
/// change: the caller links the typed pointers again.
///
/// # Safety
/// `list` must be a live, initialised header list.
unsafe fn compact(list: *mut ngx_list_t) {
    // SAFETY: walking the list's parts as nginx does, writing only inside them.
    unsafe {
        let mut wpart: *mut ngx_list_part_t = &raw mut (*list).part;
        let mut wi: ngx_uint_t = 0;
        let mut part: *mut ngx_list_part_t = &raw mut (*list).part;
        while !part.is_null() {
            let elts = (*part).elts.cast::<ngx_table_elt_t>();
            for i in 0..(*part).nelts {
                let h = elts.add(i);
                if (*h).hash == 0 {
                    continue;
                }
                if wi == (*list).nalloc {
                    // The write position's part is full: the next part (the read position is
                    // at or past it, so it exists).
                    wpart = (*wpart).next;
                    wi = 0;
                }
                let dst = (*wpart).elts.cast::<ngx_table_elt_t>().add(wi);
                if dst != h {
                    std::ptr::copy_nonoverlapping(h, dst, 1);
                }
                wi = wi.saturating_add(1);
            }
            part = (*part).next;
        }
        // The write position's part ends the list; the parts after it are unlinked (their
        // memory is the pool's): nginx's loops over a list read the first element of every
        // part they step into before checking its count, so an empty part must not follow.
        // New elements go after the last kept one. (A write part after the first always has
        // an element: it is entered only to write one.)
        (*wpart).nelts = wi;
        (*wpart).next = std::ptr::null_mut();
        (*list).last = wpart;
    }
}

/// Applies a deferred request map's edits to `headers_in` in place; `Ok(false)` (nothing
/// changed) when they cannot be (see the module documentation).
///
/// # Errors
/// Out of memory in the request's pool.
///
/// # Safety
/// `r` must be a live request, before its upstream request is created.
pub unsafe fn apply_request_edits(
    r: *mut ngx_http_request_t,
    edits: &[HeaderEdit],
) -> Result<bool, String> {
    // `host` is `:authority`; hop-by-hop fields decide what the filters see.
    let special = |n: &[u8]| {
        matches!(
            n,
            b":authority"
                | b"host"
                | b"connection"
                | b"keep-alive"
                | b"proxy-connection"
                | b"transfer-encoding"
                | b"upgrade"
        )
    };
    // The full write-back applies no other pseudo-header.
    let ignored = |n: &[u8]| n.first() == Some(&b':') && n != b":authority";
    // SAFETY: the request's own header structures, from its pool.
    unsafe {
        if r != (*r).main || edits.iter().any(|e| special(e.name())) {
            // A subrequest's `headers_in` shares its parent's list storage.
            return Ok(false);
        }
        let pool = (*r).pool;
        let hin = &raw mut (*r).headers_in;
        let list = &raw mut (*hin).headers;
        let link = move |k: &[u8], h| link_request_field(hin, pool, k, h);
        if edit_list(list, pool, edits, ignored, link)? {
            compact(list);
            relink_request_fields(hin, pool);
        }
        Ok(true)
    }
}

/// Applies a deferred response map's edits to `headers_out` in place; `Ok(false)` (nothing
/// changed) when they cannot be (see the module documentation). Removed elements keep their
/// place, marked removed (`hash` 0), as nginx's own filters mark them: every reader of
/// `headers_out` skips those.
///
/// # Errors
/// Out of memory in the request's pool.
///
/// # Safety
/// `r` must be a live request in its header filter (headers not sent yet).
pub unsafe fn apply_response_edits(
    r: *mut ngx_http_request_t,
    edits: &[HeaderEdit],
) -> Result<bool, String> {
    // nginx's own fields, its typed ones (read with its own meaning, and pointing at an element
    // a removal would leave), the arrays it links, and the framing it writes itself.
    let special = |n: &[u8]| {
        crate::headers::typed_response_field(n)
            || matches!(
                n,
                b":status"
                    | b"content-type"
                    | b"content-length"
                    | b"cache-control"
                    | b"link"
                    | b"transfer-encoding"
                    | b"connection"
                    | b"keep-alive"
                    | b"proxy-connection"
                    | b"upgrade"
            )
    };
    let ignored = |n: &[u8]| n.first() == Some(&b':') && n != b":status";
    if edits.iter().any(|e| special(e.name())) {
        return Ok(false);
    }
    // SAFETY: the request's own response header structures, from its pool.
    unsafe {
        let pool = (*r).pool;
        let out = &raw mut (*r).headers_out;
        let list = &raw mut (*out).headers;
        let link = move |k: &[u8], h| link_response_field(out, pool, k, h);
        edit_list(list, pool, edits, ignored, link)?;
        Ok(true)
    }
}

/// Writes the filters' changes of the request headers (`response: false`, before the upstream
/// request is created) or of the response headers (in the header filter) back to nginx: a
/// deferred map's edits in place where they can be (then the map reads the changed list
/// afresh), otherwise the whole map, built.
///
/// # Errors
/// Out of memory in the request's pool.
///
/// # Safety
/// `r` must be a live request at that point, `stream` its filters' stream.
pub unsafe fn write_back(
    r: *mut ngx_http_request_t,
    stream: &mut Stream,
    response: bool,
) -> Result<(), String> {
    // SAFETY: the caller's live request at the point its contract names.
    unsafe {
        let deferred = if response {
            stream.response_headers_deferred.as_mut()
        } else {
            stream.request_headers_deferred.as_mut()
        };
        if let Some(d) = deferred {
            let in_place = d.apply_in_place(|edits| {
                if response {
                    apply_response_edits(r, edits)
                } else {
                    apply_request_edits(r, edits)
                }
            })?;
            if in_place {
                return Ok(());
            }
        }
        stream.load_headers(response);
        if response {
            crate::headers::apply_response_map(r, &stream.response_headers)
        } else {
            crate::headers::apply_request_map(r, &stream.request_headers)
        }
    }
}
