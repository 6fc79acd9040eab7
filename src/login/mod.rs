//! Login-attempt protection: [`LoginGuard`], failed attempts limited per account and per
//! client at once, lockouts that grow for accounts attacked again and again, and *known
//! clients* that keep their account's owner able to log in while it is attacked.
//!
//! ```
//! use tollgate::login::LoginGuard;
//! use tollgate::FakeClock;
//!
//! let guard = LoginGuard::with_clock(FakeClock::new()); // 5/15m per account, 20/1h per client
//! assert!(guard.check("alice", "203.0.113.66").is_allowed());
//! for _ in 0..5 {
//!     let _ = guard.record_failure("alice", "203.0.113.66"); // five wrong passwords
//! }
//! assert!(!guard.check("alice", "203.0.113.66").is_allowed()); // 429, with Retry-After
//! ```
//!
//! Inside:
//!
//! | module | job |
//! |---|---|
//! | `config` | [`LoginConfig`]: the limits, the lockout schedule, how long a client stays known |
//! | `decision` | [`LoginDecision`]: what an attempt gets |
//! | `client` | [`LoginClient`]: an address (masked) or a device token, and the keys it is filed under |
//! | `strikes` | the escalation arithmetic and the per-account strike word |
//! | `known` | an account's known clients, each with its own failure budget |
//!
//! The guard itself is built from the crate's own parts: two [`RateLimiter`]s count failures
//! per account and per client, and two capped maps hold the strike records and the known
//! clients.

mod client;
mod config;
mod decision;
mod known;
pub(crate) mod strikes;

use std::fmt;

use crate::bounded::BoundedMap;
use crate::clock::{duration_to_nanos, Clock, SystemClock};
use crate::keyed::RateLimiter;
use crate::keys::KeyHasher;

pub use client::LoginClient;
pub use config::{LoginConfig, LoginConfigError};
pub use decision::LoginDecision;

use known::KnownClients;
use strikes::{Escalation, StrikeCell};

/// Protection for a login form: failed attempts limited per account and per client at once,
/// lockouts that grow for an account that keeps exhausting its limit, and known clients that
/// let the account's owner in while it is under attack.
///
/// | method | when | does |
/// |---|---|---|
/// | [`check`](LoginGuard::check) | before verifying a password | refuses while the client's limits have no room or the account is locked out; spends nothing |
/// | [`record_failure`](LoginGuard::record_failure) | after a wrong password | counts one failure; may strike and lock the account out for unknown clients |
/// | [`record_success`](LoginGuard::record_success) | after a right password | makes the client *known* for the account |
/// | [`unlock`](LoginGuard::unlock) | an administrator's action | forgets the account's failures, strikes and lockout |
/// | [`evict_idle`](LoginGuard::evict_idle) | from a timer | drops records that no longer matter |
/// | [`max_keys`](LoginGuard::max_keys) | at construction | caps every map the guard keeps |
///
/// Only failures are counted: a user who logs in successfully spends nothing. The client
/// limit stops one client trying many accounts (credential stuffing, password spraying); the
/// account limit stops many clients trying one account (a botnet rotating addresses); the
/// lockout schedule (on [`LoginConfig`]) slows an attacker who keeps using up the account
/// limit, window after window.
///
/// What each bound leaves, at the defaults:
/// * an attacker who stays one guess under the account limit in every window (or who
///   reaches it in two windows of three) never strikes three windows in a row, so no
///   lockout starts: the account limit alone holds it, about 400 to 450 guesses a day on
///   one account. Give the account limit a longer band too
///   (`sliding-log 5/15m & sliding-log 30/1d`) to bound the day;
/// * a client known for an account skips the client limit there, so an address known for
///   many accounts (a carrier's NAT, an office) lets whoever is behind it try each of them
///   up to its account limit, however many they are.
///
/// # Known clients: the owner gets in while the account is attacked
///
/// A lockout that every client meets would be a weapon: an attacker who sends a few wrong
/// passwords whenever the lockout ends keeps the real owner out for days. So a client that
/// logged into the account successfully ([`record_success`](LoginGuard::record_success)) is
/// **known** for that account for [`LoginConfig::remember_clients`] (30 days by default,
/// counted from its latest success). A known client is judged only by a failure budget of its
/// own for that account ([`LoginConfig::known_client_limit`], `sliding-log 5/15m` by
/// default): neither the account's limit and lockouts nor the client limit refuse it, and
/// its failures there count only against its own budget (an owner's typos never lock the
/// account). Every other client keeps the account's rules, so an attacker's guesses stay
/// within the account limit and the lockout schedule however long the attack lasts, and a
/// success does not forgive them: the account's failures and strikes are forgotten only as
/// time passes, or by [`unlock`](LoginGuard::unlock).
///
/// A known client's own budget has no lockout: with the default 5 per 15 minutes, whoever
/// can present a known client (anyone behind a shared address the owner used, or a thief of
/// the owner's device cookie) gets at most 480 guesses a day on that account, until the
/// client's 30 days run out. The owner's successes from that client refill none of it: they
/// only keep the client known for longer. Each account keeps at most 16 known clients (a
/// success from one more replaces the one whose latest success is the oldest), so logging
/// in over and over from new devices cannot fill the guard's memory from one account.
///
/// Pass the client as a `(device token, address)` pair where you can: the token (a random id
/// your server issued in a signed cookie) recognises a known client, and the client limit
/// counts per address, so fresh tokens buy no fresh budgets. An address alone also works,
/// but it can be shared, and everyone behind a shared address is known once its owner logged
/// in from there. See [`LoginClient`] for the forms a client takes and how addresses are
/// masked.
///
/// # Bounded memory
///
/// [`check`](LoginGuard::check) creates nothing, so probing account names costs no memory;
/// records appear only when failures and successes are recorded, and leave when they no
/// longer affect any decision (swept a few at a time as new ones arrive, or all at once by
/// [`evict_idle`](LoginGuard::evict_idle)). With [`max_keys`](LoginGuard::max_keys) every map
/// the guard keeps is capped; see there for what happens when one is full.
///
/// # Check, then record
///
/// `check` and `record_failure` are separate calls, with the password check between them,
/// so two attempts racing on one account can both pass `check` before either records its
/// failure: a burst of concurrent attempts can verify as many passwords as run at once
/// while the last permit is being spent (64 threads started together verify 64 against a
/// limit of 5). The limits themselves stay exact (each
/// `record_failure` spends through a lock-free limiter, and a full limit refuses to
/// record more), so from then on `check` refuses. To bound this, serialise attempts per
/// account, or verify only while holding a
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) permit of limit 1 for the account.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::FakeClock;
/// use tollgate::login::{LoginDecision, LoginGuard};
///
/// let clock = FakeClock::new();
/// let guard = LoginGuard::with_clock(clock.clone()); // 5/15m per account, 20/1h per client
/// let verify = |password: &str| password == "correct horse";
///
/// let attempt = |client: &str, password: &str| -> Result<(), LoginDecision> {
///     let decision = guard.check("alice", client);
///     if !decision.is_allowed() {
///         return Err(decision); // 429 with Retry-After
///     }
///     if verify(password) {
///         guard.record_success("alice", client);
///         Ok(())
///     } else {
///         Err(guard.record_failure("alice", client)) // 401
///     }
/// };
/// assert!(attempt("198.51.100.4", "correct horse").is_ok()); // alice's laptop, now known
/// for _ in 0..5 {
///     let _ = attempt("203.0.113.66", "guess"); // someone else
/// }
/// assert_eq!(
///     attempt("203.0.113.66", "correct horse"),
///     Err(LoginDecision::Account { retry_after: Duration::from_secs(900) })
/// );
/// assert!(attempt("198.51.100.4", "correct horse").is_ok()); // alice still gets in
/// ```
pub struct LoginGuard<C = SystemClock> {
    accounts: RateLimiter<String, C>,
    clients: RateLimiter<String, C>,
    /// The strike record of each account that has struck and whose streak may still
    /// continue (or is locked out).
    records: BoundedMap<String, StrikeCell, KeyHasher>,
    /// The strike record shared by accounts that have none while `records` is full.
    overflow_record: StrikeCell,
    /// Each account's known clients.
    known: BoundedMap<String, KnownClients, KeyHasher>,
    escalation: Escalation,
    /// How long a success keeps a client known, ns (0: never known).
    remember: u64,
    config: LoginConfig,
}

impl LoginGuard<SystemClock> {
    /// A guard with the default [`LoginConfig`] on the real clock.
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::login::LoginGuard::new();
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
    /// use tollgate::FakeClock;
    /// use tollgate::login::LoginGuard;
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
    /// `max_lockout` is shorter than `first_lockout`, or it or `remember_clients` is longer
    /// than [`Policy::MAX_WINDOW`](crate::Policy::MAX_WINDOW).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::FakeClock;
    /// use tollgate::login::{LoginConfig, LoginGuard};
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
            accounts: RateLimiter::with_clock(config.account_limit(), clock.clone()),
            clients: RateLimiter::with_clock(config.ip_limit(), clock),
            records: BoundedMap::with_hasher(KeyHasher::default()),
            overflow_record: StrikeCell::fresh(),
            known: BoundedMap::with_hasher(KeyHasher::default()),
            escalation: config.escalation(),
            remember: duration_to_nanos(config.remember_clients()),
            config,
        }
    }

    /// This guard keeping at most `max_keys` keys in each of its maps: failure logs per
    /// account, failure logs per client, strike records, and known clients (per account, at
    /// most 16 clients each). Each map holds its keys exactly while it tracks them, sweeps
    /// records that no longer matter as new ones arrive, and never drops a record that still
    /// affects a decision to make room: a flood of new names cannot reset anyone's spent
    /// budget or end a lockout.
    ///
    /// When a map is full (every record in it still matters), the keys it does not track get
    /// a shared record instead, as [`RateLimiter::max_keys`] describes:
    ///
    /// * accounts the account map does not track share one failure budget while it is full,
    ///   and clients likewise;
    /// * accounts that strike while the strike records are full share one strike record,
    ///   which every account without a record of its own then meets until it comes to rest
    ///   (so strikes that went there are not lost when places free up; [`unlock`] clears it);
    /// * a client that logs in while the known map is full is not made known (it keeps the
    ///   account's rules) until places free up.
    ///
    /// So a flood that fills the guard makes it refuse untracked accounts' unknown clients
    /// rather than let guesses through. That is a denial of service by design, and its reach
    /// is worth knowing: to bring the shared strike record into force, an attacker must keep
    /// `max_keys` accounts striking (a full account limit each, every strike window) and then
    /// strike three windows in a row; every account without a record of its own is then
    /// locked out for unknown clients, escalating like one account. Tracked accounts keep
    /// their exact counts, and known clients keep getting in: their budgets live in their
    /// known record. Size `max_keys` well above the accounts that fail in one strike window
    /// on a bad day, and above the clients that log in within the time a client stays known
    /// (30 days by default): the known map shares the cap, and a success while it is full
    /// makes no client known, so an owner's own device is then held to the account's rules
    /// (locked out with the attacker). Successes are not limited: an attacker with many
    /// accounts of its own can fill the known map. `max_keys(0)` makes every account and
    /// client share one record.
    ///
    /// Memory is then bounded by `max_keys` times the cost of one record per map (about two
    /// hundred bytes with the default sliding logs).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::FakeClock;
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new()).max_keys(100_000);
    /// assert!(guard.check("alice", "192.0.2.1").is_allowed());
    /// ```
    ///
    /// [`unlock`]: LoginGuard::unlock
    #[must_use]
    pub fn max_keys(self, max_keys: usize) -> Self {
        LoginGuard {
            accounts: self.accounts.max_keys(max_keys),
            clients: self.clients.max_keys(max_keys),
            records: self.records.max_entries(max_keys),
            known: self.known.max_entries(max_keys),
            ..self
        }
    }
}

impl<C: Clock> LoginGuard<C> {
    /// Whether a login attempt for `account` from `client` may go ahead: call it before
    /// verifying the password. Spends nothing and creates nothing.
    ///
    /// A client known for the account is judged by its own budget alone. Any other client
    /// is refused while the account is locked out, or while the account's or the client's
    /// failure limit has no room (see [`LoginDecision`] for which one is named when several
    /// refuse).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::FakeClock;
    /// use tollgate::login::{LoginDecision, LoginGuard};
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
    pub fn check<'c>(&self, account: &str, client: impl Into<LoginClient<'c>>) -> LoginDecision {
        let client = client.into();
        let now = self.clock().now();
        if let Some(decision) = self.check_known(account, &client.known_key(), now) {
            return decision;
        }
        let locked = self
            .record_of(account, now, |record| {
                let streak = record.load();
                self.escalation
                    .locked_for(streak, now)
                    .map(|nanos| (nanos, streak.strikes()))
            })
            .flatten();
        LoginDecision::combine(
            locked,
            self.accounts.peek(account),
            self.clients.peek(&*client.limit_key()),
        )
    }

    /// What a known client gets: `None` when `client` is not known for `account` at `now`.
    fn check_known(&self, account: &str, client: &str, now: u64) -> Option<LoginDecision> {
        if self.remember == 0 {
            return None;
        }
        let own = self
            .known
            .read(account, |known| known.peek(client, now))
            .flatten()?;
        Some(LoginDecision::known(own))
    }

    /// Records a failed attempt (a wrong password) for `account` from `client`, and returns
    /// what the next attempt would get (as [`check`](LoginGuard::check) would answer now).
    ///
    /// From a client known for the account, the failure spends one permit of that client's
    /// own budget, and nothing else. From any other client, it spends one permit in the
    /// account's limit and in the client's limit, each if it has room (a full limit stays
    /// full: its refusal writes nothing). If it leaves the account limit exhausted, the
    /// account strikes; strikes in consecutive windows escalate to lockouts (see
    /// [`LoginConfig`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::FakeClock;
    /// use tollgate::login::{LoginDecision, LoginGuard};
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
    pub fn record_failure<'c>(
        &self,
        account: &str,
        client: impl Into<LoginClient<'c>>,
    ) -> LoginDecision {
        let client = client.into();
        let now = self.clock().now();
        if self.remember > 0 {
            let known_key = client.known_key();
            let own = self
                .known
                .read(account, |known| known.fail(&known_key, self.clock(), now))
                .flatten();
            if let Some(own) = own {
                return LoginDecision::known(own);
            }
        }
        let spent = self.accounts.try_acquire(account);
        let _ = self.clients.try_acquire(&*client.limit_key());
        if spent.remaining() == 0 {
            // Exhausted now, by this failure or before it: a strike, counted at most once
            // per strike window by the escalation.
            self.strike(account, self.clock().now());
        }
        self.check(account, client)
    }

    fn strike(&self, account: &str, now: u64) {
        let escalation = &self.escalation;
        let struck = self
            .records
            .read(account, |record| record.strike(escalation, now));
        if struck.is_some() {
            return;
        }
        // First strike of the account (or its record was swept): create the record under
        // the bucket's exclusive lock, one per account however many race here.
        let created = self.records.get_or_insert(
            account.to_owned(),
            StrikeCell::fresh,
            |record| escalation.is_at_rest(record.load(), now),
            |record| record.strike(escalation, now),
        );
        if created.is_none() {
            // Full of records that still matter: the account shares the overflow record.
            self.overflow_record.strike(escalation, now);
        }
    }

    /// `f` on the account's strike record: its own, or, when it has none, the shared overflow
    /// record while that is in force (not at rest at `now`). So an account whose strikes went
    /// to the overflow record keeps them when places free up.
    fn record_of<R>(&self, account: &str, now: u64, f: impl Fn(&StrikeCell) -> R) -> Option<R> {
        self.records.read(account, &f).or_else(|| {
            let shared = &self.overflow_record;
            (!self.escalation.is_at_rest(shared.load(), now)).then(|| f(shared))
        })
    }

    /// Records a successful login for `account` from `client`: the client becomes *known*
    /// for the account for [`LoginConfig::remember_clients`] from now. A client not known
    /// yet starts with a full budget of its own there; a client known already stays known
    /// for longer and keeps its budget as it is.
    ///
    /// It forgives nothing: not the known client's own failures (whoever shares the client,
    /// behind an address the owner used or with a stolen device cookie, would get a full
    /// budget again each time the owner logs in), nor the account's failures and strikes,
    /// which every other client shares (that would hand an attacker a fresh budget each
    /// time the owner logs in), nor the client's failures on other accounts. To clear an
    /// account, use [`unlock`](LoginGuard::unlock). Call it only after
    /// [`check`](LoginGuard::check) allowed the attempt and the password was right.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::FakeClock;
    /// use tollgate::login::{LoginDecision, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// guard.record_success("alice", "device-5f1c");
    /// for _ in 0..5 {
    ///     let _ = guard.record_failure("alice", "192.0.2.1"); // an attacker
    /// }
    /// assert!(!guard.check("alice", "192.0.2.1").is_allowed());
    /// assert_eq!(
    ///     guard.check("alice", "device-5f1c"), // judged by its own budget
    ///     LoginDecision::Allowed { account_left: 5, ip_left: 5 }
    /// );
    /// ```
    pub fn record_success<'c>(&self, account: &str, client: impl Into<LoginClient<'c>>) {
        if self.remember == 0 {
            return;
        }
        let now = self.clock().now();
        let until = now.saturating_add(self.remember);
        let policy = self.config.known_client_limit();
        let client = client.into().known_key();
        // A full map leaves the client unknown: it keeps the account's rules.
        let _ = self.known.upsert(
            account.to_owned(),
            KnownClients::default,
            |known| known.remember(&client, &policy, until, now),
            |known| known.is_idle(now),
        );
    }

    /// Forgets the account's failures, its strikes and any lockout: an administrator's
    /// unlock. Known clients and the clients' own failure counts stay as they are.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::FakeClock;
    /// use tollgate::login::{LoginDecision, LoginGuard};
    ///
    /// let guard = LoginGuard::with_clock(FakeClock::new());
    /// for _ in 0..3 {
    ///     let _ = guard.record_failure("alice", "192.0.2.1");
    /// }
    /// guard.unlock("alice");
    /// assert_eq!(
    ///     guard.check("alice", "192.0.2.1"),
    ///     LoginDecision::Allowed { account_left: 5, ip_left: 17 }
    /// );
    /// ```
    pub fn unlock(&self, account: &str) {
        self.accounts.reset(account);
        if !self.records.remove(account) {
            // The account has no record of its own: any lockout it meets is the shared
            // overflow record's (see `max_keys`), which is cleared with it.
            self.overflow_record.clear();
        }
    }

    /// The account's current streak: strikes in consecutive windows, 0 when it has none
    /// (never struck, unlocked, or the streak lapsed).
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::login::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert_eq!(guard.strikes("alice"), 0);
    /// for _ in 0..5 {
    ///     let _ = guard.record_failure("alice", "192.0.2.1");
    /// }
    /// assert_eq!(guard.strikes("alice"), 1);
    /// ```
    #[must_use]
    pub fn strikes(&self, account: &str) -> u32 {
        let now = self.clock().now();
        self.record_of(account, now, |record| {
            self.escalation.streak(record.load(), now)
        })
        .unwrap_or(0)
    }

    /// Drops every record that no longer affects a decision: account and client failure
    /// logs at rest, strike records whose streak is over and lockout ended, and clients no
    /// longer known. Returns how many it removed over the four maps. Exact while attempts
    /// run; call it from a timer (the guard also sweeps a few records each time it creates
    /// one, so it never needs this to stay bounded).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::FakeClock;
    /// use tollgate::login::LoginGuard;
    ///
    /// let clock = FakeClock::new();
    /// let guard = LoginGuard::with_clock(clock.clone());
    /// let _ = guard.record_failure("alice", "192.0.2.1");
    /// clock.advance(Duration::from_secs(15 * 60));
    /// assert_eq!(guard.evict_idle(), 1); // alice's log; the client's counts for an hour
    /// clock.advance(Duration::from_secs(45 * 60));
    /// assert_eq!(guard.evict_idle(), 1);
    /// ```
    pub fn evict_idle(&self) -> usize {
        let now = self.clock().now();
        // Records change only under their bucket's lock (shared or exclusive) and are
        // removed under it exclusively: no strike is lost. A record at rest (or a client no
        // longer known) decides exactly as no record, so removing it changes nothing.
        self.accounts.evict_idle()
            + self.clients.evict_idle()
            + self
                .records
                .evict(|record| self.escalation.is_at_rest(record.load(), now))
            + self.known.evict(|known| known.is_idle(now))
    }

    /// The configuration the guard enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// let guard = tollgate::login::LoginGuard::with_clock(tollgate::FakeClock::new());
    /// assert_eq!(guard.config().ip_limit().first_band().permits(), 20);
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
    /// use tollgate::{Clock, FakeClock};
    /// use tollgate::login::LoginGuard;
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
