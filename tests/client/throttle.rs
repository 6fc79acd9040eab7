//! The throttle alone: first come first served, cancellation, the maximum wait, exactness
//! under racing callers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::client::{Throttle, ThrottleError};
use tollgate::clock::TokioClock;
use tollgate::{Clock, DirectLimiter, FakeClock, RateLimiter};

fn one_per_second() -> Arc<DirectLimiter<TokioClock>> {
    Arc::new(DirectLimiter::with_clock(
        "1/1s".parse().unwrap(),
        TokioClock::new(),
    ))
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_the_order_they_came() {
    let throttle = Throttle::new(one_per_second());
    let start = Instant::now();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (throttle, order) = (throttle.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let _call = throttle.acquire("api").await.unwrap();
            order.lock().unwrap().push((i, start.elapsed()));
        }));
        // Each asks a moment after the one before.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let expected: Vec<(i32, Duration)> =
        (0..6).map(|i| (i, Duration::from_secs(i as u64))).collect();
    assert_eq!(order, expected);
    let stats = throttle.stats();
    assert_eq!((stats.admitted, stats.waited), (6, 5));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_place_up_and_takes_nothing() {
    let budget = one_per_second();
    let throttle = Throttle::new(Arc::clone(&budget));
    let start = Instant::now();
    let _first = throttle.acquire("api").await.unwrap();
    let second = tokio::spawn({
        let throttle = throttle.clone();
        async move { throttle.acquire("api").await.map(|_| start.elapsed()) }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let third = tokio::spawn({
        let throttle = throttle.clone();
        async move { throttle.acquire("api").await.map(|_| start.elapsed()) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    // The third takes the second's place: the permit of second 1, no later.
    assert_eq!(third.await.unwrap().unwrap(), Duration::from_secs(1));
    // Nothing was lost or spent twice: the next permit is the one of second 2.
    assert!(!budget.peek().is_allowed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(budget.peek().is_allowed());
    assert_eq!(throttle.stats().admitted, 2);
}

#[tokio::test(start_paused = true)]
async fn the_maximum_wait_fails_with_a_typed_error_and_spends_nothing() {
    let budget = Arc::new(DirectLimiter::with_clock(
        "1/min".parse().unwrap(),
        TokioClock::new(),
    ));
    let throttle = Throttle::new(Arc::clone(&budget)).max_wait(Duration::from_secs(5));
    let _first = throttle.acquire("api").await.unwrap();
    let before = budget.peek();
    match throttle.acquire("api").await {
        Err(ThrottleError::TimedOut {
            key,
            waited,
            retry_after,
        }) => {
            assert_eq!(key, "api");
            assert_eq!(waited, Duration::ZERO, "gave up at once: 60 s is past 5 s");
            assert_eq!(retry_after, Duration::from_secs(60));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(budget.peek(), before);
    assert_eq!(throttle.stats().timed_out, 1);

    // A call queued behind one that waits longer than its own maximum gives up in the queue.
    let patient = throttle.clone().max_wait(Duration::from_secs(120));
    let head = tokio::spawn({
        let patient = patient.clone();
        async move { patient.acquire("api").await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let start = Instant::now();
    let queued = throttle.acquire("api").await.unwrap_err();
    assert!(
        matches!(queued, ThrottleError::TimedOut { .. }),
        "{queued:?}"
    );
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(head.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_cost_the_policy_cannot_admit_fails_at_once() {
    let throttle = Throttle::new(one_per_second());
    let err = throttle.acquire_n("api", 2).await.unwrap_err();
    assert!(
        matches!(err, ThrottleError::Cost { ref key, .. } if key == "api"),
        "{err:?}"
    );
    let err = throttle
        .acquire("api")
        .await
        .unwrap()
        .settle(1)
        .await
        .unwrap_err();
    assert!(matches!(err, ThrottleError::NotReserved { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn keys_wait_apart() {
    let per_key: RateLimiter<String, TokioClock> =
        RateLimiter::with_clock("1/1s".parse().unwrap(), TokioClock::new());
    let throttle = Throttle::new(per_key);
    let start = Instant::now();
    throttle.acquire("a").await.unwrap();
    throttle.acquire("b").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    throttle.acquire("a").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[test]
fn sixteen_racing_callers_on_a_frozen_budget_get_exactly_its_permits() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..20 {
        let clock = FakeClock::new();
        let budget = Arc::new(DirectLimiter::with_clock(
            "10/1s".parse().unwrap(),
            clock.clone(),
        ));
        let throttle = Throttle::new(Arc::clone(&budget)).max_wait(Duration::from_millis(20));
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let outcomes: Vec<bool> = runtime.block_on(async {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (throttle, barrier) = (throttle.clone(), Arc::clone(&barrier));
                    tokio::spawn(async move {
                        barrier.wait().await;
                        throttle.acquire("api").await.is_ok()
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for task in tasks {
                outcomes.push(task.await.unwrap());
            }
            outcomes
        });
        assert_eq!(outcomes.iter().filter(|&&ok| ok).count(), 10);
        assert_eq!(throttle.stats().timed_out, 6);
        assert_eq!(clock.now(), 0, "the clock never moved");
    }
}

#[tokio::test(start_paused = true)]
async fn limiters_wait_for_n_permits_at_once() {
    let keyed: RateLimiter<String, TokioClock> =
        RateLimiter::with_clock("10/1s".parse().unwrap(), TokioClock::new());
    let direct = DirectLimiter::with_clock("10/1s".parse().unwrap(), TokioClock::new());
    let start = Instant::now();
    assert!(keyed.acquire_n("a", 8).await.unwrap().is_allowed());
    assert!(direct.acquire_n(8).await.unwrap().is_allowed());
    assert!(keyed.acquire_n("a", 6).await.unwrap().is_allowed());
    assert!(direct.acquire_n(6).await.unwrap().is_allowed());
    // 4 more permits at 100 ms each: both waited 400 ms, side by side.
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert!(keyed.acquire_n("a", 11).await.is_err());
    assert!(direct.acquire_n(11).await.is_err());
    let wait = tollgate::wait::Wait::new().timeout(Duration::from_millis(50));
    assert!(keyed.acquire_n_with("a", 10, wait).await.unwrap().is_err());
    assert!(direct.acquire_n_with(10, wait).await.unwrap().is_err());
}

fn answer(status: u16, fields: &[(&'static str, &str)]) -> (http::StatusCode, http::HeaderMap) {
    let mut headers = http::HeaderMap::new();
    for (name, value) in fields {
        headers.append(*name, value.parse().unwrap());
    }
    (http::StatusCode::from_u16(status).unwrap(), headers)
}

#[tokio::test(start_paused = true)]
async fn a_short_pause_after_a_long_cap_lasts_only_its_own_time() {
    let throttle = Throttle::quota("1000/1s".parse().unwrap()).unwrap();
    let (ok, capped) = answer(200, &[("ratelimit", "\"d\";r=1000;t=300")]);
    throttle.acquire("k").await.unwrap().heard(ok, &capped);
    let (refused, retry) = answer(429, &[("retry-after", "1")]);
    throttle.acquire("k").await.unwrap().heard(refused, &retry);
    let start = Instant::now();
    throttle.acquire("k").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn fields_count_calls_unless_told_they_count_the_cost() {
    let tokens = || {
        let budget: RateLimiter<String, TokioClock> =
            RateLimiter::with_clock("100000/min".parse().unwrap(), TokioClock::new());
        Throttle::new(budget)
    };
    let (ok, requests_left) = answer(200, &[("ratelimit", "\"requests\";r=99;t=60")]);
    // 99 requests left upstream: a call of 1,500 tokens goes at once.
    let by_calls = tokens();
    by_calls
        .reserve_n("llm", 1_500)
        .await
        .unwrap()
        .heard(ok, &requests_left);
    let start = Instant::now();
    by_calls.reserve_n("llm", 1_500).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Read as 99 tokens, it waits for the reset.
    let by_cost = tokens().fields_count_cost();
    by_cost
        .reserve_n("llm", 1_500)
        .await
        .unwrap()
        .heard(ok, &requests_left);
    by_cost.reserve_n("llm", 1_500).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_gives_up_in_the_queue_is_told_how_long_the_head_still_waits() {
    let budget = Arc::new(DirectLimiter::with_clock(
        "1/min".parse().unwrap(),
        TokioClock::new(),
    ));
    let throttle = Throttle::new(budget);
    let _first = throttle.acquire("api").await.unwrap();
    let head = tokio::spawn({
        let throttle = throttle.clone();
        async move { throttle.acquire("api").await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let hurried = throttle.clone().max_wait(Duration::from_secs(1));
    match hurried.acquire("api").await {
        Err(ThrottleError::TimedOut { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::from_millis(58_999));
        }
        other => panic!("{other:?}"),
    }
    assert!(head.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_permit_exactly_at_the_maximum_wait_is_waited_for() {
    let throttle = Throttle::new(one_per_second()).max_wait(Duration::from_secs(1));
    let start = Instant::now();
    throttle.acquire("api").await.unwrap();
    throttle.acquire("api").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_unanswered_is_no_longer_in_flight() {
    let throttle = Throttle::new(DirectLimiter::with_clock(
        "100/1s".parse().unwrap(),
        TokioClock::new(),
    ));
    drop(throttle.acquire("api").await.unwrap());
    // Had the dropped call stayed in flight, 2 - 1 would be left: one call, then a wait.
    let (ok, two_left) = answer(200, &[("ratelimit", "\"d\";r=2;t=10")]);
    throttle.acquire("api").await.unwrap().heard(ok, &two_left);
    let start = Instant::now();
    throttle.acquire("api").await.unwrap();
    throttle.acquire("api").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    throttle.acquire("api").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_throttle_shows_its_policy_and_settings() {
    let throttle = Throttle::quota("4/1s".parse().unwrap())
        .unwrap()
        .max_wait(Duration::from_secs(3));
    assert_eq!(
        throttle.policy().unwrap().to_string(),
        "sliding-log 4/1020ms"
    );
    let shown = format!("{throttle:?}");
    assert!(shown.contains("max_wait: Some(3s)"), "{shown}");
    let call = throttle.acquire_n("api", 2).await.unwrap();
    let shown = format!("{call:?}");
    assert!(
        shown.contains("\"api\"") && shown.contains("reserved: false"),
        "{shown}"
    );
}

/// An upstream that names several policies in one `RateLimit` field (a burst and a day):
/// the throttle keeps each, so the day's 2 left still hold once the burst has reset, and
/// no call goes out that the upstream said it would refuse.
#[tokio::test(start_paused = true)]
async fn every_policy_of_a_field_is_kept() {
    use http::{HeaderMap, StatusCode};
    for fields in [
        &["\"burst\";r=0;t=1, \"day\";r=2;t=900"][..],
        // The same list in two lines.
        &["\"burst\";r=0;t=1", "\"day\";r=2;t=900"][..],
    ] {
        let throttle = Throttle::quota("10/1s".parse().unwrap()).unwrap();
        let mut call = throttle.acquire("api").await.unwrap();
        let mut headers = HeaderMap::new();
        for line in fields {
            headers.append("ratelimit", line.parse().unwrap());
        }
        call.heard(StatusCode::OK, &headers);
        drop(call);
        let start = Instant::now();
        let mut sent = Vec::new();
        while sent.len() < 3 {
            std::mem::forget(throttle.acquire("api").await.unwrap());
            sent.push(start.elapsed());
        }
        assert_eq!(
            sent,
            [
                Duration::from_secs(1),
                Duration::from_secs(1),
                Duration::from_secs(900)
            ],
            "{fields:?}"
        );
        assert_eq!(throttle.stats().malformed, 0);
    }
}

/// After a `200` answered with `fields`, on a budget of `100/1s`, the next call waits the
/// minute the fields' strictest report says, and no field was malformed.
async fn holds_for_a_minute(fields: &[(&'static str, &str)]) {
    let throttle = Throttle::new(DirectLimiter::with_clock(
        "100/1s".parse().unwrap(),
        TokioClock::new(),
    ));
    let (ok, stop) = answer(200, fields);
    throttle.acquire("api").await.unwrap().heard(ok, &stop);
    let start = Instant::now();
    throttle.acquire("api").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(60), "{fields:?}");
    assert_eq!(throttle.stats().malformed, 0);
}

/// An answer with several styles of fields: the strictest holds, whichever style says it, as
/// every one is read (a generous `RateLimit` field does not hide the X fields' stop).
#[tokio::test(start_paused = true)]
async fn every_style_of_fields_holds_calls_back() {
    for fields in [
        &[
            ("ratelimit", "\"default\";r=100;t=60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "60"),
        ][..],
        &[
            ("ratelimit-remaining", "50"),
            ("ratelimit-reset", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "60"),
        ][..],
    ] {
        holds_for_a_minute(fields).await;
    }
}

/// A key given twice in one answer counts its least, never its last: the provider's stop
/// holds whatever else the same field says after it.
#[tokio::test(start_paused = true)]
async fn a_remaining_given_twice_holds_at_its_least() {
    for fields in [
        &[("ratelimit", "remaining=0, remaining=50, reset=60")][..],
        &[
            ("ratelimit", "limit=100, remaining=0, reset=60"),
            ("ratelimit", "limit=100, remaining=50, reset=60"),
        ][..],
        &[("ratelimit", "\"d\";r=0;t=60;r=50")][..],
    ] {
        holds_for_a_minute(fields).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_settle_refused_with_not_reserved_does_not_abandon_the_call() {
    let throttle = Throttle::quota("10/1s".parse().unwrap()).unwrap();
    let call = throttle.acquire("api").await.unwrap();
    let before = throttle.stats().margin;
    assert!(matches!(
        call.settle(1).await,
        Err(ThrottleError::NotReserved { .. })
    ));
    assert_eq!(
        throttle.stats().margin,
        before,
        "margin widened by a refused settle"
    );
}

/// A call is settled from its answer: settled without `heard`, it counts as answered then
/// (its round trip measured), not as a call dropped unanswered that may still arrive.
#[tokio::test(start_paused = true)]
async fn a_settled_call_counts_as_answered_not_abandoned() {
    let throttle = Throttle::quota("10/1s".parse().unwrap()).unwrap();
    let call = throttle.reserve_n("api", 3).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    call.settle(1).await.unwrap();
    // A round trip of 10 ms: the first margin covers it; not widened to its cap of 250 ms.
    assert_eq!(throttle.stats().margin, Some(Duration::from_millis(20)));
    // And the call is no longer in flight: a report of 2 left lets 2 more go at once.
    let (ok, two_left) = answer(200, &[("ratelimit", "\"d\";r=2;t=10")]);
    throttle.acquire("api").await.unwrap().heard(ok, &two_left);
    let start = Instant::now();
    std::mem::forget(throttle.acquire("api").await.unwrap());
    std::mem::forget(throttle.acquire("api").await.unwrap());
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A cost the budget's policy can never admit fails at once: not after a pause the upstream
/// asked for, nor after the calls queued ahead of it, nor as a timeout.
#[tokio::test(start_paused = true)]
async fn a_cost_the_policy_cannot_admit_fails_before_any_pause_or_queue() {
    let (refused, retry) = answer(429, &[("retry-after", "60")]);
    let keyed = || -> RateLimiter<String, TokioClock> {
        RateLimiter::with_clock("10/1s".parse().unwrap(), TokioClock::new())
    };
    // Each key's policy from a resolver: "big" admits 20 at once, every other key 10.
    let resolved = || -> RateLimiter<String, TokioClock> {
        RateLimiter::with_resolver(
            |key: &String| {
                let policy = if key == "big" { "20/1s" } else { "10/1s" };
                policy.parse().unwrap()
            },
            TokioClock::new(),
        )
    };
    let direct = DirectLimiter::with_clock("10/1s".parse().unwrap(), TokioClock::new());
    for (throttle, key) in [
        (
            Throttle::new(keyed()).max_wait(Duration::from_secs(5)),
            "api",
        ),
        (Throttle::new(keyed()), "api"),
        (Throttle::new(direct), "api"),
        (Throttle::new(resolved()), "small"),
    ] {
        throttle.acquire(key).await.unwrap().heard(refused, &retry);
        let start = Instant::now();
        let err = throttle.acquire_n(key, 11).await.unwrap_err();
        assert!(
            matches!(err, ThrottleError::Cost { .. }),
            "{throttle:?}: {err:?}"
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "{throttle:?}");
        // Queued behind a caller waiting out the pause: still at once.
        let head = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.acquire(key).await.is_ok() }
        });
        tokio::task::yield_now().await;
        let err = throttle.reserve_n(key, 11).await.unwrap_err();
        assert!(
            matches!(err, ThrottleError::Cost { .. }),
            "{throttle:?}: {err:?}"
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "{throttle:?}");
        head.abort();
    }
    // A key whose own policy admits the cost waits for it, as any call does.
    let throttle = Throttle::new(resolved());
    throttle
        .acquire("big")
        .await
        .unwrap()
        .heard(refused, &retry);
    let start = Instant::now();
    assert!(throttle.acquire_n("big", 11).await.is_ok());
    assert_eq!(start.elapsed(), Duration::from_secs(60));
}

/// Under a quota, the head of a key's queue may wake early to look at the margin of a call
/// under way; a call that gives up behind it is told the head's wait for its permit as the
/// head knows it, never that earlier look.
#[tokio::test(start_paused = true)]
async fn a_call_giving_up_behind_a_quota_head_is_told_the_heads_permit() {
    let throttle = Throttle::quota("1/1s".parse().unwrap()).unwrap();
    let start = Instant::now();
    let unanswered = throttle.acquire("api").await.unwrap();
    let head = tokio::spawn({
        let throttle = throttle.clone();
        async move {
            let call = throttle.acquire("api").await.unwrap();
            std::mem::forget(call);
            start.elapsed()
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let hurried = throttle.clone().max_wait(Duration::from_millis(5));
    let asked = Instant::now();
    let err = hurried.acquire("api").await.unwrap_err();
    let ThrottleError::TimedOut { retry_after, .. } = err else {
        panic!("{err:?}")
    };
    // The head's permit comes a second after the first call, or later (the margin widens
    // while that call goes unanswered): the hurried call's own, no sooner.
    let least = Duration::from_secs(1) - (asked - start) - Duration::from_millis(5);
    assert!(
        retry_after >= least,
        "retry_after {retry_after:?} < {least:?}"
    );
    let head_admitted = head.await.unwrap();
    assert!(head_admitted >= Duration::from_secs(1), "{head_admitted:?}");
    drop(unanswered);
}
