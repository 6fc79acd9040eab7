//! The Lua script, the arguments it takes for a policy, the key names, and its reply.
//!
//! One script decides every policy: `lua/decide.lua` loops over the bands, each decided by
//! its algorithm's file (`lua/gcra.lua`, `lua/counter.lua`, `lua/log.lua`, dispatched and
//! merged by `lua/band.lua`) with the helpers of `lua/arith.lua`; `lua/parts.lua` decides
//! several keys, each under its own policy, all or nothing. They are concatenated at compile
//! time into one source (`super::source`), so one call decides a whole composite policy, or
//! a whole [`RedisAllOf`](super::RedisAllOf).

use std::fmt::Write as _;
use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};
use crate::reservation::Marks;

use super::error::BackendError;

/// The longest window the script supports, in microseconds: 2^50 us, about 35.7 years.
/// Keeping windows (and clock readings, below 2^52 us) this small keeps every intermediate
/// value of the script below 2^53, where Lua's doubles are exact integers.
pub(super) const MAX_WINDOW_MICROS: u64 = 1 << 50;

/// The bound of injected clock readings, in microseconds (2^52 us, about 142 years; a
/// reading must be below it): see [`MAX_WINDOW_MICROS`].
pub(super) const MAX_NOW_MICROS: u64 = 1 << 52;

/// The largest charge sent to the script: a charge of at least 2N permits fills every band
/// (a token bucket's debt to 2B, a counter to 2N, a log to N live), so any larger one is sent
/// as this, which keeps it exact in Lua's doubles.
pub(super) const MAX_CHARGE: u64 = 1 << 52;

/// What one call asks for a key: to spend permits, only to see what a request would get, or
/// to settle a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ask {
    /// A request of this cost (at least 1): admitted, it spends the cost in every band.
    Acquire(u64),
    /// What a request of cost 1 would get now; nothing is written.
    Peek,
    /// As `Acquire`, and the reply carries each band's mark for the reservation; an
    /// admission writes the reservation's token, numbered `serial`, next to the key's state.
    Reserve {
        /// The permits reserved.
        cost: u64,
        /// The reservation's serial number, which its token's field names.
        serial: u64,
    },
    /// Settle a reservation whose bands stand at `marks`, giving back `permits` (at least 1):
    /// applied only while the reservation's token is there, which it deletes.
    Refund {
        /// The permits given back.
        permits: u64,
        /// The reservation's marks.
        marks: Marks,
        /// The reservation's serial number.
        serial: u64,
    },
    /// Settle a reservation whose bands stand at `marks`, charging `permits` (at least 1, at
    /// most [`MAX_CHARGE`]) on top of it, and delete its token.
    Charge {
        /// The permits charged.
        permits: u64,
        /// The reservation's marks.
        marks: Marks,
        /// The reservation's serial number.
        serial: u64,
    },
    /// A lease: a reservation of as many permits as every band has, at least 1 (else a
    /// refusal of cost 1), at most `max`; the reply carries the marks and the count. A lease
    /// of more than one permit sets the lease token (the extra key) to `serial`.
    Lease {
        /// The most permits taken.
        max: u64,
        /// The lease's serial number, which the token names.
        serial: u64,
        /// The token's expiry in milliseconds (0: none).
        ttl_ms: u64,
    },
    /// As `Refund`, for the lease numbered `serial`: applied only while the lease token
    /// names it, and then the token is deleted, so a lease is given back once at most.
    Return {
        /// The permits given back.
        permits: u64,
        /// The lease's marks.
        marks: Marks,
        /// The lease's serial number.
        serial: u64,
    },
}

impl Ask {
    /// The cost whose refusal a refusal of this call stands for (in the deny cache): a peek
    /// is decided as a request of cost 1 that writes nothing, and a lease is refused only
    /// when one permit does not fit.
    pub(super) const fn cost(self) -> u64 {
        match self {
            Ask::Acquire(cost) | Ask::Reserve { cost, .. } => cost,
            Ask::Peek | Ask::Lease { .. } => 1,
            Ask::Refund { permits, .. }
            | Ask::Charge { permits, .. }
            | Ask::Return { permits, .. } => permits,
        }
    }

    /// The amount sent to the script (ARGV[3]): the cost, a lease's most permits, a settle's
    /// permits.
    const fn amount(self) -> u64 {
        match self {
            Ask::Lease { max, .. } => max,
            other => other.cost(),
        }
    }

    /// The hash of tokens the call takes as one key more (after the bands'), if any.
    pub(super) const fn tokens(self) -> Option<Tokens> {
        match self {
            Ask::Lease { .. } | Ask::Return { .. } => Some(Tokens::Lease),
            Ask::Reserve { .. } | Ask::Refund { .. } | Ask::Charge { .. } => Some(Tokens::Reserve),
            Ask::Acquire(_) | Ask::Peek => None,
        }
    }

    /// The script's name for it (ARGV[2] in lua/decide.lua).
    const fn op(self) -> &'static str {
        match self {
            Ask::Acquire(_) => "acquire",
            Ask::Peek => "peek",
            Ask::Reserve { .. } => "reserve",
            Ask::Refund { .. } => "refund",
            Ask::Charge { .. } => "charge",
            Ask::Lease { .. } => "lease",
            Ask::Return { .. } => "return",
        }
    }
}

/// A key's hash of tokens, next to its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tokens {
    /// Lease tokens: a field per limiter instance, naming its latest lease.
    Lease,
    /// Reservation tokens: a field per reservation admitted and not yet settled.
    Reserve,
}

/// One band of a policy as the script takes it.
#[derive(Clone, Debug)]
pub(super) struct ScriptBand {
    /// The end of the band's key names: algorithm, permits and window, e.g. `tb:5/1s`.
    suffix: String,
    /// The four script arguments: algorithm code, permits, window (us), interval (us).
    args: [String; 4],
}

/// A policy's bands as the script takes them, shortest window first.
#[derive(Clone, Debug)]
pub(super) struct Bands {
    bands: Vec<ScriptBand>,
}

impl Bands {
    /// The script's view of `policy`: each band's window rounded up to whole microseconds.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] for a band whose window is above
    /// [`MAX_WINDOW_MICROS`] or that asks for more than one permit per microsecond.
    pub(super) fn new(policy: &Policy) -> Result<Self, BackendError> {
        let mut bands = Vec::with_capacity(policy.bands().len());
        for band in policy.bands() {
            let window = band.window_nanos().div_ceil(1_000);
            let permits = band.permits();
            if window > MAX_WINDOW_MICROS {
                return Err(BackendError::UnsupportedPolicy {
                    band,
                    reason: "its window is longer than the Redis backend's maximum of 2^50 us (about 35.7 years)",
                });
            }
            if permits > window {
                return Err(BackendError::UnsupportedPolicy {
                    band,
                    reason: "it asks for more than one permit per microsecond, the Redis backend's resolution",
                });
            }
            let (code, interval) = match band.algorithm() {
                Algorithm::TokenBucket => ("tb", window.div_ceil(permits)),
                Algorithm::SlidingLog => ("sl", 0),
                Algorithm::SlidingCounter => ("sc", 0),
            };
            // "token-bucket 5/1s" -> "tb:5/1s": readable, distinct for distinct bands, and the
            // same for equal ones however they were written ("10/s burst 100" is "tb:100/10s").
            let shown = band.plain().to_string();
            let rate = shown
                .split_once(' ')
                .map_or(shown.as_str(), |(_, rate)| rate);
            bands.push(ScriptBand {
                suffix: format!("{code}:{rate}"),
                args: [
                    code.to_owned(),
                    permits.to_string(),
                    window.to_string(),
                    interval.to_string(),
                ],
            });
        }
        Ok(Bands { bands })
    }

    /// The Redis key of each band for the limiter key `key`: `<prefix>:{<key>}:<band>`.
    ///
    /// The `{...}` hash tag puts every band of one key in one Redis Cluster slot. The key is
    /// escaped inside it (`%` as `%25`, `}` as `%7D`, the empty key as `%`) so that the tag is
    /// always the whole, non-empty, escaped key: Redis hashes a name by its first `{...}`
    /// with something inside, and hashes the whole name when there is none, which would
    /// scatter a composite's keys. The names are injective: different keys or bands never
    /// share a name.
    pub(super) fn keys(&self, prefix: &str, key: &str) -> Vec<String> {
        let tag = tag(key);
        self.bands
            .iter()
            .map(|band| name(prefix, &tag, &band.suffix))
            .collect()
    }

    /// The Redis key of the lease tokens for `key`: `<prefix>:{<key>}:lease`, a hash with a
    /// field per limiter instance, in the slot of the key's bands.
    pub(super) fn lease_key(prefix: &str, key: &str) -> String {
        name(prefix, &tag(key), "lease")
    }

    /// The Redis key of `key`'s pause (see `RedisLimiter::pause`): `<prefix>:{<key>}:pause`,
    /// a string that expires when the pause ends, in the slot of the key's bands.
    pub(super) fn pause_key(prefix: &str, key: &str) -> String {
        name(prefix, &tag(key), "pause")
    }

    /// The record of the policy `key`'s state is under, for a limiter with per-key policies
    /// (`lua/record.lua`).
    pub(super) fn record_key(prefix: &str, key: &str) -> String {
        name(prefix, &tag(key), "policy")
    }

    /// A call built by [`Bands::args`] and [`Bands::call_keys`] (complete) made for a
    /// limiter with per-key policies: decided under the policy `text`, chosen when `chosen`
    /// says (`Chosen::arg`), only while `key`'s record names no other.
    pub(super) fn recorded(
        prefix: &str,
        key: &str,
        (text, chosen): (&str, String),
        keys: &mut Vec<String>,
        args: &mut Vec<String>,
    ) {
        keys.push(Self::record_key(prefix, key));
        args[1].push('@');
        args.push(chosen);
        args.push(text.to_owned());
    }

    /// The Redis key of what `key`'s moves to other policies could not carry (`lua/carry.lua`):
    /// `<prefix>:{<key>}:kept`, a string that expires when the last of those permits has come
    /// back, in the slot of the key's bands.
    pub(super) fn kept_key(prefix: &str, key: &str) -> String {
        name(prefix, &tag(key), "kept")
    }

    /// The call moving `key`'s state from the bands `self` (whose policy's text is
    /// `texts[0]`) to `to`'s (`texts[1]`, chosen at `chosen`): its keys and arguments
    /// (`lua/record.lua`, `convert_tier`).
    pub(super) fn convert_call(
        &self,
        to: &Bands,
        prefix: &str,
        key: &str,
        now_micros: Option<u64>,
        (texts, chosen): ([&str; 2], String),
    ) -> (Vec<String>, Vec<String>) {
        let mut keys = self.keys(prefix, key);
        keys.extend(to.keys(prefix, key));
        keys.push(Self::reserve_key(prefix, key));
        keys.push(Self::kept_key(prefix, key));
        keys.push(Self::record_key(prefix, key));
        let now = now_micros.map_or_else(String::new, |micros| micros.to_string());
        let mut args = vec![now, "convert@".to_owned()];
        for bands in [self, to] {
            args.push(bands.bands.len().to_string());
            for band in &bands.bands {
                args.extend(band.args.iter().cloned());
            }
        }
        args.push(texts[0].to_owned());
        args.push(chosen);
        args.push(texts[1].to_owned());
        (keys, args)
    }

    /// The Redis key of the reservation tokens for `key`: `<prefix>:{<key>}:reserved`, a hash
    /// with a field per reservation not yet settled, in the slot of the key's bands.
    pub(super) fn reserve_key(prefix: &str, key: &str) -> String {
        name(prefix, &tag(key), "reserved")
    }

    /// The keys of a call of `ask` for `key`: the bands', then the hash of tokens it takes,
    /// whose field names `instance` (appended to the call's `args`).
    pub(super) fn call_keys(
        &self,
        prefix: &str,
        key: &str,
        ask: Ask,
        instance: &str,
        args: &mut Vec<String>,
    ) -> Vec<String> {
        let mut keys = self.keys(prefix, key);
        if let Some(tokens) = ask.tokens() {
            args.push(instance.to_owned());
            keys.push(match tokens {
                Tokens::Lease => Self::lease_key(prefix, key),
                Tokens::Reserve => Self::reserve_key(prefix, key),
            });
        }
        keys
    }

    /// The script's arguments: `now` (in us, `None` for Redis TIME), what is asked and its
    /// amount, each band's four, then (to settle) each band's mark, and a lease's serial
    /// number (and its token's expiry).
    pub(super) fn args(&self, now_micros: Option<u64>, ask: Ask) -> Vec<String> {
        let mut args = Vec::with_capacity(3 + 5 * self.bands.len());
        let mut now = String::new();
        if let Some(micros) = now_micros {
            // Writing to a String cannot fail.
            let _ = write!(now, "{micros}");
        }
        args.push(now);
        args.push(ask.op().to_owned());
        args.push(ask.amount().to_string());
        for band in &self.bands {
            args.extend(band.args.iter().cloned());
        }
        match ask {
            Ask::Lease { serial, ttl_ms, .. } => {
                args.push(serial.to_string());
                args.push(ttl_ms.to_string());
            }
            Ask::Reserve { serial, .. } => args.push(serial.to_string()),
            Ask::Refund { marks, serial, .. }
            | Ask::Charge { marks, serial, .. }
            | Ask::Return { marks, serial, .. } => {
                args.extend(marks[..self.bands.len()].iter().map(u64::to_string));
                args.push(serial.to_string());
            }
            Ask::Acquire(_) | Ask::Peek => {}
        }
        args
    }

    /// How many bands there are.
    pub(super) fn count(&self) -> usize {
        self.bands.len()
    }

    /// One part's arguments of a call deciding several keys (`lua/parts.lua`): its `cost`,
    /// how many bands, whether it is in `shadow` mode, for a limiter with per-key policies
    /// when its policy was chosen and its text, and each band's four.
    pub(super) fn part_args(
        &self,
        cost: u64,
        shadow: bool,
        recorded: Option<(&str, String)>,
        args: &mut Vec<String>,
    ) {
        args.push(cost.to_string());
        args.push(self.bands.len().to_string());
        args.push(if shadow { "1" } else { "0" }.to_owned());
        let (text, chosen) = recorded.unwrap_or(("", "0".to_owned()));
        args.push(chosen);
        args.push(text.to_owned());
        for band in &self.bands {
            args.extend(band.args.iter().cloned());
        }
    }
}

/// What a call deciding several keys at once asks (`lua/parts.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PartsAsk {
    /// Decide, and spend every part's cost when every part admits.
    Acquire,
    /// Decide, write nothing.
    Peek,
    /// As `Acquire`, each part a reservation: its token written next to its key's state,
    /// its bands' marks in the reply.
    Reserve,
}

impl PartsAsk {
    /// The script's name for it (ARGV[2]).
    const fn op(self) -> &'static str {
        match self {
            PartsAsk::Acquire => "parts",
            PartsAsk::Peek => "parts-peek",
            PartsAsk::Reserve => "parts-reserve",
        }
    }
}

/// The arguments that open a call deciding `parts` keys at once (`lua/parts.lua`): `now`
/// (in us, `None` for Redis TIME), what is asked, and the count; each part's follow
/// ([`Bands::part_args`]).
pub(super) fn parts_args(now_micros: Option<u64>, ask: PartsAsk, parts: usize) -> Vec<String> {
    let now = now_micros.map_or_else(String::new, |micros| micros.to_string());
    vec![now, ask.op().to_owned(), parts.to_string()]
}

/// The reply to a call deciding several keys at once whose parts have `bands[i]` bands each
/// and are in shadow mode where `shadow[i]`, `[allowed, then for each part allowed,
/// remaining, limit, retry_after_us, reset_after_us, and when `marks` one mark per band]`, as
/// whether the whole was admitted and each part's decision of its own cost, with its marks
/// (all 0 without).
///
/// # Errors
///
/// [`BackendError::Reply`] when the reply has another shape, or its parts' decisions do not
/// agree with the whole's (admitted only if every part admits or is in shadow mode).
pub(super) fn parts_decisions(
    reply: &::redis::Value,
    bands: &[usize],
    shadow: &[bool],
    marks: bool,
) -> Result<(bool, Vec<(Decision, Marks)>), BackendError> {
    let bad = || BackendError::Reply(format!("{reply:?}"));
    let ::redis::Value::Array(items) = reply else {
        return Err(bad());
    };
    let each = |bands: usize| 5 + if marks { bands } else { 0 };
    if items.len() != 1 + bands.iter().map(|&b| each(b)).sum::<usize>()
        || bands.iter().any(|&b| b > Policy::MAX_BANDS)
    {
        return Err(bad());
    }
    let mut numbers = Vec::with_capacity(items.len());
    for item in items {
        match item {
            ::redis::Value::Int(n) => numbers.push(u64::try_from(*n).map_err(|_| bad())?),
            _ => return Err(bad()),
        }
    }
    let all = match numbers[0] {
        0 => false,
        1 => true,
        _ => return Err(bad()),
    };
    let nanos = |micros: u64| micros.saturating_mul(1_000);
    let mut parts = Vec::with_capacity(bands.len());
    let mut at = 1;
    for &count in bands {
        let [allowed, remaining, limit, retry, reset] = [0, 1, 2, 3, 4].map(|i| numbers[at + i]);
        let decision = match allowed {
            1 => Decision::allow(remaining, limit, nanos(reset)),
            0 => Decision::deny(remaining, limit, nanos(retry), nanos(reset)),
            _ => return Err(bad()),
        };
        let mut out = [0; Policy::MAX_BANDS + 1];
        if marks {
            out[..count].copy_from_slice(&numbers[at + 5..at + 5 + count]);
        }
        parts.push((decision, out));
        at += each(count);
    }
    let admits = |(part, (decision, _)): (usize, &(Decision, Marks))| {
        decision.is_allowed() || shadow.get(part).copied().unwrap_or(false)
    };
    if all != parts.iter().enumerate().all(admits) {
        return Err(bad());
    }
    Ok((all, parts))
}

/// `{<key>}`, escaped (see [`Bands::keys`]).
fn tag(key: &str) -> String {
    let mut tag = String::with_capacity(key.len() + 2);
    tag.push('{');
    if key.is_empty() {
        tag.push('%');
    }
    for c in key.chars() {
        match c {
            '%' => tag.push_str("%25"),
            '}' => tag.push_str("%7D"),
            c => tag.push(c),
        }
    }
    tag.push('}');
    tag
}

/// `<prefix>:<tag>:<suffix>`, without the prefix and its colon for an empty prefix.
fn name(prefix: &str, tag: &str, suffix: &str) -> String {
    let mut name = String::with_capacity(prefix.len() + tag.len() + suffix.len() + 2);
    if !prefix.is_empty() {
        name.push_str(prefix);
        name.push(':');
    }
    name.push_str(tag);
    name.push(':');
    name.push_str(suffix);
    name
}

/// The decision in the script's reply, `[allowed, remaining, limit, retry_after_us,
/// reset_after_us]`, followed by `marks` marks (one per band for a reservation or a lease,
/// else none) and, when `counted` (a lease), the permits taken; all integers. Unused marks
/// are 0, and so is the count of a call that is not a lease.
///
/// # Errors
///
/// [`BackendError::Reply`] when the reply has another shape.
pub(super) fn decision(
    reply: &::redis::Value,
    marks: usize,
    counted: bool,
) -> Result<(Decision, Marks, u64), BackendError> {
    let bad = || BackendError::Reply(format!("{reply:?}"));
    let ::redis::Value::Array(items) = reply else {
        return Err(bad());
    };
    let mut numbers = [0u64; 6 + Policy::MAX_BANDS];
    if items.len() != 5 + marks + usize::from(counted) || marks > Policy::MAX_BANDS {
        return Err(bad());
    }
    for (number, item) in numbers.iter_mut().zip(items) {
        match item {
            ::redis::Value::Int(n) => *number = u64::try_from(*n).map_err(|_| bad())?,
            _ => return Err(bad()),
        }
    }
    let [allowed, remaining, limit, retry, reset, ..] = numbers;
    let mut out = [0; Policy::MAX_BANDS + 1];
    out[..marks].copy_from_slice(&numbers[5..5 + marks]);
    let count = if counted { numbers[5 + marks] } else { 0 };
    let nanos = |micros: u64| micros.saturating_mul(1_000);
    let decision = match allowed {
        1 => Decision::allow(remaining, limit, nanos(reset)),
        0 => Decision::deny(remaining, limit, nanos(retry), nanos(reset)),
        _ => return Err(bad()),
    };
    if counted && decision.is_allowed() != (count > 0) {
        return Err(bad());
    }
    Ok((decision, out, count))
}

/// The script's reply to a lease given back: `true` (`1`) when it was applied, `false`
/// (`0`) when the lease token no longer named the lease.
///
/// # Errors
///
/// [`BackendError::Reply`] for any other reply.
pub(super) fn returned(reply: &::redis::Value) -> Result<bool, BackendError> {
    match reply {
        ::redis::Value::Int(1) => Ok(true),
        ::redis::Value::Int(0) => Ok(false),
        other => Err(BackendError::Reply(format!("{other:?}"))),
    }
}

/// The script's reply to a settle: `true` (`1`) when applied, `false` (`0`) for a refund
/// whose reservation token was gone (Redis no longer counts the reservation).
///
/// # Errors
///
/// [`BackendError::Reply`] for any other reply.
pub(super) fn settled(reply: &::redis::Value) -> Result<bool, BackendError> {
    returned(reply)
}

/// A key's record naming another policy than a call's (`lua/record.lua`): nothing was
/// decided.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Conflict {
    /// The part whose record it is (`None` for a call on one key).
    pub(super) part: Option<usize>,
    /// `true` when the record's policy was chosen no earlier than the call's: decide under
    /// it; `false`: move the key to the call's first.
    pub(super) follow: bool,
    /// The record's policy, as its text.
    pub(super) recorded: String,
    /// When the record's policy was chosen (us, on the script's clock).
    pub(super) at: u64,
}

/// The [`Conflict`] the script answered instead of a decision, if it did.
pub(super) fn conflict(reply: &::redis::Value) -> Option<Conflict> {
    let ::redis::Value::Array(items) = reply else {
        return None;
    };
    let text = |value: &::redis::Value| match value {
        ::redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    };
    let (part, mode, recorded, at) = match items.as_slice() {
        [tier, mode, recorded, at] if text(tier).as_deref() == Some("tier") => {
            (None, mode, recorded, at)
        }
        [tier, ::redis::Value::Int(part), mode, recorded, at]
            if text(tier).as_deref() == Some("tier") =>
        {
            // Lua counts parts from 1.
            let part = usize::try_from(*part).ok()?.checked_sub(1)?;
            (Some(part), mode, recorded, at)
        }
        _ => return None,
    };
    let follow = match text(mode)?.as_str() {
        "follow" => true,
        "move" => false,
        _ => return None,
    };
    Some(Conflict {
        part,
        follow,
        recorded: text(recorded)?,
        at: text(at)?.parse().ok()?,
    })
}

/// The script's reply to a move of a key's state to another policy: `Ok(true)` when it moved
/// the state, `Ok(false)` when the record names the new policy without it (moved already, or
/// no state), else the [`Conflict`] with the record (a third policy).
///
/// # Errors
///
/// [`BackendError::Reply`] for any other reply.
pub(super) fn converted(reply: &::redis::Value) -> Result<Result<bool, Conflict>, BackendError> {
    match reply {
        ::redis::Value::Int(1) => Ok(Ok(true)),
        ::redis::Value::Int(2) => Ok(Ok(false)),
        other => conflict(other)
            .map(Err)
            .ok_or_else(|| BackendError::Reply(format!("{other:?}"))),
    }
}

/// A clock reading in nanoseconds as the script's microseconds (rounded down).
///
/// # Errors
///
/// [`BackendError::ClockOutOfRange`] at [`MAX_NOW_MICROS`] or beyond.
pub(super) fn micros(nanos: u64) -> Result<u64, BackendError> {
    let micros = nanos / 1_000;
    if micros >= MAX_NOW_MICROS {
        return Err(BackendError::ClockOutOfRange {
            now: Duration::from_nanos(nanos),
        });
    }
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_share_one_non_empty_tag() {
        let bands = Bands::new(&"10/s & sliding-counter 1000/day".parse().unwrap()).unwrap();
        assert_eq!(
            bands.keys("rl", "alice"),
            ["rl:{alice}:tb:10/1s", "rl:{alice}:sc:1000/1d"]
        );
        assert_eq!(bands.keys("", "")[0], "{%}:tb:10/1s");
        assert_eq!(bands.keys("p", "}x%")[0], "p:{%7Dx%25}:tb:10/1s");
        assert_eq!(bands.keys("p", "a{b")[0], "p:{a{b}:tb:10/1s");
    }

    #[test]
    fn windows_round_up_to_microseconds() {
        let bands = Bands::new(&"3/1s".parse().unwrap()).unwrap();
        assert_eq!(
            bands.args(None, Ask::Acquire(1)),
            ["", "acquire", "1", "tb", "3", "1000000", "333334"]
        );
        let bands = Bands::new(&"sliding-log 2/1500ns".parse().unwrap()).unwrap();
        assert_eq!(
            bands.args(Some(7), Ask::Peek),
            ["7", "peek", "1", "sl", "2", "2", "0"]
        );
        assert!(matches!(
            Bands::new(&"5/4us".parse().unwrap()),
            Err(BackendError::UnsupportedPolicy { .. })
        ));
        assert!(matches!(
            Bands::new(&"1/40000d".parse().unwrap()),
            Err(BackendError::UnsupportedPolicy { .. })
        ));
    }

    #[test]
    fn a_settle_sends_one_mark_per_band() {
        let bands = Bands::new(&"5/1s & sliding-counter 9/1min".parse().unwrap()).unwrap();
        let marks = [11, 22, 0, 0, 0];
        let refund = Ask::Refund {
            permits: 2,
            marks,
            serial: 5,
        };
        assert_eq!(
            bands.args(Some(3), refund),
            [
                "3", "refund", "2", "tb", "5", "1000000", "200000", "sc", "9", "60000000", "0",
                "11", "22", "5"
            ]
        );
        let reserve = Ask::Reserve { cost: 4, serial: 6 };
        assert_eq!(bands.args(None, reserve)[1..3], ["reserve", "4"]);
        assert_eq!(bands.args(None, reserve)[11..], ["6"]);
        let charge = Ask::Charge {
            permits: 7,
            marks,
            serial: 8,
        };
        assert_eq!(bands.args(None, charge)[1..3], ["charge", "7"]);
        let mut args = bands.args(None, charge);
        assert_eq!(
            bands.call_keys("rl", "a", charge, "i0", &mut args),
            ["rl:{a}:tb:5/1s", "rl:{a}:sc:9/1m", "rl:{a}:reserved"],
            "the reservation tokens, in the slot of the key's bands"
        );
        assert_eq!(args[11..], ["11", "22", "8", "i0"]);
    }

    #[test]
    fn a_lease_sends_its_serial_and_a_return_its_marks_and_serial() {
        let bands = Bands::new(&"5/1s & sliding-counter 9/1min".parse().unwrap()).unwrap();
        let lease = Ask::Lease {
            max: 64,
            serial: 7,
            ttl_ms: 1500,
        };
        assert_eq!(lease.cost(), 1, "refused as a request of cost 1");
        assert_eq!(
            bands.args(None, lease),
            [
                "", "lease", "64", "tb", "5", "1000000", "200000", "sc", "9", "60000000", "0", "7",
                "1500"
            ]
        );
        let marks = [11, 22, 0, 0, 0];
        let back = Ask::Return {
            permits: 3,
            marks,
            serial: 7,
        };
        assert_eq!(
            bands.args(Some(4), back)[1..3],
            ["return", "3"],
            "as a refund"
        );
        assert_eq!(bands.args(Some(4), back)[11..], ["11", "22", "7"]);
        assert_eq!(
            Bands::lease_key("rl", "a}b"),
            "rl:{a%7Db}:lease",
            "in the slot of the key's bands"
        );
        assert_eq!(Bands::lease_key("", ""), "{%}:lease");
    }

    #[test]
    fn equal_bands_share_their_keys_however_they_were_written() {
        let keys = |policy: &str| {
            Bands::new(&policy.parse().unwrap())
                .unwrap()
                .keys("tollgate", "alice")
        };
        assert_eq!(keys("100/10s"), ["tollgate:{alice}:tb:100/10s"]);
        assert_eq!(keys("10/s burst 100"), keys("100/10s"));
        assert_eq!(
            keys("10/s burst 100 & 1000/day"),
            keys("token-bucket 100 per 10s & 1000/1d")
        );
    }
}
