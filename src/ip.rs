//! IP addresses as rate-limit keys: masking to a network prefix, so that one subscriber's
//! block of addresses (an IPv6 /64 is routinely one household) counts as one client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The prefixes a client address is masked to by default: IPv4 whole, IPv6 to its /64.
pub(crate) const DEFAULT_V4_PREFIX: u8 = 32;
/// See [`DEFAULT_V4_PREFIX`].
pub(crate) const DEFAULT_V6_PREFIX: u8 = 64;

/// `ip` with every bit past the prefix cleared. An IPv6 address that carries an IPv4 client's
/// address is first turned back into that IPv4 address ([`embedded_v4`]), so that a /64
/// mask neither lumps every IPv4 client behind a translator into one key nor gives one IPv4
/// host thousands of keys.
pub(crate) fn mask(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => network(IpAddr::V4(v4), v4_prefix),
            None => network(ip, v6_prefix),
        },
        IpAddr::V4(_) => network(ip, v4_prefix),
    }
}

/// `ip` with every bit past `prefix` cleared (at most 32 for IPv4, 128 for IPv6), as it is
/// written: the network of a CIDR.
pub(crate) fn network(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
    }
}

/// The IPv4 client an IPv6 address stands for, where its form says so:
/// - IPv4-mapped, `::ffff:a.b.c.d`: what a dual-stack socket reports for an IPv4 client;
/// - the NAT64 well-known prefix, `64:ff9b::a.b.c.d` (RFC 6052): what an IPv6-only server
///   behind a stateless translator sees for every IPv4 client;
/// - IPv4-compatible, `::a.b.c.d` (deprecated; not `::` or `::1`);
/// - 6to4, `2002:aabb:ccdd::/48` (RFC 3056): the /48 of the IPv4 host `aa.bb.cc.dd`, from
///   which it can use 65,536 /64s;
/// - Teredo, `2001:0::/32` (RFC 4380): the client's public IPv4 address, stored inverted
///   in the last 32 bits (the /64 names only the Teredo server, shared by all its clients).
///
/// A network-specific NAT64 prefix (an operator's own, RFC 6052 section 2.2) cannot be told
/// from native IPv6 and is masked as IPv6.
pub(crate) fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = translated_v4(v6) {
        return Some(v4);
    }
    let bits = u128::from(v6);
    let low = bits as u32;
    let v4 = match (bits >> 96) as u32 {
        // IPv4-compatible.
        0 if bits >> 32 == 0 && low > 1 => low,
        0x2001_0000 => !low,
        top if top >> 16 == 0x2002 => (bits >> 80) as u32,
        _ => return None,
    };
    Some(Ipv4Addr::from(v4))
}

/// The IPv4 host an IPv6 address is a translation of: IPv4-mapped (a dual-stack socket's
/// view of an IPv4 peer) or the NAT64 well-known prefix (a translator's). The connection
/// then really comes from that host, so a trusted IPv4 proxy reached so is trusted; the
/// other forms of [`embedded_v4`] name a client for a key, not a peer to trust.
pub(crate) fn translated_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    TRANSLATIONS
        .contains(&Ipv6Addr::from(bits >> 32 << 32))
        .then(|| Ipv4Addr::from(bits as u32))
}

/// The /96 prefixes [`translated_v4`] reads an IPv4 host from, each as its first address:
/// IPv4-mapped (`::ffff:0:0/96`) and the NAT64 well-known prefix (`64:ff9b::/96`).
pub(crate) const TRANSLATIONS: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
    Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
];

/// The netmask of a prefix length at most 32.
pub(crate) fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The netmask of a prefix length at most 128.
pub(crate) fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn masks() {
        assert_eq!(mask(ip("2001:db8::1"), 32, 64), ip("2001:db8::"));
        assert_eq!(
            mask(ip("2001:db8:a:b:c:d:e:f"), 32, 128),
            ip("2001:db8:a:b:c:d:e:f")
        );
        assert_eq!(mask(ip("2001:db8:a:b:c:d:e:f"), 32, 0), ip("::"));
        assert_eq!(mask(ip("192.0.2.77"), 24, 64), ip("192.0.2.0"));
        assert_eq!(mask(ip("192.0.2.77"), 0, 64), ip("0.0.0.0"));
        // IPv4-mapped IPv6 is IPv4.
        assert_eq!(mask(ip("::ffff:192.0.2.77"), 32, 64), ip("192.0.2.77"));
    }

    #[test]
    fn ipv4_clients_inside_ipv6_are_ipv4() {
        for (v6, v4) in [
            ("::ffff:192.0.2.77", "192.0.2.77"),
            ("64:ff9b::192.0.2.77", "192.0.2.77"),
            ("64:ff9b::198.51.100.7", "198.51.100.7"),
            ("::192.0.2.77", "192.0.2.77"),
            ("::0.0.0.2", "0.0.0.2"),
            // 6to4: any of the host's subnets and interfaces.
            ("2002:c000:24d::", "192.0.2.77"),
            ("2002:c000:24d:1::5", "192.0.2.77"),
            ("2002:c000:24d:ffff:1:2:3:4", "192.0.2.77"),
            // Teredo: server 65.54.227.120, client 192.0.2.77 (inverted: 3fff:fdb2).
            ("2001:0:4136:e378:8000:63bf:3fff:fdb2", "192.0.2.77"),
            ("2001:0:4136:e378:8000:1234:3fff:fdb2", "192.0.2.77"),
        ] {
            assert_eq!(mask(ip(v6), 32, 64), ip(v4), "{v6}");
            assert_eq!(mask(ip(v6), 24, 128), mask(ip(v4), 24, 128), "{v6}");
        }
        // Two clients behind one translator are two keys.
        assert_ne!(
            mask(ip("64:ff9b::192.0.2.1"), 32, 64),
            mask(ip("64:ff9b::198.51.100.7"), 32, 64)
        );
        // Not IPv4: the unspecified and loopback addresses, native IPv6, a NAT64 prefix with
        // bits set past /64 and before the address, Teredo's neighbours.
        for native in [
            "::",
            "::1",
            "2001:db8::192.0.2.77",
            "64:ff9b:0:0:1::c000:24d",
            "64:ff9b:1::c000:24d",
            "2001:1::1",
            "2003::1",
        ] {
            assert_eq!(mask(ip(native), 32, 128), ip(native), "{native} is IPv6");
        }
    }
}
