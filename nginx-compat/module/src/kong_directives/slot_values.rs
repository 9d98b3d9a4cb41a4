//! A directive's arguments parsed as nginx's slots parse them (`ngx_conf_set_msec_slot`,
//! `_flag_slot`, `_size_slot`, `_bufs_slot`), and the "is duplicate" of a second occurrence at
//! one level, with the messages naming the directive and the value.

use std::time::Duration;

use ngx::ffi::{ngx_conf_t, ngx_str_t};

use crate::util::{conf_args, lossy};
/// Argument `i` of the directive being parsed, lossily decoded (empty when absent).
pub(super) unsafe fn arg(cf: *mut ngx_conf_t, i: usize) -> String {
    // SAFETY: forwarded from the caller (`cf` live during a handler).
    unsafe { conf_args(cf).get(i).map(lossy).unwrap_or_default() }
}

/// The directive's name and its argument `i` as nginx's parser holds it.
pub(super) unsafe fn raw_arg<'a>(cf: *mut ngx_conf_t, i: usize) -> Option<&'a ngx_str_t> {
    // SAFETY: forwarded from the caller.
    unsafe { conf_args(cf).get(i) }
}

/// A time in nginx's syntax (`ngx_conf_set_msec_slot`: `ngx_parse_time`, 0 allowed).
pub(super) unsafe fn msec(cf: *mut ngx_conf_t, directive: &str) -> Result<Duration, String> {
    // SAFETY: forwarded from the caller; ngx_parse_time only reads the string.
    unsafe {
        let Some(v) = raw_arg(cf, 1) else {
            return Err(format!("tollgate: {directive}: missing time"));
        };
        let mut copy = *v;
        let ms = ngx::ffi::ngx_parse_time(&mut copy, 0);
        u64::try_from(ms).map(Duration::from_millis).map_err(|_| {
            format!(
                "tollgate: invalid value \"{}\" in \"{directive}\": a time such as 500ms or 5s",
                lossy(v)
            )
        })
    }
}

/// `on` or `off` (`ngx_conf_set_flag_slot`: case-insensitive).
pub(super) unsafe fn flag(cf: *mut ngx_conf_t, directive: &str) -> Result<bool, String> {
    // SAFETY: forwarded from the caller.
    let v = unsafe { arg(cf, 1) };
    if v.eq_ignore_ascii_case("on") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err(format!(
            "tollgate: invalid value \"{v}\" in \"{directive}\": it must be \"on\" or \"off\""
        ))
    }
}

/// A size in nginx's syntax (`ngx_parse_size`), as bytes.
pub(super) unsafe fn size_of(v: &ngx_str_t) -> Option<usize> {
    let mut copy = *v;
    // SAFETY: ngx_parse_size only reads the string.
    usize::try_from(unsafe { ngx::ffi::ngx_parse_size(&mut copy) }).ok()
}

/// `ngx_conf_set_size_slot`'s argument.
pub(super) unsafe fn size(cf: *mut ngx_conf_t, directive: &str) -> Result<usize, String> {
    // SAFETY: forwarded from the caller.
    unsafe {
        raw_arg(cf, 1).and_then(|v| size_of(v)).ok_or_else(|| {
            format!(
                "tollgate: invalid value \"{}\" in \"{directive}\": a size such as 1024 or 4k",
                arg(cf, 1)
            )
        })
    }
}

/// `ngx_conf_set_bufs_slot`'s `NUMBER SIZE`: a positive count and a positive size.
pub(super) unsafe fn bufs(cf: *mut ngx_conf_t, directive: &str) -> Result<(usize, usize), String> {
    // SAFETY: forwarded from the caller.
    unsafe {
        let n = arg(cf, 1).parse::<usize>().ok().filter(|n| *n > 0);
        let s = raw_arg(cf, 2).and_then(|v| size_of(v)).filter(|s| *s > 0);
        match (n, s) {
            (Some(n), Some(s)) => Ok((n, s)),
            _ => Err(format!(
                "tollgate: invalid value \"{} {}\" in \"{directive}\": NUMBER SIZE, such as 4 8k",
                arg(cf, 1),
                arg(cf, 2)
            )),
        }
    }
}

/// Refuses a second `directive` at one level, as nginx's slots do; records the first.
pub(super) fn once(seen: &mut Vec<&'static str>, directive: &'static str) -> Result<(), String> {
    if seen.contains(&directive) {
        return Err(format!("tollgate: \"{directive}\" directive is duplicate"));
    }
    seen.push(directive);
    Ok(())
}

/// Stores `value` in an unset `slot`; a set one "is duplicate".
pub(super) fn set_once<T>(slot: &mut Option<T>, value: T, directive: &str) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("tollgate: \"{directive}\" directive is duplicate"));
    }
    *slot = Some(value);
    Ok(())
}
