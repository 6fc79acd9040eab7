//! Policy strings: `band ("&" band)*` with
//! `band = [algorithm] permits ("/" | "per") [count] unit ["burst" permits]`.
//!
//! Examples: `5/1s`, `100/min`, `5 per 15m`, `token-bucket 5/1s`, `sliding-log 3/s`,
//! `10/s & 1000/day`, `10/s burst 100` (a token bucket written as a rate and a burst).
//! Whitespace around the parts is free; names and units are case-insensitive. Counts are
//! whole numbers and may use `_` as a digit separator (`1_000/day`).

use std::str::FromStr;
use std::time::Duration;

use super::{Algorithm, Policy, PolicyError};

const ALGORITHMS: &str = "`token-bucket`, `sliding-log` or `sliding-counter`";
const UNITS: &str = "a time unit: ns, us, ms, s, sec, m, min, h, hour, d or day";

impl FromStr for Algorithm {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        algorithm(s).ok_or_else(|| syntax(s, "algorithm", s.trim(), ALGORITHMS))
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut parts = input.split('&');
        // `split` always yields at least one part.
        let mut policy = band(input, parts.next().unwrap_or(""))?;
        for part in parts {
            policy = policy.and(band(input, part)?)?;
        }
        Ok(policy)
    }
}

/// Parses one band, `part` of the whole string `input` (named in errors).
fn band(input: &str, part: &str) -> Result<Policy, PolicyError> {
    let mut rest = part.trim();

    // An algorithm name, if present, starts with a letter and ends at whitespace.
    let mut algo = Algorithm::default();
    if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let name = &rest[..end];
        algo = algorithm(name).ok_or_else(|| syntax(input, "algorithm", name, ALGORITHMS))?;
        rest = rest[end..].trim_start();
    }

    let (digits, after) = split_number(rest);
    let permits = number(
        input,
        "permits",
        digits,
        rest,
        "a whole number of permits, such as 5",
    )?;
    rest = after.trim_start();

    if let Some(r) = rest.strip_prefix('/') {
        rest = r;
    } else if let Some(after) = rest
        .get(..3)
        .filter(|word| word.eq_ignore_ascii_case("per"))
        .map(|_| &rest[3..])
        // `per` as a word of its own, as `burst`: "5 pers" is not "5 per s".
        .filter(|after| after.starts_with(char::is_whitespace))
    {
        rest = after;
    } else {
        let shown = rest.split_whitespace().next().unwrap_or("");
        return Err(syntax(input, "separator", shown, "`/` or `per`"));
    }
    rest = rest.trim();

    let (digits, unit) = split_number(rest);
    let count = if digits.is_empty() {
        1
    } else {
        number(
            input,
            "window",
            digits,
            digits,
            "a whole number before the unit, such as 15m",
        )?
    };
    let unit = unit.trim();
    // A token bucket may name its burst after the rate: `10/s burst 100`.
    let (unit, burst) = match unit.split_once(char::is_whitespace) {
        Some((unit, tail)) => (unit, Some(tail.trim())),
        None => (unit, None),
    };
    let scale = unit_nanos(unit).ok_or_else(|| syntax(input, "unit", unit, UNITS))?;
    let window = match count.checked_mul(scale) {
        Some(n) => Duration::from_nanos(n),
        None => Duration::MAX,
    };
    let Some(burst) = burst else {
        return Policy::new(algo, permits, window);
    };
    // `burst` as a word of its own: followed by whitespace (or nothing, reported below).
    let Some(digits) = burst
        .get(..5)
        .filter(|word| word.eq_ignore_ascii_case("burst"))
        .map(|_| &burst[5..])
        .filter(|after| after.is_empty() || after.starts_with(char::is_whitespace))
        .map(str::trim)
    else {
        let shown = burst.split_whitespace().next().unwrap_or("");
        return Err(syntax(input, "burst", shown, BURST));
    };
    if algo != Algorithm::TokenBucket {
        return Err(syntax(
            input,
            "burst",
            burst,
            "no burst: only a token bucket has one (a windowed algorithm admits its permits per window)",
        ));
    }
    let (number_part, rest) = split_number(digits);
    if !rest.trim().is_empty() {
        return Err(syntax(input, "burst", rest.trim(), BURST));
    }
    let burst = number(input, "burst", number_part, digits, BURST)?;
    Policy::rate_with_burst(permits, window, burst)
}

const BURST: &str = "nothing, or `burst` and a whole number of permits, such as `10/s burst 100`";

fn syntax(input: &str, field: &'static str, value: &str, expected: &'static str) -> PolicyError {
    PolicyError::Syntax {
        input: input.to_owned(),
        field,
        value: value.to_owned(),
        expected,
    }
}

fn algorithm(name: &str) -> Option<Algorithm> {
    let name = name.trim().to_ascii_lowercase().replace('_', "-");
    match name.as_str() {
        "token-bucket" | "tokenbucket" | "gcra" => Some(Algorithm::TokenBucket),
        "sliding-log" | "slidinglog" | "log" => Some(Algorithm::SlidingLog),
        "sliding-counter" | "slidingcounter" | "counter" => Some(Algorithm::SlidingCounter),
        _ => None,
    }
}

/// Splits the leading run of digits and `_` from the rest.
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Parses `digits` as the number for `field`; `context` is the text that stood there, shown
/// in the error when there are no digits at all.
fn number(
    input: &str,
    field: &'static str,
    digits: &str,
    context: &str,
    expected: &'static str,
) -> Result<u64, PolicyError> {
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if clean.is_empty() {
        let shown = context.split_whitespace().next().unwrap_or("");
        return Err(syntax(input, field, shown, expected));
    }
    clean
        .parse::<u64>()
        .map_err(|_| syntax(input, field, digits, "a whole number that fits in 64 bits"))
}

fn unit_nanos(unit: &str) -> Option<u64> {
    const S: u64 = 1_000_000_000;
    let nanos = match unit.to_ascii_lowercase().as_str() {
        "ns" | "nsec" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "usec" | "microsecond" | "microseconds" => 1_000,
        "ms" | "msec" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => S,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * S,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * S,
        "d" | "day" | "days" => 86_400 * S,
        _ => return None,
    };
    Some(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: Algorithm, n: u64, w: Duration) -> Policy {
        Policy::new(a, n, w).unwrap()
    }

    #[test]
    fn accepted_forms() {
        let tb = Algorithm::TokenBucket;
        assert_eq!(
            "5/1s".parse::<Policy>().unwrap(),
            p(tb, 5, Duration::from_secs(1))
        );
        assert_eq!(
            "100/min".parse::<Policy>().unwrap(),
            p(tb, 100, Duration::from_secs(60))
        );
        assert_eq!(
            "5 per 15m".parse::<Policy>().unwrap(),
            p(tb, 5, Duration::from_secs(900))
        );
        assert_eq!(
            "token-bucket 5/1s".parse::<Policy>().unwrap(),
            p(tb, 5, Duration::from_secs(1))
        );
        assert_eq!(
            "sliding-log 3/s".parse::<Policy>().unwrap(),
            p(Algorithm::SlidingLog, 3, Duration::from_secs(1))
        );
        assert_eq!(
            " Sliding-Counter  1_000 PER 2 Hours "
                .parse::<Policy>()
                .unwrap(),
            p(Algorithm::SlidingCounter, 1000, Duration::from_secs(7200))
        );
        assert_eq!(
            "7/250ms".parse::<Policy>().unwrap(),
            p(tb, 7, Duration::from_millis(250))
        );
        assert_eq!(
            "1/day".parse::<Policy>().unwrap(),
            p(tb, 1, Duration::from_secs(86_400))
        );
        assert_eq!(
            "3/10us".parse::<Policy>().unwrap(),
            p(tb, 3, Duration::from_micros(10))
        );
        assert_eq!(
            "2/2h".parse::<Policy>().unwrap(),
            p(tb, 2, Duration::from_secs(7200))
        );
        assert_eq!(
            "9/9ns".parse::<Policy>().unwrap(),
            p(tb, 9, Duration::from_nanos(9))
        );
        assert_eq!(
            "1/sec".parse::<Policy>().unwrap(),
            p(tb, 1, Duration::from_secs(1))
        );
        assert_eq!(
            "1/hour".parse::<Policy>().unwrap(),
            p(tb, 1, Duration::from_secs(3600))
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "5/1s",
            "100/min",
            "5 per 15m",
            "sliding-log 3/1500ms",
            "counter 7/36h",
            "2/3ns",
        ] {
            let policy: Policy = s.parse().unwrap();
            assert_eq!(policy.to_string().parse::<Policy>().unwrap(), policy, "{s}");
        }
        assert_eq!(
            "100/min".parse::<Policy>().unwrap().to_string(),
            "token-bucket 100/1m"
        );
        assert_eq!(
            "5/1500ms".parse::<Policy>().unwrap().to_string(),
            "token-bucket 5/1500ms"
        );
    }

    #[test]
    fn errors_name_the_part() {
        let err = |s: &str| s.parse::<Policy>().unwrap_err();
        assert_eq!(
            err("leaky 5/s"),
            syntax("leaky 5/s", "algorithm", "leaky", ALGORITHMS)
        );
        assert!(err("five/s").to_string().contains("algorithm `five/s`"));
        assert_eq!(
            err("5 to 1s"),
            syntax("5 to 1s", "separator", "to", "`/` or `per`")
        );
        // `per` is a word: not the start of another one.
        for joined in ["5 pers", "5 persecond", "5 PERs", "5 per1s", "5 per"] {
            let word = joined.split_whitespace().nth(1).unwrap_or("");
            assert_eq!(
                err(joined),
                syntax(joined, "separator", word, "`/` or `per`"),
                "{joined}"
            );
        }
        assert_eq!(
            "5 PER s".parse::<Policy>().unwrap(),
            "5/s".parse::<Policy>().unwrap()
        );
        assert_eq!(
            err("5/1fortnight"),
            syntax("5/1fortnight", "unit", "fortnight", UNITS)
        );
        assert_eq!(err("5/"), syntax("5/", "unit", "", UNITS));
        assert_eq!(
            err("/s").to_string(),
            "policy `/s`: permits `/s` is not valid, expected a whole number of permits, such as 5"
        );
        assert_eq!(
            err("99999999999999999999/s"),
            syntax(
                "99999999999999999999/s",
                "permits",
                "99999999999999999999",
                "a whole number that fits in 64 bits"
            )
        );
        assert_eq!(err("0/s"), PolicyError::ZeroPermits);
        assert_eq!(err("5/0s"), PolicyError::ZeroWindow);
        assert_eq!(
            err("5/4ns"),
            PolicyError::IntervalTooShort {
                permits: 5,
                window: Duration::from_nanos(4)
            }
        );
        assert!(matches!(
            err("1/1000000000d"),
            PolicyError::WindowTooLong { .. }
        ));
        assert!(matches!(
            err("1/99999999999999999999s"),
            PolicyError::Syntax {
                field: "window",
                ..
            }
        ));
        assert!(matches!(
            err("1/18446744073709551615d"),
            PolicyError::WindowTooLong { .. }
        ));
    }

    #[test]
    fn a_rate_and_a_burst_are_the_token_bucket_they_describe() {
        let tb = Algorithm::TokenBucket;
        let burst: Policy = "10/s burst 100".parse().unwrap();
        assert_eq!(burst, p(tb, 100, Duration::from_secs(10)));
        assert_eq!(burst.to_string(), "token-bucket 10/1s burst 100");
        assert_eq!(burst.to_string().parse::<Policy>().unwrap(), burst);
        assert_eq!(
            "token-bucket 5 per 2m BURST 1_000"
                .parse::<Policy>()
                .unwrap(),
            p(tb, 1000, Duration::from_secs(400 * 60))
        );
        // A burst smaller than the rate: half a second of refill.
        assert_eq!(
            "10/s burst 5".parse::<Policy>().unwrap(),
            p(tb, 5, Duration::from_millis(500))
        );
        // 3 per second: the window rounds up so one permit refills in ceil(1 s / 3).
        let thirds: Policy = "3/s burst 10".parse().unwrap();
        assert_eq!(
            thirds.first_band().window(),
            Duration::from_nanos(3_333_333_334)
        );
        assert_eq!(thirds.to_string(), "token-bucket 3/1s burst 10");
        // Equal bands written in two forms: the first policy's form is kept.
        let plain: Policy = "100/10s".parse().unwrap();
        assert_eq!(
            plain.and(burst).unwrap().to_string(),
            "token-bucket 100/10s"
        );
        assert_eq!(
            burst.and(plain).unwrap().to_string(),
            "token-bucket 10/1s burst 100"
        );
        // In a composite, each band keeps its form.
        let both: Policy = "10/s burst 100 & 1000/day".parse().unwrap();
        assert_eq!(
            both.to_string(),
            "token-bucket 10/1s burst 100 & token-bucket 1000/1d"
        );
    }

    #[test]
    fn a_burst_is_refused_where_it_means_nothing() {
        let err = |s: &str| s.parse::<Policy>().unwrap_err();
        assert_eq!(
            err("sliding-log 10/s burst 100"),
            syntax(
                "sliding-log 10/s burst 100",
                "burst",
                "burst 100",
                "no burst: only a token bucket has one (a windowed algorithm admits its permits per window)"
            )
        );
        assert!(matches!(
            err("sliding-counter 10/s burst 100"),
            PolicyError::Syntax { field: "burst", .. }
        ));
        assert_eq!(
            err("10/s bust 100"),
            syntax("10/s bust 100", "burst", "bust", BURST)
        );
        assert_eq!(err("10/s burst"), syntax("10/s burst", "burst", "", BURST));
        assert_eq!(
            err("10/s burst x"),
            syntax("10/s burst x", "burst", "x", BURST)
        );
        assert_eq!(
            err("10/s burst 5 more"),
            syntax("10/s burst 5 more", "burst", "more", BURST)
        );
        assert_eq!(
            err("10/s burst100"),
            syntax("10/s burst100", "burst", "burst100", BURST)
        );
        assert_eq!(
            err("10/s bursts 1"),
            syntax("10/s bursts 1", "burst", "bursts", BURST)
        );
        assert_eq!(err("10/s burst 0"), PolicyError::ZeroBurst);
        assert_eq!(
            err("10/s burst 0").to_string(),
            "burst must be at least 1, got 0"
        );
        // More than one permit per nanosecond is refused as the rate alone would be.
        assert_eq!(
            err("10/ns burst 1"),
            PolicyError::IntervalTooShort {
                permits: 10,
                window: Duration::from_nanos(1)
            }
        );
        assert_eq!(
            err("1/d burst 18446744073709551615"),
            PolicyError::BurstTooLong {
                rate: 1,
                per: Duration::from_secs(86_400),
                burst: u64::MAX
            }
        );
        assert!(err("1/d burst 18446744073709551615")
            .to_string()
            .starts_with("burst 18446744073709551615 at 1 per 86400s takes longer to refill"));
    }
}
