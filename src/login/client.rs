//! Who makes a login attempt: [`LoginClient`], an IP address (masked to the network one
//! subscriber holds) or a device token, and the keys the guard files it under.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::ip::{mask, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX};

/// The client of a login attempt, as the [`LoginGuard`](crate::login::LoginGuard)'s methods take it:
/// an IP address, a device token, or both.
///
/// Every method of the guard takes `impl Into<LoginClient>`, so pass whichever you have:
///
/// | you pass | the guard files it under |
/// |---|---|
/// | an [`IpAddr`], [`Ipv4Addr`] or [`Ipv6Addr`] | the address, IPv6 masked to its /64 and IPv4-mapped IPv6 as IPv4 |
/// | a string that parses as an IP address (`"203.0.113.7"`, `"2001:db8::1"`) | the same, so a string and a parsed address agree |
/// | any other string | the string itself: a device token |
/// | a `(token, address)` pair | known clients by the token, the client limit by the address |
///
/// Why /64: an IPv6 subscriber is routinely given a whole /64, so without the mask one
/// household could spread its guesses over 2^64 addresses, each with a fresh budget.
///
/// A device token should be a value your server issued (a random id in a signed cookie, set
/// after a successful login), so that nobody else can present it. Tokens make the best
/// *known clients* (see [`LoginGuard::record_success`](crate::login::LoginGuard::record_success)):
/// an address can be shared (an office, a carrier's NAT) and then makes everyone behind it
/// known. But the client limit (failures over all accounts) counts per what you pass, and
/// anyone can collect fresh tokens by logging into an account of their own: so pass the
/// **pair** `(token, address)` when you have a token. Known clients are then recognised by the
/// token, and the client limit counts per address. Without a token, pass the address (never
/// an empty string: every caller passing `""` would share one budget).
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::login::LoginClient;
///
/// let a: IpAddr = "2001:db8:1:2:aaaa::1".parse()?;
/// let b: IpAddr = "2001:db8:1:2:bbbb::9".parse()?;
/// assert_eq!(LoginClient::from(a), LoginClient::from(b)); // one /64, one client
/// assert_eq!(LoginClient::from("::ffff:192.0.2.7"), LoginClient::from("192.0.2.7"));
/// assert!(matches!(LoginClient::from("device-5f1c"), LoginClient::Token("device-5f1c")));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginClient<'a> {
    /// An address. The guard masks it (IPv6 to its /64; IPv4-mapped IPv6 as IPv4), whether
    /// this variant was built directly or by a `From`.
    Ip(IpAddr),
    /// A device token (or any other client id that is not an address).
    Token(&'a str),
    /// A device token and the address it came from (masked as for `Ip`).
    Device {
        /// Recognises the client as known for an account.
        token: &'a str,
        /// What the client limit counts per (masked by the guard as for `Ip`).
        ip: IpAddr,
    },
}

impl<'a> LoginClient<'a> {
    /// The key the client limit counts this client under.
    pub(crate) fn limit_key(&self) -> Cow<'a, str> {
        match self {
            LoginClient::Ip(ip) | LoginClient::Device { ip, .. } => Cow::Owned(masked(*ip)),
            LoginClient::Token(token) => Cow::Borrowed(*token),
        }
    }

    /// The key an account knows this client by.
    pub(crate) fn known_key(&self) -> Cow<'a, str> {
        match self {
            LoginClient::Ip(ip) => Cow::Owned(masked(*ip)),
            LoginClient::Token(token) | LoginClient::Device { token, .. } => Cow::Borrowed(*token),
        }
    }
}

/// `ip` masked as a client (the mask is idempotent: a variant built by `From` is masked
/// already, one built directly is masked here).
fn masked(ip: IpAddr) -> String {
    mask(ip, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX).to_string()
}

impl From<SocketAddr> for LoginClient<'_> {
    fn from(peer: SocketAddr) -> Self {
        peer.ip().into()
    }
}

impl From<IpAddr> for LoginClient<'_> {
    fn from(ip: IpAddr) -> Self {
        LoginClient::Ip(mask(ip, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX))
    }
}

impl From<Ipv4Addr> for LoginClient<'_> {
    fn from(ip: Ipv4Addr) -> Self {
        IpAddr::V4(ip).into()
    }
}

impl From<Ipv6Addr> for LoginClient<'_> {
    fn from(ip: Ipv6Addr) -> Self {
        IpAddr::V6(ip).into()
    }
}

impl<'a> From<&'a str> for LoginClient<'a> {
    fn from(client: &'a str) -> Self {
        // A socket address (`peer.to_string()`) is its address: as a token, each source
        // port would have a budget of its own.
        if let Ok(ip) = client.parse::<IpAddr>() {
            ip.into()
        } else if let Ok(peer) = client.parse::<SocketAddr>() {
            peer.into()
        } else {
            LoginClient::Token(client)
        }
    }
}

impl<'a> From<&'a String> for LoginClient<'a> {
    fn from(client: &'a String) -> Self {
        client.as_str().into()
    }
}

impl<'a> From<(&'a str, IpAddr)> for LoginClient<'a> {
    fn from((token, ip): (&'a str, IpAddr)) -> Self {
        LoginClient::Device {
            token,
            ip: mask(ip, DEFAULT_V4_PREFIX, DEFAULT_V6_PREFIX),
        }
    }
}

impl fmt::Display for LoginClient<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginClient::Device { token, ip } => write!(f, "{token} at {ip}"),
            _ => f.write_str(&self.limit_key()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_masked_and_strings_that_are_addresses_agree() {
        let key = |c: LoginClient<'_>| c.limit_key().into_owned();
        assert_eq!(key("2001:db8:1:2:3:4:5:6".into()), "2001:db8:1:2::");
        assert_eq!(key("203.0.113.7".into()), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7".into()), "203.0.113.7");
        assert_eq!(key("2001:db8::/64".into()), "2001:db8::/64");
        assert_eq!(key("token".into()), "token");
        let device = LoginClient::from(("token", "2001:db8::5".parse::<IpAddr>().unwrap()));
        assert_eq!(device.limit_key(), "2001:db8::");
        assert_eq!(device.known_key(), "token");
        assert_eq!(device.to_string(), "token at 2001:db8::");
    }
}
