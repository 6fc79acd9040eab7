//! IP addresses as rate-limit keys: masking to a network prefix, so that one subscriber's
//! block of addresses (an IPv6 /64 is routinely one household) counts as one client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The prefixes a client address is masked to by default: IPv4 whole, IPv6 to its /64.
pub(crate) const DEFAULT_V4_PREFIX: u8 = 32;
/// See [`DEFAULT_V4_PREFIX`].
pub(crate) const DEFAULT_V6_PREFIX: u8 = 64;

/// `ip` with every bit past the prefix cleared. IPv4-mapped IPv6 addresses
/// (`::ffff:192.0.2.1`, what a dual-stack socket reports for IPv4 clients) are first turned
/// back into IPv4, so that a /64 mask does not lump every IPv4 client into one key.
pub(crate) fn mask(ip: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4) & mask32(v4_prefix);
            IpAddr::V4(Ipv4Addr::from(bits))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & mask128(v6_prefix);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
    }
}

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
}
