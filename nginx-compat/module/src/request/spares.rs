//! Allocations a worker keeps from one request for the next: the request context, the three
//! sources its stream reads nginx through (the property source, the request and response header
//! sources), its buffers (the properties filters set, the body chunks they see) and the lists
//! its deferred header maps keep the filters' edits in. Each is a fresh allocation of glibc's
//! per request otherwise: the context (about 0.9 KB) from its slow path in nginx's heap, about
//! 370 instructions to allocate and free, the sources about 130 each (callgrind,
//! `bench/instructions.py`'s `floor-1`), the buffers and lists one or more each.
//!
//! A kept allocation holds no value: the old one is dropped when it is kept, and the next
//! request writes a whole new value into it ([`Box::write`]), so nothing of one request
//! reaches the next; buffers and lists are cleared. How many and how large are kept:
//! `spare_bounds.rs`. A new context and its buffers come out of the spares together.

use std::any::Any;
use std::cell::RefCell;
use std::mem::MaybeUninit;

use tollgate_host::{DeferredMap, HeaderEdit, PropertyStore, Stream};

use super::context::RequestCtx;
use super::spare_bounds::{worth_keeping, KEPT};
use crate::headers_in_place::{RequestSource, ResponseSource};
use crate::props::NgxProps;

/// A finished request's buffers, cleared: its stream's, and the lists its deferred header
/// maps kept the edits in.
#[derive(Default)]
pub struct StreamBuffers {
    /// `Stream::properties`.
    pub properties: PropertyStore,
    /// `Stream::request_body`.
    pub request_body: Vec<u8>,
    /// `Stream::response_body`.
    pub response_body: Vec<u8>,
    /// The request headers' edits (`RequestCtx::spare_edits`).
    pub request_edits: Vec<HeaderEdit>,
    /// The response headers' edits.
    pub response_edits: Vec<HeaderEdit>,
}

impl StreamBuffers {
    /// Takes `ctx`'s buffers, cleared, when they are worth keeping ([`worth_keeping`]; else
    /// they go with the context), and the sources of its deferred maps (as `Any`, to be
    /// recognised).
    fn take(ctx: &mut RequestCtx) -> (Option<StreamBuffers>, [Option<Box<dyn Any>>; 2]) {
        let stream: &mut Stream = &mut ctx.stream;
        let (request, request_edits) = parts(
            stream.request_headers_deferred.take(),
            &mut ctx.spare_edits.0,
        );
        let (response, response_edits) = parts(
            stream.response_headers_deferred.take(),
            &mut ctx.spare_edits.1,
        );
        let bytes = stream
            .properties
            .allocated()
            .saturating_add(stream.request_body.capacity())
            .saturating_add(stream.response_body.capacity());
        let edits = [request_edits.capacity(), response_edits.capacity()];
        if !worth_keeping(bytes, edits) {
            return (None, [request, response]);
        }
        let mut b = StreamBuffers {
            properties: std::mem::take(&mut stream.properties),
            request_body: std::mem::take(&mut stream.request_body),
            response_body: std::mem::take(&mut stream.response_body),
            request_edits,
            response_edits,
        };
        b.properties.clear();
        b.request_body.clear();
        b.response_body.clear();
        (Some(b), [request, response])
    }
}

/// Freed allocations of one kind (their values dropped).
struct Kept<T>(Vec<Box<MaybeUninit<T>>>);

impl<T> Kept<T> {
    const fn new() -> Self {
        Kept(Vec::new())
    }

    /// Drops `b`'s value and keeps its allocation (frees it when `spare_bounds::KEPT` are kept).
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
    buffers: Vec<StreamBuffers>,
}

thread_local! {
    static SPARES: RefCell<Spares> = const {
        RefCell::new(Spares {
            contexts: Kept::new(),
            props: Kept::new(),
            requests: Kept::new(),
            responses: Kept::new(),
            buffers: Vec::new(),
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

/// A request context in a kept allocation where there is one, made by `make` from buffers
/// kept from an earlier request where there are some (one access to the spares for both).
pub fn context(make: impl FnOnce(StreamBuffers) -> RequestCtx) -> Box<RequestCtx> {
    let (spare, buffers) = with(|s| (s.contexts.0.pop(), s.buffers.pop())).unwrap_or_default();
    Box::write(
        spare.unwrap_or_else(Box::new_uninit),
        make(buffers.unwrap_or_default()),
    )
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
/// sources (the ones this module made: recognised by their type) and buffers.
pub fn keep_context(mut ctx: Box<RequestCtx>) {
    let (buffers, [request, response]) = StreamBuffers::take(&mut ctx);
    let props = ctx.stream.property_source.take().map(|p| p as Box<dyn Any>);
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
        if let Some(b) = buffers.filter(|_| s.buffers.len() < KEPT) {
            s.buffers.push(b);
        }
        s.contexts.keep(ctx);
    });
}

/// A deferred map's source (as `Any`, to be recognised) and its edits' list; without a map,
/// the list the context kept for one (`spare`).
fn parts(
    map: Option<DeferredMap>,
    spare: &mut Vec<HeaderEdit>,
) -> (Option<Box<dyn Any>>, Vec<HeaderEdit>) {
    match map.map(DeferredMap::into_parts) {
        Some((source, edits)) => (Some(source as Box<dyn Any>), edits),
        None => (None, std::mem::take(spare)),
    }
}
