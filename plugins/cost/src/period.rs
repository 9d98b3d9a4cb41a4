//! UTC calendar periods for budgets: day ids (`yyyymmdd`), month ids (`yyyymm`) and the seconds
//! until the next period starts. Proleptic Gregorian calendar, Unix time without leap seconds
//! (POSIX), so every day has 86,400 seconds.

/// Seconds per day.
const DAY: u64 = 86_400;
/// The last second of 9999-12-31: times are clamped to it, which bounds every value below.
const MAX_SECS: u64 = 253_402_300_799;

/// The day and month a time falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periods {
    /// `yyyymmdd` (e.g. 20250131).
    pub day: u32,
    /// `yyyymm` (e.g. 202501).
    pub month: u32,
    /// Seconds until the next UTC midnight (1..=86400).
    pub day_reset_secs: u64,
    /// Seconds until 00:00 UTC on the first of next month.
    pub month_reset_secs: u64,
    /// The time itself (Unix seconds, clamped to 9999-12-31T23:59:59).
    pub secs: u64,
}

/// Days since 1970-01-01 to (year, month 1-12, day 1-31). Era-based conversion: 400-year eras
/// of 146,097 days starting on March 1st (so that the leap day ends the year).
// Bounded inputs (0..=2,932,896 days): no operation below can overflow.
#[allow(clippy::arithmetic_side_effects)]
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of (year 1970-9999, month 1-12, day 1-31): the inverse of [`civil`]
/// (outside those ranges the result is meaningless; it never overflows for them).
#[allow(clippy::arithmetic_side_effects)]
pub fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl Periods {
    /// The periods of Unix time `secs` (UTC).
    #[allow(clippy::arithmetic_side_effects)]
    pub fn at(secs: u64) -> Periods {
        let secs = secs.min(MAX_SECS);
        let days = secs / DAY;
        let (y, m, d) = civil(days);
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        let next_month = days_from_civil(ny, nm, 1) * DAY;
        Periods {
            day: u32::try_from(y * 10_000 + m * 100 + d).unwrap_or(u32::MAX),
            month: u32::try_from(y * 100 + m).unwrap_or(u32::MAX),
            day_reset_secs: DAY - secs % DAY,
            month_reset_secs: next_month - secs,
            secs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let p = Periods::at(0);
        assert_eq!(
            (p.day, p.month, p.day_reset_secs),
            (19700101, 197001, 86_400)
        );
        assert_eq!(p.month_reset_secs, 31 * 86_400);
        // 2024-02-29T23:59:59Z (leap day).
        let p = Periods::at(1_709_251_199);
        assert_eq!(
            (p.day, p.month, p.day_reset_secs, p.month_reset_secs),
            (20240229, 202402, 1, 1)
        );
        // 2024-12-31T12:00:00Z: the next month is in the next year.
        let p = Periods::at(1_735_646_400);
        assert_eq!(
            (p.day, p.month, p.month_reset_secs),
            (20241231, 202412, 43_200)
        );
        // 2000-03-01 (a 400-year leap year's March).
        assert_eq!(Periods::at(951_868_800).day, 20000301);
        assert_eq!(Periods::at(u64::MAX).day, 99991231);
    }

    #[test]
    fn round_trips_every_day_for_a_millennium() {
        let mut last = 0;
        for days in 0..(366 * 1000) {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days);
            let id = y * 10_000 + m * 100 + d;
            assert!(id > last);
            last = id;
        }
    }
}
