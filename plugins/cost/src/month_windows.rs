//! Calendar months on the rate limit service's windows, host-free: which counters hold a
//! tenant's month spend in global mode, and when one must be carried into another.
//!
//! The reference server (envoyproxy/ratelimit) counts in windows aligned on the Unix epoch
//! (`src/utils/utilities.go`, `UnitToDivider`): `YEAR` is 365 days, `MONTH` 30 days, and a
//! counter restarts at 0 when its window does. A calendar month's spend is counted under a
//! descriptor named by the month (`crate::global`), so a window that covers the whole month
//! counts exactly the month. A `YEAR` window does, except in the one month a year that holds a
//! `YEAR` boundary (epoch + k·365 days: 2026-12-18, 2027-12-18, 2028-12-17, ...). In those
//! months every booking is also counted in a `MONTH`-unit counter, the **bridge**, and the
//! month's spend is the larger of the two counts: each counts a part of the month's bookings, so
//! neither exceeds the spend, and one that counts the whole month equals it.
//!
//! A counter is **exact** when its window started at or before the month did; one whose window
//! starts inside the month misses the spend before that start. Before the exact counter's window
//! ends, the other counter, whose window started inside the month and outlives it, is made exact
//! by a **carry**: one gateway (the one whose claim on a `limit 1` descriptor the service
//! answers OK: its counter goes 0 → 1, every later claim finds it over) reads both counters in
//! the same call and books the difference into the new one ([`carry_due`]). December 2026:
//! `YEAR` counts Dec 1-17 and restarts on Dec 18; the bridge's window is Dec 3 - Jan 2, so from
//! Dec 3 to Dec 17 the `YEAR` count minus the bridge's (the spend of Dec 1-2) is carried into
//! the bridge, which is then exact to the end of the month.
//!
//! Where both windows start at the same instant inside the month (the `YEAR` boundary is also a
//! `MONTH` one: every 6th, 2029-12-17, 2035-12-16, ...) nothing is left to carry from: the
//! month's spend before that instant is not counted after it ([`chain_breaks`]). A carry is
//! also missed when no request of the tenant reaches any gateway during its interval (then
//! the spend before the new window's start is not counted).

use tollgate_common::rls::Unit;

/// Seconds per day.
const DAY: u64 = 86_400;
/// The reference server's `YEAR` window (s).
pub const YEAR_SECS: u64 = 365 * DAY;
/// The reference server's `MONTH` window (s).
pub const MONTH_SECS: u64 = 30 * DAY;

/// A counter of a calendar month's spend on the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Counter {
    /// `<ledger>/month/<yyyymm>` in `YEAR` windows: the month's counter.
    Year,
    /// `<ledger>/month-bridge/<yyyymm>` in `MONTH` windows, kept in a month that holds a `YEAR`
    /// boundary.
    Bridge,
}

impl Counter {
    /// The window's length (s).
    pub fn window_secs(self) -> u64 {
        match self {
            Counter::Year => YEAR_SECS,
            Counter::Bridge => MONTH_SECS,
        }
    }

    /// The limit override's unit.
    pub fn unit(self) -> Unit {
        match self {
            Counter::Year => Unit::Year,
            Counter::Bridge => Unit::Month,
        }
    }

    /// The period's name in the `cost` entry.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Year => "month",
            Counter::Bridge => "month-bridge",
        }
    }

    /// The claim's name in the `cost` entry, for a carry into this counter.
    pub fn claim_name(self) -> &'static str {
        match self {
            Counter::Year => "month-carry",
            Counter::Bridge => "month-bridge-carry",
        }
    }

    /// The one-byte code of the replay queue's encoding.
    pub fn code(self) -> u8 {
        match self {
            Counter::Year => 1,
            Counter::Bridge => 2,
        }
    }

    /// The counter of [`Counter::code`] `c`.
    pub fn from_code(c: u8) -> Option<Counter> {
        match c {
            1 => Some(Counter::Year),
            2 => Some(Counter::Bridge),
            _ => None,
        }
    }

    fn other(self) -> Counter {
        match self {
            Counter::Year => Counter::Bridge,
            Counter::Bridge => Counter::Year,
        }
    }

    /// Start and end (s) of this counter's window holding `secs`.
    fn window(self, secs: u64) -> (u64, u64) {
        let len = self.window_secs();
        let start = secs.saturating_sub(secs.checked_rem(len).unwrap_or(0));
        (start, start.saturating_add(len))
    }
}

/// The counters of month `month` (`yyyymm`): `[Year]`, or `[Year, Bridge]` in a month that
/// holds a `YEAR` boundary. Read and booked together; the month is spent when either is.
pub fn counters(month: u32) -> &'static [Counter] {
    if year_boundary_in_month(month).is_some() {
        &[Counter::Year, Counter::Bridge]
    } else {
        &[Counter::Year]
    }
}

/// A carry: the month's spend counted by `from` (exact) and not by `to` (its window started
/// inside the month), to be booked into `to` once, between `start` and `end` (Unix s): the
/// interval in which both windows are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carry {
    /// The exact counter.
    pub from: Counter,
    /// The counter made exact.
    pub to: Counter,
    /// When `to`'s window starts (s).
    pub start: u64,
    /// When `from`'s window ends (s), before the month does.
    pub end: u64,
}

/// The carries of month `month` (`yyyymm`), in time order, and whether the chain breaks (a
/// moment from which no counter is exact: both windows start at once inside the month).
fn chain(month: u32) -> (Vec<Carry>, bool) {
    let (Some((start, end)), Some(_)) = (month_bounds(month), year_boundary_in_month(month)) else {
        return (Vec::new(), false);
    };
    let mut carries = Vec::new();
    // Both counters are exact at the month's start (their windows hold it).
    let mut exact = [true, true];
    let idx = |c: Counter| usize::from(c == Counter::Bridge);
    let mut at = start;
    loop {
        // The next window start inside the month, of either counter.
        let next = |c: Counter| c.window(at).1;
        let t = next(Counter::Year).min(next(Counter::Bridge));
        if t >= end {
            break;
        }
        let starting: Vec<Counter> = [Counter::Year, Counter::Bridge]
            .into_iter()
            .filter(|c| next(*c) == t)
            .collect();
        for c in &starting {
            if let Some(e) = exact.get_mut(idx(*c)) {
                *e = false;
            }
        }
        if let [to] = starting.as_slice() {
            let from = to.other();
            let from_end = from.window(t).1;
            if exact.get(idx(from)) == Some(&true) && from_end < end {
                carries.push(Carry {
                    from,
                    to: *to,
                    start: t,
                    end: from_end,
                });
                if let Some(e) = exact.get_mut(idx(*to)) {
                    *e = true;
                }
            }
        }
        if !exact.contains(&true) {
            return (carries, true);
        }
        at = t;
    }
    (carries, false)
}

/// The carry due at `secs` in month `month`, if any.
pub fn carry_due(month: u32, secs: u64) -> Option<Carry> {
    chain(month)
        .0
        .into_iter()
        .find(|c| c.start <= secs && secs < c.end)
}

/// Whether month `month` has a moment from which neither counter counts its start (both windows
/// start at once inside it): its spend before that moment is not counted after it.
pub fn chain_breaks(month: u32) -> bool {
    chain(month).1
}

/// The first `YEAR`-window boundary of the reference server strictly inside calendar month
/// `month` (`yyyymm`), as Unix seconds. `None` for most months.
pub fn year_boundary_in_month(month: u32) -> Option<u64> {
    let (start, end) = month_bounds(month)?;
    let next = start.div_ceil(YEAR_SECS).checked_mul(YEAR_SECS)?;
    (next > start && next < end).then_some(next)
}

/// Unix seconds of the start of month `month` (`yyyymm`, years 1970-9998) and of the next one.
pub fn month_bounds(month: u32) -> Option<(u64, u64)> {
    let (y, m) = (u64::from(month / 100), u64::from(month % 100));
    let (ny, nm) = if m == 12 {
        (y.checked_add(1)?, 1)
    } else {
        (y, m.checked_add(1)?)
    };
    Some((month_start(y, m)?, month_start(ny, nm)?))
}

/// Unix seconds of 00:00 UTC on the first of month `m` (1-12) of year `y` (1970-9999).
fn month_start(y: u64, m: u64) -> Option<u64> {
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    crate::period::days_from_civil(y, m, 1).checked_mul(DAY)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    /// Unix seconds of 00:00 UTC on y-m-d.
    fn date(y: u64, m: u64, d: u64) -> u64 {
        crate::period::days_from_civil(y, m, d) * DAY
    }

    #[test]
    fn the_boundary_months_are_the_decembers_holding_a_year_boundary() {
        assert_eq!(year_boundary_in_month(202612), Some(date(2026, 12, 18)));
        assert_eq!(year_boundary_in_month(202712), Some(date(2027, 12, 18)));
        assert_eq!(year_boundary_in_month(202812), Some(date(2028, 12, 17)));
        for m in [202601, 202611, 202701, 202711] {
            assert_eq!(year_boundary_in_month(m), None, "{m}");
            assert_eq!(counters(m), &[Counter::Year]);
            assert_eq!(carry_due(m, month_bounds(m).unwrap().0 + DAY), None);
        }
        assert_eq!(counters(202612), &[Counter::Year, Counter::Bridge]);
        assert_eq!(year_boundary_in_month(0), None);
        assert_eq!(year_boundary_in_month(999_913), None);
    }

    #[test]
    fn december_2026_carries_the_year_count_into_the_bridge_from_dec_3_to_dec_17() {
        // The bridge's window is 2026-12-03 .. 2027-01-02 (20,790 days = 693 x 30).
        let c = carry_due(202612, date(2026, 12, 3)).unwrap();
        assert_eq!(
            c,
            Carry {
                from: Counter::Year,
                to: Counter::Bridge,
                start: date(2026, 12, 3),
                end: date(2026, 12, 18),
            }
        );
        assert_eq!(carry_due(202612, date(2026, 12, 18) - 1), Some(c));
        assert_eq!(carry_due(202612, date(2026, 12, 3) - 1), None);
        assert_eq!(carry_due(202612, date(2026, 12, 18)), None);
        assert!(!chain_breaks(202612));
    }

    #[test]
    fn december_2027_and_2028_carry_the_bridge_into_the_new_year_window() {
        // 2027: bridge 11-28 .. 12-28 covers the month's start, YEAR restarts on 12-18.
        let c = carry_due(202712, date(2027, 12, 20)).unwrap();
        assert_eq!(
            (c.from, c.to, c.start, c.end),
            (
                Counter::Bridge,
                Counter::Year,
                date(2027, 12, 18),
                date(2027, 12, 28)
            )
        );
        assert_eq!(carry_due(202712, date(2027, 12, 28)), None);
        // 2028: YEAR restarts on 12-17, the bridge (11-22 .. 12-22) is carried from until 12-22.
        let c = carry_due(202812, date(2028, 12, 17)).unwrap();
        assert_eq!(
            (c.from, c.to, c.end),
            (Counter::Bridge, Counter::Year, date(2028, 12, 22))
        );
        assert!(!chain_breaks(202712) && !chain_breaks(202812));
    }

    #[test]
    fn december_2029_breaks_the_chain_both_windows_restart_at_once() {
        assert_eq!(year_boundary_in_month(202912), Some(date(2029, 12, 17)));
        assert!(chain_breaks(202912));
        assert_eq!(carry_due(202912, date(2029, 12, 10)), None);
    }

    #[test]
    fn at_any_moment_of_a_boundary_month_a_counter_is_exact_or_being_carried_into() {
        // Every December to 2060 except those whose chain breaks: walk the month by hours;
        // a counter is exact when its window holds the month's start or a carry into it ended.
        for y in 2025..2060u64 {
            let month = u32::try_from(y * 100 + 12).unwrap();
            if year_boundary_in_month(month).is_none() || chain_breaks(month) {
                continue;
            }
            let (start, end) = month_bounds(month).unwrap();
            let carries = chain(month).0;
            let mut t = start;
            while t < end {
                let exact = [Counter::Year, Counter::Bridge].iter().any(|c| {
                    let (ws, _) = c.window(t);
                    ws <= start
                        || carries
                            .iter()
                            .any(|k| k.to == *c && k.start == ws && k.end <= t)
                });
                let carrying = carries.iter().any(|k| k.start <= t && t < k.end);
                assert!(
                    exact,
                    "{month} at {t}: no exact counter (carrying: {carrying})"
                );
                t += 3_600;
            }
        }
    }
}
