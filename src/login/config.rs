//! [`LoginConfig`]: a login guard's limits, its lockout schedule and how long a client stays
//! known, and [`LoginConfigError`] for a configuration that cannot work.

use std::fmt;
use std::time::Duration;

use super::strikes::Escalation;
use crate::clock::duration_to_nanos;
use crate::policy::{Algorithm, Policy};

#[cfg(doc)]
use super::LoginGuard;

/// How a [`LoginGuard`] counts failures and escalates: the two limits and the lockout
/// schedule. Build it from [`LoginConfig::default`] and change what differs.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`account_limit`](LoginConfig::account_limit) | `sliding-log 5/15m` | failed attempts per account |
/// | [`ip_limit`](LoginConfig::ip_limit) | `sliding-log 20/1h` | failed attempts per client IP, over all accounts |
/// | [`strikes_to_lock`](LoginConfig::strikes_to_lock) | 3 | consecutive windows in which an account exhausts its limit before it is locked out |
/// | [`first_lockout`](LoginConfig::first_lockout) | 15 min | the first lockout; each further strike doubles it |
/// | [`max_lockout`](LoginConfig::max_lockout) | 24 h | the cap on a lockout |
/// | [`known_client_limit`](LoginConfig::known_client_limit) | `sliding-log 5/15m` | failed attempts of a known client on its account |
/// | [`remember_clients`](LoginConfig::remember_clients) | 30 days | how long a success keeps a client known (zero: never) |
///
/// # The lockout schedule
///
/// An account *strikes* when a recorded failure leaves its failure limit exhausted. Strikes
/// are counted at most once per **strike window** (the account limit's window; the longest
/// band's for a policy with several), and a **streak** is a run of strikes in consecutive
/// windows:
///
/// * the first strike of a streak opens window 1, `[t, t + W)`;
/// * window `k + 1` starts where window `k` ends and is `W` long, except that after a
///   lockout the next window starts when the lockout ends;
/// * a strike inside the current window (or during a lockout) adds nothing;
/// * a strike in the next window continues the streak; once a whole window passes without
///   a strike, the streak is over and the next strike starts a new one at 1.
///
/// Strike number `strikes_to_lock` of a streak locks the account out for `first_lockout`,
/// counted from that strike; each further strike of the same streak locks it out for twice
/// the previous lockout, up to `max_lockout`. With the defaults:
///
/// | strike in the streak | lockout |
/// |---|---|
/// | 1, 2 | none (the account limit alone refuses) |
/// | 3 | 15 min |
/// | 4 | 30 min |
/// | 5 | 1 h |
/// | 6 | 2 h |
/// | 7 | 4 h |
/// | 8 | 8 h |
/// | 9 | 16 h |
/// | 10 and later | 24 h (the cap) |
///
/// Only time ends a streak (or [`LoginGuard::unlock`]): a successful login does not, since
/// the account's rules are shared by every client that is not known for it, an attacker's
/// included.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::login::LoginConfig;
///
/// let config = LoginConfig::default()
///     .with_account_limit("sliding-log 3/10m".parse()?)
///     .with_strikes_to_lock(2)
///     .with_lockout(Duration::from_secs(600), Duration::from_secs(3600));
/// assert_eq!(config.lockout_after(1), None);
/// assert_eq!(config.lockout_after(2), Some(Duration::from_secs(600)));
/// assert_eq!(config.lockout_after(3), Some(Duration::from_secs(1200)));
/// assert_eq!(config.lockout_after(9), Some(Duration::from_secs(3600))); // capped
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginConfig {
    account: Policy,
    ip: Policy,
    strikes_to_lock: u32,
    first_lockout: Duration,
    max_lockout: Duration,
    known: Policy,
    remember: Duration,
}

impl Default for LoginConfig {
    fn default() -> Self {
        fn sliding_log(permits: u64, secs: u64) -> Policy {
            match Policy::new(Algorithm::SlidingLog, permits, Duration::from_secs(secs)) {
                Ok(policy) => policy,
                Err(_) => unreachable!("the default login policies are valid"),
            }
        }
        LoginConfig {
            account: sliding_log(5, 15 * 60),
            ip: sliding_log(20, 60 * 60),
            strikes_to_lock: 3,
            first_lockout: Duration::from_secs(15 * 60),
            max_lockout: Duration::from_secs(24 * 60 * 60),
            known: sliding_log(5, 15 * 60),
            remember: Duration::from_secs(30 * 24 * 60 * 60),
        }
    }
}

impl LoginConfig {
    /// This config with `policy` as the failure limit per account.
    ///
    /// Any policy works; a sliding log (`"sliding-log 5/15m"`) is exact, with no burst at a
    /// window boundary, and its memory (8 bytes per permit per account) is small for limits
    /// of this size.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default().with_account_limit("sliding-log 10/1h".parse()?);
    /// assert_eq!(config.account_limit().first_band().permits(), 10);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn with_account_limit(mut self, policy: Policy) -> Self {
        self.account = policy;
        self
    }

    /// This config with `policy` as the failure limit per client IP.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default().with_ip_limit("sliding-log 100/1h".parse()?);
    /// assert_eq!(config.ip_limit().first_band().permits(), 100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn with_ip_limit(mut self, policy: Policy) -> Self {
        self.ip = policy;
        self
    }

    /// This config locking an account out at the `strikes`-th consecutive strike window
    /// (at least 1; checked by [`LoginGuard::with_config`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default().with_strikes_to_lock(5);
    /// assert_eq!(config.strikes_to_lock(), 5);
    /// assert_eq!(config.lockout_after(4), None);
    /// ```
    #[must_use]
    pub const fn with_strikes_to_lock(mut self, strikes: u32) -> Self {
        self.strikes_to_lock = strikes;
        self
    }

    /// This config with lockouts starting at `first` and doubling up to `max` (checked by
    /// [`LoginGuard::with_config`]: `0 < first <= max <= Policy::MAX_WINDOW`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = tollgate::login::LoginConfig::default()
    ///     .with_lockout(Duration::from_secs(60), Duration::from_secs(300));
    /// let schedule: Vec<_> = (3..7).map(|s| config.lockout_after(s).unwrap().as_secs()).collect();
    /// assert_eq!(schedule, [60, 120, 240, 300]);
    /// ```
    #[must_use]
    pub const fn with_lockout(mut self, first: Duration, max: Duration) -> Self {
        self.first_lockout = first;
        self.max_lockout = max;
        self
    }

    /// This config judging a client known for an account by `policy`: the failed attempts it
    /// may make on that account before it waits like anyone else (see
    /// [`LoginGuard::record_success`]). No lockout follows from it.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default().with_known_client_limit("sliding-log 3/10m".parse()?);
    /// assert_eq!(config.known_client_limit().first_band().permits(), 3);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn with_known_client_limit(mut self, policy: Policy) -> Self {
        self.known = policy;
        self
    }

    /// This config keeping a client known for an account for `remember` after its latest
    /// successful login there ([`Duration::ZERO`]: no client is ever known, and every client
    /// meets the account's limit and lockouts; checked by [`LoginGuard::with_config`]: at
    /// most [`Policy::MAX_WINDOW`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let config = tollgate::login::LoginConfig::default().with_remember_clients(week);
    /// assert_eq!(config.remember_clients(), week);
    /// ```
    #[must_use]
    pub const fn with_remember_clients(mut self, remember: Duration) -> Self {
        self.remember = remember;
        self
    }

    /// The failure limit of a client known for an account, on that account.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default();
    /// assert_eq!(config.known_client_limit().to_string(), "sliding-log 5/15m");
    /// ```
    #[must_use]
    pub const fn known_client_limit(&self) -> Policy {
        self.known
    }

    /// How long a successful login keeps the client known for the account.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = tollgate::login::LoginConfig::default();
    /// assert_eq!(config.remember_clients(), Duration::from_secs(30 * 24 * 3600));
    /// ```
    #[must_use]
    pub const fn remember_clients(&self) -> Duration {
        self.remember
    }

    /// The failure limit per account.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default();
    /// assert_eq!(config.account_limit().to_string(), "sliding-log 5/15m");
    /// ```
    #[must_use]
    pub const fn account_limit(&self) -> Policy {
        self.account
    }

    /// The failure limit per client IP.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::login::LoginConfig::default();
    /// assert_eq!(config.ip_limit().to_string(), "sliding-log 20/1h");
    /// ```
    #[must_use]
    pub const fn ip_limit(&self) -> Policy {
        self.ip
    }

    /// Consecutive strike windows that lock an account out.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tollgate::login::LoginConfig::default().strikes_to_lock(), 3);
    /// ```
    #[must_use]
    pub const fn strikes_to_lock(&self) -> u32 {
        self.strikes_to_lock
    }

    /// The first lockout of a streak.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(tollgate::login::LoginConfig::default().first_lockout(), Duration::from_secs(900));
    /// ```
    #[must_use]
    pub const fn first_lockout(&self) -> Duration {
        self.first_lockout
    }

    /// The longest lockout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(tollgate::login::LoginConfig::default().max_lockout(), Duration::from_secs(86_400));
    /// ```
    #[must_use]
    pub const fn max_lockout(&self) -> Duration {
        self.max_lockout
    }

    /// The strike window: how long a strike counts for, the account limit's window (the
    /// longest band's, for a policy with several).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(tollgate::login::LoginConfig::default().strike_window(), Duration::from_secs(900));
    /// ```
    #[must_use]
    pub fn strike_window(&self) -> Duration {
        self.account
            .bands()
            .map(|band| band.window())
            .max()
            .unwrap_or_else(|| self.account.first_band().window())
    }

    /// The lockout that the `strike`-th consecutive strike of a streak starts: `None` below
    /// [`strikes_to_lock`](LoginConfig::strikes_to_lock), then `first_lockout` doubled for
    /// each strike beyond it, capped at `max_lockout` (the table on [`LoginConfig`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = tollgate::login::LoginConfig::default();
    /// let minutes = |s| config.lockout_after(s).map(|d| d.as_secs() / 60);
    /// assert_eq!(minutes(2), None);
    /// assert_eq!(minutes(3), Some(15));
    /// assert_eq!(minutes(4), Some(30));
    /// assert_eq!(minutes(9), Some(960)); // 16 h
    /// assert_eq!(minutes(10), Some(1440)); // 24 h, the cap
    /// assert_eq!(minutes(1000), Some(1440));
    /// ```
    #[must_use]
    pub fn lockout_after(&self, strike: u32) -> Option<Duration> {
        self.escalation().lockout(strike).map(Duration::from_nanos)
    }

    pub(crate) fn escalation(&self) -> Escalation {
        Escalation::new(
            duration_to_nanos(self.strike_window()),
            self.strikes_to_lock,
            duration_to_nanos(self.first_lockout),
            duration_to_nanos(self.max_lockout),
        )
    }

    pub(super) fn validate(&self) -> Result<(), LoginConfigError> {
        if self.strikes_to_lock == 0 {
            return Err(LoginConfigError::ZeroStrikes);
        }
        if self.first_lockout.is_zero() {
            return Err(LoginConfigError::ZeroLockout);
        }
        if self.max_lockout < self.first_lockout {
            return Err(LoginConfigError::MaxBelowFirst {
                first: self.first_lockout,
                max: self.max_lockout,
            });
        }
        if self.max_lockout > Policy::MAX_WINDOW {
            return Err(LoginConfigError::LockoutTooLong {
                max: self.max_lockout,
            });
        }
        if self.remember > Policy::MAX_WINDOW {
            return Err(LoginConfigError::RememberTooLong {
                remember: self.remember,
            });
        }
        Ok(())
    }
}

/// Why a [`LoginConfig`] was refused by [`LoginGuard::with_config`]. Each message names the
/// setting and its value.
///
/// # Examples
///
/// ```
/// use tollgate::FakeClock;
/// use tollgate::login::{LoginConfig, LoginConfigError, LoginGuard};
///
/// let config = LoginConfig::default().with_strikes_to_lock(0);
/// let err = LoginGuard::with_config(config, FakeClock::new()).unwrap_err();
/// assert_eq!(err, LoginConfigError::ZeroStrikes);
/// assert_eq!(err.to_string(), "strikes_to_lock must be at least 1, got 0");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoginConfigError {
    /// `strikes_to_lock` was 0.
    ZeroStrikes,
    /// `first_lockout` was zero.
    ZeroLockout,
    /// `max_lockout` was shorter than `first_lockout`.
    MaxBelowFirst {
        /// The first lockout asked for.
        first: Duration,
        /// The cap asked for.
        max: Duration,
    },
    /// `max_lockout` was longer than [`Policy::MAX_WINDOW`], so nanosecond arithmetic
    /// could overflow.
    LockoutTooLong {
        /// The cap asked for.
        max: Duration,
    },
    /// `remember_clients` was longer than [`Policy::MAX_WINDOW`].
    RememberTooLong {
        /// The time asked for.
        remember: Duration,
    },
}

impl fmt::Display for LoginConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginConfigError::ZeroStrikes => {
                f.write_str("strikes_to_lock must be at least 1, got 0")
            }
            LoginConfigError::ZeroLockout => {
                f.write_str("first_lockout must be longer than zero, got 0ns")
            }
            LoginConfigError::MaxBelowFirst { first, max } => write!(
                f,
                "max_lockout {max:?} is shorter than first_lockout {first:?}"
            ),
            LoginConfigError::LockoutTooLong { max } => write!(
                f,
                "max_lockout {max:?} is longer than the supported maximum of {:?}",
                Policy::MAX_WINDOW
            ),
            LoginConfigError::RememberTooLong { remember } => write!(
                f,
                "remember_clients {remember:?} is longer than the supported maximum of {:?}",
                Policy::MAX_WINDOW
            ),
        }
    }
}

impl std::error::Error for LoginConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_the_setting() {
        let d = Duration::from_secs;
        let bad = [
            (
                LoginConfig::default().with_strikes_to_lock(0),
                LoginConfigError::ZeroStrikes,
            ),
            (
                LoginConfig::default().with_lockout(Duration::ZERO, d(1)),
                LoginConfigError::ZeroLockout,
            ),
            (
                LoginConfig::default().with_lockout(d(10), d(5)),
                LoginConfigError::MaxBelowFirst {
                    first: d(10),
                    max: d(5),
                },
            ),
            (
                LoginConfig::default().with_lockout(d(10), Policy::MAX_WINDOW + d(1)),
                LoginConfigError::LockoutTooLong {
                    max: Policy::MAX_WINDOW + d(1),
                },
            ),
            (
                LoginConfig::default().with_remember_clients(Policy::MAX_WINDOW + d(1)),
                LoginConfigError::RememberTooLong {
                    remember: Policy::MAX_WINDOW + d(1),
                },
            ),
        ];
        for (config, want) in bad {
            assert_eq!(config.validate(), Err(want));
        }
        assert_eq!(
            LoginConfigError::MaxBelowFirst {
                first: d(10),
                max: d(5)
            }
            .to_string(),
            "max_lockout 5s is shorter than first_lockout 10s"
        );
        assert_eq!(LoginConfig::default().validate(), Ok(()));
        let never = LoginConfig::default().with_remember_clients(Duration::ZERO);
        assert_eq!(never.validate(), Ok(()));
    }
}
