//! [`LoginDecision`]: what a login attempt gets from a guard.

use std::time::Duration;

use crate::decision::Decision;

#[cfg(doc)]
use super::{LoginConfig, LoginGuard};

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
/// use tollgate::FakeClock;
/// use tollgate::login::{LoginDecision, LoginGuard};
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
        /// if it fails, included). For a client known for the account: failures it may still
        /// make there, on its own budget.
        account_left: u64,
        /// Failures the client may still record, over all accounts, before its limit
        /// refuses. For a client known for the account, the same as `account_left`: its own
        /// budget is the only limit it meets there.
        ip_left: u64,
    },
    /// The account's failure limit is exhausted (for a client known for the account: its
    /// own budget there).
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
    /// let guard = tollgate::login::LoginGuard::with_clock(tollgate::FakeClock::new());
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
    /// let guard = tollgate::login::LoginGuard::with_clock(tollgate::FakeClock::new());
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
    /// use tollgate::login::LoginDecision;
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
    pub(super) fn combine(locked: Option<(u64, u32)>, account: Decision, ip: Decision) -> Self {
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

    /// What a client known for the account gets: its own budget's verdict alone.
    pub(super) fn known(own: Decision) -> Self {
        if own.is_allowed() {
            // A peek that allows reports what would be left after admitting it.
            let left = own.remaining() + 1;
            LoginDecision::Allowed {
                account_left: left,
                ip_left: left,
            }
        } else {
            LoginDecision::Account {
                retry_after: own.retry_after(),
            }
        }
    }
}
