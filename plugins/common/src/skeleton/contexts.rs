//! The root and HTTP contexts of every filter, generic over [`Filter`].
//!
//! A filter implements [`Filter`] (its configuration, what its root context shares with the HTTP
//! contexts, its per-request state, and the phases it acts in) and registers
//! `Root::<TheFilter>::default()` as its root context ([`main`]). The contexts here do what every
//! filter did alike:
//! - `on_configure`: the plugin configuration read with the raw ABI (the SDK's
//!   `get_plugin_configuration` unwraps host errors) and parsed; a bad one is refused
//!   (`on_configure` returns false, so the host refuses the plugin) with one log line naming the
//!   field ([`crate::config::ConfigError`]).
//! - every HTTP callback: without a configuration (the host created a request's context though
//!   `on_configure` failed or never ran), the request headers are refused, 500
//!   `{"error":"internal_error","message":"<filter> is not configured"}`, and the later
//!   callbacks do nothing: a gate fails closed. A callback of a configured request whose filter
//!   sets an `error_format` or keeps its target runs between `host_calls::enter_request` and
//!   `leave_request`: its refusals use that format (`crate::error_envelope`) and that target.
//!
//! Host calls that dispatch a call from a phase take [`Calls`] as the SDK's `Context`: the SDK
//! registers the call's token with the context being called back, whichever object makes it
//! (proxy-wasm 0.2.5, `hostcalls::dispatch_grpc_call`).

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

use crate::clock::UnixNanos;
use crate::config::ConfigError;
use crate::error_envelope::ErrorFormat;
use crate::host_calls::{enter_request, leave_request, now, plugin_configuration, send_json_error};

/// A filter's plugin configuration: parsed from the bytes the host gives (JSON), or refused
/// with the field at fault.
pub trait FilterConfig: Sized {
    /// Parses the plugin configuration. Errors name the JSON path of the offending field.
    fn parse(bytes: &[u8]) -> Result<Self, ConfigError>;

    /// The envelope of the filter's refusals (its `error_format` field,
    /// `crate::error_envelope`); `auto` for a filter without one.
    fn error_format(&self) -> ErrorFormat {
        ErrorFormat::Auto
    }
}

/// One filter, as the skeleton's contexts drive it. Every phase has a default that does
/// nothing and continues; `shared` is what [`Filter::configure`] built.
pub trait Filter: Sized + 'static {
    /// The filter's name in replies and log lines (`jwt-auth`).
    const NAME: &'static str;
    /// Whether the filter keeps its request's target for a refusal in a later callback
    /// (`host_calls::keep_request_target`): then each of its callbacks carries the kept target in
    /// and out. A filter that does not, with `error_format` `auto`, runs its callbacks with no
    /// such work (the refusal state is the default outside the callbacks that set it).
    const KEEPS_REQUEST_TARGET: bool = false;
    /// The plugin configuration.
    type Config: FilterConfig;
    /// What the root context shares with its HTTP contexts (configuration, counters, caches).
    type Shared: 'static;
    /// The root context's own state (documents fetched on ticks, calls in flight).
    type Root: Default + 'static;
    /// One request's state, fresh for each request.
    type Request: Default + 'static;

    /// Builds the shared state from a parsed configuration (`started`: the host's clock when
    /// `on_configure` began, for load-time log lines); `None` refuses the configuration, the
    /// filter having logged why.
    fn configure(
        config: Self::Config,
        root: &mut Self::Root,
        started: Option<UnixNanos>,
    ) -> Option<Self::Shared>;

    /// `on_http_request_headers`.
    fn request_headers(
        request: &mut Self::Request,
        shared: &Rc<Self::Shared>,
        end_of_stream: bool,
    ) -> Action;

    /// `on_http_request_body` (`body_size`: the bytes the host holds).
    fn request_body(
        _request: &mut Self::Request,
        _shared: &Rc<Self::Shared>,
        _body_size: usize,
        _end_of_stream: bool,
    ) -> Action {
        Action::Continue
    }

    /// `on_http_request_trailers`.
    fn request_trailers(_request: &mut Self::Request, _shared: &Rc<Self::Shared>) -> Action {
        Action::Continue
    }

    /// `on_http_response_headers`.
    fn response_headers(
        _request: &mut Self::Request,
        _shared: &Rc<Self::Shared>,
        _end_of_stream: bool,
    ) -> Action {
        Action::Continue
    }

    /// `on_http_response_body`.
    fn response_body(
        _request: &mut Self::Request,
        _shared: &Rc<Self::Shared>,
        _body_size: usize,
        _end_of_stream: bool,
    ) -> Action {
        Action::Continue
    }

    /// `on_log`: the stream is over (Envoy calls it for local replies too).
    fn log(_request: &mut Self::Request, _shared: &Rc<Self::Shared>) {}

    /// The reply (or failure) of a gRPC call made by this request (proxy-wasm
    /// `on_grpc_call_response`: status 0 and the reply's size, or the gRPC status and 0).
    fn request_grpc_reply(
        _request: &mut Self::Request,
        _shared: &Rc<Self::Shared>,
        _token: u32,
        _status_code: u32,
        _response_size: usize,
    ) {
    }

    /// `on_tick` of the root context.
    fn tick(_root: &mut Self::Root, _shared: &Rc<Self::Shared>) {}

    /// `on_done` of the root context: the host is shutting the plugin down (Envoy: the
    /// plugin's configuration is removed or the worker stops; nginx: the worker exits, on a
    /// reload too). The last chance to hand the host what the VM still holds; the skeleton then
    /// answers that the context is done (proxy-wasm ABI: `proxy_on_done` returns true).
    fn done(_root: &mut Self::Root, _shared: &Rc<Self::Shared>) {}

    /// The reply of an HTTP call made by the root context (`body_size` bytes of body).
    fn root_http_reply(
        _root: &mut Self::Root,
        _shared: &Rc<Self::Shared>,
        _token: u32,
        _body_size: usize,
    ) {
    }

    /// The reply (or failure) of a gRPC call made by the root context.
    fn root_grpc_reply(
        _root: &mut Self::Root,
        _shared: &Rc<Self::Shared>,
        _token: u32,
        _status_code: u32,
        _response_size: usize,
    ) {
    }
}

/// The SDK's `Context` for calls dispatched from a phase: the token is registered with the
/// context being called back, not with this object.
pub struct Calls;

impl Context for Calls {}

/// Installs the logger and filter `F`'s root context: what a filter's `proxy_wasm::main!` does.
pub fn main<F: Filter>() {
    crate::host_calls::init_log(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::<F>::default()) });
}

/// Filter `F`'s root context.
pub struct Root<F: Filter> {
    shared: Option<Rc<F::Shared>>,
    state: F::Root,
    /// The configuration's `error_format`, handed to each HTTP context.
    error_format: ErrorFormat,
}

impl<F: Filter> Default for Root<F> {
    fn default() -> Self {
        Root {
            shared: None,
            state: F::Root::default(),
            error_format: ErrorFormat::Auto,
        }
    }
}

impl<F: Filter> Context for Root<F> {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(shared) = &self.shared {
            F::root_http_reply(&mut self.state, shared, token_id, body_size);
        }
    }

    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        if let Some(shared) = &self.shared {
            F::root_grpc_reply(
                &mut self.state,
                shared,
                token_id,
                status_code,
                response_size,
            );
        }
    }

    fn on_done(&mut self) -> bool {
        if let Some(shared) = &self.shared {
            F::done(&mut self.state, shared);
        }
        true
    }
}

impl<F: Filter> RootContext for Root<F> {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let started = now();
        let config = match F::Config::parse(&plugin_configuration()) {
            Ok(config) => config,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        self.error_format = config.error_format();
        match F::configure(config, &mut self.state, started) {
            Some(shared) => {
                self.shared = Some(Rc::new(shared));
                true
            }
            None => false,
        }
    }

    fn on_tick(&mut self) {
        if let Some(shared) = &self.shared {
            F::tick(&mut self.state, shared);
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http::<F> {
            error_format: self.error_format,
            kept_target: None,
            state: self
                .shared
                .clone()
                .map(|shared| (shared, F::Request::default())),
        }))
    }
}

/// Filter `F`'s HTTP context: one request.
struct Http<F: Filter> {
    /// What the root context shares and the request's state; `None` without a configuration.
    state: Option<(Rc<F::Shared>, F::Request)>,
    /// The envelope of this filter's refusals, set for `send_json_error` as each callback
    /// begins.
    error_format: ErrorFormat,
    /// The request target the filter kept for a later refusal (`host_calls::keep_request_target`),
    /// held between callbacks.
    kept_target: Option<Vec<u8>>,
}

impl<F: Filter> Http<F> {
    /// Runs `phase` on a configured request; without a configuration the callback continues
    /// (the request headers, the first callback, have refused it already).
    fn phase(&mut self, phase: impl FnOnce(&mut F::Request, &Rc<F::Shared>) -> Action) -> Action {
        let Some((shared, request)) = &mut self.state else {
            return Action::Continue;
        };
        if !F::KEEPS_REQUEST_TARGET && self.error_format == ErrorFormat::Auto {
            return phase(request, shared);
        }
        enter_request(self.error_format, self.kept_target.take());
        let action = phase(request, shared);
        self.kept_target = leave_request();
        action
    }
}

impl<F: Filter> Context for Http<F> {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, response_size: usize) {
        let Some((shared, request)) = &mut self.state else {
            return;
        };
        if !F::KEEPS_REQUEST_TARGET && self.error_format == ErrorFormat::Auto {
            return F::request_grpc_reply(request, shared, token_id, status_code, response_size);
        }
        enter_request(self.error_format, self.kept_target.take());
        F::request_grpc_reply(request, shared, token_id, status_code, response_size);
        self.kept_target = leave_request();
    }
}

impl<F: Filter> HttpContext for Http<F> {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.state.is_none() {
            log::error!("no configuration; refusing the request");
            send_json_error(
                500,
                &[],
                "internal_error",
                &format!("{} is not configured", F::NAME),
            );
            return Action::Pause;
        }
        self.phase(|request, shared| F::request_headers(request, shared, end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.phase(|request, shared| F::request_body(request, shared, body_size, end_of_stream))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.phase(F::request_trailers)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.phase(|request, shared| F::response_headers(request, shared, end_of_stream))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.phase(|request, shared| F::response_body(request, shared, body_size, end_of_stream))
    }

    fn on_log(&mut self) {
        if let Some((shared, request)) = &mut self.state {
            F::log(request, shared);
        }
    }
}
