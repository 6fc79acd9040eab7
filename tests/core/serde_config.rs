//! `Policy` in configuration files (feature `serde`): written and read as its string form.
#![cfg(feature = "serde")]

use serde::{Deserialize, Serialize};
use tollgate::Policy;

#[derive(Debug, Deserialize, Serialize, PartialEq)]
struct Limits {
    api: Policy,
    login: Policy,
    tiers: Vec<Policy>,
}

#[test]
fn policies_round_trip_through_toml() {
    let text = r#"
        api = "10/s & 1000/day"
        login = "sliding-log 5 per 15m"
        tiers = ["100/min", "sliding-counter 1000/min"]
    "#;
    let limits: Limits = toml::from_str(text).unwrap();
    assert_eq!(
        limits.api,
        "10/s"
            .parse::<Policy>()
            .unwrap()
            .and("1000/day".parse().unwrap())
            .unwrap()
    );
    assert_eq!(limits.login.to_string(), "sliding-log 5/15m");
    assert_eq!(limits.tiers[1].first_band().permits(), 1000);

    let written = toml::to_string(&limits).unwrap();
    assert!(
        written.contains(r#"api = "token-bucket 10/1s & token-bucket 1000/1d""#),
        "{written}"
    );
    let back: Limits = toml::from_str(&written).unwrap();
    assert_eq!(back, limits);
}

#[test]
fn a_bad_policy_string_is_an_error_naming_the_value() {
    let err = toml::from_str::<Limits>(
        r#"
        api = "10 per fortnight"
        login = "5/15m"
        tiers = []
    "#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(r#"invalid policy "10 per fortnight""#),
        "{err}"
    );
    assert!(err.contains("unit `fortnight`"), "{err}");

    let err = toml::from_str::<Limits>("api = 5\nlogin = \"5/s\"\ntiers = []").unwrap_err();
    assert!(err.to_string().contains("policy string"), "{err}");
}
