//! The middleware's errors: [`KeyError`] when a request yields no key, [`ConfigError`] when a
//! layer or extractor cannot be configured as asked.

use std::fmt;

use http::HeaderName;

/// Why no rate-limit key could be taken from a request.
///
/// The layer answers such a request as configured with
/// [`RateLimitLayer::on_missing_key`](super::RateLimitLayer::on_missing_key) (by default
/// `400 Bad Request`; [`NoPeerAddress`](KeyError::NoPeerAddress) always `500`); it never
/// panics. The message is safe to show to the client: it names
/// the header that was missing or malformed, never its value.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use tollgate::middleware::{HeaderKey, KeyError, KeyExtractor, RequestHead};
///
/// let request = Request::new(());
/// let err = HeaderKey::bearer().extract(&RequestHead::new(&request)).unwrap_err();
/// assert!(matches!(err, KeyError::MissingHeader(_)));
/// assert_eq!(err.to_string(), "no rate-limit key: header `authorization` is missing");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request carries no peer address: the server did not put a `SocketAddr` (axum's
    /// `ConnectInfo<SocketAddr>` with feature `axum`, or the type registered with
    /// `connect_info`) in the request's extensions. The server's mistake, not the client's:
    /// the layers answer it `500` and log it once, whatever
    /// [`MissingKey`](super::MissingKey) says.
    NoPeerAddress,
    /// The header the key comes from is absent or empty.
    MissingHeader(HeaderName),
    /// The header is present but cannot be used: not the expected syntax, repeated when it
    /// must appear once, or (for forwarding headers) an entry that is not an IP address where
    /// a trusted proxy's entry was expected.
    Malformed(HeaderName),
    /// The key material is longer than the extractor accepts.
    TooLong {
        /// The header it came from.
        header: HeaderName,
        /// Its length in bytes.
        len: usize,
        /// The most the extractor accepts.
        max: usize,
    },
    /// Fewer forwarding entries than trusted proxies: the request did not pass through every
    /// proxy the extractor was told to trust, so no entry can be trusted.
    ShortChain {
        /// The forwarding header read.
        header: HeaderName,
        /// The entries needed (the number of trusted hops).
        needed: usize,
        /// The entries found.
        found: usize,
    },
    /// A custom extractor (such as a closure) found no key.
    NotFound,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no rate-limit key: ")?;
        match self {
            KeyError::NoPeerAddress => f.write_str("the peer address is unknown"),
            KeyError::MissingHeader(name) => write!(f, "header `{name}` is missing"),
            KeyError::Malformed(name) => write!(f, "header `{name}` is malformed"),
            KeyError::TooLong { header, len, max } => {
                write!(f, "header `{header}` is {len} bytes long, more than {max}")
            }
            KeyError::ShortChain {
                header,
                needed,
                found,
            } => write!(
                f,
                "header `{header}` has {found} entries, fewer than the {needed} trusted hops"
            ),
            KeyError::NotFound => f.write_str("the request carries none"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Why a layer, route or key extractor could not be configured as asked.
///
/// # Examples
///
/// ```
/// use tollgate::middleware::{ClientIp, ConfigError};
///
/// let err = ClientIp::trusted_proxies(["10.0.0.0/33"]).unwrap_err();
/// assert_eq!(err, ConfigError::InvalidCidr { cidr: "10.0.0.0/33".into() });
/// assert_eq!(err.to_string(), "trusted proxy `10.0.0.0/33` is not an IP address or CIDR block");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A trusted proxy entry is neither an IP address nor a CIDR block (`10.0.0.0/8`,
    /// `2001:db8::/32`).
    InvalidCidr {
        /// The entry as given.
        cidr: String,
    },
    /// A trusted proxy network of prefix 0 (`0.0.0.0/0`, `::/0`), or an IPv6 network that
    /// holds a whole translation prefix (the NAT64 `64:ff9b::/96`, as `64::/16` does):
    /// every client, or every IPv4 client reached through the translation, would be a
    /// trusted proxy, and the leftmost forwarding entry, which the client writes, its key.
    TrustsEveryAddress {
        /// The entry as given.
        cidr: String,
    },
    /// A prefix length beyond the address size (32 for IPv4, 128 for IPv6).
    InvalidPrefix {
        /// The prefix asked for.
        prefix: u8,
        /// The address size in bits.
        max: u8,
    },
    /// Not a valid HTTP header name.
    InvalidHeaderName {
        /// The name as given.
        name: String,
    },
    /// A policy name for the `RateLimit-Policy` field outside printable ASCII, or empty.
    InvalidPolicyName {
        /// The name as given.
        name: String,
    },
    /// A route's cost of 0 permits: every request must spend at least one.
    InvalidCost {
        /// The cost asked for.
        cost: u64,
    },
    /// A [`Limit`](super::Limit) that cannot be decided together with the rules of the route
    /// it was added to ([`RateLimitLayer::and`](super::RateLimitLayer::and)).
    CannotCombine {
        /// The limit's name, or the layer's when it has none.
        limit: String,
        /// Why.
        reason: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidCidr { cidr } => {
                write!(
                    f,
                    "trusted proxy `{cidr}` is not an IP address or CIDR block"
                )
            }
            ConfigError::InvalidPrefix { prefix, max } => {
                let family = if *max == 32 { "IPv4" } else { "IPv6" };
                write!(
                    f,
                    "{family} prefix length must be at most {max}, got {prefix}"
                )
            }
            ConfigError::TrustsEveryAddress { cidr } => write!(
                f,
                "trusted proxy `{cidr}` covers every address: any client could name its own key"
            ),
            ConfigError::InvalidHeaderName { name } => {
                write!(f, "header name `{name}` is not a valid HTTP header name")
            }
            ConfigError::InvalidPolicyName { name } => write!(
                f,
                "policy name {name:?} must be non-empty printable ASCII (0x20 to 0x7e)"
            ),
            ConfigError::InvalidCost { cost } => {
                write!(f, "a route's cost must be at least 1 permit, got {cost}")
            }
            ConfigError::CannotCombine { limit, reason } => {
                write!(
                    f,
                    "limit {limit} cannot be combined with the route: {reason}"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}
