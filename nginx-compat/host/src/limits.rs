//! Bounds on a guest: how long one call into it may run (wasmtime's epoch interruption), how much
//! linear memory and how many table elements its instance may have (a `ResourceLimiter`).
//!
//! Time: the [`Engine`](crate::Engine) compiles every module with epoch checks (function entries
//! and loop headers), and an [`EpochTicker`] thread advances the engine's epoch every
//! [`EPOCH_TICK`]. Before each call into a guest the `Vm` sets the store's deadline to the
//! current epoch plus the ticks of its [`GuestLimits`] deadline; a guest still running then traps
//! with `Trap::Interrupt` (wasmtime docs, `Config::epoch_interruption`). Without a running ticker
//! the epoch never moves and no call is interrupted (the in-process tests that do not start one).
//!
//! Memory: `memory.grow` beyond [`GuestLimits::memory_max`] returns -1 to the guest, as the
//! WebAssembly spec allows for any failed growth (the Rust allocator then aborts: a trap); table
//! growth beyond [`GuestLimits::table_elements_max`] likewise. An instance whose module declares
//! more initial memory than the cap fails to instantiate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The epoch ticker's period: the granularity of every deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Bounds on every call into a guest and on its instance's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLimits {
    /// Longest one call may run: stream callbacks, `on_tick`, `on_http_call_response`,
    /// `on_queue_ready`, and an HTTP context's creation.
    pub call_deadline: Duration,
    /// Longest one start-up call may run: the module's `_initialize`/`_start`, a root
    /// context's creation, `on_vm_start` and `on_configure` (a large plugin configuration is
    /// parsed there).
    pub configure_deadline: Duration,
    /// Largest linear memory, in bytes.
    pub memory_max: usize,
    /// Most elements of a table (function references).
    pub table_elements_max: usize,
}

impl GuestLimits {
    /// 100 ms per call, 5 s per start-up call, 128 MiB of linear memory, 100,000 table elements
    /// (nginx-compat/README.md gives the measurements behind them).
    pub const DEFAULT: GuestLimits = GuestLimits {
        call_deadline: Duration::from_millis(100),
        configure_deadline: Duration::from_secs(5),
        memory_max: 128 << 20,
        table_elements_max: 100_000,
    };
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits::DEFAULT
    }
}

/// The epoch ticks that guarantee at least `d` before an interruption: the current tick may end
/// at once, so one more than `d` rounded up to whole ticks.
pub(crate) fn ticks(d: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos().max(1);
    let n = d.as_nanos().div_ceil(tick);
    u64::try_from(n).unwrap_or(u64::MAX).saturating_add(1)
}

/// Which deadline a call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// Start-up: `configure_deadline`.
    Startup,
    /// Everything else: `call_deadline`.
    Call,
}

/// The store's `ResourceLimiter`: [`GuestLimits`]' memory and table caps, and a note of the
/// last growth it refused (for the error message of the trap that usually follows).
pub(crate) struct Limiter {
    pub(crate) memory_max: usize,
    pub(crate) table_elements_max: usize,
    /// Set when a growth was refused; taken by the next error report.
    pub(crate) refused: Option<String>,
}

impl Limiter {
    pub(crate) fn new(limits: &GuestLimits) -> Limiter {
        Limiter {
            memory_max: limits.memory_max,
            table_elements_max: limits.table_elements_max,
            refused: None,
        }
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_max {
            self.refused = Some(format!(
                "memory limit of {} MiB reached (the guest asked for {} MiB)",
                self.memory_max >> 20,
                desired >> 20
            ));
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements_max {
            self.refused = Some(format!(
                "table limit of {} elements reached (the guest asked for {desired})",
                self.table_elements_max
            ));
            return Ok(false);
        }
        Ok(true)
    }

    /// The filter's instance and its callbacks' adapter (`combined_calls.rs`).
    fn instances(&self) -> usize {
        2
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        1
    }
}

/// A thread that advances an engine's epoch every [`EPOCH_TICK`] while it lives; dropping it
/// stops and joins the thread (within one tick). Start one per process that calls guests: in
/// an nginx worker after fork, and around configuration-time calls in the master (joined
/// before the master forks, so no thread crosses a fork).
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: wasmtime::Engine) -> Result<EpochTicker, crate::error::Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tollgate-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| crate::error::Error(format!("cannot start the epoch ticker: {e}")))?;
        Ok(EpochTicker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_the_deadline_with_one_tick_to_spare() {
        assert_eq!(ticks(Duration::ZERO), 1);
        assert_eq!(ticks(EPOCH_TICK), 2);
        assert_eq!(ticks(Duration::from_millis(100)), 21);
        assert_eq!(ticks(Duration::from_millis(101)), 22);
        assert_eq!(ticks(Duration::MAX), u64::MAX);
    }
}
