//! Allocations a worker keeps from one request for the next: the request context and the three
//! sources its stream reads nginx through (the property source, the request and response header
//! sources). Each is a fresh allocation of glibc's per request otherwise: the context (about
//! 0.9 KB) from its slow path in nginx's heap, about 370 instructions to allocate and free, the
//! sources about 130 each (callgrind, `bench/instructions.py`'s `floor-1`).
//!
//! A kept allocation holds no value: the old one is dropped when it is kept, and the next
//! request writes a whole new value into it ([`Box::write`]), so nothing of one request
//! reaches the next. At most [`KEPT`] of each kind are kept per worker.

use std::any::Any;
use std::cell::RefCell;
use std::mem::MaybeUninit;

use tollgate_host::Stream;

use super::context::RequestCtx;
use crate::headers_in_place::{RequestSource, ResponseSource};
use crate::props::NgxProps;

/// Most allocations of each kind a worker keeps (requests in flight at once return theirs).
const KEPT: usize = 16;

/// Freed allocations of one kind (their values dropped).
struct Kept<T>(Vec<Box<MaybeUninit<T>>>);

impl<T> Kept<T> {
    const fn new() -> Self {
        Kept(Vec::new())
    }

    /// Drops `b`'s value and keeps its allocation (frees it when [`KEPT`] are kept).
    fn keep(&mut self, b: Box<T>) {
        let raw = Box::into_raw(b);
        // SAFETY: `raw` is a live, initialised value of a Box, dropped once here; the
        // allocation is then owned again as uninitialised memory of the same layout
        // (`MaybeUninit<T>` is `T`'s).
        let spare = unsafe {
            std::ptr::drop_in_place(raw);
            Box::from_raw(raw.cast::<MaybeUninit<T>>())
        };
        if self.0.len() < KEPT {
            self.0.push(spare);
        }
    }
}

struct Spares {
    contexts: Kept<RequestCtx>,
    props: Kept<NgxProps>,
    requests: Kept<RequestSource>,
    responses: Kept<ResponseSource>,
}

thread_local! {
    static SPARES: RefCell<Spares> = const {
        RefCell::new(Spares {
            contexts: Kept::new(),
            props: Kept::new(),
            requests: Kept::new(),
            responses: Kept::new(),
        })
    };
}

/// Runs `f` on the worker's spares; `None` while they are unavailable (being destroyed at
/// thread exit, or borrowed).
fn with<R>(f: impl FnOnce(&mut Spares) -> R) -> Option<R> {
    SPARES
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

/// `value` boxed, in a kept allocation where there is one.
fn boxed<T>(value: T, kind: impl FnOnce(&mut Spares) -> &mut Kept<T>) -> Box<T> {
    let spare = with(|s| kind(s).0.pop()).flatten();
    Box::write(spare.unwrap_or_else(Box::new_uninit), value)
}

/// A request context in a kept allocation where there is one.
pub fn context(value: RequestCtx) -> Box<RequestCtx> {
    boxed(value, |s| &mut s.contexts)
}

/// A property source in a kept allocation where there is one.
pub fn props(value: NgxProps) -> Box<NgxProps> {
    boxed(value, |s| &mut s.props)
}

/// A request header source in a kept allocation where there is one.
pub fn request_source(value: RequestSource) -> Box<RequestSource> {
    boxed(value, |s| &mut s.requests)
}

/// A response header source in a kept allocation where there is one.
pub fn response_source(value: ResponseSource) -> Box<ResponseSource> {
    boxed(value, |s| &mut s.responses)
}

/// Drops a finished request's context, keeping its allocation and those of its stream's
/// sources (the ones this module made: recognised by their type).
pub fn keep_context(mut ctx: Box<RequestCtx>) {
    let stream: &mut Stream = &mut ctx.stream;
    let props = stream.property_source.take().map(|p| p as Box<dyn Any>);
    let request = stream
        .request_headers_deferred
        .take()
        .map(|d| d.source as Box<dyn Any>);
    let response = stream
        .response_headers_deferred
        .take()
        .map(|d| d.source as Box<dyn Any>);
    // Spares unavailable (thread exit): the closure is dropped, and with it every box.
    let _ = with(|s| {
        if let Some(Ok(p)) = props.map(<Box<dyn Any>>::downcast::<NgxProps>) {
            s.props.keep(p);
        }
        if let Some(Ok(r)) = request.map(<Box<dyn Any>>::downcast::<RequestSource>) {
            s.requests.keep(r);
        }
        if let Some(Ok(r)) = response.map(<Box<dyn Any>>::downcast::<ResponseSource>) {
            s.responses.keep(r);
        }
        s.contexts.keep(ctx);
    });
}
