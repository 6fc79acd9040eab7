//! [`InlineKey`]: a string key that keeps short strings inside itself, for keyed limiters
//! that track many string keys.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// The longest string kept inside the key; a longer one goes to the heap.
const INLINE: usize = 15;

/// A string key of 16 bytes that holds strings of up to 15 bytes (UTF-8) inside itself, with
/// no heap block, and longer ones behind one pointer.
///
/// A limiter stores a copy of every key it tracks. A `String` is 24 bytes plus a heap block
/// for its bytes; `Box<str>` 16 bytes plus the block. Most rate-limiting keys are short (a
/// user id, an account name, an IPv4 address as text, at most 15 bytes), and for those an
/// `InlineKey` is the 16 bytes alone: for a million 11-byte keys on a token bucket it saves
/// about a third of what the limiter holds per key with `String` keys (see the crate's
/// benchmarks).
///
/// It is looked up by `&str`, as a `String` key is: `RateLimiter<InlineKey>` takes
/// `limiter.try_acquire("alice")`. It hashes, compares and orders exactly as the string it
/// holds (the contract of [`Borrow<str>`]). Over many keys of up to 15 bytes a lookup is
/// faster than with `String` keys, since the comparison reads the key in the table's entry
/// rather than a heap block elsewhere. The price is at each comparison: reading an inline
/// key as `&str` checks that its bytes are UTF-8 (docs/BENCHMARKS.md measures what that
/// costs on one hot key), as the crate has no unsafe code to skip the check. A string longer than
/// 15 bytes costs one allocation more than a `String` (the key points at a boxed
/// `Box<str>`), and so does each clone of it.
///
/// ```
/// use tollgate::RateLimiter;
/// use tollgate::keys::InlineKey;
///
/// let limiter: RateLimiter<InlineKey> = RateLimiter::new("2/1s".parse()?);
/// assert_eq!(limiter.try_acquire("user-000042").remaining(), 1);
/// assert_eq!(limiter.try_acquire("user-000042").remaining(), 0);
/// assert_eq!(InlineKey::from("user-000042"), *"user-000042");
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct InlineKey(Repr);

#[derive(Clone)]
enum Repr {
    /// `bytes[..len]` is the string; the rest is zero.
    Inline { len: Len, bytes: [u8; INLINE] },
    /// Behind a thin pointer, so that the key stays 16 bytes.
    Heap(Box<Box<str>>),
}

/// The length of an inline string. An enum rather than a `u8` so that its unused values
/// (16 to 255) can tell `Repr::Heap` apart: the length byte doubles as the tag, and 15 bytes
/// are left for the string.
#[derive(Clone, Copy)]
#[repr(u8)]
#[rustfmt::skip]
enum Len { L0, L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11, L12, L13, L14, L15 }

impl Len {
    /// Every length, at its own index.
    #[rustfmt::skip]
    const ALL: [Len; INLINE + 1] = [
        Len::L0, Len::L1, Len::L2, Len::L3, Len::L4, Len::L5, Len::L6, Len::L7, Len::L8,
        Len::L9, Len::L10, Len::L11, Len::L12, Len::L13, Len::L14, Len::L15,
    ];
}

// The whole point of the type: 15 bytes and a length, or a pointer, in 16 bytes.
const _: () = assert!(std::mem::size_of::<InlineKey>() == 16);

impl InlineKey {
    /// The key's string.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => match std::str::from_utf8(&bytes[..*len as usize]) {
                Ok(text) => text,
                // Only `From<&str>` fills `bytes`, with a whole string's bytes.
                Err(_) => unreachable!("an inline key holds a copy of a string's bytes"),
            },
            Repr::Heap(text) => text,
        }
    }

    /// Whether the string is kept inside the key (15 bytes or fewer) rather than on the heap.
    pub fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

impl From<&str> for InlineKey {
    fn from(text: &str) -> Self {
        match Len::ALL.get(text.len()) {
            Some(&len) => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                InlineKey(Repr::Inline { len, bytes })
            }
            None => InlineKey(Repr::Heap(Box::new(text.into()))),
        }
    }
}

impl From<String> for InlineKey {
    /// Moves a string too long to go inline into a box (reallocated only when the string
    /// has spare capacity).
    fn from(text: String) -> Self {
        if text.len() <= INLINE {
            InlineKey::from(text.as_str())
        } else {
            InlineKey(Repr::Heap(Box::new(text.into_boxed_str())))
        }
    }
}

impl From<&String> for InlineKey {
    fn from(text: &String) -> Self {
        InlineKey::from(text.as_str())
    }
}

impl From<Box<str>> for InlineKey {
    fn from(text: Box<str>) -> Self {
        InlineKey::from(String::from(text))
    }
}

impl From<InlineKey> for String {
    fn from(key: InlineKey) -> String {
        match key.0 {
            Repr::Heap(text) => String::from(*text),
            Repr::Inline { .. } => key.as_str().to_owned(),
        }
    }
}

impl Deref for InlineKey {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for InlineKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for InlineKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl Hash for InlineKey {
    /// As the string hashes: a limiter looks an `InlineKey` up by `&str`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq for InlineKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for InlineKey {}

impl PartialEq<str> for InlineKey {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for InlineKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for InlineKey {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<InlineKey> for str {
    fn eq(&self, other: &InlineKey) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<InlineKey> for &str {
    fn eq(&self, other: &InlineKey) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<InlineKey> for String {
    fn eq(&self, other: &InlineKey) -> bool {
        self == other.as_str()
    }
}

impl Default for InlineKey {
    /// The empty string.
    fn default() -> Self {
        InlineKey::from("")
    }
}

impl std::str::FromStr for InlineKey {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(InlineKey::from(text))
    }
}

impl PartialOrd for InlineKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InlineKey {
    /// As the strings order.
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for InlineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for InlineKey {
    /// As the string displays, width and precision included.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    use proptest::prelude::*;

    #[test]
    fn up_to_15_bytes_stay_inline() {
        for text in [
            "",
            "a",
            "user-000042",
            "192.168.100.200",
            "é-ünïcödé",
            "ünïcödé-ü",
            "abcdefghijklmé",
        ] {
            let key = InlineKey::from(text);
            assert!(key.is_inline(), "{text:?}");
            assert_eq!(key.as_str(), text);
        }
        for text in [
            "abcdefghijklmnop",
            "abcdefghijklmné",
            "2001:db8::8a2e:370:7334",
            "ünïcödé-ünïcödé",
        ] {
            let key = InlineKey::from(text);
            assert!(!key.is_inline(), "{text:?}");
            assert_eq!(key.as_str(), text);
            assert_eq!(InlineKey::from(text.to_owned()).as_str(), text);
            assert_eq!(String::from(key), text);
        }
        assert_eq!(String::from(InlineKey::from("short")), "short");
        assert_eq!(InlineKey::from(Box::<str>::from("boxed")), "boxed");
        assert_eq!(
            format!(
                "{:>5}|{:.2}",
                InlineKey::from("x y"),
                InlineKey::from("x y")
            ),
            "  x y|x "
        );
        assert_eq!(InlineKey::default(), "");
        assert_eq!("abc".parse::<InlineKey>(), Ok(InlineKey::from("abc")));
        let (key, string) = (InlineKey::from("abc"), String::from("abc"));
        assert!(string == key && "abc" == key && *"abc" == key);
        assert!(key == string && key == "abc" && key == *"abc");
        assert_eq!(format!("{:?}", InlineKey::from("x\"y")), r#""x\"y""#);
    }

    #[test]
    fn a_limiter_tracks_inline_and_heap_keys_by_str() {
        use crate::{FakeClock, RateLimiter};

        let limiter: RateLimiter<InlineKey, FakeClock> =
            RateLimiter::with_clock("3/1h".parse().unwrap(), FakeClock::new());
        let long = "a-key-longer-than-fifteen-bytes";
        for key in ["alice", long, "alicf"] {
            assert!(limiter.try_acquire(key).is_allowed(), "{key}");
            assert_eq!(limiter.peek(key).remaining(), 1, "{key}");
        }
        // Settling takes the key by `&str` and may create it from a `String`.
        let reservation = limiter.reserve_n(long, 1).unwrap();
        assert_eq!(limiter.peek(long).remaining(), 0);
        limiter.settle(long, reservation, 0).unwrap();
        assert_eq!(limiter.peek(long).remaining(), 1);
        assert_eq!(limiter.peek("alice").remaining(), 1);
        assert_eq!(limiter.len(), 3);
    }

    proptest! {
        /// Hash, equality and order are the string's, as `Borrow<str>` requires.
        #[test]
        fn behaves_as_its_string(a in ".{0,20}", b in ".{0,20}") {
            let hasher = std::collections::hash_map::RandomState::new();
            let (ka, kb) = (InlineKey::from(a.as_str()), InlineKey::from(b.clone()));
            prop_assert_eq!(ka.as_str(), a.as_str());
            prop_assert_eq!(ka.is_inline(), a.len() <= INLINE);
            prop_assert_eq!(hasher.hash_one(&ka), hasher.hash_one(a.as_str()));
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(ka.clone(), ka);
        }
    }
}
