//! The client side of Envoy's rate limit service protocol (`ShouldRateLimit`), host-free: the
//! messages, their encoding and a strict decoding of replies, the `global` configuration block the
//! filters share, and a per-worker circuit breaker.
//!
//! The service is `envoy.service.ratelimit.v3.RateLimitService`, method `ShouldRateLimit`, a unary
//! gRPC call (Envoy's `api/envoy/service/ratelimit/v3/rls.proto`), served by envoyproxy/ratelimit
//! (on Redis) or Kuadrant's Limitador. The messages are prost-derived structs whose tags are those
//! of Envoy's protos:
//! - `api/envoy/service/ratelimit/v3/rls.proto`: [`RateLimitRequest`] `{domain = 1,
//!   descriptors = 2, hits_addend = 3}`, [`RateLimitResponse`] `{overall_code = 1, statuses = 2}`
//!   (`response_headers_to_add = 3`, `request_headers_to_add = 4`, `raw_body = 5`,
//!   `dynamic_metadata = 6`, `quota = 7` are skipped as unknown fields), [`DescriptorStatus`]
//!   `{code = 1, current_limit = 2, limit_remaining = 3, duration_until_reset = 4}`,
//!   [`CurrentLimit`] (`RateLimitResponse.RateLimit`) `{requests_per_unit = 1, unit = 2, name = 3}`.
//! - `api/envoy/extensions/common/ratelimit/v3/ratelimit.proto`: [`RateLimitDescriptor`]
//!   `{entries = 1, limit = 2, hits_addend = 3 (google.protobuf.UInt64Value)}`, [`Entry`]
//!   `{key = 1, value = 2}`, [`LimitOverride`] `{requests_per_unit = 1, unit = 2}`;
//! - `api/envoy/type/v3/ratelimit_unit.proto`: [`Unit`].
//!
//! The tags were read in the generated Go of go-control-plane envoy v1.32.4 (the module
//! envoyproxy/ratelimit builds with) and are checked by the tests against encodings made by
//! Python's protobuf runtime (`testdata/rls/vectors.py`).
//!
//! How the reference server counts (envoyproxy/ratelimit `src/utils/utilities.go`,
//! `GetHitsAddends`): a descriptor's `hits_addend`, when present, is what it adds (0 is a pure
//! check); when absent, the request's `hits_addend`, with 0 read as 1. A descriptor's `limit`
//! override replaces the limit configured in the server for that descriptor
//! (`src/config/config_impl.go`, `GetLimit`), so the server's configuration needs only the
//! domain.

use std::cell::Cell;
use std::fmt;

use prost::Message;
use serde::Deserialize;

use crate::config::ConfigError;

/// The gRPC service, as `dispatch_grpc_call` takes it (`rls.proto`: `package
/// envoy.service.ratelimit.v3; service RateLimitService`).
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The unary method (`rpc ShouldRateLimit(RateLimitRequest) returns (RateLimitResponse)`).
pub const METHOD: &str = "ShouldRateLimit";
/// Largest reply accepted (bytes of the protobuf message, without gRPC framing). A reply for 16
/// descriptors is under 1 KiB; anything beyond this is refused as [`ReplyError::Oversize`]
/// without decoding. Read `MAX_REPLY_BYTES + 1` bytes from the host to detect it.
pub const MAX_REPLY_BYTES: usize = 16 * 1024;

/// `RateLimitRequest` (`rls.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitRequest {
    /// The limits' namespace in the service (its configuration's `domain`).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// All are checked and charged; the request is over limit when any is.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Hits added to each descriptor without its own `hits_addend`; 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `RateLimitDescriptor` (`ratelimit.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitDescriptor {
    /// The descriptor's key: ordered (key, value) entries, each non-empty.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// The limit to apply instead of the service's configured one.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<LimitOverride>,
    /// Hits this descriptor adds (`google.protobuf.UInt64Value`): `Some(0)` checks without
    /// charging; `None` takes the request's `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<u64>,
}

/// `RateLimitDescriptor.Entry` (`ratelimit.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    /// Descriptor key (non-empty: the proto's `min_len: 1`).
    #[prost(string, tag = "1")]
    pub key: String,
    /// Descriptor value (non-empty).
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride` (`ratelimit.proto`): `requests_per_unit` hits per
/// `unit`, a fixed window aligned on the unit in the reference server.
#[derive(Clone, PartialEq, Message)]
pub struct LimitOverride {
    /// Hits per window.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The window ([`Unit`] as `i32`).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `envoy.type.v3.RateLimitUnit` (`ratelimit_unit.proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// Not known.
    Unknown = 0,
    /// One second.
    Second = 1,
    /// One minute.
    Minute = 2,
    /// One hour.
    Hour = 3,
    /// One day (a UTC day in the reference server).
    Day = 4,
    /// One month.
    Month = 5,
    /// One year.
    Year = 6,
}

/// `RateLimitResponse` (`rls.proto`); the fields Tollgate reads.
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitResponse {
    /// [`Code`] as `i32`: over limit when any descriptor is.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One per descriptor of the request, in its order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
}

/// `RateLimitResponse.Code` (`rls.proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not known: refused by [`decode_response`].
    Unknown = 0,
    /// Under the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `RateLimitResponse.DescriptorStatus` (`rls.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct DescriptorStatus {
    /// [`Code`] as `i32`.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit the service applied.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<CurrentLimit>,
    /// Hits left in the current window.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Time until the window resets.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<prost_types::Duration>,
}

/// `RateLimitResponse.RateLimit` (`rls.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct CurrentLimit {
    /// Hits per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `RateLimitResponse.RateLimit.Unit` as `i32` (the numbers of [`Unit`], plus `WEEK = 7` in
    /// newer protos); informational, not checked.
    #[prost(int32, tag = "2")]
    pub unit: i32,
    /// The limit's name in the service's configuration.
    #[prost(string, tag = "3")]
    pub name: String,
}

/// The protobuf bytes of `request` (the gRPC message, without the 5-byte gRPC frame header,
/// which the host adds).
pub fn encode_request(request: &RateLimitRequest) -> Vec<u8> {
    request.encode_to_vec()
}

/// What the service decided, checked: the overall code is OK or OVER_LIMIT and there is one
/// status per descriptor sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the request is over the limit of any descriptor.
    pub over_limit: bool,
    /// One per descriptor, in the request's order.
    pub statuses: Vec<Status>,
}

/// One descriptor's status in a [`Verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Whether this descriptor is over its limit.
    pub over_limit: bool,
    /// Hits left in the window.
    pub limit_remaining: u32,
    /// Milliseconds until the window resets (0 when the service sent none or a negative one).
    pub reset_ms: u64,
}

impl Status {
    /// The hits the service counts against `limit` (the limit sent with the descriptor), as far
    /// as this status tells: `limit - limit_remaining`, or `limit + 1` when over it (the
    /// reference server is over only above the limit: `src/limiter/base_limiter.go`,
    /// `GetResponseDescriptorStatus`).
    pub fn counted(&self, limit: u32) -> u64 {
        if self.over_limit {
            u64::from(limit).saturating_add(1)
        } else {
            u64::from(limit.saturating_sub(self.limit_remaining))
        }
    }
}

/// Why a reply cannot be used. Each is a failure of the call (the configured `on_error` applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The host delivered no reply body.
    Missing,
    /// Larger than [`MAX_REPLY_BYTES`] (the size the host announced, or more than it read).
    Oversize(usize),
    /// Not a `RateLimitResponse` (prost's reason: truncated, wrong wire type...).
    Malformed(String),
    /// An `overall_code` or a status `code` other than OK and OVER_LIMIT (UNKNOWN included).
    UnknownCode(i32),
    /// Not one status per descriptor: `(sent, received)`.
    StatusCount(usize, usize),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Missing => write!(f, "the reply has no body"),
            ReplyError::Oversize(n) => write!(
                f,
                "the reply is {n} bytes, more than the {MAX_REPLY_BYTES} accepted"
            ),
            ReplyError::Malformed(e) => write!(f, "the reply is not a RateLimitResponse: {e}"),
            ReplyError::UnknownCode(c) => {
                write!(
                    f,
                    "the reply has code {c}, neither OK (1) nor OVER_LIMIT (2)"
                )
            }
            ReplyError::StatusCount(sent, got) => write!(
                f,
                "the reply has {got} descriptor statuses for {sent} descriptors"
            ),
        }
    }
}

impl std::error::Error for ReplyError {}

fn code_of(raw: i32) -> Result<bool, ReplyError> {
    match Code::try_from(raw) {
        Ok(Code::Ok) => Ok(false),
        Ok(Code::OverLimit) => Ok(true),
        _ => Err(ReplyError::UnknownCode(raw)),
    }
}

/// Decodes and checks a `ShouldRateLimit` reply to a request of `descriptors` descriptors.
///
/// Errors (never a panic): more than [`MAX_REPLY_BYTES`] ([`ReplyError::Oversize`]), not a
/// `RateLimitResponse` ([`ReplyError::Malformed`], e.g. truncated), an overall or per-descriptor
/// code other than OK/OVER_LIMIT ([`ReplyError::UnknownCode`]; an empty message has overall code
/// UNKNOWN), or a status count other than `descriptors` ([`ReplyError::StatusCount`]). A status
/// that says OVER_LIMIT makes the verdict over limit even if the overall code says OK.
pub fn decode_response(bytes: &[u8], descriptors: usize) -> Result<Verdict, ReplyError> {
    if bytes.len() > MAX_REPLY_BYTES {
        return Err(ReplyError::Oversize(bytes.len()));
    }
    let reply =
        RateLimitResponse::decode(bytes).map_err(|e| ReplyError::Malformed(e.to_string()))?;
    let mut over_limit = code_of(reply.overall_code)?;
    if reply.statuses.len() != descriptors {
        return Err(ReplyError::StatusCount(descriptors, reply.statuses.len()));
    }
    let mut statuses = Vec::with_capacity(reply.statuses.len());
    for s in &reply.statuses {
        let over = code_of(s.code)?;
        over_limit |= over;
        statuses.push(Status {
            over_limit: over,
            limit_remaining: s.limit_remaining,
            reset_ms: s.duration_until_reset.as_ref().map_or(0, duration_ms),
        });
    }
    Ok(Verdict {
        over_limit,
        statuses,
    })
}

/// A `google.protobuf.Duration` in milliseconds, rounded up; negative durations are 0.
fn duration_ms(d: &prost_types::Duration) -> u64 {
    let secs = u64::try_from(d.seconds).unwrap_or(0);
    let nanos = u64::try_from(d.nanos).unwrap_or(0);
    secs.saturating_mul(1000)
        .saturating_add(nanos.div_ceil(1_000_000))
}

/// Why a `ShouldRateLimit` call gave no usable verdict, for counters and log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The host refused to dispatch the call (its proxy-wasm status: e.g. Envoy answers
    /// `ParseFailure` (4) for an unknown cluster).
    Dispatch(u32),
    /// The call ended with a gRPC status other than OK (0): the service's, or the host's for a
    /// timeout or a connection failure (Envoy: 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED...).
    Grpc(u32),
    /// The reply was unusable.
    Reply(ReplyError),
    /// The circuit breaker is open: no call was made.
    BreakerOpen,
}

impl fmt::Display for CallFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallFailure::Dispatch(s) => write!(f, "the host refused the gRPC call (status {s})"),
            CallFailure::Grpc(s) => write!(f, "the gRPC call failed with status {s}"),
            CallFailure::Reply(e) => e.fmt(f),
            CallFailure::BreakerOpen => write!(f, "the circuit breaker is open"),
        }
    }
}

impl CallFailure {
    /// A short label for metrics: `dispatch`, `grpc_status`, `reply` or `breaker_open`.
    pub fn reason(&self) -> &'static str {
        match self {
            CallFailure::Dispatch(_) => "dispatch",
            CallFailure::Grpc(_) => "grpc_status",
            CallFailure::Reply(_) => "reply",
            CallFailure::BreakerOpen => "breaker_open",
        }
    }
}

/// The verdict of a finished call from what the host reported: `grpc_status` and `size` as
/// `on_grpc_call_response(token, status, size)` gives them (proxy-wasm Rust SDK 0.2.5: a reply
/// arrives as status 0 with the message size from `proxy_on_grpc_receive`; a failure as the
/// gRPC status from `proxy_on_grpc_close` with size 0), and `body`, the
/// `GrpcReceiveBuffer` read with at most `MAX_REPLY_BYTES + 1` bytes (`None`: nothing to read).
///
/// Errors: a non-zero status ([`CallFailure::Grpc`]), an announced or read size above
/// [`MAX_REPLY_BYTES`], and every [`decode_response`] error ([`CallFailure::Reply`]).
pub fn reply_verdict(
    grpc_status: u32,
    size: usize,
    body: Option<&[u8]>,
    descriptors: usize,
) -> Result<Verdict, CallFailure> {
    if grpc_status != 0 {
        return Err(CallFailure::Grpc(grpc_status));
    }
    if size > MAX_REPLY_BYTES {
        return Err(CallFailure::Reply(ReplyError::Oversize(size)));
    }
    decode_response(body.unwrap_or_default(), descriptors).map_err(CallFailure::Reply)
}

/// What a request gets when the service gives no verdict ([`CallFailure`]).
#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The filter's own per-instance limit decides (default): limits keep holding per gateway,
    /// so N instances admit up to N times the global limit while the service is away.
    #[default]
    Local,
    /// Admitted uncharged (fail-open, an explicit choice).
    Allow,
    /// Refused (fail-closed).
    Deny,
}

/// Default `timeout_ms`.
pub const DEFAULT_TIMEOUT_MS: u32 = 50;
/// Largest `timeout_ms`.
pub const MAX_TIMEOUT_MS: u32 = 10_000;
/// Default `breaker.failures`.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// Default `breaker.open_ms`.
pub const DEFAULT_BREAKER_OPEN_MS: u32 = 2_000;
/// Longest `service` and `domain` (bytes).
pub const MAX_NAME_BYTES: usize = 255;

fn default_timeout_ms() -> u32 {
    DEFAULT_TIMEOUT_MS
}

/// The JSON `global` block, as written (see [`GlobalSpec::check`]):
/// `{"service": "ratelimit", "domain": "tollgate", "timeout_ms": 50, "on_error": "local",
/// "breaker": {"failures": 5, "open_ms": 2000}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalSpec {
    service: String,
    domain: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
    #[serde(default)]
    on_error: OnError,
    #[serde(default)]
    breaker: BreakerSpec,
}

/// The JSON `breaker` block of [`GlobalSpec`].
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    #[serde(default = "default_failures")]
    failures: u32,
    #[serde(default = "default_open_ms")]
    open_ms: u32,
}

fn default_failures() -> u32 {
    DEFAULT_BREAKER_FAILURES
}
fn default_open_ms() -> u32 {
    DEFAULT_BREAKER_OPEN_MS
}

impl Default for BreakerSpec {
    fn default() -> Self {
        BreakerSpec {
            failures: DEFAULT_BREAKER_FAILURES,
            open_ms: DEFAULT_BREAKER_OPEN_MS,
        }
    }
}

/// A checked `global` block: where and how to call the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalConfig {
    /// The upstream of the call: an Envoy cluster (HTTP/2) or an nginx `upstream {}` name.
    pub service: String,
    /// The `domain` of every request.
    pub domain: String,
    /// Deadline of a call (milliseconds), passed to `dispatch_grpc_call`.
    pub timeout_ms: u32,
    /// What a request gets when the call fails.
    pub on_error: OnError,
    /// Consecutive failures that open the breaker.
    pub breaker_failures: u32,
    /// How long an open breaker skips the service (milliseconds) before one probe call.
    pub breaker_open_ms: u32,
}

impl GlobalSpec {
    /// Checks the block found at JSON path `field` (e.g. `rules[0].global`); errors name the
    /// offending member: `service` (1 to 255 bytes of `A-Z a-z 0-9 . _ - :`, an upstream name or
    /// `host:port`), `domain` (1 to 255 printable ASCII bytes), `timeout_ms` (1 to 10000),
    /// `breaker.failures` (1 to 1000), `breaker.open_ms` (100 to 600000).
    pub fn check(self, field: &str) -> Result<GlobalConfig, ConfigError> {
        let service_ok = !self.service.is_empty()
            && self.service.len() <= MAX_NAME_BYTES
            && self
                .service
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b));
        if !service_ok {
            return Err(ConfigError::new(
                format!("{field}.service"),
                format!(
                    "{:?} must be 1 to {MAX_NAME_BYTES} characters of A-Z a-z 0-9 . _ - : (an Envoy cluster or nginx upstream name)",
                    self.service
                ),
            ));
        }
        let domain_ok = !self.domain.is_empty()
            && self.domain.len() <= MAX_NAME_BYTES
            && self.domain.bytes().all(|b| b.is_ascii_graphic());
        if !domain_ok {
            return Err(ConfigError::new(
                format!("{field}.domain"),
                format!(
                    "{:?} must be 1 to {MAX_NAME_BYTES} printable ASCII characters without spaces",
                    self.domain
                ),
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(ConfigError::new(
                format!("{field}.timeout_ms"),
                format!("must be between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        if self.breaker.failures == 0 || self.breaker.failures > 1000 {
            return Err(ConfigError::new(
                format!("{field}.breaker.failures"),
                "must be between 1 and 1000",
            ));
        }
        if !(100..=600_000).contains(&self.breaker.open_ms) {
            return Err(ConfigError::new(
                format!("{field}.breaker.open_ms"),
                "must be between 100 and 600000",
            ));
        }
        Ok(GlobalConfig {
            service: self.service,
            domain: self.domain,
            timeout_ms: self.timeout_ms,
            on_error: self.on_error,
            breaker_failures: self.breaker.failures,
            breaker_open_ms: self.breaker.open_ms,
        })
    }
}

impl GlobalConfig {
    /// Parses a JSON `global` block on its own (`field` names it in errors): strict (unknown
    /// members refused), then [`GlobalSpec::check`].
    pub fn parse(bytes: &[u8], field: &str) -> Result<GlobalConfig, ConfigError> {
        let spec: GlobalSpec = crate::config::parse_json(bytes).map_err(|e| {
            let inner = if e.field == "." {
                field.to_string()
            } else {
                format!("{field}.{}", e.field)
            };
            ConfigError::new(inner, e.message)
        })?;
        spec.check(field)
    }

    /// A breaker with this block's settings.
    pub fn breaker(&self) -> Breaker {
        Breaker::new(self.breaker_failures, u64::from(self.breaker_open_ms))
    }
}

/// What the breaker lets a request do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Call the service (closed breaker).
    Call,
    /// Call the service as the one probe of a half-open breaker: its outcome closes or reopens it.
    Probe,
    /// Do not call: the breaker is open (or its probe is in flight); apply `on_error`.
    Skip,
}

/// A circuit breaker for one worker (VM): after `failures` consecutive failed calls it skips the
/// service for `open_ms`, then lets one probe call through; the probe's success closes it, its
/// failure opens it again. A probe that never reports (its stream was destroyed first) is
/// forgotten after `open_ms`, and another is let through. Host-free: times are Unix ms passed in.
/// Interior mutability (`Cell`s), so the root context can share it with the HTTP contexts.
#[derive(Debug)]
pub struct Breaker {
    failures: u32,
    open_ms: u64,
    consecutive: Cell<u32>,
    /// While `Some`, the breaker is open until this time.
    open_until: Cell<Option<u64>>,
    /// When the current probe started.
    probe_since: Cell<Option<u64>>,
}

impl Breaker {
    /// A closed breaker opening after `failures` (at least 1) consecutive failures for `open_ms`.
    pub fn new(failures: u32, open_ms: u64) -> Breaker {
        Breaker {
            failures: failures.max(1),
            open_ms,
            consecutive: Cell::new(0),
            open_until: Cell::new(None),
            probe_since: Cell::new(None),
        }
    }

    /// Whether a request at `now_ms` may call the service.
    pub fn admit(&self, now_ms: u64) -> Admit {
        let Some(until) = self.open_until.get() else {
            return Admit::Call;
        };
        if now_ms < until {
            return Admit::Skip;
        }
        match self.probe_since.get() {
            Some(since) if now_ms.saturating_sub(since) < self.open_ms => Admit::Skip,
            _ => {
                self.probe_since.set(Some(now_ms));
                Admit::Probe
            }
        }
    }

    /// A call (or probe) got a verdict: the breaker closes.
    pub fn success(&self) {
        self.consecutive.set(0);
        self.open_until.set(None);
        self.probe_since.set(None);
    }

    /// A call (or probe) failed at `now_ms`: a failed probe, or the `failures`-th consecutive
    /// failure, opens the breaker for `open_ms`. Returns whether this failure opened it.
    pub fn failure(&self, now_ms: u64) -> bool {
        let n = self.consecutive.get().saturating_add(1);
        self.consecutive.set(n);
        let probing = self.probe_since.get().is_some();
        let was_open = self.open_until.get().is_some();
        if probing || (!was_open && n >= self.failures) {
            self.open_until
                .set(Some(now_ms.saturating_add(self.open_ms)));
            self.probe_since.set(None);
            return !was_open || probing;
        }
        false
    }

    /// Whether the breaker is open (skipping or probing) at `now_ms`.
    pub fn is_open(&self) -> bool {
        self.open_until.get().is_some()
    }
}

/// The host side of a call, on the raw ABI where the SDK would trap (wasm32 only).
///
/// The call itself stays on the SDK (`Context::dispatch_grpc_call`), whose wrapper registers
/// the token with its dispatcher so that `on_grpc_call_response` reaches the calling context;
/// that wrapper returns `Err` for `ParseFailure` (Envoy: no such cluster) and
/// `InternalFailure` and traps on any other non-Ok status (a host without gRPC calls answers
/// `Unimplemented`).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)] // The ABI import itself; the call's SAFETY is stated.
pub mod host_calls {
    use std::time::Duration;

    use proxy_wasm::traits::Context;
    use proxy_wasm::types::{BufferType, Status};

    use super::{GlobalConfig, RateLimitRequest};

    /// Sends `request` as one `ShouldRateLimit` to `config.service` (an Envoy cluster or an nginx
    /// `upstream {}`) with the SDK's `dispatch_grpc_call` on `ctx`, whose
    /// `on_grpc_call_response` gets the reply; deadline `config.timeout_ms` (enforced by the
    /// host). The call's token, or the host's status: `ParseFailure` (no such upstream) or
    /// `InternalFailure` (the call could not start).
    pub fn should_rate_limit(
        ctx: &(impl Context + ?Sized),
        config: &GlobalConfig,
        request: &RateLimitRequest,
    ) -> Result<u32, Status> {
        let message = super::encode_request(request);
        ctx.dispatch_grpc_call(
            &config.service,
            super::SERVICE,
            super::METHOD,
            Vec::new(),
            Some(&message),
            Duration::from_millis(u64::from(config.timeout_ms)),
        )
    }

    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_continue_stream(stream_type: u32) -> u32;
        fn proxy_grpc_call(
            upstream: *const u8,
            upstream_len: usize,
            service: *const u8,
            service_len: usize,
            method: *const u8,
            method_len: usize,
            metadata: *const u8,
            metadata_len: usize,
            message: *const u8,
            message_len: usize,
            timeout_ms: u32,
            token: *mut u32,
        ) -> u32;
    }

    /// The ABI's `Unimplemented` status.
    const UNIMPLEMENTED: u32 = 12;

    /// Whether the host implements `proxy_grpc_call`, asked once from `on_configure` so that a
    /// host without gRPC calls (answering `Unimplemented`, as nginx hosts without them do)
    /// refuses the configuration instead of trapping the SDK's `dispatch_grpc_call` on every
    /// request. The probe names the upstream `~`, which is neither a serialized `GrpcService`
    /// nor a cluster, so Envoy answers `ParseFailure` before creating anything
    /// (`Context::grpcCall`, source/extensions/common/wasm/context.cc); any answer other than
    /// `Unimplemented` counts as support (a host that dispatches it anyway reports to the root
    /// context, where the SDK ignores an unknown token). `Err(12)` when unsupported.
    pub fn grpc_calls_supported() -> Result<(), u32> {
        let upstream = b"~";
        let mut token = 0u32;
        // SAFETY: every pointer is to a live local or a static for the duration of the call;
        // the host writes 4 bytes to `token`.
        let status = unsafe {
            proxy_grpc_call(
                upstream.as_ptr(),
                upstream.len(),
                super::SERVICE.as_ptr(),
                super::SERVICE.len(),
                super::METHOD.as_ptr(),
                super::METHOD.len(),
                std::ptr::null(),
                0,
                std::ptr::null(),
                0,
                1,
                &mut token,
            )
        };
        if status == UNIMPLEMENTED {
            Err(status)
        } else {
            Ok(())
        }
    }

    /// `proxy_continue_stream(HttpRequest)`: resumes a request paused for a call; the host's
    /// status when it cannot (the SDK's `resume_http_request` would trap).
    pub fn resume_request() -> Result<(), u32> {
        // SAFETY: a plain integer (proxy-wasm ABI 0.2.1 `proxy_stream_type_t`: 0 = request).
        match unsafe { proxy_continue_stream(0) } {
            0 => Ok(()),
            s => Err(s),
        }
    }

    /// The verdict of the call being reported to `on_grpc_call_response(token, status_code,
    /// response_size)` (the SDK's arguments: a reply is status 0 with its size, a failure the
    /// gRPC status and 0), for a request of `descriptors` descriptors: the reply message read
    /// with [`reply_body`] and judged by [`super::reply_verdict`].
    pub fn reply(
        status_code: u32,
        response_size: usize,
        descriptors: usize,
    ) -> Result<super::Verdict, super::CallFailure> {
        let body = (status_code == 0 && response_size > 0)
            .then(reply_body)
            .flatten();
        super::reply_verdict(status_code, response_size, body.as_deref(), descriptors)
    }

    /// The reply message of the call being reported, at most `MAX_REPLY_BYTES + 1` bytes (so
    /// that [`super::reply_verdict`] sees an oversize one); `None` when there is none or the
    /// host cannot give it.
    pub fn reply_body() -> Option<Vec<u8>> {
        crate::raw::buffer(
            BufferType::GrpcReceiveBuffer,
            0,
            super::MAX_REPLY_BYTES.saturating_add(1),
        )
        .ok()
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `testdata/rls/vectors.txt`: `name hex` lines printed by `testdata/rls/vectors.py`
    /// (Python's protobuf 5.29.3, messages compiled by grpcio-tools' protoc):
    /// `/tmp/pbvenv/bin/python plugins/common/testdata/rls/vectors.py > plugins/common/testdata/rls/vectors.txt`
    const VECTORS: &str = include_str!("../testdata/rls/vectors.txt");

    fn vector(name: &str) -> Vec<u8> {
        let line = VECTORS
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("no vector {name}"));
        let hex = line.split(' ').nth(1).unwrap_or("");
        hex.as_bytes()
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn requests_encode_as_pythons_protobuf_does() {
        let req = RateLimitRequest {
            domain: "tollgate".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry("rule", "per-user"), entry("key", "alice")],
                    limit: Some(LimitOverride {
                        requests_per_unit: 10,
                        unit: Unit::Minute as i32,
                    }),
                    hits_addend: Some(3),
                },
                RateLimitDescriptor {
                    entries: vec![entry("rule", "per-user")],
                    limit: Some(LimitOverride {
                        requests_per_unit: 5,
                        unit: Unit::Second as i32,
                    }),
                    hits_addend: None,
                },
            ],
            hits_addend: 3,
        };
        assert_eq!(encode_request(&req), vector("request_two_descriptors"));
        assert_eq!(
            RateLimitRequest::decode(&*vector("request_two_descriptors")).unwrap(),
            req
        );
    }

    #[test]
    fn a_zero_hits_addend_is_sent_not_omitted() {
        // The wrapper makes 0 (a pure check) differ from absent (the request's hits_addend).
        let req = RateLimitRequest {
            domain: "tollgate".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry("tenant", "acme")],
                limit: Some(LimitOverride {
                    requests_per_unit: 4_000_000_000,
                    unit: Unit::Day as i32,
                }),
                hits_addend: Some(0),
            }],
            hits_addend: 0,
        };
        let bytes = encode_request(&req);
        assert_eq!(bytes, vector("request_check_only"));
        assert!(bytes.ends_with(&[0x1a, 0x00]), "{bytes:02x?}");
    }

    #[test]
    fn decodes_an_ok_reply() {
        let v = decode_response(&vector("response_ok"), 2).unwrap();
        assert_eq!(
            v,
            Verdict {
                over_limit: false,
                statuses: vec![
                    Status {
                        over_limit: false,
                        limit_remaining: 7,
                        reset_ms: 42_000
                    },
                    Status {
                        over_limit: false,
                        limit_remaining: 4,
                        reset_ms: 500
                    },
                ],
            }
        );
    }

    #[test]
    fn decodes_an_over_limit_reply_skipping_unknown_fields() {
        let v = decode_response(&vector("response_over_limit_with_raw_body"), 2).unwrap();
        assert!(v.over_limit);
        assert_eq!(
            v.statuses[0],
            Status {
                over_limit: true,
                limit_remaining: 0,
                reset_ms: 17_250
            }
        );
        assert!(!v.statuses[1].over_limit);
        assert_eq!(v.statuses[1].reset_ms, 1_000);
    }

    #[test]
    fn refuses_unknown_codes() {
        assert_eq!(
            decode_response(&vector("response_unknown_overall_code"), 1),
            Err(ReplyError::UnknownCode(7))
        );
        // An empty message is valid protobuf: overall code UNKNOWN.
        assert_eq!(
            decode_response(&vector("response_empty"), 0),
            Err(ReplyError::UnknownCode(0))
        );
        // A status with an unknown code, under an OK overall code.
        let reply = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: 9,
                current_limit: None,
                limit_remaining: 1,
                duration_until_reset: None,
            }],
        };
        assert_eq!(
            decode_response(&reply.encode_to_vec(), 1),
            Err(ReplyError::UnknownCode(9))
        );
    }

    #[test]
    fn an_over_limit_status_wins_over_an_ok_overall_code() {
        let reply = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: None,
                limit_remaining: 0,
                duration_until_reset: None,
            }],
        };
        let v = decode_response(&reply.encode_to_vec(), 1).unwrap();
        assert!(v.over_limit);
        assert_eq!(v.statuses[0].reset_ms, 0);
    }

    #[test]
    fn refuses_truncated_replies_at_every_length() {
        // Every prefix of a reply without trailing unknown fields either fails to decode (a cut
        // inside a field) or decodes into a shorter message that fails the code or count checks
        // (a cut between fields). (A cut that only drops trailing unknown fields, such as
        // `raw_body`, is undetectable in protobuf and harmless: the verdict is complete.)
        let full = vector("response_ok");
        for n in 0..full.len() {
            let r = decode_response(&full[..n], 2);
            assert!(r.is_err(), "prefix of {n} bytes decoded: {r:?}");
        }
        assert!(matches!(
            decode_response(&full[..full.len() - 3], 2),
            Err(ReplyError::Malformed(_))
        ));
        let over = vector("response_over_limit_with_raw_body");
        assert!(matches!(
            decode_response(&over[..over.len() - 3], 2),
            Err(ReplyError::Malformed(_))
        ));
    }

    #[test]
    fn refuses_garbage_and_wrong_counts() {
        for bad in [
            &[0xffu8; 12][..],
            &[0x08, 0x80],
            &[0x0a, 0x05, 0x01],
            &[0x07],
        ] {
            assert!(
                matches!(decode_response(bad, 1), Err(ReplyError::Malformed(_))),
                "{bad:02x?}"
            );
        }
        assert_eq!(
            decode_response(&vector("response_ok"), 3),
            Err(ReplyError::StatusCount(3, 2))
        );
        assert_eq!(
            decode_response(&vector("response_ok"), 1),
            Err(ReplyError::StatusCount(1, 2))
        );
    }

    #[test]
    fn refuses_oversize_replies_before_decoding() {
        let mut big = vector("response_ok");
        // A valid message padded with an unknown bytes field past the bound.
        big.extend_from_slice(&[0x2a, 0x80, 0x80, 0x01]);
        big.resize(big.len() + 16384, b'x');
        assert_eq!(
            decode_response(&big, 2),
            Err(ReplyError::Oversize(big.len()))
        );
        assert!(decode_response(&big[..MAX_REPLY_BYTES], 2).is_err());
    }

    #[test]
    fn call_outcomes() {
        let ok = vector("response_ok");
        assert!(reply_verdict(0, ok.len(), Some(&ok), 2).is_ok());
        // Envoy's timeout and unreachable service arrive as gRPC statuses with no body.
        assert_eq!(reply_verdict(14, 0, None, 2), Err(CallFailure::Grpc(14)));
        assert_eq!(reply_verdict(4, 0, None, 2), Err(CallFailure::Grpc(4)));
        // An OK call with no message: an empty RateLimitResponse, code UNKNOWN.
        assert_eq!(
            reply_verdict(0, 0, None, 2),
            Err(CallFailure::Reply(ReplyError::UnknownCode(0)))
        );
        // An announced size beyond the bound is refused without reading.
        assert_eq!(
            reply_verdict(0, MAX_REPLY_BYTES + 1, None, 2),
            Err(CallFailure::Reply(ReplyError::Oversize(
                MAX_REPLY_BYTES + 1
            )))
        );
        // A host that delivers more than it announced: the read itself is bounded.
        let big = vec![0u8; MAX_REPLY_BYTES + 1];
        assert_eq!(
            reply_verdict(0, 10, Some(&big), 2),
            Err(CallFailure::Reply(ReplyError::Oversize(
                MAX_REPLY_BYTES + 1
            )))
        );
        assert_eq!(CallFailure::Grpc(14).reason(), "grpc_status");
        assert_eq!(CallFailure::BreakerOpen.reason(), "breaker_open");
    }

    #[test]
    fn durations_round_up_and_clamp() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(duration_ms(&d(0, 1)), 1);
        assert_eq!(duration_ms(&d(2, 999_999_999)), 3_000);
        assert_eq!(duration_ms(&d(-5, 0)), 0);
        assert_eq!(duration_ms(&d(0, -1)), 0);
        assert_eq!(duration_ms(&d(i64::MAX, 999_999_999)), u64::MAX);
    }

    #[test]
    fn global_block_defaults_and_strictness() {
        let g = GlobalConfig::parse(br#"{"service":"ratelimit","domain":"tollgate"}"#, "global")
            .unwrap();
        assert_eq!(
            g,
            GlobalConfig {
                service: "ratelimit".into(),
                domain: "tollgate".into(),
                timeout_ms: 50,
                on_error: OnError::Local,
                breaker_failures: 5,
                breaker_open_ms: 2000,
            }
        );
        let g = GlobalConfig::parse(
            br#"{"service":"127.0.0.1:8081","domain":"d","timeout_ms":200,"on_error":"deny","breaker":{"failures":1,"open_ms":100}}"#,
            "global",
        )
        .unwrap();
        assert_eq!(g.on_error, OnError::Deny);
        assert_eq!((g.breaker_failures, g.breaker_open_ms), (1, 100));
    }

    #[test]
    fn global_block_errors_name_the_field() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"service":"","domain":"d"}"#, "rules[0].global.service"),
            (
                br#"{"service":"a b","domain":"d"}"#,
                "rules[0].global.service",
            ),
            (
                br#"{"service":"a/b","domain":"d"}"#,
                "rules[0].global.service",
            ),
            (br#"{"service":"s","domain":""}"#, "rules[0].global.domain"),
            (
                br#"{"service":"s","domain":"a b"}"#,
                "rules[0].global.domain",
            ),
            (
                br#"{"service":"s","domain":"\u0000"}"#,
                "rules[0].global.domain",
            ),
            (
                br#"{"service":"s","domain":"d","timeout_ms":0}"#,
                "rules[0].global.timeout_ms",
            ),
            (
                br#"{"service":"s","domain":"d","timeout_ms":10001}"#,
                "rules[0].global.timeout_ms",
            ),
            (
                br#"{"service":"s","domain":"d","timeout_ms":-1}"#,
                "rules[0].global.timeout_ms",
            ),
            (
                br#"{"service":"s","domain":"d","on_error":"open"}"#,
                "rules[0].global.on_error",
            ),
            (
                br#"{"service":"s","domain":"d","breaker":{"failures":0}}"#,
                "rules[0].global.breaker.failures",
            ),
            (
                br#"{"service":"s","domain":"d","breaker":{"open_ms":99}}"#,
                "rules[0].global.breaker.open_ms",
            ),
            (
                br#"{"service":"s","domain":"d","breaker":{"open":1}}"#,
                "rules[0].global.breaker.open",
            ),
            (
                br#"{"service":"s","domain":"d","timeout":5}"#,
                "rules[0].global.timeout",
            ),
            (br#"{"domain":"d"}"#, "rules[0].global"),
        ];
        for (json, field) in cases {
            let err = GlobalConfig::parse(json, "rules[0].global").unwrap_err();
            assert_eq!(
                &err.field,
                field,
                "{}: {err}",
                String::from_utf8_lossy(json)
            );
        }
        let long = format!(r#"{{"service":"{}","domain":"d"}}"#, "s".repeat(256));
        assert_eq!(
            GlobalConfig::parse(long.as_bytes(), "g").unwrap_err().field,
            "g.service"
        );
    }

    #[test]
    fn breaker_opens_after_consecutive_failures_then_probes_once() {
        let b = Breaker::new(3, 1000);
        assert_eq!(b.admit(0), Admit::Call);
        assert!(!b.failure(1));
        assert!(!b.failure(2));
        b.success(); // a success resets the count
        assert!(!b.failure(3));
        assert!(!b.failure(4));
        assert!(b.failure(5)); // third consecutive: opens until 1005
        assert!(b.is_open());
        assert_eq!(b.admit(6), Admit::Skip);
        assert_eq!(b.admit(1004), Admit::Skip);
        assert_eq!(b.admit(1005), Admit::Probe);
        assert_eq!(b.admit(1006), Admit::Skip); // one probe at a time
        assert!(b.failure(1010)); // the probe failed: open again until 2010
        assert_eq!(b.admit(2009), Admit::Skip);
        assert_eq!(b.admit(2010), Admit::Probe);
        b.success();
        assert!(!b.is_open());
        assert_eq!(b.admit(2011), Admit::Call);
    }

    #[test]
    fn late_failures_of_calls_started_before_opening_do_not_extend_it() {
        let b = Breaker::new(1, 1000);
        assert!(b.failure(0)); // open until 1000
        assert!(!b.failure(500)); // a call dispatched before: no new window
        assert_eq!(b.admit(1000), Admit::Probe);
    }

    #[test]
    fn a_lost_probe_is_replaced_after_open_ms() {
        let b = Breaker::new(1, 1000);
        b.failure(0);
        assert_eq!(b.admit(1000), Admit::Probe);
        // The probe's stream went away without a reply: nothing reported.
        assert_eq!(b.admit(1999), Admit::Skip);
        assert_eq!(b.admit(2000), Admit::Probe);
    }

    #[test]
    fn breaker_survives_extreme_times() {
        let b = Breaker::new(1, u64::MAX);
        assert!(b.failure(u64::MAX));
        assert_eq!(b.admit(u64::MAX), Admit::Probe);
        assert_eq!(b.admit(u64::MAX), Admit::Skip);
    }
}
