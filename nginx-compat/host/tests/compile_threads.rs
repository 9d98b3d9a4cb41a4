#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::arithmetic_side_effects
)] // a test: a failure panics

//! Compiling leaves no thread behind: nginx's master compiles every module and then forks its
//! workers, and a thread alive at fork is lost in the child with whatever it held (a rayon
//! global pool's threads would be). One test in its own binary, so that the process's threads
//! are this test's.

use tollgate_host::Engine;

/// jwt-auth: the largest filter, so that its functions are compiled in parallel.
const JWT_AUTH_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../target/wasm32-wasip1/release/tollgate_jwt_auth.wasm"
);

/// The threads of this process (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// The threads of this process once those just joined have left `/proc/self/task` (a joined
/// thread's entry can outlive the join by a moment), within 2 s: a thread still running then
/// (rayon's global pool's) is counted.
fn settled_threads(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let n = threads();
        if n == want || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn compiling_leaves_no_thread_behind() {
    let wasm = std::fs::read(JWT_AUTH_WASM).expect("scripts/build.sh builds the filters first");
    let engine = Engine::new().unwrap();
    let before = threads();
    for round in 0..2 {
        let modules = engine.compile_all(&[&wasm, &wasm], None);
        assert!(modules.iter().all(Result::is_ok), "round {round}");
        assert_eq!(
            settled_threads(before),
            before,
            "round {round}: threads left after compile_all"
        );
        engine.compile(&wasm).unwrap();
        assert_eq!(
            settled_threads(before),
            before,
            "round {round}: threads left after compile"
        );
    }
}
