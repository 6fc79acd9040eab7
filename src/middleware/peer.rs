//! The connection's address as a key: [`PeerIp`], and the lookup of the peer address in a
//! request's extensions that [`ClientIp`](super::ClientIp) shares.

use std::any::Any;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Extensions;

use super::error::{ConfigError, KeyError};
use super::key::{KeyExtractor, LimitKey, RequestHead};
use crate::ip::{mask, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX};

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

    /// The connection's address, unmasked: from a registered lookup, else axum's
    /// `ConnectInfo<SocketAddr>` (feature `axum`), else a `SocketAddr` or an `IpAddr`.
    pub(crate) fn address(&self, extensions: &Extensions) -> Option<IpAddr> {
        self.lookups
            .iter()
            .find_map(|lookup| lookup(extensions))
            .or_else(|| axum_connect_info(extensions))
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

/// The address axum's `into_make_service_with_connect_info::<SocketAddr>()` puts in every
/// request.
#[cfg(feature = "axum")]
fn axum_connect_info(extensions: &Extensions) -> Option<IpAddr> {
    use axum::extract::ConnectInfo;

    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip())
}

#[cfg(not(feature = "axum"))]
fn axum_connect_info(_: &Extensions) -> Option<IpAddr> {
    None
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
/// 2^64 budgets. IPv4 addresses are kept whole (`/32`) by default. An IPv6 address that
/// carries an IPv4 client counts as that IPv4 address: IPv4-mapped (what a dual-stack socket
/// reports), the NAT64 well-known prefix `64:ff9b::/96` (an IPv6-only server behind a
/// translator), IPv4-compatible, 6to4 (`2002::/16`) and Teredo (`2001::/32`). An operator's
/// own NAT64 prefix cannot be told from native IPv6 and is masked as IPv6: key such a
/// deployment with [`ipv6_prefix(128)`](PeerIp::ipv6_prefix), or by the translator's logs.
///
/// The address comes from the request's extensions, looked up in this order:
///
/// 1. a type registered with [`connect_info`](PeerIp::connect_info) (a server's own
///    connection-info type, such as tonic's `TcpConnectInfo`);
/// 2. with feature `axum`, axum's `ConnectInfo<SocketAddr>`, which
///    `into_make_service_with_connect_info::<SocketAddr>()` puts in every request: axum
///    users need no closure;
/// 3. a plain `SocketAddr` (what a hand-written hyper server inserts, and what
///    tower_governor reads after axum's type), then an `IpAddr`.
///
/// axum's type is read behind a feature rather than by default because naming it needs the
/// `axum` crate, which a hyper or tonic server has no use for; a plain `SocketAddr` needs
/// nothing.
///
/// A request without a peer address is the server's mistake, not the client's (with axum:
/// serving without `into_make_service_with_connect_info`): every layer answers it
/// `500 Internal Server Error`, whatever [`MissingKey`](super::MissingKey) says, and logs
/// the cause once per layer through the `log` facade ([`KeyError::NoPeerAddress`]).
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
/// With axum (feature `axum`), serve with `into_make_service_with_connect_info::<SocketAddr>()`
/// and nothing else:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use http::Request;
/// use tollgate::middleware::{KeyExtractor, LimitKey, PeerIp, RequestHead};
///
/// let mut request = Request::new(());
/// let peer: SocketAddr = "192.0.2.7:9000".parse().unwrap();
/// request.extensions_mut().insert(ConnectInfo(peer));
/// let key = PeerIp::new().extract(&RequestHead::new(&request));
/// assert_eq!(key, Ok(LimitKey::Ip(peer.ip())));
/// # }
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
    /// before axum's `ConnectInfo`, `SocketAddr` and `IpAddr`.
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
