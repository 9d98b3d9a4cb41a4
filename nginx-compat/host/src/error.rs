//! The host's error type.

/// Errors of loading, instantiating and calling a module. A trap in a callback is an `Error`
/// too: the embedding fails that request with 500 and logs the message; the `Vm` stays usable
/// only if [`Vm::is_poisoned`] says so (a trapped instance is replaced by a fresh one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl Error {
    pub(crate) fn wasm(what: &str, e: &wasmtime::Error) -> Error {
        let mut msg = String::from(what);
        for cause in e.chain() {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
        }
        Error(msg)
    }
}
