//! The Lua code Redis runs, assembled from `lua/*.lua` at compile time: as one script
//! ([`SOURCE`], for `EVAL` and `EVALSHA`) and as a function library ([`library`], for
//! `FCALL`, Redis 7 and later). What the code takes and answers is `super::script`'s.

/// The files that define what `lua/decide.lua` uses, in order (each defines what the next
/// ones use).
macro_rules! helpers {
    () => {
        concat!(
            include_str!("lua/arith.lua"),
            "\n",
            include_str!("lua/gcra.lua"),
            "\n",
            include_str!("lua/counter.lua"),
            "\n",
            include_str!("lua/log.lua"),
            "\n",
            include_str!("lua/band.lua"),
            "\n",
            include_str!("lua/tokens.lua"),
            "\n",
            include_str!("lua/carry.lua"),
            "\n",
            include_str!("lua/record.lua"),
            "\n",
            include_str!("lua/parts.lua"),
        )
    };
}

/// The script Redis runs as `EVAL`: the helpers, then `lua/decide.lua` at the top level.
pub(super) const SOURCE: &str = concat!(helpers!(), "\n", include_str!("lua/decide.lua"));

/// The same code as a Redis function library (Redis 7 and later), named `name`, which
/// registers one function of that name. Redis creates a script's local functions each time
/// it runs the script, and a library's once, when it is loaded: the helpers are defined at
/// the library's top level, and `lua/decide.lua` becomes the body of the function called.
/// `KEYS` and `ARGV`, globals in a script, are locals of the library that each call sets
/// before it runs that body.
pub(super) fn library(name: &str) -> String {
    format!(
        "#!lua name={name}\nlocal KEYS, ARGV\n{}\nlocal function decide()\n{}\nend\n\
         redis.register_function('{name}', function(keys, args)\n  \
         KEYS, ARGV = keys, args\n  return decide()\nend)\n",
        helpers!(),
        include_str!("lua/decide.lua"),
    )
}
