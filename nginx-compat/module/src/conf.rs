//! The HTTP module's configuration: what the `proxy_wasm*` directives build (see
//! `directives.rs`), per http{} block ([`MainConf`]) and per server or location ([`LocConf`]),
//! and the defaults of `dispatch_http_call` that ngx_wasm_module's socket directives set
//! ([`SocketTimeouts`], [`CallDefaults`]; `kong_directives/call_defaults.rs`).

use std::time::Duration;

use tollgate_services::http_client::StepTimeouts;

/// ngx_wasm_module's default of every socket timeout (`socket_*_timeout`,
/// `wasm_socket_*_timeout`: `60s`, docs/DIRECTIVES.md).
pub const DEFAULT_SOCKET_TIMEOUT: Duration = Duration::from_secs(60);

/// ngx_wasm_module's default of `resolver_timeout` (`30s`, docs/DIRECTIVES.md).
pub const DEFAULT_RESOLVER_TIMEOUT: Duration = Duration::from_secs(30);

/// The socket timeouts of one level: `socket_connect|send|read_timeout` in `wasm{}` (calls of
/// root contexts: `on_vm_start`, `on_configure`, `on_tick`...) or
/// `wasm_socket_connect|send|read_timeout` in http{}, server{}, location{} (calls of a request's
/// filters). Unset ones are ngx_wasm_module's default, [`DEFAULT_SOCKET_TIMEOUT`]; as in its
/// source (`ngx_http_wasm_merge_loc_conf`), the http levels do not inherit the `wasm{}` ones.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketTimeouts {
    /// Connecting (nginx's time syntax; milliseconds).
    pub connect: Option<Duration>,
    /// Writing the request.
    pub send: Option<Duration>,
    /// Reading the response.
    pub read: Option<Duration>,
}

impl SocketTimeouts {
    /// nginx's merge: what this level did not set comes from `prev`.
    pub fn merge(&mut self, prev: &SocketTimeouts) {
        self.connect = self.connect.or(prev.connect);
        self.send = self.send.or(prev.send);
        self.read = self.read.or(prev.read);
    }
}

/// What a `dispatch_http_call` gets from the configuration of the context that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDefaults {
    /// The level's socket timeouts.
    pub sockets: SocketTimeouts,
    /// `resolver_timeout` (`wasm{}`).
    pub resolve: Duration,
    /// `proxy_wasm_log_dispatch_errors`: log a failed call at `error`.
    pub log_errors: bool,
}

impl Default for CallDefaults {
    fn default() -> Self {
        CallDefaults {
            sockets: SocketTimeouts::default(),
            resolve: DEFAULT_RESOLVER_TIMEOUT,
            log_errors: true,
        }
    }
}

impl CallDefaults {
    /// The overall deadline and the step limits of a call whose filter gave `timeout_ms`
    /// (`proxy_dispatch_http_call`'s timeout). As in ngx_wasm_module
    /// (`ngx_http_proxy_wasm_dispatch`, `ngx_wasm_socket_tcp_connect`), a non-zero timeout is
    /// the filter's and the socket directives apply when it is 0: connect within the connect
    /// timeout, then the request written and the response read within send + read timeouts
    /// (this host's client has one limit for the exchange, not one per socket operation).
    /// Resolving a name is bounded by `resolver_timeout` either way.
    pub fn timeouts(&self, timeout_ms: u32) -> (Duration, StepTimeouts) {
        let resolve = self.resolve;
        if timeout_ms > 0 {
            let t = Duration::from_millis(u64::from(timeout_ms));
            let steps = StepTimeouts {
                resolve: resolve.min(t),
                connect: t,
                exchange: t,
            };
            return (t, steps);
        }
        let or_default = |d: Option<Duration>| d.unwrap_or(DEFAULT_SOCKET_TIMEOUT);
        let connect = or_default(self.sockets.connect);
        let exchange = or_default(self.sockets.send).saturating_add(or_default(self.sockets.read));
        let steps = StepTimeouts {
            resolve,
            connect,
            exchange,
        };
        (
            resolve.saturating_add(connect).saturating_add(exchange),
            steps,
        )
    }
}

/// A `proxy_wasm` directive: one root context per worker. Two are the same filter (not run
/// twice on a request, see `request/chain.rs`) when their module, name and configuration are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterDef {
    /// The module's name (also the plugin name).
    pub name: String,
    /// Index of the module in the `wasm {}` block.
    pub module: usize,
    /// The plugin configuration (`on_configure`).
    pub config: Vec<u8>,
}

/// The isolation mode (`proxy_wasm_isolation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Isolation {
    /// One instance per module per worker.
    #[default]
    None,
    /// One instance per module per request.
    Stream,
    /// One instance per filter per request.
    Filter,
}

impl Isolation {
    /// The mode named by `proxy_wasm_isolation`'s argument; `None` for another word.
    pub fn parse(v: &[u8]) -> Option<Isolation> {
        match v {
            b"none" => Some(Isolation::None),
            b"stream" => Some(Isolation::Stream),
            b"filter" => Some(Isolation::Filter),
            _ => None,
        }
    }
}

#[derive(Default)]
pub struct MainConf {
    /// Filters by index (location chains refer to them).
    pub filters: Vec<FilterDef>,
    /// The file each filter's configuration was read from (`tollgate_proxy_wasm_file`), by
    /// filter index, for error messages.
    pub config_files: Vec<(usize, std::path::PathBuf)>,
    /// Whether nginx drops every client header name outside `[A-Za-z0-9-]` (every server keeps
    /// `underscores_in_headers off` and `ignore_invalid_headers on`): the property
    /// `tollgate.http.plain_header_names` (`header_names.rs`), set in `postconfiguration`.
    pub plain_header_names: bool,
}

/// A server or location configuration.
#[derive(Default, Clone)]
pub struct LocConf {
    /// The chain (`None`: not set at this level, inherited).
    pub chain: Option<Vec<usize>>,
    /// `proxy_wasm_isolation`.
    pub isolation: Option<Isolation>,
    /// `proxy_wasm_request_headers_in_access`.
    pub headers_in_access: Option<bool>,
    /// `tollgate_metrics` here.
    pub metrics: bool,
    /// `wasm_socket_connect|send|read_timeout`.
    pub sockets: SocketTimeouts,
    /// `proxy_wasm_log_dispatch_errors` (unset: the `wasm{}` one, else on).
    pub log_dispatch_errors: Option<bool>,
    /// ngx_wasm_module's tuning directives given at this level (a second one is refused as
    /// nginx's slots refuse it: "is duplicate"); not inherited.
    pub tuning: Vec<&'static str>,
}

impl LocConf {
    /// nginx's merge: what this level did not set comes from the enclosing one (`prev`). A
    /// level with its own `proxy_wasm` directives keeps its chain whole (as ngx_wasm_module).
    pub fn merge(&mut self, prev: &LocConf) {
        if self.chain.is_none() {
            self.chain = prev.chain.clone();
        }
        if self.isolation.is_none() {
            self.isolation = prev.isolation;
        }
        if self.headers_in_access.is_none() {
            self.headers_in_access = prev.headers_in_access;
        }
        self.sockets.merge(&prev.sockets);
        if self.log_dispatch_errors.is_none() {
            self.log_dispatch_errors = prev.log_dispatch_errors;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_are_ngx_wasm_modules() {
        assert_eq!(Isolation::parse(b"none"), Some(Isolation::None));
        assert_eq!(Isolation::parse(b"stream"), Some(Isolation::Stream));
        assert_eq!(Isolation::parse(b"filter"), Some(Isolation::Filter));
        assert_eq!(Isolation::parse(b"Stream"), None);
        assert_eq!(Isolation::parse(b""), None);
        assert_eq!(Isolation::default(), Isolation::None);
    }

    #[test]
    fn a_level_without_settings_inherits_them_all() {
        let outer = LocConf {
            chain: Some(vec![0, 1]),
            isolation: Some(Isolation::Filter),
            headers_in_access: Some(true),
            metrics: true,
            sockets: SocketTimeouts {
                read: Some(Duration::from_millis(300)),
                ..SocketTimeouts::default()
            },
            log_dispatch_errors: Some(false),
            tuning: vec!["wasm_socket_buffer_size"],
        };
        let mut inner = LocConf::default();
        inner.merge(&outer);
        assert_eq!(inner.chain, Some(vec![0, 1]));
        assert_eq!(inner.isolation, Some(Isolation::Filter));
        assert_eq!(inner.headers_in_access, Some(true));
        assert_eq!(inner.sockets.read, Some(Duration::from_millis(300)));
        assert_eq!(inner.log_dispatch_errors, Some(false));
        // `tollgate_metrics` is a location's own handler, never inherited; nor is the record
        // of the level's own tuning directives.
        assert!(!inner.metrics);
        assert!(inner.tuning.is_empty());
    }

    #[test]
    fn a_level_with_its_own_chain_keeps_it_whole() {
        let outer = LocConf {
            chain: Some(vec![0, 1]),
            isolation: Some(Isolation::Stream),
            ..LocConf::default()
        };
        let mut inner = LocConf {
            chain: Some(vec![2]),
            headers_in_access: Some(false),
            ..LocConf::default()
        };
        inner.merge(&outer);
        // As ngx_wasm_module: the outer chain is not appended to or merged into the inner one.
        assert_eq!(inner.chain, Some(vec![2]));
        assert_eq!(inner.isolation, Some(Isolation::Stream));
        assert_eq!(inner.headers_in_access, Some(false));
    }

    #[test]
    fn a_filters_timeout_wins_and_zero_takes_the_socket_directives() {
        let d = CallDefaults {
            sockets: SocketTimeouts {
                connect: Some(Duration::from_millis(100)),
                send: Some(Duration::from_millis(200)),
                read: None,
            },
            resolve: Duration::from_secs(5),
            log_errors: true,
        };
        let (all, steps) = d.timeouts(2000);
        assert_eq!(all, Duration::from_secs(2));
        assert_eq!(steps.resolve, Duration::from_secs(2));
        assert_eq!(steps.connect, Duration::from_secs(2));
        let (all, steps) = d.timeouts(0);
        assert_eq!(steps.resolve, Duration::from_secs(5));
        assert_eq!(steps.connect, Duration::from_millis(100));
        // send + read, the unset read being ngx_wasm_module's 60 s.
        assert_eq!(steps.exchange, Duration::from_millis(60_200));
        assert_eq!(all, Duration::from_millis(65_300));
    }
}
