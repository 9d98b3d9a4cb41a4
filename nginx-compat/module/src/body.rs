//! Request and response bodies: nginx buffer chains to bytes and back.

use std::os::unix::fs::FileExt;

use ngx::ffi::{
    ngx_alloc_chain_link, ngx_buf_t, ngx_chain_t, ngx_create_temp_buf, ngx_http_request_t,
};

use crate::table_elts::table_elts;

/// Reads the bytes of one buffer (memory, or the file part of a file buffer).
///
/// # Safety
/// `b` must be a live buffer.
unsafe fn buf_bytes(b: *mut ngx_buf_t, out: &mut Vec<u8>) {
    // SAFETY: memory buffers span pos..last; file buffers file_pos..file_last of an open fd.
    unsafe {
        if (*b).in_file() != 0 && !(*b).file.is_null() {
            let (Ok(start), Ok(end)) =
                (u64::try_from((*b).file_pos), u64::try_from((*b).file_last))
            else {
                return;
            };
            let Ok(len) = usize::try_from(end.saturating_sub(start)) else {
                return;
            };
            let fd = (*(*b).file).fd;
            // Borrow the descriptor without taking ownership (nginx closes it).
            let file = std::mem::ManuallyDrop::new(
                <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd),
            );
            let mut buf = vec![0u8; len];
            if file.read_exact_at(&mut buf, start).is_ok() {
                out.extend_from_slice(&buf);
            }
            return;
        }
        if !(*b).pos.is_null() && !(*b).last.is_null() && (*b).last > (*b).pos {
            let len = usize::try_from((*b).last.offset_from((*b).pos)).unwrap_or(0);
            out.extend_from_slice(std::slice::from_raw_parts((*b).pos, len));
        }
    }
}

/// Appends the bytes of a chain to `out` (a buffer the caller reuses from request to request);
/// returns whether the chain ends the stream (`last_buf`/`last_in_chain`), and whether it asks
/// for a flush.
///
/// # Safety
/// `chain` must be a live chain.
pub unsafe fn chain_bytes(chain: *mut ngx_chain_t, out: &mut Vec<u8>) -> (bool, bool) {
    let (mut eos, mut flush) = (false, false);
    // SAFETY: walking a live chain.
    unsafe {
        let mut cl = chain;
        while !cl.is_null() {
            let b = (*cl).buf;
            if !b.is_null() {
                buf_bytes(b, out);
                eos |= (*b).last_buf() != 0;
                flush |= (*b).flush() != 0;
            }
            cl = (*cl).next;
        }
    }
    (eos, flush)
}

/// Marks every buffer of `chain` as consumed (its owner may reuse it).
///
/// # Safety
/// `chain` must be a live chain.
pub unsafe fn consume(chain: *mut ngx_chain_t) {
    // SAFETY: as nginx's filters do when they take over a buffer's content.
    unsafe {
        let mut cl = chain;
        while !cl.is_null() {
            let b = (*cl).buf;
            if !b.is_null() {
                (*b).pos = (*b).last;
                (*b).file_pos = (*b).file_last;
            }
            cl = (*cl).next;
        }
    }
}

/// A one-buffer chain holding `data` in the request pool.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn memory_chain(
    r: *mut ngx_http_request_t,
    data: &[u8],
    last: bool,
    flush: bool,
) -> Option<*mut ngx_chain_t> {
    // SAFETY: pool allocations of the request.
    unsafe {
        let pool = (*r).pool;
        let b = ngx_create_temp_buf(pool, data.len().max(1));
        if b.is_null() {
            return None;
        }
        if data.is_empty() {
            (*b).set_temporary(0);
            (*b).pos = std::ptr::null_mut();
            (*b).last = std::ptr::null_mut();
            (*b).start = std::ptr::null_mut();
            (*b).end = std::ptr::null_mut();
            (*b).set_sync(1);
        } else {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (*b).last, data.len());
            (*b).last = (*b).last.add(data.len());
        }
        if last {
            (*b).set_last_buf(u32::from(r == (*r).main));
            (*b).set_last_in_chain(1);
        }
        if flush {
            (*b).set_flush(1);
        }
        let cl = ngx_alloc_chain_link(pool);
        if cl.is_null() {
            return None;
        }
        (*cl).buf = b;
        (*cl).next = std::ptr::null_mut();
        Some(cl)
    }
}

/// The client body read by `ngx_http_read_client_request_body`, into `out` (cleared first).
///
/// # Safety
/// `r` must be a live request whose body has been read.
pub unsafe fn read_request_body(r: *mut ngx_http_request_t, out: &mut Vec<u8>) {
    out.clear();
    // SAFETY: r->request_body is set once the body is read.
    unsafe {
        let rb = (*r).request_body;
        if rb.is_null() || (*rb).bufs.is_null() {
            return;
        }
        chain_bytes((*rb).bufs, out);
    }
}

/// Replaces the client body (what the upstream will receive) and its Content-Length.
///
/// # Safety
/// `r` must be a live request whose body has been read, before the upstream request is made.
pub unsafe fn replace_request_body(r: *mut ngx_http_request_t, body: &[u8]) -> Option<()> {
    // SAFETY: replacing the request's own structures with pool allocations.
    unsafe {
        let rb = (*r).request_body;
        if rb.is_null() {
            return None;
        }
        let cl = memory_chain(r, body, true, false)?;
        (*rb).bufs = cl;
        (*rb).temp_file = std::ptr::null_mut();
        let len = i64::try_from(body.len()).ok()?;
        (*r).headers_in.content_length_n = len;
        let text = body.len().to_string();
        for h in table_elts(&raw mut (*r).headers_in.headers) {
            if crate::util::bytes(&(*h).key).eq_ignore_ascii_case(b"content-length") {
                (*h).value = crate::util::pool_str((*r).pool, text.as_bytes())?;
            }
        }
        Some(())
    }
}
