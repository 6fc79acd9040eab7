//! Any string: parsing never panics, and a policy that parses prints back to a string that
//! parses to the same policy: see `tollgate_fuzz::parse_policy`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate_fuzz::parse_policy(data));
