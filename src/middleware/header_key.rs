//! [`HeaderKey`]: a request counted against the value of one header, or the token of an
//! `Authorization: Bearer` header, hashed into a fixed-size key.

use http::header::AUTHORIZATION;
use http::HeaderName;

use super::error::{ConfigError, KeyError};
use super::key::{trim, KeyExtractor, LimitKey, RequestHead};

/// The key is the value of one header, or the token of an `Authorization: Bearer` header,
/// hashed into a fixed-size [`LimitKey::Digest`].
///
/// The value is **length-bounded** (4096 bytes by default; longer values are
/// [`KeyError::TooLong`]) and **hashed** into 128 bits, so the limiter's memory per key is
/// fixed and the token itself is never stored. A header that appears more than once is
/// [`KeyError::Malformed`] (which one would count?).
///
/// **The digest is the same in every process**: SipHash-2-4-128 (a keyed hash with a fixed
/// definition) under [`shared_secret`](HeaderKey::shared_secret) when one is given, else
/// under the fixed [`PUBLIC_DIGEST_KEY`](HeaderKey::PUBLIC_DIGEST_KEY). So a Redis-backed
/// rule shared by several servers files one client under one Redis key whatever the
/// configuration: a per-process key would split each client over as many Redis keys as
/// there are servers (and multiply its budget by as many), with nothing to show for it.
///
/// Without a secret, spending another client's budget takes a token whose digest equals the
/// victim's, and the victim's digest is found only by reading your Redis. SipHash is made to
/// be keyed with a secret; with its key public no practical way to find such a token is
/// known, but SipHash promises none. **Set [`shared_secret`](HeaderKey::shared_secret)
/// (the same 16 random bytes on every server) for rules decided by Redis**, and always when
/// the tokens are guessable (short API keys) or the Redis is shared with others: under the
/// public key, whoever reads the Redis can check guessed or leaked tokens against the stored
/// digests, and link one token across every deployment that uses the default.
///
/// Changing the key changes every client's digest: adding or rotating the secret (or
/// rolling between versions that digest differently) starts every client afresh, and while
/// servers disagree (a rolling deploy) each client is counted under two keys, up to twice
/// its budget. Change it all at once, at a quiet time.
///
/// **Only key by a token that has been checked.** Anyone can invent a new token per
/// request; keyed by unchecked tokens, each gets a fresh budget. Place this layer after your
/// authentication, or cap the keys with `RateLimiter::max_keys` and add a per-IP layer.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use tollgate::middleware::{HeaderKey, KeyExtractor, LimitKey, RequestHead};
///
/// let bearer = HeaderKey::bearer();
/// let request = Request::get("/").header("authorization", "Bearer abc.def").body(())?;
/// let digest = |token: &[u8]| LimitKey::digest_with_secret(&HeaderKey::PUBLIC_DIGEST_KEY, token);
/// assert_eq!(bearer.extract(&RequestHead::new(&request))?, digest(b"abc.def"));
///
/// let api_key = HeaderKey::new("x-api-key")?.max_len(64);
/// let request = Request::get("/").header("x-api-key", "k-123").body(())?;
/// assert_eq!(api_key.extract(&RequestHead::new(&request))?, digest(b"k-123"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    bearer: bool,
    max_len: usize,
    /// The digest's key; `None`: [`HeaderKey::PUBLIC_DIGEST_KEY`].
    secret: Option<[u8; 16]>,
}

impl HeaderKey {
    /// The default bound on the key's length, in bytes.
    pub const DEFAULT_MAX_LEN: usize = 4096;

    /// The digest key used without a [`shared_secret`](HeaderKey::shared_secret): fixed and
    /// public, so that every server turns one token into one key.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::middleware::{HeaderKey, KeyExtractor, LimitKey, RequestHead};
    ///
    /// let request = Request::get("/").header("x-api-key", "k-123").body(())?;
    /// let key = HeaderKey::new("x-api-key")?.extract(&RequestHead::new(&request))?;
    /// assert_eq!(key, LimitKey::digest_with_secret(&HeaderKey::PUBLIC_DIGEST_KEY, b"k-123"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const PUBLIC_DIGEST_KEY: [u8; 16] = *b"tollgate:header1";

    /// Keys by the whole value of the header `name` (case-insensitive).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidHeaderName`] when `name` is not a valid header name.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::HeaderKey;
    ///
    /// let api_key = HeaderKey::new("X-Api-Key")?;
    /// assert!(HeaderKey::new("bad name").is_err());
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            ConfigError::InvalidHeaderName {
                name: name.to_owned(),
            }
        })?;
        Ok(HeaderKey {
            name,
            bearer: false,
            max_len: Self::DEFAULT_MAX_LEN,
            secret: None,
        })
    }

    /// Keys by the token of `Authorization: Bearer <token>` (the scheme is matched without
    /// regard to case). Another scheme is [`KeyError::Malformed`].
    ///
    /// # Examples
    ///
    /// ```
    /// let bearer = tollgate::middleware::HeaderKey::bearer();
    /// ```
    #[must_use]
    pub fn bearer() -> Self {
        HeaderKey {
            name: AUTHORIZATION,
            bearer: true,
            max_len: Self::DEFAULT_MAX_LEN,
            secret: None,
        }
    }

    /// Refuses key material longer than `max_len` bytes (default
    /// [`DEFAULT_MAX_LEN`](HeaderKey::DEFAULT_MAX_LEN)).
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::middleware::{HeaderKey, KeyError, KeyExtractor, RequestHead};
    ///
    /// let short = HeaderKey::new("x-api-key")?.max_len(4);
    /// let request = Request::get("/").header("x-api-key", "12345").body(())?;
    /// assert!(matches!(
    ///     short.extract(&RequestHead::new(&request)),
    ///     Err(KeyError::TooLong { len: 5, max: 4, .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// Digests the key material under `secret` ([`LimitKey::digest_with_secret`]) instead of
    /// [`PUBLIC_DIGEST_KEY`](HeaderKey::PUBLIC_DIGEST_KEY): every server given the same
    /// secret still turns one token into the same key, and the digests (in a Redis, say) can
    /// no longer be checked against guessed tokens by anyone who does not know the secret.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::middleware::{HeaderKey, KeyExtractor, LimitKey, RequestHead};
    ///
    /// let secret = *b"16 random bytes!";
    /// let server_a = HeaderKey::bearer().shared_secret(secret);
    /// let server_b = HeaderKey::bearer().shared_secret(secret);
    /// let request = Request::get("/").header("authorization", "Bearer abc").body(())?;
    /// let head = RequestHead::new(&request);
    /// assert_eq!(server_a.extract(&head)?, server_b.extract(&head)?);
    /// assert_eq!(server_a.extract(&head)?, LimitKey::digest_with_secret(&secret, b"abc"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn shared_secret(mut self, secret: [u8; 16]) -> Self {
        self.secret = Some(secret);
        self
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, head: &RequestHead<'_>) -> Result<LimitKey, KeyError> {
        let mut values = head.headers().get_all(&self.name).iter();
        let value = values
            .next()
            .ok_or_else(|| KeyError::MissingHeader(self.name.clone()))?;
        if values.next().is_some() {
            return Err(KeyError::Malformed(self.name.clone()));
        }
        let mut material = trim(value.as_bytes());
        if self.bearer {
            material =
                bearer_token(material).ok_or_else(|| KeyError::Malformed(self.name.clone()))?;
        }
        if material.is_empty() {
            return Err(KeyError::MissingHeader(self.name.clone()));
        }
        if material.len() > self.max_len {
            return Err(KeyError::TooLong {
                header: self.name.clone(),
                len: material.len(),
                max: self.max_len,
            });
        }
        let secret = self.secret.as_ref().unwrap_or(&Self::PUBLIC_DIGEST_KEY);
        Ok(LimitKey::digest_with_secret(secret, material))
    }
}

/// The token of a `Bearer` credential, or `None` for another scheme.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || rest.first() != Some(&b' ') {
        return None;
    }
    Some(trim(rest))
}

#[cfg(test)]
mod tests {
    use siphasher::sip128::SipHasher24;

    use super::*;

    #[test]
    fn digests_without_a_secret_are_the_same_in_every_process() {
        // The key is a constant: a digest computed here equals one computed by any other
        // server, which a per-process random key would not.
        let request = http::Request::get("/")
            .header("authorization", "Bearer abc")
            .body(())
            .unwrap();
        let key = HeaderKey::bearer().extract(&RequestHead::new(&request));
        let want = SipHasher24::new_with_key(b"tollgate:header1")
            .hash(b"abc")
            .as_bytes();
        assert_eq!(key, Ok(LimitKey::Digest(want)));
        assert_ne!(key, Ok(LimitKey::digest(b"abc")));
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bEaReR   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
        assert_eq!(bearer_token(b"Bear"), None);
        assert_eq!(bearer_token(b"Bearer "), Some(&b""[..]));
    }
}
