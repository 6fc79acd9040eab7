//! What a request is counted against: [`LimitKey`], what an extractor sees of a request
//! ([`RequestHead`]), the [`KeyExtractor`] trait and the simplest extractor, [`GlobalKey`].
//! The others have modules of their own: `peer`, `forwarded`, `header_key`.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::OnceLock;

use http::{Extensions, HeaderMap, Method, Request, Uri};
use siphasher::sip128::SipHasher24;

use super::error::KeyError;

/// The key a request is counted against: small, fixed-size and `Copy`, so a lookup allocates
/// nothing and memory per tracked key is bounded whatever clients send.
///
/// The layer keys a `RateLimiter<LimitKey>`. Built-in extractors produce
/// [`Ip`](LimitKey::Ip) (masked to a prefix), [`Digest`](LimitKey::Digest) (a keyed hash of a
/// header or token) and [`Global`](LimitKey::Global); your own extractors may also produce
/// [`Id`](LimitKey::Id) for numeric ids.
///
/// # Examples
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use tollgate::middleware::LimitKey;
///
/// let ip = LimitKey::from(IpAddr::V4(Ipv4Addr::LOCALHOST));
/// assert_eq!(ip, LimitKey::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)));
/// assert_eq!(LimitKey::digest(b"token"), LimitKey::digest(b"token"));
/// assert_ne!(LimitKey::digest(b"token"), LimitKey::digest(b"tokem"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitKey {
    /// One key for every request: a global limit.
    Global,
    /// A client address, or the network it belongs to (see [`PeerIp::ipv6_prefix`](super::PeerIp::ipv6_prefix)).
    Ip(IpAddr),
    /// A numeric id (user, tenant) from your own extractor.
    Id(u64),
    /// A 128-bit keyed hash of variable-length key material (a header value, a token),
    /// made by [`LimitKey::digest_with_secret`] or [`LimitKey::digest`].
    Digest([u8; 16]),
}

impl LimitKey {
    /// A fixed-size key for variable-length material such as an API key or a bearer token:
    /// 128 bits of a keyed hash.
    ///
    /// The hash is the standard library's keyed hasher (`RandomState`, SipHash-1-3 today)
    /// under one random key drawn per process, run twice with a domain byte (0, then 1) to
    /// give two independent 64-bit halves. Clients cannot predict it, so they cannot choose
    /// two tokens that collide to spend another client's budget, and the limiter never stores
    /// the token itself. The key changes with every process: digests are not meant to be
    /// stored or shared between servers. A custom extractor feeding a rule decided by Redis
    /// must not use it (each server would file one client under a Redis key of its own):
    /// use [`digest_with_secret`](LimitKey::digest_with_secret), as
    /// [`HeaderKey`](super::HeaderKey) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::LimitKey;
    ///
    /// let key = LimitKey::digest(b"api-key-123");
    /// assert!(matches!(key, LimitKey::Digest(_)));
    /// assert_eq!(key, LimitKey::digest(b"api-key-123"));
    /// ```
    #[must_use]
    pub fn digest(material: &[u8]) -> LimitKey {
        static SECRET: OnceLock<RandomState> = OnceLock::new();
        let secret = SECRET.get_or_init(RandomState::new);
        let half = |domain: u8| {
            let mut hasher = secret.build_hasher();
            hasher.write_u8(domain);
            hasher.write(material);
            hasher.finish().to_le_bytes()
        };
        let mut out = [0; 16];
        out[..8].copy_from_slice(&half(0));
        out[8..].copy_from_slice(&half(1));
        LimitKey::Digest(out)
    }

    /// A digest of `material` under `secret`, the same in every process given the same
    /// secret: SipHash-2-4 with a 128-bit output, a keyed hash with a fixed definition. Servers
    /// that share one Redis and one secret file a client's token under one Redis key, while
    /// clients, who do not know the secret, still cannot choose tokens that collide.
    ///
    /// Keep the secret as secret as the tokens it hashes (16 random bytes from your
    /// configuration); changing it starts every client's Redis state afresh.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::LimitKey;
    ///
    /// let secret = *b"0123456789abcdef";
    /// let a = LimitKey::digest_with_secret(&secret, b"api-key-123");
    /// assert_eq!(a, LimitKey::digest_with_secret(&secret, b"api-key-123"));
    /// assert_ne!(a, LimitKey::digest_with_secret(b"fedcba9876543210", b"api-key-123"));
    /// ```
    #[must_use]
    pub fn digest_with_secret(secret: &[u8; 16], material: &[u8]) -> LimitKey {
        LimitKey::Digest(SipHasher24::new_with_key(secret).hash(material).as_bytes())
    }
}

/// The key's stable text form, the same in every process and on every platform: `global`,
/// `ip:<address>` (IPv4 dotted, IPv6 in its canonical compressed form), `id:<decimal>`,
/// `digest:<32 lowercase hex digits>`. The Redis-backed rules of a
/// [`RateLimitLayer`](super::RateLimitLayer) use it as the Redis key.
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::middleware::LimitKey;
///
/// let ip: IpAddr = "2001:db8::".parse()?;
/// assert_eq!(LimitKey::Ip(ip).to_string(), "ip:2001:db8::");
/// assert_eq!(LimitKey::Id(42).to_string(), "id:42");
/// assert_eq!(LimitKey::Global.to_string(), "global");
/// assert_eq!(LimitKey::Digest([0xab; 16]).to_string(), format!("digest:{}", "ab".repeat(16)));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitKey::Global => f.write_str("global"),
            LimitKey::Ip(ip) => write!(f, "ip:{ip}"),
            LimitKey::Id(id) => write!(f, "id:{id}"),
            LimitKey::Digest(bytes) => {
                f.write_str("digest:")?;
                bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl From<IpAddr> for LimitKey {
    fn from(ip: IpAddr) -> Self {
        LimitKey::Ip(ip)
    }
}

impl From<u64> for LimitKey {
    fn from(id: u64) -> Self {
        LimitKey::Id(id)
    }
}

/// A borrowed view of a request's head (method, URI, headers, extensions), which is all a
/// [`KeyExtractor`] sees. It is the same for every body type, so one extractor serves axum,
/// hyper and tonic alike.
///
/// # Examples
///
/// ```
/// use http::{Method, Request};
/// use tollgate::middleware::RequestHead;
///
/// let request = Request::post("/login").header("x-user", "7").body(())?;
/// let head = RequestHead::new(&request);
/// assert_eq!(head.method(), Method::POST);
/// assert_eq!(head.uri().path(), "/login");
/// assert_eq!(head.headers()["x-user"], "7");
/// # Ok::<(), http::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    ///
    /// # Examples
    ///
    /// ```
    /// let request = http::Request::new(());
    /// let head = tollgate::middleware::RequestHead::new(&request);
    /// assert_eq!(head.uri().path(), "/");
    /// ```
    #[must_use]
    pub fn new<B>(request: &'a Request<B>) -> Self {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The head of a request already split into parts.
    ///
    /// # Examples
    ///
    /// ```
    /// let (parts, ()) = http::Request::get("/a").body(())?.into_parts();
    /// let head = tollgate::middleware::RequestHead::from_parts(&parts);
    /// assert_eq!(head.uri().path(), "/a");
    /// # Ok::<(), http::Error>(())
    /// ```
    #[must_use]
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The request method.
    ///
    /// # Examples
    ///
    /// ```
    /// let request = http::Request::new(());
    /// assert_eq!(tollgate::middleware::RequestHead::new(&request).method(), http::Method::GET);
    /// ```
    #[must_use]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI (for a server, usually just the path and query).
    ///
    /// # Examples
    ///
    /// ```
    /// let request = http::Request::get("/x?y=1").body(())?;
    /// assert_eq!(tollgate::middleware::RequestHead::new(&request).uri().query(), Some("y=1"));
    /// # Ok::<(), http::Error>(())
    /// ```
    #[must_use]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request headers.
    ///
    /// # Examples
    ///
    /// ```
    /// let request = http::Request::get("/").header("x-a", "1").body(())?;
    /// assert!(tollgate::middleware::RequestHead::new(&request).headers().contains_key("x-a"));
    /// # Ok::<(), http::Error>(())
    /// ```
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions, where servers put the peer address and earlier middleware
    /// (authentication) puts what it learned.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert(42u64);
    /// let head = tollgate::middleware::RequestHead::new(&request);
    /// assert_eq!(head.extensions().get::<u64>(), Some(&42));
    /// ```
    #[must_use]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

/// Takes the rate-limit key from a request.
///
/// Built in: [`PeerIp`](super::PeerIp) (the connection's address), [`ClientIp`](super::ClientIp) (the client
/// behind trusted proxies), [`HeaderKey`](super::HeaderKey) (a header or bearer token, hashed) and
/// [`GlobalKey`]. Any closure `Fn(&RequestHead<'_>) -> Option<LimitKey>` is an extractor too;
/// its `None` is [`KeyError::NotFound`].
///
/// # Errors
///
/// A [`KeyError`] when the request carries no usable key; the layer then answers as
/// configured with [`on_missing_key`](super::RateLimitLayer::on_missing_key).
///
/// # Examples
///
/// A key from what an authentication middleware left in the extensions:
///
/// ```
/// use http::Request;
/// use tollgate::middleware::{KeyExtractor, LimitKey, RequestHead};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// let by_user = |head: &RequestHead<'_>| head.extensions().get::<UserId>().map(|u| LimitKey::Id(u.0));
///
/// let mut request = Request::new(());
/// assert!(by_user.extract(&RequestHead::new(&request)).is_err());
/// request.extensions_mut().insert(UserId(7));
/// assert_eq!(by_user.extract(&RequestHead::new(&request)), Ok(LimitKey::Id(7)));
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of the request whose head is `head`.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] saying why the request has no usable key.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{GlobalKey, KeyExtractor, LimitKey, RequestHead};
    ///
    /// let request = http::Request::new(());
    /// assert_eq!(GlobalKey.extract(&RequestHead::new(&request)), Ok(LimitKey::Global));
    /// ```
    fn extract(&self, head: &RequestHead<'_>) -> Result<LimitKey, KeyError>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Option<LimitKey> + Send + Sync + 'static,
{
    fn extract(&self, head: &RequestHead<'_>) -> Result<LimitKey, KeyError> {
        self(head).ok_or(KeyError::NotFound)
    }
}

/// One key for all requests: a global limit (say, what a fragile backend can take).
///
/// # Examples
///
/// ```
/// use tollgate::middleware::{GlobalKey, KeyExtractor, LimitKey, RequestHead};
///
/// let request = http::Request::new(());
/// assert_eq!(GlobalKey.extract(&RequestHead::new(&request)), Ok(LimitKey::Global));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _: &RequestHead<'_>) -> Result<LimitKey, KeyError> {
        Ok(LimitKey::Global)
    }
}

/// `bytes` without leading and trailing spaces and tabs.
pub(crate) fn trim(bytes: &[u8]) -> &[u8] {
    let is_ws = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ws(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ws(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_secret_digests_are_siphash_2_4_128() {
        // The reference implementation's first 128-bit test vector: key 00..0f, empty input.
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let want = [
            0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55,
            0x02, 0x93,
        ];
        assert_eq!(
            LimitKey::digest_with_secret(&key, b""),
            LimitKey::Digest(want)
        );
    }

    #[test]
    fn digests_are_fixed_size_and_distinct() {
        assert_ne!(LimitKey::digest(b""), LimitKey::digest(b"\0"));
        // No heap part; the size of a u64 id aligned, which a map entry beside an atomic
        // state word pads to anyway.
        assert_eq!(std::mem::size_of::<LimitKey>(), 24);
    }
}
