#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failure panics

//! Compiling leaves no thread behind: nginx's master compiles every module and then forks its
//! workers, and a thread alive at fork is lost in the child with whatever it held (a rayon
//! global pool's threads would be). One test in its own binary, so that the process's threads
//! are this test's.

use tollgate_host::Engine;

/// The cost filter: the largest module, so that its functions are compiled in parallel.
const COST_WASM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../target/wasm32-wasip1/release/tollgate_cost.wasm"
);

/// The threads of this process (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

#[test]
fn compiling_leaves_no_thread_behind() {
    let wasm = std::fs::read(COST_WASM).expect("scripts/build.sh builds the filters first");
    let engine = Engine::new().unwrap();
    let before = threads();
    for round in 0..2 {
        let modules = engine.compile_all(&[&wasm, &wasm], None);
        assert!(modules.iter().all(Result::is_ok), "round {round}");
        assert_eq!(
            threads(),
            before,
            "round {round}: threads left after compile_all"
        );
        engine.compile(&wasm).unwrap();
        assert_eq!(
            threads(),
            before,
            "round {round}: threads left after compile"
        );
    }
}
