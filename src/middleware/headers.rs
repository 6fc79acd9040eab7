//! Turning a [`Decision`] into header fields and refusal responses: [`HeaderStyle`], the
//! IETF `RateLimit-Policy` / `RateLimit` structured fields, the older triples,
//! `Retry-After`, `application/problem+json` bodies and gRPC trailers-only refusals.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::error::ConfigError;
use crate::decision::Decision;
use crate::policy::{window_in_units, Band, Policy};

/// Which rate-limit header fields go on responses (allowed and refused alike).
///
/// A refusal always carries `Retry-After` (whole seconds, rounded up, at least 1), whatever
/// the style: it is HTTP's own field for a 429.
///
/// | style | fields, for policy `100/min` with 42 left and 17 s to reset |
/// |---|---|
/// | [`Draft`](HeaderStyle::Draft) (default) | `RateLimit-Policy: "default";q=100;w=60` and `RateLimit: "default";r=42;t=17` |
/// | [`Legacy`](HeaderStyle::Legacy) | `RateLimit-Limit: 100`, `RateLimit-Remaining: 42`, `RateLimit-Reset: 17` |
/// | [`XRateLimit`](HeaderStyle::XRateLimit) | `X-RateLimit-Limit: 100`, `X-RateLimit-Remaining: 42`, `X-RateLimit-Reset: 17` |
/// | [`None`](HeaderStyle::None) | nothing but `Retry-After` on refusals |
///
/// Draft fields are *lists* (IETF httpapi `draft-ietf-httpapi-ratelimit-headers`, structured
/// fields): they are appended to what a response already has, so two stacked layers both
/// show. The older styles hold one value: a field already set (by an inner layer or the
/// handler) is left alone. `Reset` values are delta seconds, not timestamps.
///
/// Every integer in these fields is at most 999,999,999,999,999, the largest a structured
/// field (RFC 8941) may carry: a larger quota or remaining (a token bucket may have up to
/// `u64::MAX` permits) is shown as that, so that parsers never reject the field. Windows
/// and resets, in seconds, always fit.
///
/// # Examples
///
/// ```
/// use tollgate::middleware::{HeaderStyle, RateLimitLayer};
/// use tollgate::RateLimiter;
///
/// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
///     .headers(HeaderStyle::XRateLimit);
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Draft);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit`, structured fields of the current IETF draft.
    #[default]
    Draft,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`: earlier drafts.
    Legacy,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`: the de facto style
    /// (reset in delta seconds).
    XRateLimit,
    /// No rate-limit fields (a refusal still carries `Retry-After`).
    None,
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The rate-limit fields of one response, computed when the request is decided.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    items: [Option<(HeaderName, HeaderValue)>; 3],
    /// List fields (draft style) are appended; single-valued ones only fill a gap.
    append: bool,
}

impl Fields {
    /// The draft `RateLimit-Policy` value among these fields, if any.
    pub(crate) fn policy(&self) -> Option<&HeaderValue> {
        self.items
            .iter()
            .flatten()
            .find(|(name, _)| *name == RATELIMIT_POLICY)
            .map(|(_, value)| value)
    }

    /// These fields with `policies` (each a draft `RateLimit-Policy` value, several rules
    /// decided together) as one `RateLimit-Policy` list; unchanged for other styles.
    pub(crate) fn with_policies<'a>(
        mut self,
        policies: impl Iterator<Item = &'a HeaderValue>,
    ) -> Self {
        let Some((_, value)) = self
            .items
            .iter_mut()
            .flatten()
            .find(|(name, _)| *name == RATELIMIT_POLICY)
        else {
            return self;
        };
        let mut list = Vec::new();
        for policy in policies {
            if !list.is_empty() {
                list.extend_from_slice(b", ");
            }
            list.extend_from_slice(policy.as_bytes());
        }
        *value = header_value(list);
        self
    }

    /// Adds the fields to `headers`.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        headers.reserve(self.items.iter().flatten().count());
        for (name, value) in self.items.into_iter().flatten() {
            if self.append {
                headers.append(name, value);
            } else if !headers.contains_key(&name) {
                headers.insert(name, value);
            }
        }
    }
}

/// The largest integer a structured field may carry (RFC 8941: at most 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// `n` as a structured-field integer: clamped to [`SF_INTEGER_MAX`].
fn sf_integer(n: impl TryInto<u64>) -> u64 {
    n.try_into()
        .map_or(SF_INTEGER_MAX, |n: u64| n.min(SF_INTEGER_MAX))
}

/// A validated policy name, rendered as a structured-field string (quotes included).
pub(crate) fn sf_string(name: &str) -> Result<String, ConfigError> {
    if name.is_empty() || !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ConfigError::InvalidPolicyName {
            name: name.to_owned(),
        });
    }
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// The `RateLimit-Policy` value of a policy and the item name of each band, cached per rule.
#[derive(Clone, Debug)]
pub(crate) struct Rendered {
    /// The policy this was rendered for; `None` for a limiter with per-key policies.
    policy: Option<Policy>,
    /// Each band's item name, as a structured-field string.
    names: Vec<String>,
    /// `None` when the policy is per key (the value then depends on the decision).
    value: Option<HeaderValue>,
}

impl Rendered {
    /// Renders `policy` under the (already quoted) base name `name`: one item per band,
    /// named `name` for a single band and `name-<window>` for each band of a composite.
    pub(crate) fn new(name: &str, policy: Option<Policy>) -> Self {
        let Some(policy) = policy else {
            return Rendered {
                policy,
                names: vec![name.to_owned()],
                value: None,
            };
        };
        let bare = &name[1..name.len() - 1];
        let mut names: Vec<String> = Vec::with_capacity(policy.bands().len());
        let mut value = String::new();
        for (i, band) in policy.bands().enumerate() {
            let mut item = if policy.is_composite() {
                format!("\"{bare}-{}\"", window_label(band))
            } else {
                name.to_owned()
            };
            if names.contains(&item) {
                // Two bands with the same window (different algorithms or permits).
                item = format!("\"{bare}-{}-{}\"", window_label(band), i + 1);
            }
            if i > 0 {
                value.push_str(", ");
            }
            let _ = write!(
                value,
                "{item};q={};w={}",
                sf_integer(band.permits()),
                sf_integer(whole_seconds(band.window().as_nanos()))
            );
            names.push(item);
        }
        Rendered {
            policy: Some(policy),
            names,
            // Validated printable ASCII and digits: always a valid header value.
            value: HeaderValue::from_str(&value).ok(),
        }
    }

    /// The policy this was rendered for.
    pub(crate) fn policy(&self) -> Option<Policy> {
        self.policy
    }

    /// The draft fields for `decision`.
    fn draft(&self, decision: &Decision) -> [Option<(HeaderName, HeaderValue)>; 3] {
        let (index, policy_value) = match (&self.policy, &self.value) {
            // The band the decision reports, by its position in the policy: bands of equal
            // permits are told apart.
            (Some(_), Some(value)) => (decision.band(), value.clone()),
            // Per-key policies: only the quota of the key's (tightest) band is known.
            _ => {
                let value = format!("{};q={}", self.names[0], sf_integer(decision.limit()));
                (0, header_value(value))
            }
        };
        let name = self.names.get(index).unwrap_or(&self.names[0]);
        let (r, t) = (
            sf_integer(decision.remaining()),
            sf_integer(decision.reset_after_secs()),
        );
        // Exactly sized, so the header value takes the buffer over without copying it.
        let mut state = Vec::with_capacity(name.len() + 6 + digits(r) + digits(t));
        state.extend_from_slice(name.as_bytes());
        state.extend_from_slice(b";r=");
        push_digits(&mut state, r);
        state.extend_from_slice(b";t=");
        push_digits(&mut state, t);
        [
            Some((RATELIMIT_POLICY, policy_value)),
            Some((RATELIMIT, header_value(state))),
            None,
        ]
    }
}

/// A header value from bytes built of validated ASCII.
fn header_value(value: impl Into<Vec<u8>>) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from(value.into()))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `n` as a header value (clamped like a structured-field integer), in one exactly sized
/// allocation.
fn number(n: u64) -> HeaderValue {
    let n = sf_integer(n);
    let mut out = Vec::with_capacity(digits(n));
    push_digits(&mut out, n);
    header_value(out)
}

/// The number of decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Appends `n` in decimal.
fn push_digits(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// A window in seconds for the `w` parameter, which is an integer: rounded up, at least 1.
fn whole_seconds(nanos: u128) -> u128 {
    nanos.div_ceil(1_000_000_000).max(1)
}

/// A short label for a band's window: `1s`, `15m`, `1d`, `100ms`.
fn window_label(band: Band) -> String {
    let (count, unit) = window_in_units(band.window_nanos());
    format!("{count}{unit}")
}

/// The fields of `decision` in `style`; `rendered` is the rule's cached policy rendering.
pub(crate) fn fields(style: HeaderStyle, rendered: &Rendered, decision: &Decision) -> Fields {
    let triple = |names: [HeaderName; 3]| {
        let [limit, remaining, reset] = names;
        [
            Some((limit, number(decision.limit()))),
            Some((remaining, number(decision.remaining()))),
            Some((reset, number(decision.reset_after_secs()))),
        ]
    };
    match style {
        HeaderStyle::Draft => Fields {
            items: rendered.draft(decision),
            append: true,
        },
        HeaderStyle::Legacy => Fields {
            items: triple([RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET]),
            append: false,
        },
        HeaderStyle::XRateLimit => Fields {
            items: triple([X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET]),
            append: false,
        },
        HeaderStyle::None => Fields::default(),
    }
}

/// `text` as the inside of a JSON string.
fn json_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

/// An RFC 9457 problem document (`type` `about:blank`, so `title` is the status's phrase).
fn problem(status: StatusCode, detail: &str, retry_after: Option<u64>) -> Bytes {
    let mut body = String::with_capacity(160);
    body.push_str("{\"type\":\"about:blank\",\"title\":\"");
    json_escape(status.canonical_reason().unwrap_or("Error"), &mut body);
    let _ = write!(body, "\",\"status\":{},\"detail\":\"", status.as_u16());
    json_escape(detail, &mut body);
    body.push('"');
    if let Some(secs) = retry_after {
        let _ = write!(body, ",\"retry_after\":{secs}");
    }
    body.push('}');
    Bytes::from(body)
}

/// Whether a request is gRPC (`content-type: application/grpc...`): refused the gRPC way.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        // A media type's type and subtype are case-insensitive (RFC 9110, 8.3.1).
        let prefix = b"application/grpc";
        v.as_bytes()
            .get(..prefix.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    })
}

/// The gRPC status code closest to an HTTP refusal status.
fn grpc_code(status: StatusCode) -> u16 {
    match status.as_u16() {
        429 => 8,  // RESOURCE_EXHAUSTED
        400 => 3,  // INVALID_ARGUMENT
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        503 => 14, // UNAVAILABLE
        500 => 13, // INTERNAL
        _ => 2,    // UNKNOWN
    }
}

/// A refusal or rejection: `status` with a problem+json body, or, for a gRPC request, a
/// trailers-only response (HTTP 200, `grpc-status`, `grpc-message`, no body, and
/// `cache-control: no-store`: the client chose the gRPC form by its content type, and an
/// empty `200` must not be stored by a shared cache as the page of the URL).
pub(crate) fn error_response(
    status: StatusCode,
    detail: &str,
    retry_after: Option<u64>,
    grpc: bool,
) -> Response<Bytes> {
    let mut response = if grpc {
        let mut response = Response::new(Bytes::new());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(GRPC_STATUS, HeaderValue::from(grpc_code(status)));
        // `detail` is printable ASCII (built here or from a KeyError naming a header).
        if let Ok(message) = HeaderValue::from_str(detail) {
            headers.insert(GRPC_MESSAGE, message);
        }
        response
    } else {
        let mut response = Response::new(problem(status, detail, retry_after));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    };
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_told_by_its_media_type_in_any_case() {
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC", true),
            ("application/json", false),
            ("application/grp", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_grpc(&headers), grpc, "{value}");
        }
    }

    fn policy(s: &str) -> Option<Policy> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn policy_values() {
        let name = sf_string("default").unwrap();
        let r = Rendered::new(&name, policy("100/min"));
        assert_eq!(r.value.unwrap(), "\"default\";q=100;w=60");
        let r = Rendered::new(&name, policy("10/s & 1000/day"));
        assert_eq!(
            r.value.unwrap(),
            "\"default-1s\";q=10;w=1, \"default-1d\";q=1000;w=86400"
        );
        let r = Rendered::new(&name, policy("5/100ms & sliding-log 3/100ms"));
        assert_eq!(
            r.value.unwrap(),
            "\"default-100ms\";q=3;w=1, \"default-100ms-2\";q=5;w=1"
        );
        let r = Rendered::new(&sf_string("a\"b\\c").unwrap(), policy("2/3s"));
        assert_eq!(r.value.unwrap(), r#""a\"b\\c";q=2;w=3"#);
    }

    #[test]
    fn integers_fit_structured_fields() {
        assert_eq!(sf_integer(0u64), 0);
        assert_eq!(sf_integer(SF_INTEGER_MAX), SF_INTEGER_MAX);
        assert_eq!(sf_integer(SF_INTEGER_MAX + 1), SF_INTEGER_MAX);
        assert_eq!(sf_integer(u64::MAX), SF_INTEGER_MAX);
        assert_eq!(sf_integer(u128::MAX), SF_INTEGER_MAX);
        let name = sf_string("big").unwrap();
        let r = Rendered::new(&name, policy("10000000000000000/200d"));
        assert_eq!(
            r.value.as_ref().unwrap(),
            "\"big\";q=999999999999999;w=17280000"
        );
        let decision = Decision::allow(u64::MAX - 1, u64::MAX, u64::MAX);
        let [_, state, _] = r.draft(&decision);
        assert_eq!(state.unwrap().1, "\"big\";r=999999999999999;t=18446744074");
        let per_key = Rendered::new(&name, None);
        let [quota, _, _] = per_key.draft(&decision);
        assert_eq!(quota.unwrap().1, "\"big\";q=999999999999999");
        assert_eq!(number(u64::MAX), "999999999999999");
    }

    #[test]
    fn decimal_digits() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = Vec::new();
            push_digits(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(digits(n), out.len());
        }
    }

    #[test]
    fn names_are_validated() {
        assert!(sf_string("").is_err());
        assert!(sf_string("caf\u{e9}").is_err());
        assert!(sf_string("a\nb").is_err());
        assert_eq!(sf_string("api v2").unwrap(), "\"api v2\"");
    }

    #[test]
    fn problems_are_json() {
        let body = problem(StatusCode::TOO_MANY_REQUESTS, "a \"b\"\n", Some(3));
        assert_eq!(
            body,
            "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
             \"detail\":\"a \\\"b\\\"\\u000a\",\"retry_after\":3}"
        );
    }
}
