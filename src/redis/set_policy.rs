//! Setting the policy of every server: a `set_policy` stored in Redis for the others, and
//! each instance's reading of it (the state is in `live`).

use crate::policy::Policy;

use super::error::BackendError;
use super::failure::bump;
use super::live::{self, Live};
use super::shared::Shared;
use super::tiers::{Choice, Chosen, Tier};

impl Shared {
    /// Sets `policy` for every server: stored in Redis as chosen now (on the script's clock),
    /// unless a policy chosen no earlier is stored already (then that one is taken here
    /// instead), and taken here at once.
    pub(super) async fn set_policy(&self, policy: Policy) -> Result<Policy, BackendError> {
        let Some(known) = &self.live else {
            return Err(BackendError::InvalidSetting {
                setting: "live_policy",
                value: "off".to_owned(),
                reason: "set_policy reaches the other servers through a policy stored in Redis, which only limiters built with live_policy() read",
            });
        };
        let tier = Tier::new(policy)?;
        let key = live::key(&self.prefix);
        let now = self
            .test_micros()?
            .map_or_else(String::new, |micros| micros.to_string());
        let args = [now, "publish".to_owned(), tier.text.clone()];
        let reply = self
            .script
            .call(
                std::slice::from_ref(&key),
                &args,
                &self.counters.script_reloads,
                true,
                self.timeout,
            )
            .await
            .map_err(|_| BackendError::Timeout(self.timeout))??;
        let choice = match reply {
            ::redis::Value::BulkString(stored) => live::parse(&String::from_utf8_lossy(&stored))?,
            other => return Err(BackendError::Reply(format!("publish: {other:?}"))),
        };
        let policy = choice.tier.policy;
        self.take_live(known, choice);
        Ok(policy)
    }

    /// Reads the stored policy when it is due (at most once a second, and not while the
    /// failure policy decides), and takes it if it is newer than the one known here. A
    /// failed read changes nothing but `policy_read_failures` and a log line: the next one is
    /// a second later, and meanwhile the keys' records keep this server on the newest policy
    /// of every key a newer server has used.
    pub(super) async fn read_live(&self) {
        let Some(known) = &self.live else {
            return;
        };
        if self.breaker.is_failing() || !known.due(self.clock.now()) {
            return;
        }
        let get = ::redis::cmd("GET").arg(live::key(&self.prefix)).clone();
        let read = tokio::time::timeout(self.timeout, self.script.conn().query(&get)).await;
        let failed = |why: &dyn std::fmt::Display| {
            bump(&self.counters.policy_read_failures);
            let kept = known
                .current()
                .map_or_else(|| self.tier.text.clone(), |choice| choice.tier.text.clone());
            log::warn!(
                "tollgate: the policy set live (prefix `{}`) could not be read: {why}; keeping {kept}",
                self.prefix
            );
        };
        let stored = match read {
            Ok(Ok(::redis::Value::BulkString(stored))) => stored,
            // None stored yet.
            Ok(Ok(::redis::Value::Nil)) => return,
            Ok(Ok(other)) => return failed(&format_args!("not a string: {other:?}")),
            Ok(Err(err)) => return failed(&err),
            Err(_) => return failed(&format_args!("no answer within {:?}", self.timeout)),
        };
        match live::parse(&String::from_utf8_lossy(&stored)) {
            Ok(choice) => self.take_live(known, choice),
            Err(err) => failed(&err),
        }
    }

    /// A key's record named `choice`, a policy chosen later than this server's: taken at
    /// once for every key, as reading the stored policy would, when it is a policy set live
    /// (the records' dates put those after every resolver's answer), or when this limiter
    /// has no resolver (another server's configured policy, started later: a deploy).
    pub(super) fn learn_live(&self, choice: &Choice) {
        if let (Some(known), Chosen::At(at)) = (&self.live, choice.chosen) {
            if at >= live::LIVE_RANK || self.tiers.is_none() {
                self.take_live(known, choice.clone());
            }
        }
    }

    /// Takes `choice` as the policy in force here if it is newer than the one known; the
    /// deny cache's refusals, made under the old one, are forgotten.
    fn take_live(&self, known: &Live, choice: Choice) {
        if known.adopt(choice) {
            if let Some(cache) = &self.cache {
                cache.forget_all();
            }
        }
    }
}
