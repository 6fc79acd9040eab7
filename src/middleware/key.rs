//! What a request is counted against: [`LimitKey`], the [`KeyExtractor`] trait, and the
//! extractors that need no proxy configuration: [`PeerIp`] and [`GlobalKey`] (and
//! [`HeaderKey`](super::HeaderKey), in `header_key`).

use std::any::Any;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use siphasher::sip128::SipHasher24;

use http::{Extensions, HeaderMap, Method, Request, Uri};

use super::error::{ConfigError, KeyError};
use crate::ip::{mask, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX};

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
    /// A client address, or the network it belongs to (see [`PeerIp::ipv6_prefix`]).
    Ip(IpAddr),
    /// A numeric id (user, tenant) from your own extractor.
    Id(u64),
    /// A 128-bit keyed hash of variable-length key material (a header value, a token),
    /// made by [`LimitKey::digest`].
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
    /// stored or shared between servers (for that, see
    /// [`digest_with_secret`](LimitKey::digest_with_secret)).
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
/// Built in: [`PeerIp`] (the connection's address), [`ClientIp`](super::ClientIp) (the client
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

/// Reads a peer address from a request's extensions.
type PeerLookup = dyn Fn(&Extensions) -> Option<IpAddr> + Send + Sync;

/// How to find the connection's address and how far to mask it; shared by [`PeerIp`] and
/// [`ClientIp`](super::ClientIp).
#[derive(Clone)]
pub(crate) struct Peer {
    /// Custom lookups, tried first, in order.
    lookups: Vec<Arc<PeerLookup>>,
    v4_prefix: u8,
    v6_prefix: u8,
}

impl Peer {
    pub(crate) fn new() -> Self {
        Peer {
            lookups: Vec::new(),
            v4_prefix: DEFAULT_V4_PREFIX,
            v6_prefix: DEFAULT_V6_PREFIX,
        }
    }

    /// The connection's address, unmasked.
    pub(crate) fn address(&self, extensions: &Extensions) -> Option<IpAddr> {
        self.lookups
            .iter()
            .find_map(|lookup| lookup(extensions))
            .or_else(|| extensions.get::<SocketAddr>().map(SocketAddr::ip))
            .or_else(|| extensions.get::<IpAddr>().copied())
    }

    pub(crate) fn mask(&self, ip: IpAddr) -> IpAddr {
        mask(ip, self.v4_prefix, self.v6_prefix)
    }

    pub(crate) fn set_v4_prefix(&mut self, prefix: u8) -> Result<(), ConfigError> {
        if prefix > 32 {
            return Err(ConfigError::InvalidPrefix { prefix, max: 32 });
        }
        self.v4_prefix = prefix;
        Ok(())
    }

    pub(crate) fn set_v6_prefix(&mut self, prefix: u8) -> Result<(), ConfigError> {
        if prefix > 128 {
            return Err(ConfigError::InvalidPrefix { prefix, max: 128 });
        }
        self.v6_prefix = prefix;
        Ok(())
    }

    pub(crate) fn add_lookup<T, A>(&mut self, address: impl Fn(&T) -> A + Send + Sync + 'static)
    where
        T: Any + Send + Sync,
        A: Into<Option<IpAddr>>,
    {
        self.lookups.push(Arc::new(move |extensions: &Extensions| {
            extensions.get::<T>().and_then(|info| address(info).into())
        }));
    }
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("lookups", &self.lookups.len())
            .field("v4_prefix", &self.v4_prefix)
            .field("v6_prefix", &self.v6_prefix)
            .finish()
    }
}

/// The key is the address of the connection's peer, with IPv6 addresses masked to their /64
/// by default.
///
/// Why /64: an IPv6 subscriber is routinely given a whole /64 (often a /56 or /48), and
/// picks addresses in it freely, so keying by the full address would hand one client
/// 2^64 budgets. IPv4 addresses are kept whole (`/32`) by default. IPv4-mapped IPv6 addresses
/// (what a dual-stack socket reports) count as IPv4.
///
/// The address comes from the request's extensions: a registered
/// [`connect_info`](PeerIp::connect_info) type first (such as axum's
/// `ConnectInfo<SocketAddr>`), then a plain `SocketAddr` or `IpAddr`. Without one, the request
/// has no key ([`KeyError::NoPeerAddress`]).
///
/// Behind a reverse proxy every request comes from the proxy's address: use
/// [`ClientIp`](super::ClientIp) there.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::middleware::{KeyExtractor, LimitKey, PeerIp, RequestHead};
///
/// let mut request = Request::new(());
/// let peer: SocketAddr = "[2001:db8:1:2:3:4:5:6]:4711".parse()?;
/// request.extensions_mut().insert(peer);
/// let key = PeerIp::new().extract(&RequestHead::new(&request))?;
/// assert_eq!(key, LimitKey::Ip("2001:db8:1:2::".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With axum, serve with `into_make_service_with_connect_info::<SocketAddr>()` and register
/// its `ConnectInfo`:
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use tollgate::middleware::PeerIp;
///
/// let peer_ip = PeerIp::new().connect_info(|info: &ConnectInfo<SocketAddr>| info.0.ip());
/// ```
#[derive(Clone, Debug)]
pub struct PeerIp {
    peer: Peer,
}

impl PeerIp {
    /// Keys by the peer address: IPv4 whole, IPv6 masked to /64.
    ///
    /// # Examples
    ///
    /// ```
    /// let extractor = tollgate::middleware::PeerIp::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        PeerIp { peer: Peer::new() }
    }

    /// Masks IPv6 addresses to their first `prefix` bits (default 64; 128 keeps them whole).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix above 128.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::PeerIp;
    ///
    /// let per_site = PeerIp::new().ipv6_prefix(48)?;
    /// assert!(PeerIp::new().ipv6_prefix(129).is_err());
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.peer.set_v6_prefix(prefix)?;
        Ok(self)
    }

    /// Masks IPv4 addresses to their first `prefix` bits (default 32: the whole address).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix above 32.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::PeerIp;
    ///
    /// let per_network = PeerIp::new().ipv4_prefix(24)?;
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn ipv4_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.peer.set_v4_prefix(prefix)?;
        Ok(self)
    }

    /// Also looks for the peer address in an extension of type `T`, with `address` reading
    /// it (returning an `IpAddr`, or an `Option<IpAddr>` for types whose address may be
    /// unknown, such as tonic's `TcpConnectInfo`): how a server's own connection-info type is
    /// supported without this crate depending on the server. Registered types are tried
    /// before `SocketAddr` and `IpAddr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use http::Request;
    /// use tollgate::middleware::{KeyExtractor, LimitKey, PeerIp, RequestHead};
    ///
    /// #[derive(Clone)]
    /// struct Conn { remote: SocketAddr }
    ///
    /// let extractor = PeerIp::new().connect_info(|conn: &Conn| conn.remote.ip());
    /// let mut request = Request::new(());
    /// request.extensions_mut().insert(Conn { remote: "192.0.2.7:9000".parse()? });
    /// assert_eq!(
    ///     extractor.extract(&RequestHead::new(&request))?,
    ///     LimitKey::Ip("192.0.2.7".parse()?)
    /// );
    ///
    /// // A type whose address may be unknown (like tonic's `TcpConnectInfo`): return an Option.
    /// #[derive(Clone)]
    /// struct MaybeConn(Option<SocketAddr>);
    /// let extractor = PeerIp::new().connect_info(|conn: &MaybeConn| conn.0.map(|a| a.ip()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn connect_info<T, A>(mut self, address: impl Fn(&T) -> A + Send + Sync + 'static) -> Self
    where
        T: Any + Send + Sync,
        A: Into<Option<IpAddr>>,
    {
        self.peer.add_lookup(address);
        self
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, head: &RequestHead<'_>) -> Result<LimitKey, KeyError> {
        let ip = self
            .peer
            .address(head.extensions())
            .ok_or(KeyError::NoPeerAddress)?;
        Ok(LimitKey::Ip(self.peer.mask(ip)))
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
