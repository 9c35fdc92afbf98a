//! The fixed-seed generator of the parsers' fuzz tests (test builds only):
//! a xorshift, so every run tries the same inputs and a failure repeats.

/// The next value of a xorshift64 from `seed`'s state (never 0).
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed.max(1);
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
