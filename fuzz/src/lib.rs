//! The checks behind tollgate's fuzz targets, as a library so that they run three ways:
//!
//! * under libFuzzer, through the thin wrappers in `fuzz_targets/` (nightly,
//!   `cargo +nightly fuzz run <target>`);
//! * on a stable toolchain, replaying every committed corpus file
//!   (`cargo test --manifest-path fuzz/Cargo.toml --lib`), so a reproducer added to the
//!   corpus keeps guarding the bug it found even where no nightly is installed;
//! * to write the seed corpus of the differential target (see [`differential::seeds`]).
//!
//! The reference models are the very file the property tests use (`tests/models/mod.rs`),
//! included here by path: one copy of each model.

#[path = "../../tests/models/mod.rs"]
pub mod models;

pub mod differential;

use tollgate::Policy;

/// The `parse_policy` target: any bytes; if they are UTF-8, parsing never panics, and a
/// policy that parses prints back to a string that parses to the same policy.
pub fn parse_policy(data: &[u8]) {
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
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    /// Every file of `corpus/<target>/`, sorted, so a failure names the same file each run.
    pub(crate) fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|path| {
                let data = fs::read(&path).unwrap();
                (path, data)
            })
            .collect()
    }

    #[test]
    fn parse_policy_corpus_replays_clean() {
        let files = corpus("parse_policy");
        assert!(!files.is_empty());
        for (path, data) in files {
            eprintln!("{}", path.display());
            super::parse_policy(&data);
        }
    }
}
