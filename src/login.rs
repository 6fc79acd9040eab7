//! Login-attempt protection: [`LoginGuard`], failed attempts limited per account and per
//! client IP at once, with lockouts that grow for accounts attacked again and again.
//!
//! It is built from the crate's own parts: two [`RateLimiter`]s (sliding logs by default, so
//! there is no boundary burst) count failures per account and per IP, and a third map keeps
//! a small *strike record* per account, one atomic word, for the escalating lockouts. The
//! pure escalation arithmetic is [`Escalation`]; [`StrikeCell`] owns the word and its
//! compare-and-swap loop.

use std::fmt;
use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::sync::{AtomicU128, Ordering};
use crate::{Algorithm, Clock, Decision, KeyHasher, Policy, RateLimiter, SystemClock};

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
/// A successful login ([`LoginGuard::record_success`]) ends the streak.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::LoginConfig;
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
    /// let config = tollgate::LoginConfig::default().with_account_limit("sliding-log 10/1h".parse()?);
    /// assert_eq!(config.account_limit().permits(), 10);
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
    /// let config = tollgate::LoginConfig::default().with_ip_limit("sliding-log 100/1h".parse()?);
    /// assert_eq!(config.ip_limit().permits(), 100);
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
    /// let config = tollgate::LoginConfig::default().with_strikes_to_lock(5);
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
    /// let config = tollgate::LoginConfig::default()
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

    /// The failure limit per account.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = tollgate::LoginConfig::default();
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
    /// let config = tollgate::LoginConfig::default();
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
    /// assert_eq!(tollgate::LoginConfig::default().strikes_to_lock(), 3);
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
    /// assert_eq!(tollgate::LoginConfig::default().first_lockout(), Duration::from_secs(900));
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
    /// assert_eq!(tollgate::LoginConfig::default().max_lockout(), Duration::from_secs(86_400));
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
    /// assert_eq!(tollgate::LoginConfig::default().strike_window(), Duration::from_secs(900));
    /// ```
    #[must_use]
    pub fn strike_window(&self) -> Duration {
        self.account
            .bands()
            .map(|band| band.window())
            .max()
            .unwrap_or_else(|| self.account.window())
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
    /// let config = tollgate::LoginConfig::default();
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

    fn escalation(&self) -> Escalation {
        Escalation {
            window: duration_to_nanos(self.strike_window()),
            threshold: self.strikes_to_lock,
            first: duration_to_nanos(self.first_lockout),
            cap: duration_to_nanos(self.max_lockout),
        }
    }

    fn validate(&self) -> Result<(), LoginConfigError> {
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
        Ok(())
    }
}

/// Why a [`LoginConfig`] was refused by [`LoginGuard::with_config`]. Each message names the
/// setting and its value.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, LoginConfig, LoginConfigError, LoginGuard};
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
        }
    }
}

impl std::error::Error for LoginConfigError {}

/// What a [`LoginGuard`] says about a login attempt: go ahead, or which limit refuses and
/// for how long.
///
/// When several limits refuse at once, the decision names the one that refuses longest
/// (ties: the lockout, then the account, then the IP), and its `retry_after` is when every
/// refusing limit has room again, if nothing else is recorded meanwhile.
///
/// | variant | meaning | HTTP |
/// |---|---|---|
/// | `Allowed` | verify the password | |
/// | `Account` | too many recent failures for this account | 429, `Retry-After` |
/// | `Ip` | too many recent failures from this client, over all accounts | 429, `Retry-After` |
/// | `LockedOut` | the account is locked out after repeated strikes | 429 or 423, `Retry-After` |
///
/// Telling a client *which* limit refused helps a real user ("too many attempts for this
/// account") but also tells an attacker; many services answer every refusal alike.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, LoginDecision, LoginGuard};
///
/// let guard = LoginGuard::with_clock(FakeClock::new());
/// match guard.check("alice", "192.0.2.1") {
///     LoginDecision::Allowed { account_left, ip_left } => {
///         assert_eq!((account_left, ip_left), (5, 20));
///     }
///     refused => panic!("a fresh account is refused: {refused:?}"),
/// }
/// for _ in 0..5 {
///     let _ = guard.record_failure("alice", "192.0.2.1");
/// }
/// let d = guard.check("alice", "192.0.2.1");
/// assert_eq!(d, LoginDecision::Account { retry_after: Duration::from_secs(900) });
/// assert_eq!(d.retry_after_secs(), 900);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a LoginDecision says whether the attempt may go ahead"]
pub enum LoginDecision {
    /// The attempt may go ahead.
    Allowed {
        /// Failures the account may still record before its limit refuses (this attempt's,
        /// if it fails, included).
        account_left: u64,
        /// Failures the client IP may still record before its limit refuses.
        ip_left: u64,
    },
    /// The account's failure limit is exhausted.
    Account {
        /// How long until the account's oldest counted failure leaves the window.
        retry_after: Duration,
    },
    /// The client IP's failure limit is exhausted.
    Ip {
        /// How long until the IP's oldest counted failure leaves the window.
        retry_after: Duration,
    },
    /// The account is locked out (see the schedule on [`LoginConfig`]).
    LockedOut {
        /// How long until the lockout ends.
        retry_after: Duration,
        /// The strike that started the lockout, counted in the current streak.
        strikes: u32,
    },
}

impl LoginDecision {
    /// `true` for [`LoginDecision::Allowed`].
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert!(guard.check("alice", "192.0.2.1").is_allowed());
    /// ```
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        matches!(self, LoginDecision::Allowed { .. })
    }

    /// Zero when allowed; otherwise how long until an attempt would be allowed, if nothing
    /// else is recorded meanwhile.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let guard = tollgate::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert_eq!(guard.check("alice", "192.0.2.1").retry_after(), Duration::ZERO);
    /// ```
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        match *self {
            LoginDecision::Allowed { .. } => Duration::ZERO,
            LoginDecision::Account { retry_after }
            | LoginDecision::Ip { retry_after }
            | LoginDecision::LockedOut { retry_after, .. } => retry_after,
        }
    }

    /// [`retry_after`](LoginDecision::retry_after) in whole seconds for a `Retry-After`
    /// header: rounded up, at least 1 when refused, 0 when allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::LoginDecision;
    ///
    /// let d = LoginDecision::Ip { retry_after: Duration::from_millis(1500) };
    /// assert_eq!(d.retry_after_secs(), 2);
    /// ```
    #[must_use]
    pub const fn retry_after_secs(&self) -> u64 {
        if self.is_allowed() {
            return 0;
        }
        let retry = self.retry_after();
        let secs = retry.as_secs() + (retry.subsec_nanos() > 0) as u64;
        if secs == 0 {
            1
        } else {
            secs
        }
    }

    /// Combines the three verdicts: the refusal that lasts longest, ties broken lockout,
    /// account, IP; otherwise an admission.
    fn combine(locked: Option<(u64, u32)>, account: Decision, ip: Decision) -> Self {
        let candidates = [
            locked.map(|(nanos, strikes)| LoginDecision::LockedOut {
                retry_after: Duration::from_nanos(nanos),
                strikes,
            }),
            (!account.is_allowed()).then(|| LoginDecision::Account {
                retry_after: account.retry_after(),
            }),
            (!ip.is_allowed()).then(|| LoginDecision::Ip {
                retry_after: ip.retry_after(),
            }),
        ];
        let mut refusal: Option<LoginDecision> = None;
        for candidate in candidates.into_iter().flatten() {
            if refusal.is_none_or(|r| candidate.retry_after() > r.retry_after()) {
                refusal = Some(candidate);
            }
        }
        refusal.unwrap_or(LoginDecision::Allowed {
            // A peek that allows reports what would be left after admitting it.
            account_left: account.remaining() + 1,
            ip_left: ip.remaining() + 1,
        })
    }
}

/// Protection for a login form: failed attempts limited per account and per client IP at
/// once, and lockouts that grow for an account that keeps exhausting its limit.
///
/// | method | when | does |
/// |---|---|---|
/// | [`check`](LoginGuard::check) | before verifying a password | refuses while locked out or while either limit is exhausted; spends nothing |
/// | [`record_failure`](LoginGuard::record_failure) | after a wrong password | counts one failure for the account and for the IP; may strike and lock out |
/// | [`record_success`](LoginGuard::record_success) | after a right password | clears the account's failures and strikes; the IP's stay |
/// | [`evict_idle`](LoginGuard::evict_idle) | from a timer | drops records that no longer matter |
///
/// Only failures are counted: a user who logs in successfully spends nothing. The IP limit
/// stops one client trying many accounts (credential stuffing, password spraying); the
/// account limit stops many clients trying one account (a botnet rotating IPs); the lockout
/// schedule (on [`LoginConfig`]) slows a patient attacker who stays within the limits by
/// waiting out each window.
///
/// `check` creates nothing, so probing unknown account names costs no memory; records
/// appear only when failures are recorded. Record failures for account names that do not
/// exist as well, so that the answers do not reveal which exist. Time comes only from the
/// guard's clock ([`FakeClock`](crate::FakeClock) in tests).
///
/// # Check, then record
///
/// `check` and `record_failure` are separate calls, with the password check between them,
/// so two attempts racing on one account can both pass `check` before either records its
/// failure: a burst of concurrent attempts can verify a few more passwords than the limit
/// while the last permit is being spent. The limits themselves stay exact (each
/// `record_failure` spends through the lock-free limiter, and a full limit refuses to
/// record more), so from then on `check` refuses. To bound this, serialise attempts per
/// account, or verify only while holding a
/// [`ConcurrencyLimiter`](crate::ConcurrencyLimiter) permit of limit 1 for the account.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, LoginDecision, LoginGuard};
///
/// let clock = FakeClock::new();
/// let guard = LoginGuard::with_clock(clock.clone()); // 5/15m per account, 20/1h per IP
/// let verify = |password: &str| password == "correct horse";
///
/// let mut attempt = |password: &str| -> Result<(), LoginDecision> {
///     let decision = guard.check("alice", "198.51.100.4");
///     if !decision.is_allowed() {
///         return Err(decision); // 429 with Retry-After
///     }
///     if verify(password) {
///         guard.record_success("alice");
///         Ok(())
///     } else {
///         Err(guard.record_failure("alice", "198.51.100.4")) // 401
///     }
/// };
/// for _ in 0..4 {
///     assert!(attempt("guess").is_err());
/// }
/// assert!(attempt("correct horse").is_ok()); // and the four failures are forgotten
/// for _ in 0..5 {
///     let _ = attempt("guess");
/// }
/// assert_eq!(
///     attempt("correct horse"),
///     Err(LoginDecision::Account { retry_after: Duration::from_secs(900) })
/// );
/// ```
pub struct LoginGuard<C = SystemClock> {
    accounts: RateLimiter<String, C>,
    ips: RateLimiter<String, C>,
    /// The strike record of each account that has struck and whose streak may still
    /// continue (or is locked out).
    records: scc::HashMap<String, StrikeCell, KeyHasher>,
    escalation: Escalation,
    config: LoginConfig,
}

impl LoginGuard<SystemClock> {
    /// A guard with the default [`LoginConfig`] on the real clock.
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::LoginGuard::new();
    /// assert!(guard.check("alice", "203.0.113.9").is_allowed());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }
}

impl Default for LoginGuard<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock + Clone> LoginGuard<C> {
    /// A guard with the default [`LoginConfig`], reading time from `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// assert_eq!(guard.config().strikes_to_lock(), 3);
    /// ```
    #[must_use]
    pub fn with_clock(clock: C) -> Self {
        Self::build(LoginConfig::default(), clock)
    }

    /// A guard with `config`, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// [`LoginConfigError`] when `strikes_to_lock` is 0, `first_lockout` is zero,
    /// `max_lockout` is shorter than `first_lockout`, or longer than
    /// [`Policy::MAX_WINDOW`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, LoginConfig, LoginGuard};
    ///
    /// let config = LoginConfig::default()
    ///     .with_account_limit("sliding-log 10/1h".parse()?)
    ///     .with_lockout(Duration::from_secs(300), Duration::from_secs(7200));
    /// let guard = LoginGuard::with_config(config, FakeClock::new())?;
    /// assert_eq!(guard.config().first_lockout(), Duration::from_secs(300));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_config(config: LoginConfig, clock: C) -> Result<Self, LoginConfigError> {
        config.validate()?;
        Ok(Self::build(config, clock))
    }

    fn build(config: LoginConfig, clock: C) -> Self {
        LoginGuard {
            accounts: RateLimiter::with_clock(config.account, clock.clone()),
            ips: RateLimiter::with_clock(config.ip, clock),
            records: scc::HashMap::with_hasher(KeyHasher::default()),
            escalation: config.escalation(),
            config,
        }
    }
}

impl<C: Clock> LoginGuard<C> {
    /// Whether a login attempt for `account` from `ip` may go ahead: call it before
    /// verifying the password. Spends nothing and creates nothing.
    ///
    /// Refuses while the account is locked out, or while either failure limit has no room
    /// (see [`LoginDecision`] for which one is named when several refuse).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, LoginDecision, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// assert_eq!(
    ///     guard.check("alice", "192.0.2.1"),
    ///     LoginDecision::Allowed { account_left: 5, ip_left: 20 }
    /// );
    /// let _ = guard.record_failure("alice", "192.0.2.1");
    /// assert_eq!(
    ///     guard.check("alice", "192.0.2.1"),
    ///     LoginDecision::Allowed { account_left: 4, ip_left: 19 }
    /// );
    /// ```
    pub fn check(&self, account: &str, ip: &str) -> LoginDecision {
        let now = self.clock().now();
        let locked = self
            .records
            .read_sync(account, |_, record| {
                let streak = record.load();
                self.escalation
                    .locked_for(streak, now)
                    .map(|nanos| (nanos, streak.strikes))
            })
            .flatten();
        LoginDecision::combine(locked, self.accounts.peek(account), self.ips.peek(ip))
    }

    /// Records a failed attempt (a wrong password) for `account` from `ip`, and returns
    /// what the next attempt would get (as [`check`](LoginGuard::check) would answer now).
    ///
    /// The failure spends one permit in each limit that has room (a full limit stays full:
    /// its refusal writes nothing). If it leaves the account limit exhausted, the account
    /// strikes; strikes in consecutive windows escalate to lockouts (see [`LoginConfig`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, LoginDecision, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// for left in (1..5).rev() {
    ///     assert_eq!(
    ///         guard.record_failure("alice", "192.0.2.1"),
    ///         LoginDecision::Allowed { account_left: left, ip_left: 15 + left }
    ///     );
    /// }
    /// assert_eq!(
    ///     guard.record_failure("alice", "192.0.2.1"), // the fifth: the first strike
    ///     LoginDecision::Account { retry_after: Duration::from_secs(900) }
    /// );
    /// assert_eq!(guard.strikes("alice"), 1);
    /// ```
    pub fn record_failure(&self, account: &str, ip: &str) -> LoginDecision {
        let spent = self.accounts.try_acquire(account);
        let _ = self.ips.try_acquire(ip);
        if spent.remaining() == 0 {
            // Exhausted now, by this failure or before it: a strike, counted at most once
            // per strike window by the escalation.
            self.strike(account, self.clock().now());
        }
        self.check(account, ip)
    }

    fn strike(&self, account: &str, now: u64) {
        let struck = self
            .records
            .read_sync(account, |_, record| record.strike(&self.escalation, now));
        if struck.is_none() {
            // First strike of the account (or its record was evicted): create the record
            // under the bucket's exclusive lock, one per account however many race here.
            let entry = self
                .records
                .entry_sync(account.to_owned())
                .or_insert_with(StrikeCell::fresh);
            entry.get().strike(&self.escalation, now);
        }
    }

    /// Records a successful login for `account`: forgets its failures, its strikes and any
    /// lockout. The IP's failures stay counted (one success does not vouch for a client
    /// that has been trying other accounts).
    ///
    /// Call it only after [`check`](LoginGuard::check) allowed the attempt and the password
    /// was right; called on its own, it doubles as an administrator's unlock.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, LoginDecision, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// for _ in 0..3 {
    ///     let _ = guard.record_failure("alice", "192.0.2.1");
    /// }
    /// guard.record_success("alice");
    /// assert_eq!(
    ///     guard.check("alice", "192.0.2.1"),
    ///     LoginDecision::Allowed { account_left: 5, ip_left: 17 }
    /// );
    /// ```
    pub fn record_success(&self, account: &str) {
        self.accounts.reset(account);
        self.records.remove_sync(account);
    }

    /// The account's current streak: strikes in consecutive windows, 0 when it has none
    /// (never struck, cleared by a success, or the streak lapsed).
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert_eq!(guard.strikes("alice"), 0);
    /// for _ in 0..5 {
    ///     let _ = guard.record_failure("alice", "192.0.2.1");
    /// }
    /// assert_eq!(guard.strikes("alice"), 1);
    /// ```
    #[must_use]
    pub fn strikes(&self, account: &str) -> u32 {
        let now = self.clock().now();
        self.records
            .read_sync(account, |_, record| {
                self.escalation.streak(record.load(), now)
            })
            .unwrap_or(0)
    }

    /// Drops every record that no longer affects a decision: account and IP failure logs
    /// at rest, and strike records whose streak is over and lockout ended. Returns how
    /// many it removed over the three maps. Exact while attempts run; call it from a timer.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, LoginGuard};
    ///
    /// let clock = FakeClock::new();
    /// let guard = LoginGuard::with_clock(clock.clone());
    /// let _ = guard.record_failure("alice", "192.0.2.1");
    /// clock.advance(Duration::from_secs(15 * 60));
    /// assert_eq!(guard.evict_idle(), 1); // alice's log; the IP's counts for an hour
    /// clock.advance(Duration::from_secs(45 * 60));
    /// assert_eq!(guard.evict_idle(), 1);
    /// ```
    pub fn evict_idle(&self) -> usize {
        let now = self.clock().now();
        let mut removed = self.accounts.evict_idle() + self.ips.evict_idle();
        // `retain_sync` holds each bucket exclusively, and records change only under the
        // bucket's lock (shared, in `read_sync`, or exclusive): no strike is lost. A record
        // at rest decides exactly as no record, so removing it changes nothing.
        self.records.retain_sync(|_, record| {
            let idle = self.escalation.is_at_rest(record.load(), now);
            removed += usize::from(idle);
            !idle
        });
        removed
    }

    /// The configuration the guard enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert_eq!(guard.config().ip_limit().permits(), 20);
    /// ```
    #[must_use]
    pub const fn config(&self) -> &LoginConfig {
        &self.config
    }

    /// The clock the guard reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, FakeClock, LoginGuard};
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// assert_eq!(guard.clock().now(), 0);
    /// ```
    pub fn clock(&self) -> &C {
        self.accounts.clock()
    }
}

impl<C> fmt::Debug for LoginGuard<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGuard")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The lockout escalation as pure arithmetic on a [`Streak`] and `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Escalation {
    /// W: the strike window, ns.
    window: u64,
    /// Strikes in a streak that start the first lockout (>= 1 once validated).
    threshold: u32,
    /// The first lockout, ns.
    first: u64,
    /// The longest lockout, ns.
    cap: u64,
}

/// One account's strike record, unpacked. `Streak::default()` is "no record".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Streak {
    /// Strikes in the current streak (saturating); 0 for none.
    strikes: u32,
    /// ns on the guard's clock: the end of the window the latest strike was counted in,
    /// or, for a strike that locked the account out, the end of the lockout.
    until: u64,
}

impl Streak {
    const fn pack(self) -> u128 {
        (self.until as u128) | ((self.strikes as u128) << 64)
    }

    const fn unpack(word: u128) -> Self {
        Streak {
            // Truncations intended: the fields' bits (see `StrikeCell`).
            until: word as u64,
            strikes: (word >> 64) as u32,
        }
    }
}

impl Escalation {
    /// The lockout the `strikes`-th strike of a streak starts, ns: `None` below the
    /// threshold, then `first * 2^(strikes - threshold)`, capped.
    pub(crate) fn lockout(&self, strikes: u32) -> Option<u64> {
        let doublings = strikes.checked_sub(self.threshold)?;
        let grown = match 1u64.checked_shl(doublings) {
            Some(factor) => self.first.saturating_mul(factor),
            None => u64::MAX,
        };
        Some(grown.min(self.cap))
    }

    /// A stored `until` further ahead of `now` than any valid record could be (the clock
    /// went backwards) is treated as the furthest valid one: `now + max(W, cap)`. So a
    /// faulty clock never stretches a lockout beyond the cap.
    fn clamp(&self, streak: Streak, now: u64) -> Streak {
        Streak {
            until: streak
                .until
                .min(now.saturating_add(self.window.max(self.cap))),
            ..streak
        }
    }

    /// The record after the account struck at `now`.
    pub(crate) fn strike(&self, streak: Streak, now: u64) -> Streak {
        let streak = self.clamp(streak, now);
        if streak.strikes > 0 && now < streak.until {
            // Already counted in this window, or locked out: nothing more.
            return streak;
        }
        let continues = streak.strikes > 0 && now < streak.until.saturating_add(self.window);
        let strikes = if continues {
            streak.strikes.saturating_add(1)
        } else {
            1
        };
        let until = match self.lockout(strikes) {
            Some(lockout) => now.saturating_add(lockout),
            // The next window starts where the counted one ended (anchored, so a streak's
            // windows do not drift later with each strike).
            None if continues => streak.until.saturating_add(self.window),
            None => now.saturating_add(self.window),
        };
        Streak { strikes, until }
    }

    /// ns until the lockout ends, if the record locks the account out at `now`.
    pub(crate) fn locked_for(&self, streak: Streak, now: u64) -> Option<u64> {
        let streak = self.clamp(streak, now);
        (streak.strikes >= self.threshold && now < streak.until).then(|| streak.until - now)
    }

    /// The streak at `now`: 0 once it can no longer continue.
    pub(crate) fn streak(&self, streak: Streak, now: u64) -> u32 {
        if self.is_at_rest(streak, now) {
            0
        } else {
            streak.strikes
        }
    }

    /// `true` when the record decides exactly as no record from `now` on: not locked out,
    /// and a strike now would start a new streak.
    pub(crate) fn is_at_rest(&self, streak: Streak, now: u64) -> bool {
        let streak = self.clamp(streak, now);
        streak.strikes == 0 || now >= streak.until.saturating_add(self.window)
    }
}

/// One account's strike record in a single atomic word, updated by compare-and-swap.
///
/// | bits | field |
/// |---|---|
/// | 0..64 | `until`: ns on the guard's clock; the end of the window the latest strike was counted in, or of the lockout it started |
/// | 64..96 | `strikes`: strikes in the current streak (`u32`, saturating) |
/// | 96..128 | zero |
///
/// All zeros is a record with no strike, what a new account starts from. 128 bits because
/// `until` is a full clock reading: no room is left in 64 bits for the count without
/// losing precision or range. (`portable_atomic::AtomicU128`: a lock-free `cmpxchg16b` on
/// x86-64; this is not a hot path.)
///
/// Orderings: the word is the whole record and publishes no other memory, so every access
/// is `Relaxed`; a strike is a CAS from the exact snapshot it was computed from, so two
/// racing strikes are both applied, in one order (and the second, in the same window,
/// then adds nothing). The map's bucket lock keeps eviction out while a strike runs.
#[derive(Debug)]
pub(crate) struct StrikeCell {
    word: AtomicU128,
}

impl StrikeCell {
    pub(crate) fn fresh() -> Self {
        StrikeCell {
            word: AtomicU128::new(0),
        }
    }

    /// The record now.
    pub(crate) fn load(&self) -> Streak {
        // Relaxed: see the type's docs.
        Streak::unpack(self.word.load(Ordering::Relaxed))
    }

    /// Applies a strike at `now`; returns the record after it.
    pub(crate) fn strike(&self, escalation: &Escalation, now: u64) -> Streak {
        // Relaxed: see the type's docs; a stale read only makes the CAS fail and retry.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let next = escalation.strike(Streak::unpack(current), now).pack();
            if next == current {
                return Streak::unpack(current);
            }
            match self
                .word
                .compare_exchange(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Streak::unpack(next),
                Err(actual) => current = actual,
            }
        }
    }
}

/// A strike record with the escalation of a config, for the loom models; compiled only
/// under `--cfg tollgate_loom` (re-exported from `tollgate::model`).
#[cfg(tollgate_loom)]
#[doc(hidden)]
#[derive(Debug)]
pub struct ModelStrikes(StrikeCell, Escalation);

#[cfg(tollgate_loom)]
impl ModelStrikes {
    /// A record with no strike, escalating as `config` says.
    pub fn new(config: &LoginConfig) -> Self {
        ModelStrikes(StrikeCell::fresh(), config.escalation())
    }

    /// Strikes at `now`; returns the streak after it.
    pub fn strike(&self, now: u64) -> u32 {
        self.0.strike(&self.1, now).strikes
    }

    /// ns of lockout left at `now`, if locked out.
    pub fn locked_for(&self, now: u64) -> Option<u64> {
        self.1.locked_for(self.0.load(), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;

    fn defaults() -> Escalation {
        LoginConfig::default().escalation()
    }

    /// Strikes at each time (minutes); returns the records after each.
    fn run(e: &Escalation, minutes: &[u64]) -> Vec<Streak> {
        let mut streak = Streak::default();
        minutes
            .iter()
            .map(|&m| {
                streak = e.strike(streak, m * MIN);
                streak
            })
            .collect()
    }

    #[test]
    fn schedule_doubles_from_the_threshold_and_caps() {
        let e = defaults();
        let got: Vec<Option<u64>> = (1..=11).map(|s| e.lockout(s).map(|n| n / MIN)).collect();
        let want = [
            None,
            None,
            Some(15),
            Some(30),
            Some(60),
            Some(120),
            Some(240),
            Some(480),
            Some(960),
            Some(1440),
            Some(1440),
        ];
        assert_eq!(got, want);
        assert_eq!(e.lockout(u32::MAX), Some(1440 * MIN));
    }

    #[test]
    fn one_strike_per_window_and_windows_are_anchored() {
        let e = defaults();
        // 0: window [0, 15). 5, 14: same window. 20: window 2 [15, 30) -> 2 strikes, until 30.
        let r = run(&e, &[0, 5, 14, 20]);
        assert_eq!(
            r[0],
            Streak {
                strikes: 1,
                until: 15 * MIN
            }
        );
        assert_eq!(r[1], r[0]);
        assert_eq!(r[2], r[0]);
        assert_eq!(
            r[3],
            Streak {
                strikes: 2,
                until: 30 * MIN
            }
        );
        // 44: window 3 [30, 45) -> third strike: 15 min lockout from 44.
        let s = e.strike(r[3], 44 * MIN);
        assert_eq!(
            s,
            Streak {
                strikes: 3,
                until: 59 * MIN
            }
        );
        assert_eq!(e.locked_for(s, 44 * MIN), Some(15 * MIN));
        assert_eq!(e.locked_for(s, 59 * MIN), None);
    }

    #[test]
    fn a_window_without_a_strike_ends_the_streak() {
        let e = defaults();
        // Strike at 0 (window [0, 15)); window 2 is [15, 30); a strike at 30 starts over.
        let r = run(&e, &[0, 30]);
        assert_eq!(
            r[1],
            Streak {
                strikes: 1,
                until: 45 * MIN
            }
        );
        // Just inside window 2 continues it.
        let r = run(&e, &[0, 29]);
        assert_eq!(r[1].strikes, 2);
    }

    #[test]
    fn after_a_lockout_the_next_window_starts_when_it_ends() {
        let e = defaults();
        let r = run(&e, &[0, 15, 30]); // locked 30..45
        assert_eq!(
            r[2],
            Streak {
                strikes: 3,
                until: 45 * MIN
            }
        );
        assert_eq!(e.strike(r[2], 40 * MIN), r[2], "no strike while locked out");
        // Window after the lockout: [45, 60). A strike at 59 -> 30 min lockout.
        let s = e.strike(r[2], 59 * MIN);
        assert_eq!(
            s,
            Streak {
                strikes: 4,
                until: 89 * MIN
            }
        );
        // A strike only after [89, 104) has passed starts over.
        assert!(e.is_at_rest(s, 104 * MIN));
        assert!(!e.is_at_rest(s, 104 * MIN - 1));
        assert_eq!(
            e.strike(s, 104 * MIN),
            Streak {
                strikes: 1,
                until: 119 * MIN
            }
        );
    }

    #[test]
    fn threshold_of_one_locks_at_the_first_strike() {
        let config = LoginConfig::default().with_strikes_to_lock(1);
        let e = config.escalation();
        let s = e.strike(Streak::default(), 0);
        assert_eq!(
            s,
            Streak {
                strikes: 1,
                until: 15 * MIN
            }
        );
        assert_eq!(e.locked_for(s, 0), Some(15 * MIN));
    }

    #[test]
    fn backwards_clock_never_locks_beyond_the_cap() {
        let e = defaults();
        let far = Streak {
            strikes: 3,
            until: u64::MAX - 1,
        };
        assert_eq!(e.locked_for(far, 0), Some(1440 * MIN));
        let s = e.strike(far, 0);
        assert!(s.until <= 1440 * MIN);
    }

    #[test]
    fn packing_round_trips() {
        let s = Streak {
            strikes: u32::MAX,
            until: u64::MAX,
        };
        assert_eq!(Streak::unpack(s.pack()), s);
        assert_eq!(Streak::unpack(0), Streak::default());
        assert_eq!(Streak::unpack(0).pack(), 0);
    }

    #[test]
    fn cell_applies_strikes_once_per_window() {
        let e = defaults();
        let cell = StrikeCell::fresh();
        assert_eq!(cell.strike(&e, 0).strikes, 1);
        assert_eq!(cell.strike(&e, MIN).strikes, 1);
        assert_eq!(cell.strike(&e, 16 * MIN).strikes, 2);
        assert_eq!(
            cell.load(),
            Streak {
                strikes: 2,
                until: 30 * MIN
            }
        );
    }

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
    }
}
