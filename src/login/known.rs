//! Known clients: a client that logged into an account successfully is *known* for that
//! account for a while, and is then judged by a failure budget of its own. Each account
//! keeps a short list of its known clients.

use crate::clock::Clock;
use crate::clock::Fixed;
use crate::decision::Decision;
use crate::engine::any_state::{any_state, AnyState};
use crate::engine::state::Decides;
use crate::policy::Policy;

/// The most clients an account keeps known at once; a success from one more replaces the
/// client whose latest success is the oldest. It bounds what one account (an attacker's own
/// included) can put into the guard's memory, however often it logs in.
pub(crate) const MAX_KNOWN_PER_ACCOUNT: usize = 16;

/// One account's known clients, at most [`MAX_KNOWN_PER_ACCOUNT`].
///
/// Changed only under the map bucket's exclusive lock (a success), read under its shared lock;
/// failures spend through each client's own lock-free budget.
#[derive(Debug, Default)]
pub(crate) struct KnownClients {
    clients: Vec<KnownClient>,
}

/// One known client of an account.
#[derive(Debug)]
struct KnownClient {
    /// The client's key (its masked address or its device token).
    client: Box<str>,
    /// ns on the guard's clock at which the client stops being known.
    until: u64,
    failures: AnyState,
}

impl KnownClient {
    /// What the client's next attempt gets at `clock`'s reading, spending nothing.
    fn next<C: Clock + ?Sized>(&self, clock: &C) -> Decision {
        match self.failures.peek(clock, 1) {
            Some(decision) => decision,
            None => unreachable!("a known client's budget is never retired"),
        }
    }
}

impl KnownClients {
    /// The client's verdict at `now` when it is known, spending nothing.
    pub(crate) fn peek(&self, client: &str, now: u64) -> Option<Decision> {
        Some(self.find(client, now)?.next(&Fixed(now)))
    }

    /// Spends one failure from the client's own budget when it is known (a full budget stays
    /// as it is), and returns what its next attempt gets; `None` when it is not known.
    pub(crate) fn fail<C: Clock + ?Sized>(
        &self,
        client: &str,
        clock: &C,
        now: u64,
    ) -> Option<Decision> {
        let known = self.find(client, now)?;
        let _ = known.failures.try_acquire(clock, 1);
        Some(known.next(clock))
    }

    /// Makes `client` known until `until`. A client known already keeps its place and its
    /// budget as it is, failures included: a success refills nothing, or whoever shares the
    /// client (an address the owner used, a stolen device cookie) would get a full budget
    /// after each of the owner's logins. A client not known gets a full budget under `policy`,
    /// in a new place, else in the place of the client whose latest success is the oldest.
    pub(crate) fn remember(&mut self, client: &str, policy: &Policy, until: u64, now: u64) {
        self.clients.retain(|known| now < known.until);
        if let Some(known) = self.clients.iter_mut().find(|k| *k.client == *client) {
            known.until = known.until.max(until);
            return;
        }
        let fresh = KnownClient {
            client: client.into(),
            until,
            failures: any_state(policy, None, now),
        };
        if self.clients.len() < MAX_KNOWN_PER_ACCOUNT {
            self.clients.push(fresh);
        } else if let Some(oldest) = self.clients.iter_mut().min_by_key(|known| known.until) {
            *oldest = fresh;
        }
    }

    /// Whether no client is known at `now`: the list decides as no list.
    pub(crate) fn is_idle(&self, now: u64) -> bool {
        self.clients.iter().all(|known| now >= known.until)
    }

    fn find(&self, client: &str, now: u64) -> Option<&KnownClient> {
        self.clients
            .iter()
            .find(|known| *known.client == *client && now < known.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_keeps_its_latest_clients_only() {
        let policy: Policy = "sliding-log 5/15m".parse().unwrap();
        let mut known = KnownClients::default();
        for i in 0..MAX_KNOWN_PER_ACCOUNT as u64 + 4 {
            known.remember(&format!("device-{i}"), &policy, 1_000 + i, 0);
        }
        assert_eq!(known.clients.len(), MAX_KNOWN_PER_ACCOUNT);
        assert!(
            known.peek("device-3", 0).is_none(),
            "the oldest were replaced"
        );
        assert!(known.peek("device-4", 0).is_some());
        // A success again keeps the client known longer, in its own place.
        known.remember("device-4", &policy, 5_000, 0);
        assert_eq!(known.clients.len(), MAX_KNOWN_PER_ACCOUNT);
        assert!(known.peek("device-4", 4_000).is_some());
        assert!(known.is_idle(5_000));
        assert!(!known.is_idle(4_999));
    }

    #[test]
    fn a_success_keeps_a_known_clients_failures() {
        let policy: Policy = "sliding-log 2/15m".parse().unwrap();
        let clock = Fixed(0);
        let mut known = KnownClients::default();
        known.remember("device", &policy, 1_000, 0);
        let _ = known.fail("device", &clock, 0);
        let spent = known.fail("device", &clock, 0).unwrap();
        assert!(!spent.is_allowed());
        known.remember("device", &policy, 2_000, 0);
        assert_eq!(known.peek("device", 0), Some(spent), "not refilled");
        assert!(known.peek("device", 1_500).is_some(), "known for longer");
    }
}
