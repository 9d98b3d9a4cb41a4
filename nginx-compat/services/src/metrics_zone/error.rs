//! The errors of metric operations ([`MetricsError`], one per proxy-wasm status they become).
/// Errors of metric operations; the proxy-wasm status of the same name applies
/// (`Corrupt`: `InternalFailure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsError {
    /// No metric with that id.
    NotFound,
    /// Wrong kind for the call, `delta <= 0` on a counter, an empty or too long name, or a name
    /// defined with another kind.
    BadArgument,
    /// No definition or slot left (see the module documentation).
    NoSpace,
    /// The zone holds an impossible value (offset out of range).
    Corrupt,
}

impl std::fmt::Display for MetricsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricsError::NotFound => "metric not found",
            MetricsError::BadArgument => "bad argument",
            MetricsError::NoSpace => "metrics zone full",
            MetricsError::Corrupt => "metrics zone corrupted",
        })
    }
}

impl std::error::Error for MetricsError {}
