//! Live policy changes that reach every server (`RedisLimiterBuilder::live_policy`): the
//! policy a `set_policy` stores in Redis, `<prefix>:live-policy` = `<chosen>|<policy>`, and
//! each instance's copy of it, read again at most once a second.
//!
//! Why stored and read, not published: a published message reaches the servers listening at
//! that moment only, where a stored policy also reaches a server that starts later, or whose
//! connection dropped meanwhile; and the keys' records (`lua/record.lua`) already make a
//! server whose copy is older follow the newer policy on every key a newer server has used
//! (and take it from there), so in the second between reads a server applies its old policy
//! only to keys no newer server has used since the change.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::error::BackendError;
use super::tiers::{Choice, Chosen, Tier};

/// How often an instance reads the stored policy again.
pub(super) const READ_EVERY: Duration = Duration::from_secs(1);

/// How much later than its instant a policy set live is dated (2^52 us, `lua/record.lua`):
/// later than any resolver's answer, so that it outranks them all, as `set_policy` replaces
/// the resolver in process.
pub(super) const LIVE_RANK: u64 = 1 << 52;

/// This instance's copy of the stored policy.
#[derive(Debug, Default)]
pub(super) struct Live {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The newest policy known here (`None`: none was ever set; the builder's applies).
    choice: Option<Choice>,
    /// The clock reading (ns) from which the stored policy is read again.
    next_read: u64,
}

impl Live {
    /// The newest policy known here, if any was set.
    pub(super) fn current(&self) -> Option<Choice> {
        self.state().choice.clone()
    }

    /// Whether the stored policy is due to be read at `now` (clock ns); if so, the next read
    /// is due [`READ_EVERY`] later, so that concurrent requests read it once.
    pub(super) fn due(&self, now: u64) -> bool {
        let mut state = self.state();
        if now < state.next_read {
            return false;
        }
        let every = u64::try_from(READ_EVERY.as_nanos()).unwrap_or(u64::MAX);
        state.next_read = now.saturating_add(every);
        true
    }

    /// Takes `choice` (a stored policy, dated on the script's clock) if it is newer than the
    /// policy known here: `true` when it was taken.
    pub(super) fn adopt(&self, choice: Choice) -> bool {
        let at = |choice: &Choice| match choice.chosen {
            Chosen::At(at) => at,
            Chosen::Since(_) => 0,
        };
        let mut state = self.state();
        let newer = state
            .choice
            .as_ref()
            .is_none_or(|known| at(&choice) > at(known));
        if newer {
            state.choice = Some(choice);
        }
        newer
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The Redis key of the stored policy of limiters with `prefix` (which holds their hash tag,
/// if any): no key's state or record is named so, as theirs hold the key's `{tag}`.
pub(super) fn key(prefix: &str) -> String {
    if prefix.is_empty() {
        "live-policy".to_owned()
    } else {
        format!("{prefix}:live-policy")
    }
}

/// The stored policy `<chosen>|<policy>` as a [`Choice`].
///
/// # Errors
///
/// [`BackendError::Reply`] for a value that is not one, [`BackendError::UnsupportedPolicy`]
/// for a policy the scripts cannot decide.
pub(super) fn parse(value: &str) -> Result<Choice, BackendError> {
    let bad = || BackendError::Reply(format!("a stored policy `{value}`"));
    let (chosen, text) = value.split_once('|').ok_or_else(bad)?;
    // Below 2^53, as the scripts take it (`lua/record.lua`).
    let chosen = chosen
        .parse()
        .ok()
        .filter(|&chosen: &u64| chosen < 2 * LIVE_RANK)
        .ok_or_else(bad)?;
    Ok(Choice {
        tier: Arc::new(Tier::recorded(text)?),
        chosen: Chosen::At(chosen),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(text: &str, chosen: u64) -> Choice {
        Choice {
            tier: Arc::new(Tier::new(text.parse().unwrap()).unwrap()),
            chosen: Chosen::At(chosen),
        }
    }

    /// Only a newer policy is taken; the stored form parses back; reads are due once a
    /// second.
    #[test]
    fn newer_wins_and_reads_are_spaced() {
        let live = Live::default();
        assert!(live.current().is_none());
        assert!(live.adopt(choice("5/1s", 10)));
        assert!(!live.adopt(choice("7/1s", 10)), "as new: kept");
        assert!(!live.adopt(choice("7/1s", 9)));
        assert!(live.adopt(choice("7/1s", 11)));
        assert_eq!(live.current().unwrap().tier.text, "token-bucket 7/1s");

        let parsed = parse("42|sliding-log 5/1min & 100/1h").unwrap();
        assert_eq!(parsed.chosen, Chosen::At(42));
        assert_eq!(
            parsed.tier.policy,
            "sliding-log 5/1min & 100/1h".parse().unwrap()
        );
        assert!(matches!(parse("5/1min"), Err(BackendError::Reply(_))));
        assert!(matches!(parse("x|5/1min"), Err(BackendError::Reply(_))));
        let beyond = format!("{}|5/1min", 2 * LIVE_RANK);
        assert!(matches!(parse(&beyond), Err(BackendError::Reply(_))));

        assert!(live.due(0));
        assert!(!live.due(999_999_999));
        assert!(live.due(1_000_000_000));
        assert_eq!(key(""), "live-policy");
        assert_eq!(key("api:{t}"), "api:{t}:live-policy");
    }
}
