//! The host's ABI edges with hand-written modules (WAT): version detection, linking, traps,
//! bounds checks, stubs, WASI output, effective contexts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::string_slice,
    clippy::arithmetic_side_effects
)]

use std::rc::Rc;

use tollgate_host::testing::MemoryHost;
use tollgate_host::{
    AbiVersion, Action, Engine, HttpId, LogLevel, Module, Stream, StreamCallback, Vm,
};

/// A module with a bump allocator, the 0.2.x version export and `body` (more functions).
fn wat(version: &str, imports: &str, body: &str) -> Vec<u8> {
    let text = format!(
        r#"(module
          {imports}
          (memory (export "memory") 1)
          (global $heap (mut i32) (i32.const 4096))
          (func (export "proxy_abi_version_{version}"))
          (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
            (local $p i32)
            (local.set $p (global.get $heap))
            (global.set $heap (i32.add (global.get $heap) (local.get $n)))
            (local.get $p))
          {body})"#
    );
    wat::parse_str(text).unwrap()
}

fn compile(bytes: &[u8]) -> Result<Module, tollgate_host::Error> {
    Engine::new().unwrap().compile(bytes)
}

const LOG: &str = r#"(import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))"#;

#[test]
fn abi_0_2_0_is_detected_and_runs() {
    let m = compile(&wat(
        "0_2_0",
        LOG,
        r#"(data (i32.const 100) "configured")
           (func (export "proxy_on_context_create") (param i32 i32))
           (func (export "proxy_on_configure") (param i32 i32) (result i32)
             (drop (call $log (i32.const 2) (i32.const 100) (i32.const 10)))
             (i32.const 1))"#,
    ))
    .unwrap();
    assert_eq!(m.abi_version(), AbiVersion::V0_2_0);
    let host = Rc::new(MemoryHost::new());
    let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
    vm.create_root("p", b"{}").unwrap();
    let logs = host.logs.borrow();
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].message, "configured");
    assert_eq!(logs[0].plugin, "p");
    assert_eq!(logs[0].level, LogLevel::Info);
}

#[test]
fn non_proxy_wasm_and_old_abi_are_refused() {
    let err = compile(&wat::parse_str(r#"(module (memory (export "memory") 1))"#).unwrap())
        .err()
        .unwrap();
    assert!(err.0.contains("proxy_abi_version"), "{err}");
    let err = compile(&wat("0_1_0", "", "")).err().unwrap();
    assert!(err.0.contains("0.1.0"), "{err}");
    assert!(compile(b"not wasm").is_err());
}

#[test]
fn imports_of_unknown_modules_fail_clearly() {
    let err = compile(&wat(
        "0_2_1",
        r#"(import "foo" "bar" (func (param i32) (result i32)))"#,
        "",
    ))
    .err()
    .unwrap();
    assert!(err.0.contains("foo.bar"), "{err}");
}

#[test]
fn unknown_env_imports_return_unimplemented() {
    // on_configure returns whether the unknown host function returned 12.
    let m = compile(&wat(
        "0_2_1",
        r#"(import "env" "proxy_something_new" (func $new (param i32 i64) (result i32)))
           (import "env" "proxy_grpc_cancel" (func $cancel (param i32) (result i32)))"#,
        r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
             (i32.and
               (i32.eq (call $new (i32.const 1) (i64.const 2)) (i32.const 12))
               (i32.eq (call $cancel (i32.const 1)) (i32.const 12))))"#,
    ))
    .unwrap();
    let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
    vm.create_root("p", b"").unwrap();
}

#[test]
fn out_of_bounds_pointers_are_invalid_memory_access() {
    // on_configure returns whether proxy_log with a pointer past the memory returned 6.
    let m = compile(&wat(
        "0_2_1",
        LOG,
        r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
             (i32.and
               (i32.eq (call $log (i32.const 2) (i32.const 65530) (i32.const 100)) (i32.const 6))
               (i32.eq (call $log (i32.const 2) (i32.const -1) (i32.const 2)) (i32.const 6))))"#,
    ))
    .unwrap();
    let host = Rc::new(MemoryHost::new());
    let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
    vm.create_root("p", b"").unwrap();
    assert!(host.logs.borrow().is_empty());
}

#[test]
fn a_trap_is_an_error_and_poisons_the_vm() {
    let m = compile(&wat(
        "0_2_1",
        "",
        r#"(func (export "proxy_on_context_create") (param i32 i32))
           (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
             (i32.load (i32.const 70000)))"#,
    ))
    .unwrap();
    let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
    let root = vm.create_root("p", b"").unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = Stream {
        request_headers: vec![(b":path".to_vec(), b"/".to_vec())],
        ..Default::default()
    };
    let err = vm
        .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap_err();
    assert!(err.0.contains("out of bounds"), "{err}");
    assert!(vm.is_poisoned());
    // The stream came back.
    assert_eq!(s.request_headers.len(), 1);
    assert!(vm
        .on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .is_err());
    assert!(vm.create_http(root).is_err());
}

#[test]
fn wasi_stdout_is_logged_and_proc_exit_traps() {
    let m = compile(&wat(
        "0_2_1",
        r#"(import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
           (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
           (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))"#,
        r#"(data (i32.const 100) "hello\nwor")
           (data (i32.const 200) "ld\n")
           ;; iovecs at 300: (100, 9), (200, 3)
           (data (i32.const 300) "\64\00\00\00\09\00\00\00\c8\00\00\00\03\00\00\00")
           (func (export "proxy_on_configure") (param i32 i32) (result i32)
             (drop (call $write (i32.const 2) (i32.const 300) (i32.const 2) (i32.const 400)))
             ;; 12 bytes written, and an unknown WASI function is ENOSYS (52)
             (i32.and
               (i32.eq (i32.load (i32.const 400)) (i32.const 12))
               (i32.eq (call $read (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)) (i32.const 52))))
           (func (export "proxy_on_tick") (param i32)
             (call $exit (i32.const 3)))"#,
    ))
    .unwrap();
    let host = Rc::new(MemoryHost::new());
    let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
    let root = vm.create_root("p", b"").unwrap();
    {
        let logs = host.logs.borrow();
        let lines: Vec<_> = logs.iter().map(|l| (l.level, l.message.as_str())).collect();
        assert_eq!(
            lines,
            [(LogLevel::Error, "hello"), (LogLevel::Error, "world")]
        );
    }
    let err = vm.on_tick(root).unwrap_err();
    assert!(err.0.contains("proc_exit(3)"), "{err}");
    assert!(vm.is_poisoned());
}

#[test]
fn properties_builtins_and_returned_buffers() {
    // on_configure reads the property named at 100 and logs it.
    let m = compile(&wat(
        "0_2_1",
        r#"(import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
           (import "env" "proxy_get_property" (func $get (param i32 i32 i32 i32) (result i32)))"#,
        r#"(data (i32.const 100) "plugin_vm_id")
           (data (i32.const 120) "plugin_name")
           (func $show (param $p i32) (param $n i32)
             (if (i32.eqz (call $get (local.get $p) (local.get $n) (i32.const 200) (i32.const 204)))
               (then (drop (call $log (i32.const 2) (i32.load (i32.const 200)) (i32.load (i32.const 204)))))))
           (func (export "proxy_on_configure") (param i32 i32) (result i32)
             (call $show (i32.const 100) (i32.const 12))
             (call $show (i32.const 120) (i32.const 11))
             (i32.const 1))"#,
    ))
    .unwrap();
    let host = Rc::new(MemoryHost::new());
    let mut vm = Vm::new(&m, host.clone(), "my_vm", b"").unwrap();
    vm.create_root("my_plugin", b"").unwrap();
    let messages: Vec<_> = host
        .logs
        .borrow()
        .iter()
        .map(|l| l.message.clone())
        .collect();
    assert_eq!(messages, ["my_vm", "my_plugin"]);
}

#[test]
fn continue_from_a_root_callback_is_recorded_for_take_resumed() {
    // The module remembers the last HTTP context and, on tick, makes it effective and resumes it.
    let m = compile(&wat(
        "0_2_1",
        r#"(import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
           (import "env" "proxy_continue_stream" (func $cont (param i32) (result i32)))
           (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))"#,
        r#"(global $http (mut i32) (i32.const 0))
           (func (export "proxy_on_context_create") (param $id i32) (param $parent i32)
             (if (local.get $parent) (then (global.set $http (local.get $id)))))
           (func (export "proxy_on_configure") (param i32 i32) (result i32)
             (i32.eqz (call $tick (i32.const 250))))
           (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
             (i32.const 1))
           (func (export "proxy_on_tick") (param i32)
             (if (i32.eqz (call $eff (global.get $http)))
               (then (drop (call $cont (i32.const 0))))))"#,
    ))
    .unwrap();
    let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
    let root = vm.create_root("p", b"").unwrap();
    assert_eq!(vm.tick_period_ms(root), 250);
    let id = vm.create_http(root).unwrap();
    let mut s = Stream::default();
    assert_eq!(
        vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
            .unwrap(),
        Action::Pause
    );
    assert!(vm.take_resumed().is_empty());
    vm.on_tick(root).unwrap();
    assert_eq!(vm.take_resumed(), [HttpId(id.0)]);
    assert!(vm.take_resumed().is_empty());
}

#[test]
fn request_trailers_the_embedding_does_not_have_refuse_writes() {
    // on_request_headers tries add, replace, remove and set_pairs (an empty map) on the request
    // trailers (map 1), then add on the response trailers (map 3), reads the request trailers'
    // pairs, and reports the six statuses as digits in the request header `x-status`.
    let m = compile(&wat(
        "0_2_1",
        r#"(import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
           (import "env" "proxy_replace_header_map_value" (func $replace (param i32 i32 i32 i32 i32) (result i32)))
           (import "env" "proxy_remove_header_map_value" (func $remove (param i32 i32 i32) (result i32)))
           (import "env" "proxy_set_header_map_pairs" (func $set (param i32 i32 i32) (result i32)))
           (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))"#,
        r#"(data (i32.const 100) "x-t")
           (data (i32.const 110) "v")
           (data (i32.const 120) "x-status")
           (func $digit (param $at i32) (param $status i32)
             (i32.store8 (local.get $at) (i32.add (i32.const 48) (local.get $status))))
           (func (export "proxy_on_context_create") (param i32 i32))
           (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
             (call $digit (i32.const 300)
               (call $add (i32.const 1) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
             (call $digit (i32.const 301)
               (call $replace (i32.const 1) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
             (call $digit (i32.const 302)
               (call $remove (i32.const 1) (i32.const 100) (i32.const 3)))
             (call $digit (i32.const 303)
               (call $set (i32.const 1) (i32.const 200) (i32.const 4)))
             (call $digit (i32.const 304)
               (call $add (i32.const 3) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 1)))
             (call $digit (i32.const 305)
               (call $pairs (i32.const 1) (i32.const 400) (i32.const 404)))
             (drop (call $add (i32.const 0) (i32.const 120) (i32.const 8) (i32.const 300) (i32.const 6)))
             (i32.const 0))"#,
    ))
    .unwrap();
    let mut vm = Vm::new(&m, Rc::new(MemoryHost::new()), "vm", b"").unwrap();
    let root = vm.create_root("p", b"").unwrap();
    let status = |s: &Stream| {
        s.request_headers
            .iter()
            .find(|(k, _)| k == b"x-status")
            .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
            .unwrap()
    };

    // nginx: no request trailers. Writes are BadArgument (2); reads see an empty map.
    let id = vm.create_http(root).unwrap();
    let mut s = Stream {
        request_trailers_unavailable: true,
        ..Default::default()
    };
    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    assert_eq!(status(&s), "222200");
    assert!(s.request_trailers.is_empty() && !s.request_trailers_changed);
    assert_eq!(s.response_trailers, [(b"x-t".to_vec(), b"v".to_vec())]);
    assert!(s.response_trailers_changed);

    // An embedding that has them: the writes apply and mark the map changed.
    let id = vm.create_http(root).unwrap();
    let mut s = Stream::default();
    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    assert_eq!(status(&s), "000000");
    assert!(s.request_trailers.is_empty(), "set_pairs emptied it last");
    assert!(s.request_trailers_changed);
}

#[test]
fn one_fd_write_is_a_short_write_of_at_most_64_kib() {
    // 4096 iovecs naming the whole 64 KiB page: 256 MiB asked for in one call. The host takes
    // 64 KiB (a short write, as WASI and POSIX writev allow) and says so; it used to copy and
    // log all of it (a guest with a few MiB of memory held the host for seconds per call).
    let m = compile(&wat(
        "0_2_1",
        r#"(import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
           (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))"#,
        r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
             (local $i i32)
             (loop $fill
               (i32.store (i32.mul (local.get $i) (i32.const 8)) (i32.const 0))
               (i32.store (i32.add (i32.mul (local.get $i) (i32.const 8)) (i32.const 4)) (i32.const 65536))
               (local.set $i (i32.add (local.get $i) (i32.const 1)))
               (br_if $fill (i32.lt_u (local.get $i) (i32.const 4096))))
             (drop (call $write (i32.const 1) (i32.const 0) (i32.const 4096) (i32.const 65528)))
             ;; Report the count written as a 4-byte message (the page's last bytes).
             (i32.store (i32.const 65532) (i32.load (i32.const 65528)))
             (drop (call $log (i32.const 5) (i32.const 65532) (i32.const 4)))
             (i32.const 1))"#,
    ))
    .unwrap();
    let host = Rc::new(MemoryHost::new());
    // Only the Critical report reaches the log, not the written bytes (Info).
    host.level.set(LogLevel::Critical);
    let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
    let start = std::time::Instant::now();
    vm.create_root("p", b"").unwrap();
    let logs = host.logs.borrow();
    let written = u32::from_le_bytes(logs[0].message.as_bytes().try_into().unwrap_or([0xff; 4]));
    assert_eq!(written, 64 << 10, "bytes written by one fd_write");
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn an_allocator_that_changes_the_result_it_is_asked_room_for_gets_a_status() {
    // The host measures a result, calls the guest's allocator, then copies. This allocator first
    // changes what is being returned (mode 1: makes the other root effective, so the plugin
    // name and configuration change; 2: replaces the header being read; 3: sets the property
    // being read), to another length. Each read answers InternalFailure (10), logged as 4 bytes;
    // the host used to panic (copy_from_slice of two lengths: an abort in nginx).
    let m = wat::parse_str(
        r#"(module
          (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
          (import "env" "proxy_get_configuration" (func $getcfg (param i32 i32) (result i32)))
          (import "env" "proxy_get_header_map_value" (func $gethdr (param i32 i32 i32 i32 i32) (result i32)))
          (import "env" "proxy_get_header_map_pairs" (func $getmap (param i32 i32 i32) (result i32)))
          (import "env" "proxy_replace_header_map_value" (func $rephdr (param i32 i32 i32 i32 i32) (result i32)))
          (import "env" "proxy_get_property" (func $getprop (param i32 i32 i32 i32) (result i32)))
          (import "env" "proxy_set_property" (func $setprop (param i32 i32 i32 i32) (result i32)))
          (import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
          (memory (export "memory") 1)
          (global $heap (mut i32) (i32.const 4096))
          (global $mode (mut i32) (i32.const 0))
          (data (i32.const 100) "x-h")
          (data (i32.const 110) "a much longer value")
          (data (i32.const 140) "prop")
          (data (i32.const 150) "plugin_name")
          (func (export "proxy_abi_version_0_2_1"))
          (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
            (local $p i32)
            (if (i32.eq (global.get $mode) (i32.const 1))
              (then (drop (call $eff (i32.const 1)))))
            (if (i32.eq (global.get $mode) (i32.const 2))
              (then (drop (call $rephdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 19)))))
            (if (i32.eq (global.get $mode) (i32.const 3))
              (then (drop (call $setprop (i32.const 140) (i32.const 4) (i32.const 110) (i32.const 19)))))
            (local.set $p (global.get $heap))
            (global.set $heap (i32.add (global.get $heap) (local.get $n)))
            (local.get $p))
          (func $report (param $status i32)
            (i32.store (i32.const 200) (local.get $status))
            (drop (call $log (i32.const 2) (i32.const 200) (i32.const 4))))
          (func (export "proxy_on_context_create") (param i32 i32))
          (func (export "proxy_on_configure") (param $root i32) (param i32) (result i32)
            (if (i32.eq (local.get $root) (i32.const 2))
              (then
                (global.set $mode (i32.const 1))
                (call $report (call $getcfg (i32.const 300) (i32.const 304)))
                (drop (call $eff (i32.const 2)))
                (call $report (call $getprop (i32.const 150) (i32.const 11) (i32.const 300) (i32.const 304)))
                (global.set $mode (i32.const 0))))
            (i32.const 1))
          (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
            (global.set $mode (i32.const 2))
            (call $report (call $gethdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 300) (i32.const 304)))
            (drop (call $rephdr (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 100) (i32.const 1)))
            (call $report (call $getmap (i32.const 0) (i32.const 300) (i32.const 304)))
            (drop (call $setprop (i32.const 140) (i32.const 4) (i32.const 140) (i32.const 4)))
            (global.set $mode (i32.const 3))
            (call $report (call $getprop (i32.const 140) (i32.const 4) (i32.const 300) (i32.const 304)))
            (global.set $mode (i32.const 0))
            (i32.const 0)))"#,
    )
    .unwrap();
    let m = compile(&m).unwrap();
    let host = Rc::new(MemoryHost::new());
    let mut vm = Vm::new(&m, host.clone(), "vm", b"").unwrap();
    vm.create_root("a", b"short").unwrap();
    let root = vm
        .create_root("bbbb", b"a much longer configuration")
        .unwrap();
    let id = vm.create_http(root).unwrap();
    let mut s = Stream {
        request_headers: vec![(b"x-h".to_vec(), b"v".to_vec())],
        ..Default::default()
    };
    vm.on_stream(StreamCallback::RequestHeaders, id, &mut s, true)
        .unwrap();
    assert!(!vm.is_poisoned());
    let statuses: Vec<u32> = host
        .logs
        .borrow()
        .iter()
        .map(|l| u32::from_le_bytes(l.message.as_bytes().try_into().unwrap()))
        .collect();
    assert_eq!(statuses, [10, 10, 10, 10, 10]);
}
