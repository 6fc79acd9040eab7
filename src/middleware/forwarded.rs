//! [`ClientIp`]: the client's address behind trusted reverse proxies, read from
//! `X-Forwarded-For` or `Forwarded` **from the right**.
//!
//! Each proxy appends the address it received the request from, so the chain reads
//! `client, proxy1, proxy2` and the server's peer is the last proxy. Everything left of the
//! entry written by the outermost trusted proxy was written by the client and can say
//! anything; the leftmost entry in particular is whatever the client chose.

use std::any::Any;
use std::net::{IpAddr, SocketAddr};

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName};

use super::error::{ConfigError, KeyError};
use super::key::{trim, KeyExtractor, LimitKey, RequestHead};
use super::peer::Peer;
use crate::ip::{mask128, mask32, network, translated_v4, TRANSLATIONS};

/// `X-Forwarded-For`, which `http` has no constant for.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// An IP network: the address with the bits past the prefix cleared, and the prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(text: &str) -> Option<Cidr> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix.parse::<u8>().ok()?)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().ok()?;
        // A mapped IPv4 address written in IPv6 form is IPv4: its prefix counts from the
        // IPv4 part (::ffff:10.0.0.0/104 is 10.0.0.0/8).
        let (address, prefix) = match (address, address.to_canonical()) {
            (IpAddr::V6(_), IpAddr::V4(v4)) => (IpAddr::V4(v4), prefix.map(|p| p.checked_sub(96))),
            _ => (address, prefix.map(Some)),
        };
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(Some(prefix)) if prefix <= max => prefix,
            Some(_) => return None,
        };
        Some(Cidr {
            network: network(address, prefix),
            prefix,
        })
    }

    /// Whether the network holds every address, or every IPv4 address as the IPv6
    /// translations trusted for IPv4 proxies (`ip::translated_v4`: IPv4-mapped and NAT64)
    /// carry them: a network that would trust every client, or every IPv4 client reached
    /// through a translator.
    fn holds_every_client(&self) -> bool {
        self.prefix == 0
            || (self.network.is_ipv6()
                && self.prefix <= 96
                && TRANSLATIONS
                    .into_iter()
                    .any(|start| self.contains(IpAddr::V6(start))))
    }

    /// Whether `ip` lies in the network; an IPv4 network holds the IPv6 translations of
    /// its addresses too (IPv4-mapped, NAT64: `ip::translated_v4`), as a proxy reached
    /// through them is that IPv4 host.
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), ip) => {
                let ip = match ip {
                    IpAddr::V4(v4) => Some(v4),
                    IpAddr::V6(v6) => translated_v4(v6),
                };
                ip.is_some_and(|ip| u32::from(ip) & mask32(self.prefix) == u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

/// Which proxies are trusted.
#[derive(Clone, Debug)]
enum Trust {
    /// This many proxies stand in front of the server, each appending one entry.
    Hops(usize),
    /// Proxies whose addresses lie in these networks.
    Networks(Vec<Cidr>),
}

/// The key is the client's address as reported by trusted reverse proxies, masked like
/// [`PeerIp`](super::PeerIp)'s (IPv6 to /64 by default).
///
/// Two ways to say which proxies to trust, both reading the chain from the right:
///
/// * [`trusted_hops(n)`](ClientIp::trusted_hops): exactly `n` proxies stand in front of the
///   server (a load balancer, then a CDN...). The client is the `n`-th entry from the right
///   of `X-Forwarded-For`. A request with fewer entries did not pass through them all:
///   [`KeyError::ShortChain`]. `trusted_hops(0)` is the peer address itself.
/// * [`trusted_proxies(cidrs)`](ClientIp::trusted_proxies): any peer or entry inside these
///   networks is a trusted proxy. If the peer is not trusted, the header is ignored (the
///   client wrote it) and the peer is the key. Otherwise entries are skipped from the right
///   while they are trusted; the first untrusted one is the client. This needs the peer
///   address, found as [`PeerIp`](super::PeerIp) finds it.
///
/// The leftmost entry is never taken on trust: a client can put anything there, and
/// proxies append to what it sent. Only the entries the walk reaches are read, so what a
/// client wrote to their left (for `Forwarded`, an unterminated quote or a comma in a
/// quoted string, even on the line a proxy appended to) cannot hide or shift them. An entry
/// the walk has to use that is not an IP address (`unknown`, a hostname, garbage, broken
/// syntax) is [`KeyError::Malformed`].
///
/// Reads `X-Forwarded-For` by default, or RFC 7239 `Forwarded` (its `for=` parameters) with
/// [`forwarded`](ClientIp::forwarded). Read only the one your proxies write: the other is
/// entirely under the client's control. Entries may carry ports (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`); repeated header lines are read as one list, in order.
///
/// # Examples
///
/// One proxy in front; the client tried to spoof the leftmost entry:
///
/// ```
/// use http::Request;
/// use tollgate::middleware::{ClientIp, KeyExtractor, LimitKey, RequestHead};
///
/// let behind_one = ClientIp::trusted_hops(1);
/// let request = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9")
///     .body(())?;
/// let key = behind_one.extract(&RequestHead::new(&request))?;
/// assert_eq!(key, LimitKey::Ip("203.0.113.9".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Proxies identified by network:
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate::middleware::{ClientIp, KeyExtractor, LimitKey, RequestHead};
///
/// let extractor = ClientIp::trusted_proxies(["10.0.0.0/8", "fd00::/8"])?;
/// let mut request = Request::get("/")
///     .header("forwarded", "for=6.6.6.6, for=198.51.100.4;proto=https, for=10.1.1.1")
///     .body(())?;
/// request.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>()?);
/// let key = extractor.forwarded().extract(&RequestHead::new(&request))?;
/// assert_eq!(key, LimitKey::Ip("198.51.100.4".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trust: Trust,
    header: HeaderName,
    peer: Peer,
}

impl ClientIp {
    /// Trusts exactly `hops` reverse proxies in front of the server: the client is the
    /// `hops`-th entry from the right (0: the peer address itself).
    ///
    /// # Examples
    ///
    /// ```
    /// let behind_load_balancer = tollgate::middleware::ClientIp::trusted_hops(1);
    /// ```
    #[must_use]
    pub fn trusted_hops(hops: usize) -> Self {
        ClientIp {
            trust: Trust::Hops(hops),
            header: X_FORWARDED_FOR,
            peer: Peer::new(),
        }
    }

    /// Trusts proxies whose addresses lie in `cidrs` (`"10.0.0.0/8"`, `"2001:db8::/32"`, or a
    /// single address).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCidr`] for an entry that is not an address or CIDR block, and
    /// [`ConfigError::TrustsEveryAddress`] for a network of prefix 0, which would make every
    /// client a trusted proxy, or an IPv6 network holding a whole translation prefix (the
    /// NAT64 `64:ff9b::/96`), which would make every IPv4 client reached through it one.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::ClientIp;
    ///
    /// let extractor = ClientIp::trusted_proxies(["10.0.0.0/8", "192.0.2.10"])?;
    /// assert!(ClientIp::trusted_proxies(["10.0.0.0/8", "ten"]).is_err());
    /// assert!(ClientIp::trusted_proxies(["0.0.0.0/0"]).is_err()); // would trust every client
    /// assert!(ClientIp::trusted_proxies(["64:ff9b::/96"]).is_err()); // every IPv4 one, by NAT64
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn trusted_proxies<I>(cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let networks = cidrs
            .into_iter()
            .map(|cidr| {
                let text = || cidr.as_ref().to_owned();
                match Cidr::parse(cidr.as_ref()) {
                    None => Err(ConfigError::InvalidCidr { cidr: text() }),
                    Some(network) if network.holds_every_client() => {
                        Err(ConfigError::TrustsEveryAddress { cidr: text() })
                    }
                    Some(network) => Ok(network),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClientIp {
            trust: Trust::Networks(networks),
            header: X_FORWARDED_FOR,
            peer: Peer::new(),
        })
    }

    /// Reads the RFC 7239 `Forwarded` header (its `for=` parameters) instead of
    /// `X-Forwarded-For`.
    ///
    /// # Examples
    ///
    /// ```
    /// let extractor = tollgate::middleware::ClientIp::trusted_hops(1).forwarded();
    /// ```
    #[must_use]
    pub fn forwarded(mut self) -> Self {
        self.header = FORWARDED;
        self
    }

    /// Masks IPv6 client addresses to their first `prefix` bits (default 64).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix above 128.
    ///
    /// # Examples
    ///
    /// ```
    /// let extractor = tollgate::middleware::ClientIp::trusted_hops(1).ipv6_prefix(56)?;
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.peer.set_v6_prefix(prefix)?;
        Ok(self)
    }

    /// Masks IPv4 client addresses to their first `prefix` bits (default 32).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix above 32.
    ///
    /// # Examples
    ///
    /// ```
    /// let extractor = tollgate::middleware::ClientIp::trusted_hops(1).ipv4_prefix(24)?;
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn ipv4_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.peer.set_v4_prefix(prefix)?;
        Ok(self)
    }

    /// Also looks for the peer address in an extension of type `T` (see
    /// [`PeerIp::connect_info`](super::PeerIp::connect_info)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tollgate::middleware::ClientIp;
    ///
    /// #[derive(Clone)]
    /// struct Conn { remote: SocketAddr }
    ///
    /// let extractor = ClientIp::trusted_proxies(["10.0.0.0/8"])?
    ///     .connect_info(|conn: &Conn| conn.remote.ip());
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
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

    /// The client's address, unmasked.
    fn client(&self, head: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let headers = head.headers();
        match &self.trust {
            Trust::Hops(0) => self
                .peer
                .address(head.extensions())
                .ok_or(KeyError::NoPeerAddress),
            &Trust::Hops(hops) => {
                let mut found = 0;
                let mut nth = None;
                self.for_each_from_right(headers, |entry| {
                    found += 1;
                    if found == hops {
                        nth = Some(entry.and_then(parse_node));
                        false
                    } else {
                        true
                    }
                })?;
                match nth {
                    Some(ip) => ip.ok_or_else(|| KeyError::Malformed(self.header.clone())),
                    None => Err(KeyError::ShortChain {
                        header: self.header.clone(),
                        needed: hops,
                        found,
                    }),
                }
            }
            Trust::Networks(networks) => {
                let trusted = |ip: IpAddr| networks.iter().any(|net| net.contains(ip));
                let mut client = self
                    .peer
                    .address(head.extensions())
                    .ok_or(KeyError::NoPeerAddress)?;
                if !trusted(client) {
                    return Ok(client);
                }
                let mut malformed = false;
                self.for_each_from_right(headers, |entry| {
                    // This entry was written by a trusted proxy (the one at `client`).
                    match entry.and_then(parse_node) {
                        Some(ip) => {
                            client = ip;
                            trusted(ip)
                        }
                        None => {
                            malformed = true;
                            false
                        }
                    }
                })?;
                if malformed {
                    return Err(KeyError::Malformed(self.header.clone()));
                }
                // Either the first untrusted entry, or every hop is trusted and the
                // leftmost one (itself a trusted address) is the client.
                Ok(client)
            }
        }
    }

    /// Calls `visit` with each entry of the forwarding header from the right (`None` for a
    /// `Forwarded` element without `for=`) until it returns `false`.
    fn for_each_from_right(
        &self,
        headers: &HeaderMap,
        mut visit: impl FnMut(Option<&[u8]>) -> bool,
    ) -> Result<(), KeyError> {
        let lines = headers.get_all(&self.header).iter().rev();
        if self.header == FORWARDED {
            for line in lines {
                for element in ElementsFromRight::new(line.as_bytes()) {
                    match forwarded_element(element) {
                        None => return Err(KeyError::Malformed(self.header.clone())),
                        Some(Element::Empty) => {}
                        Some(Element::For(node)) => {
                            if !visit(node) {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        } else {
            for line in lines {
                for entry in line.as_bytes().rsplit(|&b| b == b',') {
                    let entry = trim(entry);
                    if entry.is_empty() {
                        continue; // an empty list member, as in "a,,b"
                    }
                    if !visit(Some(entry)) {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, head: &RequestHead<'_>) -> Result<LimitKey, KeyError> {
        let ip = self.client(head)?;
        Ok(LimitKey::Ip(self.peer.mask(ip)))
    }
}

/// An address from a forwarding entry: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`. `None` for anything else (`unknown`, `_hidden`,
/// hostnames).
fn parse_node(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = text.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
}

/// The elements of one `Forwarded` line (RFC 7239 section 4), from the right, each split
/// off at the nearest comma outside a quoted string. Quotes are found scanning leftwards (a
/// quote after an odd number of backslashes is escaped), so the elements that proxies
/// appended on the right come out whole whatever the client wrote to their left: an
/// unterminated quote or a stray comma there cannot swallow or shift them. Only as many
/// elements are split as the caller reads; what lies further left is never looked at.
struct ElementsFromRight<'a> {
    line: &'a [u8],
    /// The end of what is left to split; `None` once the line's start was reached.
    end: Option<usize>,
}

impl<'a> ElementsFromRight<'a> {
    fn new(line: &'a [u8]) -> Self {
        ElementsFromRight {
            line,
            end: Some(line.len()),
        }
    }
}

impl<'a> Iterator for ElementsFromRight<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let end = self.end?;
        let mut quoted = false;
        for i in (0..end).rev() {
            match self.line[i] {
                b'"' if quoted => {
                    let escapes = self.line[..i]
                        .iter()
                        .rev()
                        .take_while(|&&b| b == b'\\')
                        .count();
                    quoted = escapes % 2 == 1;
                }
                b'"' => quoted = true,
                b',' if !quoted => {
                    self.end = Some(i);
                    return Some(&self.line[i + 1..end]);
                }
                _ => {}
            }
        }
        // The leftmost element (or, inside an unterminated quote, all that is left: it
        // does not parse).
        self.end = None;
        Some(&self.line[..end])
    }
}

/// One element of a `Forwarded` line, as [`forwarded_element`] reads it.
#[derive(Debug, PartialEq, Eq)]
enum Element<'a> {
    /// Nothing but whitespace: allowed by the list syntax, ignored.
    Empty,
    /// Pairs, with the value of `for` if one of them is `for`.
    For(Option<&'a [u8]>),
}

/// Reads one element of a `Forwarded` line: pairs `name=value` (a token, or a quoted
/// string) separated by `;`. `None` when it is not valid syntax: an unterminated quoted
/// string, a pair without `=`, a repeated `for`, anything after a value.
fn forwarded_element(element: &[u8]) -> Option<Element<'_>> {
    let is_ws = |b: u8| b == b' ' || b == b'\t';
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let n = element.len();
    let mut i = 0;
    let mut value_for: Option<&[u8]> = None;
    let mut empty = true;
    loop {
        while i < n && is_ws(element[i]) {
            i += 1;
        }
        if i < n && element[i] != b';' {
            let start = i;
            while i < n && is_tchar(element[i]) {
                i += 1;
            }
            let name = &element[start..i];
            if name.is_empty() || i == n || element[i] != b'=' {
                return None;
            }
            i += 1;
            let value = if i < n && element[i] == b'"' {
                i += 1;
                let start = i;
                loop {
                    match element.get(i)? {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
                let value = element.get(start..i)?;
                i += 1;
                value
            } else {
                let start = i;
                while i < n && is_tchar(element[i]) {
                    i += 1;
                }
                &element[start..i]
            };
            if name.eq_ignore_ascii_case(b"for") {
                if value_for.is_some() {
                    return None;
                }
                value_for = Some(value);
            }
            empty = false;
            while i < n && is_ws(element[i]) {
                i += 1;
            }
        }
        match element.get(i) {
            // An empty pair (`;;`) is allowed, as an empty element is.
            Some(b';') => i += 1,
            None if empty => return Some(Element::Empty),
            None => return Some(Element::For(value_for)),
            Some(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element's `for` value of `line`, left to right; `None` if one does not parse.
    fn fors(line: &str) -> Option<Vec<Option<String>>> {
        let mut out = Vec::new();
        for element in ElementsFromRight::new(line.as_bytes()) {
            if let Element::For(value) = forwarded_element(element)? {
                out.push(value.map(|v| String::from_utf8(v.to_vec()).unwrap()));
            }
        }
        out.reverse();
        Some(out)
    }

    #[test]
    fn forwarded_syntax() {
        assert_eq!(
            fors(r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711""#),
            Some(vec![
                Some("192.0.2.60".into()),
                Some("[2001:db8:cafe::17]:4711".into())
            ])
        );
        assert_eq!(
            fors("proto=https, for=1.2.3.4"),
            Some(vec![None, Some("1.2.3.4".into())])
        );
        assert_eq!(fors(" , for=1.2.3.4 ,"), Some(vec![Some("1.2.3.4".into())]));
        // A comma hidden in quotes does not split the element.
        assert_eq!(
            fors(r#"for="1.2.3.4, for=5.6.7.8", for=9.9.9.9"#),
            Some(vec![
                Some("1.2.3.4, for=5.6.7.8".into()),
                Some("9.9.9.9".into())
            ])
        );
        assert_eq!(fors(r#"for="1.2.3.4, for=9.9.9.9"#), None); // unterminated
        assert_eq!(fors("for=1.2.3.4;for=5.6.7.8"), None); // repeated for
        assert_eq!(fors("for"), None);
        assert_eq!(fors("for=1.2.3.4 x"), None);
        assert_eq!(fors(r#"for="a\"b""#), Some(vec![Some(r#"a\"b"#.into())]));
        assert_eq!(fors(r#"for="a\"#), None);
    }

    /// A proxy that appends its element to the client's line (nginx's
    /// `"$http_forwarded, for=$remote_addr"`): what the client wrote to its left, an
    /// unterminated quote or a stray comma, does not swallow or shift it.
    #[test]
    fn the_proxy_s_element_is_read_whatever_the_client_wrote_to_its_left() {
        let key = |hops: usize, line: &str| {
            let request = http::Request::get("/")
                .header(FORWARDED, line)
                .body(())
                .unwrap();
            ClientIp::trusted_hops(hops)
                .forwarded()
                .extract(&RequestHead::new(&request))
        };
        let client = Ok(LimitKey::Ip("203.0.113.7".parse().unwrap()));
        for line in [
            r#"for="x, for=203.0.113.7"#,
            r#"for=6.6.6.6, x=", for=203.0.113.7"#,
            r#"for="\", for=203.0.113.7"#,
            r#"for=6.6.6.6;for=6.6.6.7, for=203.0.113.7"#,
            r#"for=203.0.113.7"#,
        ] {
            assert_eq!(key(1, line), client, "{line}");
        }
        // The proxy's own quoted element, with an escaped quote before it.
        assert_eq!(key(1, r#"for="a\"b", for="203.0.113.7:4711""#), client);
        // Trusting two proxies makes the client's own element the one read: garbage there
        // is malformed, as an entry that is not an address is.
        assert_eq!(
            key(2, r#"for="x, for=203.0.113.7"#),
            Err(KeyError::Malformed(FORWARDED))
        );
    }

    #[test]
    fn nodes() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(parse_node(b"192.0.2.1"), ip("192.0.2.1"));
        assert_eq!(parse_node(b"192.0.2.1:80"), ip("192.0.2.1"));
        assert_eq!(parse_node(b"2001:db8::1"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]:80"), ip("2001:db8::1"));
        assert_eq!(parse_node(b"unknown"), None);
        assert_eq!(parse_node(b"_hidden"), None);
        assert_eq!(parse_node(b"\xff"), None);
    }

    /// Networks that would trust every client, or every IPv4 client reached through a
    /// translator, are refused; a network inside a translation prefix, or beside one, is not.
    #[test]
    fn networks_that_trust_every_client_are_refused() {
        for every in [
            "0.0.0.0/0",
            "::/0",
            "::ffff:0.0.0.0/96",
            "64:ff9b::/96",
            "64::/16",
            "::/1",
        ] {
            assert!(
                matches!(
                    ClientIp::trusted_proxies([every]),
                    Err(ConfigError::TrustsEveryAddress { .. })
                ),
                "{every}"
            );
        }
        for some in [
            "64:ff9b::/97",
            "64:ff9b::10.0.0.0/104",
            "2001:db8::/32",
            "10.0.0.0/8",
        ] {
            assert!(ClientIp::trusted_proxies([some]).is_ok(), "{some}");
        }
    }

    #[test]
    fn cidrs() {
        let c = |s: &str| Cidr::parse(s).unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.200.1.1")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(c("10.1.2.3/8").contains(ip("10.0.0.1"))); // host bits ignored
        assert!(c("10.0.0.0/8").contains(ip("::ffff:10.9.9.9")));
        // A proxy reached through NAT64 is that IPv4 host; the key-only forms are not.
        assert!(c("192.0.2.10").contains(ip("64:ff9b::192.0.2.10")));
        assert!(!c("192.0.2.10").contains(ip("2002:c000:20a::1")));
        assert!(!c("192.0.2.10").contains(ip("::192.0.2.10")));
        assert!(c("::ffff:10.0.0.0/104").contains(ip("10.9.9.9")));
        assert!(c("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(!c("2001:db8::/32").contains(ip("10.0.0.1")));
        assert!(c("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(c("192.0.2.1").contains(ip("192.0.2.1")));
        assert!(!c("192.0.2.1").contains(ip("192.0.2.2")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "ten",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "::ffff:1.2.3.4/95",
        ] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }
}
