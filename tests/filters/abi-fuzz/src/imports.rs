//! Every import the nginx host defines (nginx-compat/host: `src/abi/*.rs`, `src/wasi.rs`), with
//! the host's signatures, plus a few it does not define (linked to its stubs). Pointers and sizes
//! are plain `u32` so that any value can be passed (wasm32: `i32` either way).

#[link(wasm_import_module = "env")]
extern "C" {
    pub fn proxy_log(level: u32, ptr: u32, len: u32) -> u32;
    pub fn proxy_get_log_level(ret: u32) -> u32;
    pub fn proxy_get_current_time_nanoseconds(ret: u32) -> u32;
    pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    pub fn proxy_get_property(pp: u32, pl: u32, rp: u32, rs: u32) -> u32;
    pub fn proxy_set_property(pp: u32, pl: u32, vp: u32, vl: u32) -> u32;
    pub fn proxy_get_header_map_pairs(t: u32, rp: u32, rs: u32) -> u32;
    pub fn proxy_get_header_map_size(t: u32, rs: u32) -> u32;
    pub fn proxy_set_header_map_pairs(t: u32, p: u32, l: u32) -> u32;
    pub fn proxy_get_header_map_value(t: u32, kp: u32, kl: u32, rp: u32, rs: u32) -> u32;
    pub fn proxy_add_header_map_value(t: u32, kp: u32, kl: u32, vp: u32, vl: u32) -> u32;
    pub fn proxy_replace_header_map_value(t: u32, kp: u32, kl: u32, vp: u32, vl: u32) -> u32;
    pub fn proxy_remove_header_map_value(t: u32, kp: u32, kl: u32) -> u32;
    pub fn proxy_get_buffer_bytes(t: u32, start: u32, max: u32, rp: u32, rs: u32) -> u32;
    pub fn proxy_get_buffer(t: u32, start: u32, max: u32, rp: u32, rs: u32) -> u32;
    pub fn proxy_set_buffer_bytes(t: u32, start: u32, size: u32, p: u32, l: u32) -> u32;
    pub fn proxy_set_buffer(t: u32, start: u32, size: u32, p: u32, l: u32) -> u32;
    pub fn proxy_get_buffer_status(t: u32, rl: u32, rf: u32) -> u32;
    pub fn proxy_get_configuration(rp: u32, rs: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_send_local_response(
        status: u32,
        dp: u32,
        dl: u32,
        bp: u32,
        bl: u32,
        hp: u32,
        hl: u32,
        grpc: i32,
    ) -> u32;
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_send_http_response(
        status: u32,
        dp: u32,
        dl: u32,
        bp: u32,
        bl: u32,
        hp: u32,
        hl: u32,
        grpc: i32,
    ) -> u32;
    pub fn proxy_continue_stream(t: u32) -> u32;
    pub fn proxy_continue_request() -> u32;
    pub fn proxy_continue_response() -> u32;
    pub fn proxy_close_stream(t: u32) -> u32;
    pub fn proxy_clear_route_cache() -> u32;
    pub fn proxy_done() -> u32;
    pub fn proxy_set_effective_context(id: u32) -> u32;
    pub fn proxy_get_shared_data(kp: u32, kl: u32, rp: u32, rs: u32, rcas: u32) -> u32;
    pub fn proxy_set_shared_data(kp: u32, kl: u32, vp: u32, vl: u32, cas: u32) -> u32;
    pub fn proxy_register_shared_queue(np: u32, nl: u32, rid: u32) -> u32;
    pub fn proxy_resolve_shared_queue(vp: u32, vl: u32, np: u32, nl: u32, rid: u32) -> u32;
    pub fn proxy_enqueue_shared_queue(id: u32, vp: u32, vl: u32) -> u32;
    pub fn proxy_dequeue_shared_queue(id: u32, rp: u32, rs: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_http_call(
        up: u32,
        ul: u32,
        hp: u32,
        hl: u32,
        bp: u32,
        bl: u32,
        tp: u32,
        tl: u32,
        timeout_ms: u32,
        rtoken: u32,
    ) -> u32;
    pub fn proxy_define_metric(kind: u32, np: u32, nl: u32, rid: u32) -> u32;
    pub fn proxy_increment_metric(id: u32, delta: i64) -> u32;
    pub fn proxy_record_metric(id: u32, value: u64) -> u32;
    pub fn proxy_get_metric(id: u32, ret: u32) -> u32;
    pub fn proxy_call_foreign_function(np: u32, nl: u32, ap: u32, al: u32, rp: u32, rs: u32)
        -> u32;
    // Not defined by the host: linked to its `Unimplemented` stub.
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_grpc_call(
        sp: u32,
        sl: u32,
        np: u32,
        nl: u32,
        mp: u32,
        ml: u32,
        ip: u32,
        il: u32,
        rp: u32,
        rl: u32,
        timeout_ms: u32,
        rtoken: u32,
    ) -> u32;
    pub fn proxy_get_status(rcode: u32, rp: u32, rs: u32) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    pub fn fd_write(fd: u32, iovs: u32, iovs_len: u32, ret: u32) -> i32;
    pub fn environ_sizes_get(rc: u32, rs: u32) -> i32;
    pub fn args_sizes_get(rc: u32, rs: u32) -> i32;
    pub fn environ_get(ptrs: u32, buf: u32) -> i32;
    pub fn args_get(ptrs: u32, buf: u32) -> i32;
    pub fn clock_time_get(id: u32, precision: u64, ret: u32) -> i32;
    pub fn clock_res_get(id: u32, ret: u32) -> i32;
    pub fn random_get(p: u32, l: u32) -> i32;
    pub fn proc_exit(code: u32);
    pub fn fd_close(fd: u32) -> i32;
    pub fn fd_seek(fd: u32, offset: i64, whence: u32, ret: u32) -> i32;
    pub fn fd_fdstat_get(fd: u32, ret: u32) -> i32;
    pub fn fd_prestat_get(fd: u32, ret: u32) -> i32;
    pub fn fd_prestat_dir_name(fd: u32, p: u32, l: u32) -> i32;
    pub fn sched_yield() -> i32;
    pub fn poll_oneoff(input: u32, out: u32, n: u32, ret: u32) -> i32;
    // Not defined by the host: linked to its `ENOSYS` stub.
    #[allow(clippy::too_many_arguments)]
    pub fn path_open(
        fd: u32,
        dirflags: u32,
        p: u32,
        l: u32,
        oflags: u32,
        base: u64,
        inheriting: u64,
        fdflags: u32,
        ret: u32,
    ) -> i32;
}
