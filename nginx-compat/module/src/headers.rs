//! nginx's `headers_in`/`headers_out` to proxy-wasm header maps and back.
//!
//! Request map: Envoy's pseudo-headers `:authority` (the authority nginx routes the request
//! on, [`authority`]: an absolute-form target's, else the Host header, which is then not
//! repeated as `host`), `:path` (the raw request target), `:method`, `:scheme`, then every
//! request header in arrival order, names lower-case.
//!
//! Writing a changed map back rebuilds nginx's header list (so `$http_*` variables and the
//! proxied request see exactly the new set) and re-links the typed pointers nginx keeps for
//! known headers (`headers_in.host`, `.authorization`, `.cookies`, ...). The filters' maps are
//! usually read and edited in place instead (`headers_in_place.rs`), which builds them here
//! only when a filter writes the whole map and falls back on this write-back (why there are
//! two write paths, and when each is taken: the top of `headers_in_place.rs`). Response maps
//! carry `:status`, `content-type` and `content-length` from nginx's dedicated fields.

use std::mem::size_of;

use ngx::ffi::{
    ngx_array_push, ngx_array_t, ngx_hash_key, ngx_http_headers_in_t, ngx_http_headers_out_t,
    ngx_http_request_t, ngx_list_push, ngx_list_t, ngx_palloc, ngx_pool_t, ngx_table_elt_t,
    ngx_uint_t,
};
use tollgate_host::HeaderMap;

use crate::table_elts::table_elts;
use crate::typed_fields::{in_field, IN_FIELDS, OUT_FIELDS};
use crate::util::{bytes, pool_str};

/// The request's header map (see the module documentation), and whether the request carries
/// hop-by-hop fields that must not reach the upstream either (`proxy-connection`, fields
/// nominated by `Connection`): the caller then writes the map back, which drops them (nginx's
/// proxy module would forward them, unseen by the filters).
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn request_map(r: *mut ngx_http_request_t) -> (HeaderMap, bool) {
    let mut map: HeaderMap = Vec::with_capacity(16);
    let mut drops = false;
    // SAFETY: reading the live request.
    unsafe {
        map.push((b":authority".to_vec(), authority(r).to_vec()));
        let hin = &mut (*r).headers_in;
        map.push((b":path".to_vec(), request_target(r)));
        map.push((b":method".to_vec(), bytes(&(*r).method_name).to_vec()));
        let c = (*r).connection;
        let scheme: &[u8] = if !c.is_null() && !(*c).ssl.is_null() {
            b"https"
        } else {
            b"http"
        };
        map.push((b":scheme".to_vec(), scheme.to_vec()));
        let hop = HopByHop::of(std::ptr::from_mut(hin));
        for h in table_elts(&raw mut hin.headers) {
            if (*h).hash == 0 {
                continue;
            }
            let name = bytes(&(*h).key).to_ascii_lowercase();
            if name == b"host" {
                continue;
            }
            if hop.hides(&name) {
                drops |= !hop.nginx_keeps(&name);
                continue;
            }
            map.push((name, bytes(&(*h).value).to_vec()));
        }
    }
    (map, drops)
}

/// The request's `:authority`: the authority nginx chose the `server {}` by and gives as
/// `$host` (before its normalisation: the bytes as the client sent them; the filters
/// canonicalise them). In order:
/// 1. the authority of an absolute-form request target (`GET http://HOST[:PORT]/path`), host
///    and port as sent, whatever the Host header says: RFC 9112 section 3.2.2 (a server MUST
///    ignore Host then; a proxy MUST replace it), and nginx routes on it
///    (`ngx_http_process_request_line` sets `headers_in.server` from the request line's host,
///    and `ngx_http_process_host` then keeps it). nginx's parser (`ngx_http_parse_request_line`)
///    marks it with `host_start`/`host_end` and, when a port follows, `port_end`; the port is
///    read again here as the digits after `host_end`, since nginx 1.22 moves `port_end` with a
///    request line copied to a large header buffer only when `port_start` is set, which its
///    parser never sets. Envoy's HTTP/1 codec sets `:authority` from an absolute URL the same
///    way (`ServerConnectionImpl::handlePath`). A subrequest (which nginx serves in its main
///    request's `server {}`) reads its main request's.
/// 2. the Host header (HTTP/1.1; HTTP/2's `:authority`, which nginx turns into one);
/// 3. `headers_in.server`: empty for an HTTP/1.0 request without Host.
///
/// Pointer reads only, no allocation: `get_header_map_value(":authority")` is on the hot path.
///
/// # Safety
/// `r` must be a live request.
pub(crate) unsafe fn authority<'a>(r: *mut ngx_http_request_t) -> &'a [u8] {
    // SAFETY: the live request; its request line and header strings live as long as it does.
    unsafe {
        if let Some(a) = request_line_authority((*r).main) {
            return a;
        }
        let hin = &(*r).headers_in;
        if hin.host.is_null() {
            bytes(&hin.server)
        } else {
            bytes(&(*hin.host).value)
        }
    }
}

/// The absolute-form target's authority in `r`'s request line (see [`authority`]), checked to
/// lie inside the request line; `None` for any other form (and for HTTP/2, whose requests nginx
/// gives no `host_start`).
///
/// # Safety
/// `r` must be a live request or null.
unsafe fn request_line_authority<'a>(r: *mut ngx_http_request_t) -> Option<&'a [u8]> {
    // SAFETY: the live request's request line (`request_line` points into the buffer nginx read
    // it into, kept for the whole request: `$request` reads it in the log phase).
    unsafe {
        let r = r.as_ref()?;
        let (start, end) = (r.host_start, r.host_end);
        if start.is_null() || end.is_null() || r.request_line.data.is_null() {
            return None;
        }
        let line = bytes(&r.request_line);
        let base = r.request_line.data as usize;
        let from = (start as usize).checked_sub(base)?;
        let host_to = (end as usize).checked_sub(base)?;
        let host = line.get(from..host_to)?;
        let after = line.get(host_to..).unwrap_or_default();
        if after.first() != Some(&b':') {
            return Some(host);
        }
        let digits = after
            .iter()
            .skip(1)
            .take_while(|b| b.is_ascii_digit())
            .count();
        line.get(from..host_to.saturating_add(1).saturating_add(digits))
    }
}

/// Forgets the request line's authority of a main request whose `Host` header was just written
/// from the filters' `:authority` ([`apply_request_map`]), so that [`authority`] reads that
/// header from now on (what the filters wrote, or saw). nginx reads `host_start`, `host_end`
/// and `port_end` only while it parses the request line and when it moves the line to a large
/// header buffer (`ngx_http_request.c`), both over before the phases run; `headers_in.server`
/// (routing, `$host`) is not changed. A subrequest's writes leave its main request alone.
///
/// # Safety
/// `r` must be a live request.
unsafe fn authority_from_host_header(r: *mut ngx_http_request_t) {
    // SAFETY: the live request's own fields.
    unsafe {
        if r == (*r).main {
            (*r).host_start = std::ptr::null_mut();
            (*r).host_end = std::ptr::null_mut();
            (*r).port_end = std::ptr::null_mut();
        }
    }
}

/// The entry count of [`request_map`] when the request has no hop-by-hop field (`connection`,
/// `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade`): then the map needs no
/// decision about hidden fields and can be built later, when a filter first touches it.
/// `None` when the request has such a field (build the map now, with its `drops`).
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn plain_request_count(r: *mut ngx_http_request_t) -> Option<usize> {
    // :authority, :path, :method, :scheme
    let mut n: usize = 4;
    // SAFETY: reading the live request's header list.
    unsafe {
        for h in table_elts(&raw mut (*r).headers_in.headers) {
            if (*h).hash == 0 {
                continue;
            }
            let key = bytes(&(*h).key);
            let hop = match key.len() {
                4 if key.eq_ignore_ascii_case(b"host") => continue,
                7 => key.eq_ignore_ascii_case(b"upgrade"),
                10 => {
                    key.eq_ignore_ascii_case(b"connection")
                        || key.eq_ignore_ascii_case(b"keep-alive")
                }
                16 => key.eq_ignore_ascii_case(b"proxy-connection"),
                17 => key.eq_ignore_ascii_case(b"transfer-encoding"),
                _ => false,
            };
            if hop {
                return None;
            }
            n = n.saturating_add(1);
        }
    }
    Some(n)
}

/// The request's hop-by-hop header fields (RFC 9110 §7.6.1), which filters do not see, as in
/// Envoy (its connection manager removes them before the filters run): `connection`,
/// `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade` (unless the request asks
/// for an upgrade: `Connection: upgrade` with an `Upgrade` field, when both stay), and every
/// field that `Connection` nominates. nginx keeps those it needs for its own framing
/// (`connection`, `keep-alive`, `transfer-encoding`, `upgrade`; its proxy module does not
/// forward them as they are) across a write-back of the map; the others are dropped from the
/// request, as Envoy drops them, so that the upstream never gets a field the filters did not
/// see (e.g. `Connection: x-user` hiding a forged `X-User` from them).
struct HopByHop {
    /// The tokens of every `Connection` field, lower-case: more hop-by-hop field names.
    nominated: Vec<Vec<u8>>,
    upgrade: bool,
}

impl HopByHop {
    /// Reads the `Connection` fields (all of them: a client may send several) and `Upgrade`
    /// from the header list (nginx 1.22 does not fill `headers_in.connection`, and its typed
    /// pointers name one field of several: the list is the only complete source).
    ///
    /// # Safety
    /// `hin` must be a live request's `headers_in`.
    unsafe fn of(hin: *mut ngx_http_headers_in_t) -> HopByHop {
        let mut hop = HopByHop {
            nominated: Vec::new(),
            upgrade: false,
        };
        // SAFETY: the caller's live `headers_in` and its header list.
        unsafe {
            let mut has_upgrade = false;
            for h in table_elts(&raw mut (*hin).headers) {
                if (*h).hash == 0 {
                    continue;
                }
                let key = bytes(&(*h).key);
                if key.eq_ignore_ascii_case(b"upgrade") {
                    has_upgrade = true;
                } else if key.eq_ignore_ascii_case(b"connection") {
                    for token in bytes(&(*h).value).split(|b| *b == b',') {
                        let t = token.trim_ascii();
                        if !t.is_empty() {
                            hop.nominated.push(t.to_ascii_lowercase());
                        }
                    }
                }
            }
            hop.upgrade = has_upgrade && hop.nominates(b"upgrade");
        }
        hop
    }

    /// Whether a `Connection` field names `name` (lower-case).
    fn nominates(&self, name: &[u8]) -> bool {
        self.nominated.iter().any(|t| t == name)
    }

    /// Whether nginx keeps the hidden field `name` when the map is written back.
    fn nginx_keeps(&self, name: &[u8]) -> bool {
        matches!(
            name,
            b"connection" | b"keep-alive" | b"transfer-encoding" | b"upgrade"
        )
    }

    /// Whether a field named `name` (lower-case) is hidden from the filters.
    fn hides(&self, name: &[u8]) -> bool {
        match name {
            b"keep-alive" | b"proxy-connection" | b"transfer-encoding" => true,
            b"connection" | b"upgrade" => !self.upgrade,
            _ => self.nominates(name),
        }
    }
}

/// The request target the upstream gets from `proxy_pass` without a URI part: the client's
/// raw target, or, once a `rewrite` or an internal redirect changed the URI, the new URI
/// escaped as nginx escapes it (`NGX_ESCAPE_URI`) with the arguments.
///
/// # Safety
/// `r` must be a live request.
pub(crate) unsafe fn request_target(r: *mut ngx_http_request_t) -> Vec<u8> {
    // SAFETY: reading the live request; ngx_escape_uri with a null destination only counts.
    unsafe {
        if (*r).valid_unparsed_uri() != 0 {
            return bytes(&(*r).unparsed_uri).to_vec();
        }
        let uri = bytes(&(*r).uri);
        let n =
            ngx::ffi::ngx_escape_uri(std::ptr::null_mut(), uri.as_ptr().cast_mut(), uri.len(), 0);
        let extra = n.saturating_mul(2);
        let mut out = vec![0u8; uri.len().saturating_add(extra)];
        if extra == 0 {
            out.copy_from_slice(uri);
        } else {
            ngx::ffi::ngx_escape_uri(out.as_mut_ptr(), uri.as_ptr().cast_mut(), uri.len(), 0);
        }
        let args = bytes(&(*r).args);
        if !args.is_empty() {
            out.push(b'?');
            out.extend_from_slice(args);
        }
        out
    }
}

/// A fresh header list element for `name: value` in `list` (name lower-case).
pub(crate) unsafe fn push_elt(
    list: *mut ngx_list_t,
    pool: *mut ngx_pool_t,
    name: &[u8],
    value: &[u8],
) -> Option<*mut ngx_table_elt_t> {
    // SAFETY: list and pool are the request's; strings are copied into the pool.
    unsafe {
        let key = pool_str(pool, name)?;
        let val = pool_str(pool, value)?;
        let h = ngx_list_push(list).cast::<ngx_table_elt_t>();
        if h.is_null() {
            return None;
        }
        std::ptr::write_bytes(h, 0, 1);
        (*h).key = key;
        (*h).value = val;
        (*h).lowcase_key = key.data;
        (*h).hash = ngx_hash_key(key.data, key.len).max(1);
        Some(h)
    }
}

/// Pushes `h` into an `ngx_array_t` of `ngx_table_elt_t *` (initialising it if needed).
unsafe fn array_push_ptr(a: *mut ngx_array_t, pool: *mut ngx_pool_t, h: *mut ngx_table_elt_t) {
    // SAFETY: the array belongs to the request; an uninitialised one has null `elts`.
    unsafe {
        if (*a).elts.is_null() {
            let n: ngx_uint_t = 2;
            let elts = ngx_palloc(pool, n.saturating_mul(size_of::<*mut ngx_table_elt_t>()));
            if elts.is_null() {
                return;
            }
            (*a).elts = elts;
            (*a).nelts = 0;
            (*a).size = size_of::<*mut ngx_table_elt_t>();
            (*a).nalloc = n;
            (*a).pool = pool;
        }
        let slot = ngx_array_push(a).cast::<*mut ngx_table_elt_t>();
        if !slot.is_null() {
            *slot = h;
        }
    }
}

/// Re-initialises `list` in place as an empty header list (an `ngx_list_t` points to its own
/// first part: it must never be moved after initialisation).
unsafe fn reset_list(list: *mut ngx_list_t, pool: *mut ngx_pool_t, n: usize) -> Option<()> {
    // SAFETY: ngx_list_init allocates the first part from the pool and links `last` to
    // `(*list).part`, in place.
    unsafe {
        if ngx::ffi::ngx_list_init(list, pool, n.max(4), size_of::<ngx_table_elt_t>()) != 0 {
            return None;
        }
        Some(())
    }
}

/// Links a new element `h` of `headers_in`'s list named `name` (lower-case) where nginx keeps
/// typed access to it: the `cookies` and `x_forwarded_for` arrays, or the typed pointer of its
/// name when that is still unset (nginx's parser links the first of several too).
///
/// # Safety
/// `hin` must be a live request's `headers_in`, `h` an element of its list.
pub(crate) unsafe fn link_request_field(
    hin: *mut ngx_http_headers_in_t,
    pool: *mut ngx_pool_t,
    name: &[u8],
    h: *mut ngx_table_elt_t,
) {
    // SAFETY: the caller's live `headers_in`; offsets from `offset_of!` on its type.
    unsafe {
        if name == b"cookie" {
            array_push_ptr(&raw mut (*hin).cookies, pool, h);
        } else if name == b"x-forwarded-for" {
            array_push_ptr(&raw mut (*hin).x_forwarded_for, pool, h);
        } else if let Some(off) = in_field(name) {
            let field = hin.cast::<u8>().add(off).cast::<*mut ngx_table_elt_t>();
            if (*field).is_null() {
                *field = h;
            }
        }
    }
}

/// Links every element of `headers_in`'s list again (after its elements moved): typed pointers
/// and arrays emptied, then each element linked as [`link_request_field`] does.
///
/// # Safety
/// `hin` must be a live main request's `headers_in` (its arrays are its own).
pub(crate) unsafe fn relink_request_fields(hin: *mut ngx_http_headers_in_t, pool: *mut ngx_pool_t) {
    // SAFETY: the caller's live `headers_in` and its list.
    unsafe {
        for (_, off) in IN_FIELDS {
            *hin.cast::<u8>().add(*off).cast::<*mut ngx_table_elt_t>() = std::ptr::null_mut();
        }
        (*hin).cookies.nelts = 0;
        (*hin).x_forwarded_for.nelts = 0;
        for h in table_elts(&raw mut (*hin).headers) {
            // `lowcase_key`: nginx's parser and `push_elt` set it (`key.len` bytes).
            if (*h).hash != 0 && !(*h).lowcase_key.is_null() {
                let name = std::slice::from_raw_parts((*h).lowcase_key, (*h).key.len);
                link_request_field(hin, pool, name, h);
            } else if (*h).hash != 0 {
                let name = bytes(&(*h).key).to_ascii_lowercase();
                link_request_field(hin, pool, &name, h);
            }
        }
    }
}

/// Links a new element `h` of `headers_out`'s list named `name` (lower-case): the
/// `cache_control` and `link` arrays, or the typed pointer of its name when still unset.
///
/// # Safety
/// `out` must be a live request's `headers_out`, `h` an element of its list.
pub(crate) unsafe fn link_response_field(
    out: *mut ngx_http_headers_out_t,
    pool: *mut ngx_pool_t,
    name: &[u8],
    h: *mut ngx_table_elt_t,
) {
    // SAFETY: the caller's live `headers_out`; offsets from `offset_of!` on its type.
    unsafe {
        if name == b"cache-control" {
            array_push_ptr(&raw mut (*out).cache_control, pool, h);
        } else if name == b"link" {
            array_push_ptr(&raw mut (*out).link, pool, h);
        } else if let Some((_, off)) = OUT_FIELDS.iter().find(|(n, _)| *n == name) {
            let field = out.cast::<u8>().add(*off).cast::<*mut ngx_table_elt_t>();
            if (*field).is_null() {
                *field = h;
            }
        }
    }
}

/// Whether `name` (lower-case) has a typed pointer in `headers_out` (nginx reads those fields
/// with its own meaning: dates, `Location`, `Server`...).
pub(crate) fn typed_response_field(name: &[u8]) -> bool {
    OUT_FIELDS.iter().any(|(n, _)| *n == name)
}

/// Writes a changed request map back to `headers_in` (pseudo-headers: `:authority` becomes
/// the Host header, which [`authority`] then reads; `:path`, `:method`, `:scheme` changes are
/// not applied).
///
/// # Safety
/// `r` must be a live request, before its upstream request is created.
pub unsafe fn apply_request_map(r: *mut ngx_http_request_t, map: &HeaderMap) -> Result<(), String> {
    // SAFETY: rebuilding the request's own header structures from its pool.
    unsafe {
        let pool = (*r).pool;
        let hin: *mut ngx_http_headers_in_t = &raw mut (*r).headers_in;
        let list: *mut ngx_list_t = &raw mut (*hin).headers;
        // The hop-by-hop fields the filters did not see and nginx needs stay.
        let kept: Vec<(Vec<u8>, Vec<u8>)> = {
            let hop = HopByHop::of(hin);
            table_elts(list)
                .filter(|h| (**h).hash != 0)
                .map(|h| {
                    (
                        bytes(&(*h).key).to_ascii_lowercase(),
                        bytes(&(*h).value).to_vec(),
                    )
                })
                .filter(|(k, _)| hop.hides(k) && hop.nginx_keeps(k))
                .collect()
        };
        reset_list(list, pool, map.len().saturating_add(kept.len())).ok_or("out of memory")?;
        for (_, off) in IN_FIELDS {
            *hin.cast::<u8>().add(*off).cast::<*mut ngx_table_elt_t>() = std::ptr::null_mut();
        }
        // Fresh arrays (null `elts`: array_push_ptr allocates): a subrequest's `headers_in`
        // is a copy of its parent's, sharing their storage.
        (*hin).cookies.elts = std::ptr::null_mut();
        (*hin).cookies.nelts = 0;
        (*hin).x_forwarded_for.elts = std::ptr::null_mut();
        (*hin).x_forwarded_for.nelts = 0;
        for (name, value) in kept.iter().chain(map.iter()) {
            let name: &[u8] = if name == b":authority" { b"host" } else { name };
            if name.first() == Some(&b':') {
                continue;
            }
            let name = name.to_ascii_lowercase();
            let h = push_elt(list, pool, &name, value).ok_or("out of memory")?;
            link_request_field(hin, pool, &name, h);
        }
        // The request line's Host (absolute URI) stays authoritative for `server` (routing);
        // the filters' `:authority` is the Host header now.
        if map.iter().any(|(k, _)| k == b":authority") {
            authority_from_host_header(r);
        }
        Ok(())
    }
}

/// The response's header map: `:status`, then `content-type`, `content-length`, and the list.
///
/// # Safety
/// `r` must be a live request in its header filter.
pub unsafe fn response_map(r: *mut ngx_http_request_t) -> HeaderMap {
    let mut map: HeaderMap = Vec::with_capacity(16);
    // SAFETY: reading the live request.
    unsafe {
        let out = &mut (*r).headers_out;
        map.push((b":status".to_vec(), out.status.to_string().into_bytes()));
        if out.content_type.len > 0 {
            map.push((b"content-type".to_vec(), content_type_value(out)));
        }
        if out.content_length.is_null() && out.content_length_n >= 0 {
            map.push((
                b"content-length".to_vec(),
                out.content_length_n.to_string().into_bytes(),
            ));
        }
        push_list(&mut map, &raw mut out.headers);
    }
    map
}

/// The response map's `content-type`: nginx's `content_type` with its `charset` when that is
/// set and the type does not name one.
pub(crate) fn content_type_value(out: &ngx_http_headers_out_t) -> Vec<u8> {
    content_type_with_charset(out).unwrap_or_else(|| bytes(&out.content_type).to_vec())
}

/// [`content_type_value`] when it differs from nginx's `content_type` (a charset appended);
/// `None` when it is that field as it is.
pub(crate) fn content_type_with_charset(out: &ngx_http_headers_out_t) -> Option<Vec<u8>> {
    let ct = bytes(&out.content_type);
    if out.charset.len == 0 || ct.windows(8).any(|w| w.eq_ignore_ascii_case(b"charset=")) {
        return None;
    }
    let mut with = Vec::with_capacity(ct.len().saturating_add(10).saturating_add(out.charset.len));
    with.extend_from_slice(ct);
    with.extend_from_slice(b"; charset=");
    with.extend_from_slice(bytes(&out.charset));
    Some(with)
}

/// The entry count of [`response_map`], without building it.
///
/// # Safety
/// `r` must be a live request in its header filter.
pub unsafe fn response_count(r: *mut ngx_http_request_t) -> usize {
    // SAFETY: reading the live request.
    unsafe {
        let out = &mut (*r).headers_out;
        let fields = usize::from(out.content_type.len > 0).saturating_add(usize::from(
            out.content_length.is_null() && out.content_length_n >= 0,
        ));
        let listed = table_elts(&raw mut out.headers)
            .filter(|h| (**h).hash != 0)
            .count();
        listed.saturating_add(fields).saturating_add(1) // :status
    }
}

/// Appends the entries of an nginx header list to `map`, names lower-case, skipping removed
/// ones (`hash` 0, nginx's removal mark).
///
/// # Safety
/// `list` must be a live, initialised `ngx_list_t` of `ngx_table_elt_t`.
unsafe fn push_list(map: &mut HeaderMap, list: *mut ngx_list_t) {
    // SAFETY: the caller's list; its elements and strings live as long as the request.
    unsafe {
        for h in table_elts(list) {
            if (*h).hash == 0 {
                continue;
            }
            map.push((
                bytes(&(*h).key).to_ascii_lowercase(),
                bytes(&(*h).value).to_vec(),
            ));
        }
    }
}

/// Writes a changed response map back to `headers_out`.
///
/// # Safety
/// `r` must be a live request in its header filter (headers not sent yet).
pub unsafe fn apply_response_map(
    r: *mut ngx_http_request_t,
    map: &HeaderMap,
) -> Result<(), String> {
    // SAFETY: rebuilding the request's own response header structures from its pool.
    unsafe {
        let pool = (*r).pool;
        let out: *mut ngx_http_headers_out_t = &raw mut (*r).headers_out;
        let list: *mut ngx_list_t = &raw mut (*out).headers;
        reset_list(list, pool, map.len()).ok_or("out of memory")?;
        for (_, off) in OUT_FIELDS {
            *out.cast::<u8>().add(*off).cast::<*mut ngx_table_elt_t>() = std::ptr::null_mut();
        }
        (*out).cache_control.nelts = 0;
        (*out).link.nelts = 0;
        (*out).content_type.len = 0;
        (*out).content_type_len = 0;
        (*out).charset.len = 0;
        (*out).content_type_lowcase = std::ptr::null_mut();
        (*out).content_type_hash = 0;
        (*out).content_length_n = -1;
        (*out).last_modified_time = -1;
        for (name, value) in map {
            let name = name.to_ascii_lowercase();
            match name.as_slice() {
                b":status" => {
                    if let Some(s) = std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.trim().parse::<ngx_uint_t>().ok())
                    {
                        if (100..1000).contains(&s) {
                            (*out).status = s;
                            (*out).status_line.len = 0;
                            (*out).status_line.data = std::ptr::null_mut();
                        }
                    }
                }
                b"content-type" => {
                    let v = pool_str(pool, value).ok_or("out of memory")?;
                    (*out).content_type = v;
                    (*out).content_type_len =
                        value.iter().position(|b| *b == b';').unwrap_or(value.len());
                }
                b"content-length" => {
                    if let Some(n) = std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                    {
                        (*out).content_length_n = n;
                    }
                }
                _ if name.first() == Some(&b':') => {}
                // Framing is nginx's: it writes its own Transfer-Encoding, Connection and
                // Keep-Alive, so a filter's copies would contradict them (a client then reads a
                // body framed one way as another, and the next response on the connection with
                // it). Dropped as Envoy drops them from responses; Upgrade stays on a 101.
                b"transfer-encoding" | b"connection" | b"keep-alive" | b"proxy-connection" => {}
                b"upgrade" if (*out).status != 101 => {}
                _ => {
                    let h = push_elt(list, pool, &name, value).ok_or("out of memory")?;
                    link_response_field(out, pool, &name, h);
                }
            }
        }
        Ok(())
    }
}

/// The response trailers nginx has for the request (`headers_out.trailers`: an upstream's, as
/// `grpc_pass` passes them, or a filter's earlier writes), names lower-case.
///
/// # Safety
/// `r` must be a live main request.
pub unsafe fn trailers_map(r: *mut ngx_http_request_t) -> HeaderMap {
    let mut map: HeaderMap = Vec::new();
    // SAFETY: headers_out.trailers is initialised with the request (ngx_http_alloc_request).
    unsafe { push_list(&mut map, &raw mut (*r).headers_out.trailers) };
    map
}

/// Replaces `headers_out.trailers` with `map` (pseudo-headers are dropped). nginx sends them
/// after the last buffer: as the chunked trailer section (HTTP/1.1, chunked responses only) or
/// a trailing HEADERS frame (HTTP/2).
///
/// # Safety
/// `r` must be a live main request whose last body buffer has not passed the chunked / HTTP/2
/// filters yet.
pub unsafe fn apply_trailers(r: *mut ngx_http_request_t, map: &HeaderMap) -> Result<(), String> {
    // SAFETY: rebuilding the request's own trailer list from its pool.
    unsafe {
        let pool = (*r).pool;
        let list: *mut ngx_list_t = &raw mut (*r).headers_out.trailers;
        reset_list(list, pool, map.len()).ok_or("out of memory")?;
        for (name, value) in map {
            if name.first() == Some(&b':') {
                continue;
            }
            push_elt(list, pool, &name.to_ascii_lowercase(), value).ok_or("out of memory")?;
        }
        Ok(())
    }
}
