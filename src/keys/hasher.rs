//! The default hasher of the keyed registry, [`KeyHasher`].

use std::hash::BuildHasher;

/// The default key hasher of [`RateLimiter`](crate::RateLimiter): aHash with random keys drawn
/// once per hasher from the operating system.
///
/// Keys of a rate limiter are chosen by the clients it limits (IP addresses, tokens, user
/// names), so a hasher with fixed or guessable keys would let an attacker send keys that all
/// land in one bucket and turn every lookup into a scan. aHash claims resistance to such
/// hash flooding with per-process random keys while running at about the speed of the fastest
/// non-cryptographic hashers (see `docs/ARCHITECTURE.md`, "The table and the hasher", and
/// `docs/BENCHMARKS.md`).
/// Pass another [`BuildHasher`] with
/// [`RateLimiter::with_hasher`](crate::RateLimiter::with_hasher) to trade differently.
///
/// # Examples
///
/// ```
/// use std::hash::BuildHasher;
/// use tollgate::keys::KeyHasher;
///
/// let hasher = KeyHasher::default();
/// assert_eq!(hasher.hash_one("alice"), hasher.hash_one("alice"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct KeyHasher(ahash::RandomState);

impl BuildHasher for KeyHasher {
    type Hasher = ahash::AHasher;

    #[inline]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}
