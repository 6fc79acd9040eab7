//! What an upstream's answer says about its quota: a pause (`429`, or `503` with
//! `Retry-After`) or what is left in its current window (the IETF `RateLimit` field, the
//! earlier drafts' `RateLimit-Remaining`/`-Reset`, the common `X-RateLimit-Remaining`/`-Reset`).
//!
//! Every value is untrusted: a value that does not parse, or parses to something no honest
//! upstream sends, is ignored and counted, never a panic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, StatusCode};

/// The most policies of one upstream whose caps are kept apart; a policy an answer names
/// beyond them is folded into the one whose reset is nearest its own (the least remaining,
/// the longer reset: never more than either lets through).
pub(super) const MOST_POLICIES: usize = 4;

/// What an answer said one of the upstream's policies leaves: at most `remaining` more in
/// the next `reset`. `policy` names it: a hash of its name in a `RateLimit` field, 0 for the
/// fields that name none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Left {
    pub(super) policy: u64,
    pub(super) remaining: u64,
    pub(super) reset: Duration,
}

/// What one answer said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// Nothing about the quota.
    Nothing,
    /// Send nothing more for this long (a refusal).
    Pause(Duration),
    /// What each of the upstream's policies leaves, one or more of them.
    Left(Lefts),
}

/// What an answer said of each policy it named, up to [`MOST_POLICIES`].
pub(super) type Lefts = [Option<Left>; MOST_POLICIES];

/// A `429` with no usable `Retry-After` and no reset: pause this long.
pub(super) const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// A reset or a `Retry-After` in seconds at least this large is a Unix time (as GitHub's and
/// Twitter's `X-RateLimit-Reset` are), not a delay.
const EPOCH_SECONDS: u64 = 1_000_000_000;

/// What `status` and `headers` say, with the number of rate-limit values that were present
/// but ignored as malformed. Durations are capped at `max_pause`.
pub(super) fn hear(status: StatusCode, headers: &HeaderMap, max_pause: Duration) -> (Heard, u64) {
    let mut malformed = 0;
    let left = left(headers, &mut malformed);
    let refused = status == StatusCode::TOO_MANY_REQUESTS;
    let unavailable = status == StatusCode::SERVICE_UNAVAILABLE;
    let heard = if refused || unavailable {
        match retry_after(headers, &mut malformed) {
            Some(pause) => Heard::Pause(pause),
            // A 503 without Retry-After is an outage, not a quota: nothing learned.
            None if unavailable => Heard::Nothing,
            // The tightest policy's reset: the least remaining, and of those the longest.
            None => Heard::Pause(
                left.iter()
                    .flatten()
                    .min_by_key(|left| (left.remaining, std::cmp::Reverse(left.reset)))
                    .map(|left| left.reset)
                    .filter(|&reset| reset > Duration::ZERO)
                    .unwrap_or(DEFAULT_PAUSE),
            ),
        }
    } else if left[0].is_some() {
        Heard::Left(left)
    } else {
        Heard::Nothing
    };
    let heard = match heard {
        Heard::Pause(pause) => Heard::Pause(pause.min(max_pause)),
        Heard::Left(mut lefts) => {
            for left in lefts.iter_mut().flatten() {
                left.reset = left.reset.min(max_pause);
            }
            Heard::Left(lefts)
        }
        Heard::Nothing => Heard::Nothing,
    };
    (heard, malformed)
}

/// What is left of each policy, from every style of fields present (none: the first entry
/// is `None`). Each style is read on its own, a malformed one counted and skipped, and what
/// they say is merged ([`place`]): the unnamed policies of every style are one policy, the
/// least remaining and the longest reset any of them reported, so a stricter style is never
/// hidden by a more generous one.
fn left(headers: &HeaderMap, malformed: &mut u64) -> Lefts {
    let mut lefts: Lefts = [None; MOST_POLICIES];
    // A list field may come in several lines: one list, in order (RFC 9110, section 5.3).
    let mut lines = Vec::new();
    let mut unreadable = false;
    for value in headers.get_all(HeaderName::from_static("ratelimit")) {
        match value.to_str() {
            Ok(text) => lines.push(text.trim()),
            Err(_) => unreadable = true,
        }
    }
    if unreadable {
        *malformed += 1;
    } else if !lines.is_empty() {
        let value = lines.join(", ");
        match structured(&value).or_else(|| dictionary(&value).map(|only| vec![only])) {
            Some(members) => {
                for member in members {
                    place(&mut lefts, member);
                }
            }
            None => *malformed += 1,
        }
    }
    for (remaining, reset) in [
        ("ratelimit-remaining", "ratelimit-reset"),
        ("x-ratelimit-remaining", "x-ratelimit-reset"),
    ] {
        let Some(remaining) = one(headers, remaining, malformed) else {
            continue;
        };
        let Some(remaining) = integer(remaining) else {
            *malformed += 1;
            continue;
        };
        let Some(reset) = one(headers, reset, malformed) else {
            // A remaining count with no reset says nothing about when it ends.
            continue;
        };
        match seconds_or_epoch(reset) {
            Some(reset) => place(&mut lefts, unnamed(remaining, reset)),
            None => *malformed += 1,
        }
    }
    lefts
}

/// What the fields that name no policy say: policy 0.
fn unnamed(remaining: u64, reset: Duration) -> Left {
    Left {
        policy: 0,
        remaining,
        reset,
    }
}

/// Puts what one answer said of a policy among `lefts`, the one rule for every source: with
/// what is there of the same policy (the least remaining, the longer reset), else in the
/// first free place, else, past [`MOST_POLICIES`], folded the same way into the policy whose
/// reset is nearest its own. Either way never more than any report lets through.
fn place(lefts: &mut Lefts, member: Left) {
    let place = lefts
        .iter()
        .position(|left| left.is_none_or(|left| left.policy == member.policy))
        .or_else(|| {
            // No room: the policy whose reset is nearest this one's.
            let apart = |left: &Left| left.reset.abs_diff(member.reset);
            (0..MOST_POLICIES).min_by_key(|&i| lefts[i].as_ref().map(apart))
        })
        .unwrap_or(MOST_POLICIES - 1);
    lefts[place] = Some(match lefts[place] {
        Some(left) => Left {
            policy: left.policy,
            remaining: left.remaining.min(member.remaining),
            reset: left.reset.max(member.reset),
        },
        None => member,
    });
}

/// The field's one value as text; absent, repeated or not text counts as absent (the last
/// two as malformed).
fn one<'a>(headers: &'a HeaderMap, name: &'static str, malformed: &mut u64) -> Option<&'a str> {
    let name = HeaderName::from_static(name);
    let mut values = headers.get_all(&name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        *malformed += 1;
        return None;
    }
    match value.to_str() {
        Ok(text) => Some(text.trim()),
        Err(_) => {
            *malformed += 1;
            None
        }
    }
}

/// The current draft's structured field, `"name";r=42;t=17` with one member per policy:
/// each member, named by a hash of its name, in the order given ([`place`] merges a name
/// given twice into one policy, the least of its members). A parameter given twice in a
/// member counts its least `r` and its longest `t`. `None` if any member is not one.
fn structured(value: &str) -> Option<Vec<Left>> {
    let mut members = Vec::new();
    for member in value.split(',') {
        let mut params = member.trim().split(';');
        let name = params.next()?.trim();
        let quoted = name.len() >= 2 && name.starts_with('"') && name.ends_with('"');
        if !quoted && !is_token(name) {
            return None;
        }
        let (mut remaining, mut reset) = (None, None);
        for param in params {
            let (key, value) = param.trim().split_once('=')?;
            match key.trim() {
                "r" => remaining = least(remaining, integer(value)?),
                "t" => reset = longest(reset, Duration::from_secs(integer(value)?)),
                _ => {}
            }
        }
        members.push(Left {
            policy: name_hash(name.trim_matches('"')),
            remaining: remaining?,
            reset: reset?,
        });
    }
    Some(members)
}

/// A policy's name as the caps tell policies apart: FNV-1a, never 0 (which names the
/// fields without names).
fn name_hash(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash | 1
}

/// An earlier draft's dictionary, `limit=100, remaining=42, reset=17`: its one unnamed
/// policy. A key given twice (two lines of the field, joined) counts its least `remaining`
/// and its longest `reset`.
fn dictionary(value: &str) -> Option<Left> {
    let (mut remaining, mut reset) = (None, None);
    for member in value.split(',') {
        let (key, value) = member.trim().split_once('=')?;
        match key.trim() {
            "remaining" => remaining = least(remaining, integer(value)?),
            "reset" => reset = longest(reset, Duration::from_secs(integer(value)?)),
            _ => {}
        }
    }
    Some(unnamed(remaining?, reset?))
}

/// A `remaining` given again: the least of them counts, never the more generous.
fn least(before: Option<u64>, value: u64) -> Option<u64> {
    Some(before.map_or(value, |before| before.min(value)))
}

/// A reset given again: the longest of them counts.
fn longest(before: Option<Duration>, value: Duration) -> Option<Duration> {
    Some(before.map_or(value, |before| before.max(value)))
}

/// `Retry-After`: delay-seconds or an HTTP date; absent is `None`, malformed is counted.
fn retry_after(headers: &HeaderMap, malformed: &mut u64) -> Option<Duration> {
    let value = one(headers, "retry-after", malformed)?;
    let parsed = match integer(value) {
        Some(seconds) => Some(Duration::from_secs(seconds)),
        None => http_date(value).map(until),
    };
    if parsed.is_none() {
        *malformed += 1;
    }
    parsed
}

/// A reset in seconds: a delay, or a Unix time when it is that large.
fn seconds_or_epoch(value: &str) -> Option<Duration> {
    let seconds = integer(value)?;
    Some(if seconds >= EPOCH_SECONDS {
        until(seconds)
    } else {
        Duration::from_secs(seconds)
    })
}

/// From now to the Unix time `at` (seconds), zero if it is past.
fn until(at: u64) -> Duration {
    Duration::from_secs(at).saturating_sub(unix_now())
}

/// The time since the Unix epoch now (zero on a clock set before it).
fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// A non-negative decimal integer of at most 15 digits (structured fields' limit), with no
/// sign, space or fraction inside.
fn integer(value: &str) -> Option<u64> {
    let value = value.trim();
    if value.is_empty() || value.len() > 15 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn is_token(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'*')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
}

/// An HTTP date as Unix seconds, in any of the three formats RFC 9110 (section 5.6.7) has
/// recipients accept: the IMF-fixdate senders must use, and the obsolete RFC 850 and
/// asctime formats; see [`http_date_at`].
fn http_date(value: &str) -> Option<u64> {
    http_date_at(value, unix_now().as_secs())
}

/// An HTTP date as Unix seconds, read at the Unix time `now` (which places an RFC 850
/// date's two-digit year):
///
/// * IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`;
/// * RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT`, its year in the current century unless that
///   is more than 50 years ahead of `now`, then in the century before (the most recent past
///   year with those two digits);
/// * asctime: `Sun Nov  6 08:49:37 1994` (a day of one digit after two spaces, or of two).
///
/// Each field has exactly the digits its format gives it and a value in range (a leap
/// second allowed); a date before 1970 or after 9999 is `None`.
fn http_date_at(value: &str, now: u64) -> Option<u64> {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const LONG_DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    if let Some((name, rest)) = value.split_once(", ") {
        let (date, time) = rest.strip_suffix(" GMT")?.rsplit_once(' ')?;
        let time = time_of_day(time)?;
        let (day, month, year) = if DAYS.contains(&name) {
            // IMF-fixdate: `06 Nov 1994`.
            date_parts(date, ' ', 4)?
        } else if LONG_DAYS.contains(&name) {
            // RFC 850: `06-Nov-94`.
            let (day, month, yy) = date_parts(date, '-', 2)?;
            (day, month, rfc850_year(yy, month, day, time, now))
        } else {
            return None;
        };
        return unix_time(year, month, day, time);
    }
    // asctime: `Sun Nov  6 08:49:37 1994`.
    let (name, rest) = value.split_once(' ')?;
    if !DAYS.contains(&name) {
        return None;
    }
    let (month_name, rest) = rest.split_once(' ')?;
    let (day, rest) = match rest.strip_prefix(' ') {
        Some(rest) => (digits(rest.get(..1)?, 1)?, rest.get(1..)?),
        None => (digits(rest.get(..2)?, 2)?, rest.get(2..)?),
    };
    let (time, year) = rest.strip_prefix(' ')?.split_once(' ')?;
    unix_time(
        digits(year, 4)?,
        month(month_name)?,
        day,
        time_of_day(time)?,
    )
}

/// A date of three parts split by `separator`, `day month year`: a day of two digits, a
/// month's three letters, a year of `year_digits` digits.
fn date_parts(date: &str, separator: char, year_digits: usize) -> Option<(u64, u64, u64)> {
    let mut parts = date.split(separator);
    let day = digits(parts.next()?, 2)?;
    let month = month(parts.next()?)?;
    let year = digits(parts.next()?, year_digits)?;
    parts.next().is_none().then_some((day, month, year))
}

/// The year of an RFC 850 date whose year is written `yy`, read at the Unix time `now`: in
/// the current century, unless the date is then more than 50 years ahead of `now` (the same
/// date 50 years earlier is still ahead), then in the century before.
fn rfc850_year(yy: u64, month: u64, day: u64, time: u64, now: u64) -> u64 {
    let this_year = year_of(now);
    let year = this_year - this_year % 100 + yy;
    // Before 1970 (None), the date 50 years earlier is behind `now` too.
    match unix_time(year - 50, month, day, time) {
        Some(at) if at > now => year - 100,
        _ => year,
    }
}

/// The month named by its three letters, 1 to 12.
fn month(name: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let at = MONTHS.iter().position(|&month| month == name)?;
    Some(at as u64 + 1)
}

/// `HH:MM:SS` as seconds into the day: two digits each, a leap second allowed.
fn time_of_day(value: &str) -> Option<u64> {
    let mut clock = value.split(':');
    let h = digits(clock.next()?, 2)?;
    let m = digits(clock.next()?, 2)?;
    let s = digits(clock.next()?, 2)?;
    if clock.next().is_some() || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(h * 3_600 + m * 60 + s)
}

/// Exactly `count` ASCII digits, as a number.
fn digits(value: &str, count: usize) -> Option<u64> {
    if value.len() != count || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The Unix time of `time` seconds into a day of a year from 1970 to 9999 (`None` outside
/// them, or for a day that is not 1 to 31).
fn unix_time(year: u64, month: u64, day: u64, time: u64) -> Option<u64> {
    if !(1970..=9999).contains(&year) || day == 0 || day > 31 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + time)
}

/// The year of the Unix time `at` (seconds), at most 9999.
fn year_of(at: u64) -> u64 {
    /// 9999-12-31 23:59:59 UTC.
    const LAST: u64 = 253_402_300_799;
    // Howard Hinnant's civil_from_days, on days from 0000-03-01.
    let days = at.min(LAST) / 86_400 + 719_468;
    let era = days / 146_097;
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    // Months from March: January and February (10 and 11) belong to the next year.
    let month_from_march = (5 * doy + 2) / 153;
    era * 400 + yoe + u64::from(month_from_march >= 10)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (year >= 1970).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const CAP: Duration = Duration::from_secs(3_600);

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn ok(fields: &[(&'static str, &str)]) -> (Heard, u64) {
        hear(StatusCode::OK, &headers(fields), CAP)
    }

    /// One unnamed policy's answer (the fields without names).
    fn left(remaining: u64, reset: u64) -> Heard {
        let mut lefts = [None; MOST_POLICIES];
        lefts[0] = Some(unnamed(remaining, Duration::from_secs(reset)));
        Heard::Left(lefts)
    }

    /// The answer of the named policies `members`, `(name, remaining, reset)`.
    fn named(members: &[(&str, u64, u64)]) -> Heard {
        let mut lefts = [None; MOST_POLICIES];
        for (place, &(name, remaining, reset)) in members.iter().enumerate() {
            lefts[place] = Some(Left {
                policy: name_hash(name),
                remaining,
                reset: Duration::from_secs(reset),
            });
        }
        Heard::Left(lefts)
    }

    #[test]
    fn the_current_draft_keeps_every_policy() {
        assert_eq!(
            ok(&[("ratelimit", "\"default\";r=42;t=17")]),
            (named(&[("default", 42, 17)]), 0)
        );
        assert_eq!(
            ok(&[(
                "ratelimit",
                "\"minute\";r=5;t=30, \"day\";r=5;t=900, \"burst\";r=9;t=1"
            )]),
            (
                named(&[("minute", 5, 30), ("day", 5, 900), ("burst", 9, 1)]),
                0
            )
        );
        assert_eq!(
            ok(&[("ratelimit", "default;r=0;t=2")]),
            (named(&[("default", 0, 2)]), 0)
        );
        // A list in two lines is one list; a name given twice is one policy, its least.
        assert_eq!(
            ok(&[
                ("ratelimit", "\"minute\";r=0;t=60"),
                ("ratelimit", "\"day\";r=500;t=3000, \"minute\";r=3;t=50")
            ]),
            (named(&[("minute", 0, 60), ("day", 500, 3_000)]), 0)
        );
        // Past four policies, each folds into the one whose reset is nearest its own: the
        // least, the longer (a burst at 0 does not stop the key for the day).
        assert_eq!(
            ok(&[(
                "ratelimit",
                "a;r=9;t=1, b;r=9;t=60, c;r=9;t=600, day;r=500;t=3000, burst;r=0;t=2, f;r=7;t=700"
            )]),
            (
                named(&[
                    ("a", 0, 2),
                    ("b", 9, 60),
                    ("c", 7, 700),
                    ("day", 500, 3_000)
                ]),
                0
            )
        );
        // A 429 without Retry-After pauses for the tightest policy's reset.
        assert_eq!(
            hear(
                StatusCode::TOO_MANY_REQUESTS,
                &headers(&[("ratelimit", "s;r=0;t=1, d;r=0;t=900, m;r=4;t=60")]),
                CAP
            ),
            (Heard::Pause(Duration::from_secs(900)), 0)
        );
    }

    #[test]
    fn earlier_drafts_and_the_x_fields() {
        assert_eq!(
            ok(&[("ratelimit", "limit=100, remaining=7, reset=3")]),
            (left(7, 3), 0)
        );
        assert_eq!(
            ok(&[
                ("ratelimit-remaining", "7"),
                ("ratelimit-reset", "3"),
                ("ratelimit-limit", "10")
            ]),
            (left(7, 3), 0)
        );
        assert_eq!(
            ok(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "12")]),
            (left(0, 12), 0)
        );
        // A Unix time, as GitHub sends it: a few seconds from now.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let (heard, bad) = ok(&[
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", &(now + 30).to_string()),
        ]);
        assert_eq!(bad, 0);
        match heard {
            Heard::Left(
                [Some(Left {
                    policy: 0,
                    remaining: 3,
                    reset,
                }), None, None, None],
            ) => {
                assert!(
                    reset <= Duration::from_secs(30) && reset >= Duration::from_secs(28),
                    "{reset:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A remaining count without a reset says nothing.
        assert_eq!(ok(&[("x-ratelimit-remaining", "3")]), (Heard::Nothing, 0));
    }

    #[test]
    fn every_style_present_is_read_and_the_strictest_holds() {
        // A generous `RateLimit` field does not hide the X fields' stop: a named policy and
        // the unnamed one, each kept.
        let mut both = [None; MOST_POLICIES];
        both[0] = Some(Left {
            policy: name_hash("default"),
            remaining: 100,
            reset: Duration::from_secs(60),
        });
        both[1] = Some(unnamed(0, Duration::from_secs(60)));
        assert_eq!(
            ok(&[
                ("ratelimit", "\"default\";r=100;t=60"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "60")
            ]),
            (Heard::Left(both), 0)
        );
        // The unnamed policies of every style are one: the least remaining, the longest
        // reset, whichever style said it and in whatever order.
        assert_eq!(
            ok(&[
                ("ratelimit-remaining", "50"),
                ("ratelimit-reset", "10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "60")
            ]),
            (left(0, 60), 0)
        );
        assert_eq!(
            ok(&[
                ("ratelimit", "limit=100, remaining=3, reset=90"),
                ("ratelimit-remaining", "50"),
                ("ratelimit-reset", "10"),
                ("x-ratelimit-remaining", "7"),
                ("x-ratelimit-reset", "60")
            ]),
            (left(3, 90), 0)
        );
        // Four named policies fill every place: the unnamed one folds into the policy whose
        // reset is nearest its own, as a fifth member would.
        assert_eq!(
            ok(&[
                (
                    "ratelimit",
                    "a;r=9;t=1, b;r=9;t=60, c;r=9;t=600, d;r=9;t=3000"
                ),
                ("x-ratelimit-remaining", "2"),
                ("x-ratelimit-reset", "500")
            ]),
            (
                named(&[("a", 9, 1), ("b", 9, 60), ("c", 2, 600), ("d", 9, 3_000)]),
                0
            )
        );
        // A malformed style is counted and the others still read.
        assert_eq!(
            ok(&[
                ("ratelimit", "\"d\";r=-1;t=5"),
                ("ratelimit-remaining", "lots"),
                ("ratelimit-reset", "5"),
                ("x-ratelimit-remaining", "4"),
                ("x-ratelimit-reset", "30")
            ]),
            (left(4, 30), 2)
        );
        // A 429 without Retry-After pauses for the tightest of them all.
        assert_eq!(
            hear(
                StatusCode::TOO_MANY_REQUESTS,
                &headers(&[
                    ("ratelimit", "\"d\";r=5;t=2"),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "40")
                ]),
                CAP
            ),
            (Heard::Pause(Duration::from_secs(40)), 0)
        );
    }

    #[test]
    fn a_key_given_twice_counts_its_least() {
        assert_eq!(
            ok(&[("ratelimit", "remaining=0, remaining=50, reset=60")]),
            (left(0, 60), 0)
        );
        assert_eq!(
            ok(&[("ratelimit", "reset=60, remaining=9, reset=5, remaining=3")]),
            (left(3, 60), 0)
        );
        // Two lines of the earlier draft's field, one list: the least of the two.
        assert_eq!(
            ok(&[
                ("ratelimit", "limit=100, remaining=0, reset=60"),
                ("ratelimit", "limit=100, remaining=50, reset=60")
            ]),
            (left(0, 60), 0)
        );
        // A parameter given twice in a member: the least `r`, the longest `t`.
        assert_eq!(
            ok(&[("ratelimit", "\"d\";r=0;t=60;r=50")]),
            (named(&[("d", 0, 60)]), 0)
        );
        assert_eq!(
            ok(&[("ratelimit", "\"d\";t=60;r=7;t=5")]),
            (named(&[("d", 7, 60)]), 0)
        );
    }

    #[test]
    fn refusals_pause_for_retry_after_or_the_reset() {
        let refused = |fields: &[(&'static str, &str)]| {
            hear(StatusCode::TOO_MANY_REQUESTS, &headers(fields), CAP)
        };
        assert_eq!(
            refused(&[("retry-after", "7")]),
            (Heard::Pause(Duration::from_secs(7)), 0)
        );
        assert_eq!(
            refused(&[("ratelimit", "\"d\";r=0;t=4")]),
            (Heard::Pause(Duration::from_secs(4)), 0)
        );
        assert_eq!(refused(&[]), (Heard::Pause(DEFAULT_PAUSE), 0));
        let unavailable = |fields: &[(&'static str, &str)]| {
            hear(StatusCode::SERVICE_UNAVAILABLE, &headers(fields), CAP)
        };
        assert_eq!(
            unavailable(&[("retry-after", "2")]),
            (Heard::Pause(Duration::from_secs(2)), 0)
        );
        assert_eq!(unavailable(&[]), (Heard::Nothing, 0));
        // An HTTP date in the past pauses for nothing; one far ahead is capped.
        assert_eq!(
            refused(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            (Heard::Pause(Duration::ZERO), 0)
        );
        assert_eq!(
            refused(&[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]),
            (Heard::Pause(CAP), 0)
        );
        assert_eq!(
            refused(&[("retry-after", "999999999999999")]),
            (Heard::Pause(CAP), 0)
        );
    }

    #[test]
    fn dates_count_days_as_the_calendar_does() {
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            http_date("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(951_825_600)
        );
        assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 UTC"), None);
        assert_eq!(http_date("Sun, 06 Nov 1994 24:49:37 GMT"), None);
    }

    #[test]
    fn every_month_and_the_edges_of_a_date() {
        let firsts = [
            ("Fri, 01 Jan 2021", 1_609_459_200),
            ("Mon, 01 Feb 2021", 1_612_137_600),
            ("Mon, 01 Mar 2021", 1_614_556_800),
            ("Thu, 01 Apr 2021", 1_617_235_200),
            ("Sat, 01 May 2021", 1_619_827_200),
            ("Tue, 01 Jun 2021", 1_622_505_600),
            ("Thu, 01 Jul 2021", 1_625_097_600),
            ("Sun, 01 Aug 2021", 1_627_776_000),
            ("Wed, 01 Sep 2021", 1_630_454_400),
            ("Fri, 01 Oct 2021", 1_633_046_400),
            ("Mon, 01 Nov 2021", 1_635_724_800),
            ("Wed, 01 Dec 2021", 1_638_316_800),
        ];
        for (day, seconds) in firsts {
            assert_eq!(
                http_date(&format!("{day} 00:00:00 GMT")),
                Some(seconds),
                "{day}"
            );
        }
        // A leap second is a valid time of day.
        assert_eq!(
            http_date("Sat, 31 Dec 2016 23:59:60 GMT"),
            Some(1_483_228_800)
        );
        for bad in [
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sun, 06 Nov 1994 08:49:37:00 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:60:37 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
            "Sun, 06 Nop 1994 08:49:37 GMT",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_obsolete_date_formats_are_read_too() {
        // RFC 9110, section 5.6.7: the same instant in its three formats.
        assert_eq!(
            http_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(http_date("Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        assert_eq!(http_date("Sun Nov 06 08:49:37 1994"), Some(784_111_777));
        assert_eq!(
            http_date("Wednesday, 31-Dec-25 23:59:60 GMT"),
            Some(1_767_225_600)
        );
        assert_eq!(http_date("Thu Dec 31 23:59:59 2099"), Some(4_102_444_799));
        // Seen from 2026-01-01 (1_767_225_600): the current century, unless that is more
        // than 50 years ahead; then the most recent past year with the same two digits.
        let new_year_2026 = 1_767_225_600;
        let rfc850 = |value: &str| http_date_at(value, new_year_2026);
        // 2076-01-01 is 50 years ahead, not more: 2076.
        assert_eq!(
            rfc850("Wednesday, 01-Jan-76 00:00:00 GMT"),
            Some(3_345_062_400)
        );
        // A second later is more than 50 years ahead: 1976.
        assert_eq!(
            rfc850("Thursday, 01-Jan-76 00:00:01 GMT"),
            Some(189_302_401)
        );
        assert_eq!(
            rfc850("Saturday, 01-Jan-77 00:00:00 GMT"),
            Some(220_924_800)
        );
        assert_eq!(
            rfc850("Thursday, 01-Jan-26 00:00:00 GMT"),
            Some(new_year_2026)
        );
        // `69` is 2069, 43 years ahead; seen from 2000-01-01, 69 years ahead, so 1969: before
        // any Unix time, not a date this reads.
        assert_eq!(
            rfc850("Tuesday, 31-Dec-69 23:59:59 GMT"),
            Some(3_155_759_999)
        );
        assert_eq!(
            http_date_at("Wednesday, 31-Dec-69 23:59:59 GMT", 946_684_800),
            None
        );
        assert_eq!(
            http_date_at("Thursday, 01-Jan-70 00:00:00 GMT", 946_684_800),
            Some(0)
        );
        // Seen from 2100-01-01, `00` is 2100 and `99` the year before.
        let new_year_2100 = 4_102_444_800;
        assert_eq!(
            http_date_at("Friday, 01-Jan-00 00:00:00 GMT", new_year_2100),
            Some(new_year_2100)
        );
        assert_eq!(
            http_date_at("Thursday, 31-Dec-99 23:59:59 GMT", new_year_2100),
            Some(new_year_2100 - 1)
        );
        // A Retry-After in either obsolete format is heard, not counted as malformed.
        for date in ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"] {
            assert_eq!(
                hear(
                    StatusCode::TOO_MANY_REQUESTS,
                    &headers(&[("retry-after", date)]),
                    CAP
                ),
                (Heard::Pause(Duration::ZERO), 0),
                "{date}"
            );
        }
        for bad in [
            // RFC 850: a long day name, two-digit day and year, GMT.
            "Sun, 06-Nov-94 08:49:37 GMT",
            "Sunday, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 6-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37",
            "Sunday, 06-Nov-94-01 08:49:37 GMT",
            "Sunday, 32-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-94 24:00:00 GMT",
            "Sunday, 06-Nov-94 08:49:61 GMT",
            "Sundae, 06-Nov-94 08:49:37 GMT",
            // asctime: a one-digit day after two spaces, a four-digit year, no zone.
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov   6 08:49:37 1994",
            "Sun Nov  06 08:49:37 1994",
            "Sun Nov  6 08:49:37 94",
            "Sun Nov  6 08:49:37 1994 GMT",
            "Sun Nov  0 08:49:37 1994",
            "Sun Nov 32 08:49:37 1994",
            "Sun Nov  6 08:60:37 1994",
            "Sun Nov  6 8:49:37 1994",
            "Sun Nop  6 08:49:37 1994",
            "Sunday Nov  6 08:49:37 1994",
            "Sun Nov  6 08:49:37 1969",
            "Sun Nov \u{e9} 08:49:37 1994",
            // IMF-fixdate: a short day name and exact digits.
            "Sunday, 06 Nov 1994 08:49:37 GMT",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, +6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov  1994 08:49:37 GMT",
            "",
            ",",
            " ",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_year_is_read_from_a_unix_time() {
        assert_eq!(year_of(0), 1970);
        assert_eq!(year_of(951_782_399), 2000); // 2000-02-28 23:59:59
        assert_eq!(year_of(946_684_799), 1999); // 1999-12-31 23:59:59
        assert_eq!(year_of(946_684_800), 2000);
        assert_eq!(year_of(1_767_225_599), 2025);
        assert_eq!(year_of(1_767_225_600), 2026);
        assert_eq!(year_of(u64::MAX), 9999);
    }

    #[test]
    fn integers_are_plain_digits_of_at_most_fifteen() {
        assert_eq!(integer(""), None);
        assert_eq!(integer("999999999999999"), Some(999_999_999_999_999));
        assert_eq!(integer("1000000000000000"), None);
        assert_eq!(integer("12a"), None);
        assert_eq!(integer(" 7 "), Some(7));
    }

    #[test]
    fn a_429_pauses_for_the_tightest_member_whatever_the_order() {
        let pause = |value: &str| match hear(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("ratelimit", value)]),
            CAP,
        ) {
            (Heard::Pause(pause), 0) => Some(pause.as_secs()),
            _ => None,
        };
        assert_eq!(pause("\"b\";r=5;t=900, \"a\";r=5;t=30"), Some(900));
        assert_eq!(pause("\"a\";r=5;t=30, \"b\";r=9;t=1000"), Some(30));
        assert_eq!(pause("\"a\";r=9;t=1, \"b\";r=5;t=2"), Some(2));
        // A name with an opening quote and no closing one is not a name.
        assert_eq!(structured("\"a;r=5;t=30"), None);
        // A 429 whose reset is now pauses for the default, not for nothing.
        let refused = hear(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("ratelimit", "\"d\";r=0;t=0")]),
            CAP,
        );
        assert_eq!(refused, (Heard::Pause(DEFAULT_PAUSE), 0));
    }

    #[test]
    fn hostile_values_are_ignored_and_counted() {
        for (name, value) in [
            ("ratelimit", "\"d\";r=-1;t=5"),
            ("ratelimit", "\"d\";r=1e9;t=5"),
            ("ratelimit", "\"d\";r=99999999999999999999;t=5"),
            ("ratelimit", "\"d\";t=5"),
            ("ratelimit", "1d;r=1;t=1"),
            ("ratelimit", ";;;"),
            ("x-ratelimit-remaining", "lots"),
        ] {
            let mut fields = vec![(name, value)];
            if name == "x-ratelimit-remaining" {
                fields.push(("x-ratelimit-reset", "1"));
            }
            assert_eq!(ok(&fields), (Heard::Nothing, 1), "{name}: {value}");
        }
        let bad_reset = ok(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "soon"),
        ]);
        assert_eq!(bad_reset, (Heard::Nothing, 1));
        // A list field in two lines is one list (RFC 9110): a policy named twice counts the
        // least of the two, never the more generous.
        let twice = ok(&[
            ("ratelimit", "\"d\";r=1;t=1"),
            ("ratelimit", "\"d\";r=9;t=1"),
        ]);
        assert_eq!(twice, (named(&[("d", 1, 1)]), 0));
        // A single-value field sent twice is still hostile.
        let twice = ok(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-remaining", "9"),
            ("x-ratelimit-reset", "1"),
        ]);
        assert_eq!(twice, (Heard::Nothing, 1));
        let mut binary = HeaderMap::new();
        binary.insert("retry-after", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(
            hear(StatusCode::TOO_MANY_REQUESTS, &binary, CAP),
            (Heard::Pause(DEFAULT_PAUSE), 1)
        );
        let date = hear(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "tomorrow")]),
            CAP,
        );
        assert_eq!(date, (Heard::Pause(DEFAULT_PAUSE), 1));
    }
}
