//! Properties over arbitrary answers: whatever an upstream says, the throttle never lets
//! more through than its budget would alone, and never panics.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use tollgate::client::Throttle;
use tollgate::clock::TokioClock;
use tollgate::DirectLimiter;

/// One step: wait, then a call answered with `status` and these fields.
#[derive(Clone, Debug)]
struct Step {
    wait_ms: u64,
    status: u16,
    fields: Vec<(&'static str, Vec<u8>)>,
}

fn field_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0u64..50).prop_map(|n| n.to_string().into_bytes()),
        (0u64..50, 0u64..5).prop_map(|(r, t)| format!("\"d\";r={r};t={t}").into_bytes()),
        Just(b"Sun, 06 Nov 1994 08:49:37 GMT".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        Just(b"-1".to_vec()),
        proptest::collection::vec(0x20u8..0x7f, 0..20),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let name = prop_oneof![
        Just("retry-after"),
        Just("ratelimit"),
        Just("ratelimit-remaining"),
        Just("ratelimit-reset"),
        Just("x-ratelimit-remaining"),
        Just("x-ratelimit-reset"),
    ];
    (
        0u64..400,
        prop_oneof![Just(200u16), Just(429), Just(503), Just(500)],
        proptest::collection::vec((name, field_value()), 0..4),
    )
        .prop_map(|(wait_ms, status, fields)| Step {
            wait_ms,
            status,
            fields,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_answer_lets_more_through_than_the_budget(steps in proptest::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let admitted = runtime.block_on(async {
            let budget = Arc::new(DirectLimiter::with_clock(
                "sliding-log 3/1s".parse().unwrap(),
                TokioClock::new(),
            ));
            let throttle = Throttle::new(Arc::clone(&budget)).max_wait(Duration::from_secs(2));
            let start = tokio::time::Instant::now();
            let mut admitted = Vec::new();
            for step in steps {
                tokio::time::sleep(Duration::from_millis(step.wait_ms)).await;
                let Ok(mut call) = throttle.acquire("api").await else {
                    continue;
                };
                admitted.push(start.elapsed());
                let mut headers = HeaderMap::new();
                for (name, value) in &step.fields {
                    if let Ok(value) = HeaderValue::from_bytes(value) {
                        headers.append(*name, value);
                    }
                }
                call.heard(StatusCode::from_u16(step.status).unwrap(), &headers);
            }
            admitted
        });
        // The budget alone: at most 3 in any second.
        for (i, at) in admitted.iter().enumerate() {
            let in_window = admitted[i..]
                .iter()
                .take_while(|&&later| later < *at + Duration::from_secs(1))
                .count();
            prop_assert!(in_window <= 3, "{admitted:?}");
        }
    }
}
