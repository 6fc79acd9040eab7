//! Any string: parsing never panics, and a policy that parses prints back to a string that
//! parses to the same policy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(policy) = text.parse::<Policy>() {
        let printed = policy.to_string();
        let reparsed: Policy = printed
            .parse()
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which fails: {e}"));
        assert_eq!(reparsed, policy, "{text:?} printed as {printed:?}");
    }
});
