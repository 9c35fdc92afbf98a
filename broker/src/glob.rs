//! Glob patterns as `KEYS`, `SCAN MATCH` and `CONFIG GET` read them: `*`,
//! `?`, `[abc]`, `[^a]`, `[a-z]`, and `\` quoting the next byte, with
//! redis-server 7.0's answers at the edges: the empty name matches only
//! the empty pattern and `*` (which `KEYS` and `SCAN` take for "every
//! name" without matching), range bounds and bytes compare as C's signed
//! `char` (x86), and a pattern nesting more than [`MAX_NESTED_STARS`]
//! stars matches nothing (Redis's guard against abusive patterns).

/// The most `*` (each followed by more pattern) a pattern may nest:
/// past it Redis's matcher gives up and answers "no match".
pub const MAX_NESTED_STARS: usize = 1000;

/// Whether `text` matches `pattern` (with `nocase`, ASCII letters match
/// either case).
pub fn glob_match(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    if text.is_empty() {
        // Redis's matcher takes no step on an empty string.
        return pattern.is_empty() || pattern == b"*";
    }
    // Iterative with one backtrack point for the last `*`: linear in
    // practice and never recursive, so a hostile pattern cannot blow the
    // stack.
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    // Runs of `*` passed that more pattern follows, each counted once
    // (a mismatch goes back only to the last): past the limit, no match,
    // as Redis's recursion gives up there. A match passes every one.
    let mut nested = 0usize;
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    nested += 1;
                    if nested > MAX_NESTED_STARS {
                        return false;
                    }
                    star = Some((p, t));
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, text[t], nocase) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if eq(pattern[p + 1], text[t]) {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if eq(c, text[t]) {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        // Mismatch: let the last `*` take one more byte.
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class opening at `pattern[open] == b'['`:
/// whether it matched and the index after the class. An unclosed class
/// runs to the end of the pattern, as in Redis.
fn class(pattern: &[u8], open: usize, c: u8, nocase: bool) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let not = pattern.get(i) == Some(&b'^');
    if not {
        i += 1;
    }
    let fold = |b: u8| if nocase { b.to_ascii_lowercase() } else { b };
    let raw = c;
    let c = fold(c);
    let mut matched = false;
    loop {
        match pattern.get(i) {
            None => break,
            Some(b']') => {
                i += 1;
                break;
            }
            // An escaped byte compares as it is, case and all (as Redis).
            Some(b'\\') if i + 1 < pattern.len() => {
                if pattern[i + 1] == raw {
                    matched = true;
                }
                i += 2;
            }
            Some(&lo) if pattern.get(i + 1) == Some(&b'-') && i + 2 < pattern.len() => {
                // Bounds and byte as C's signed `char`: 0x80..=0xff sort
                // below 0x00 (Redis on x86).
                let signed = |b: u8| fold(b) as i8;
                let (lo, hi) = (lo as i8, pattern[i + 2] as i8);
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                if (signed(lo as u8)..=signed(hi as u8)).contains(&(c as i8)) {
                    matched = true;
                }
                i += 3;
            }
            Some(&b) => {
                if fold(b) == c {
                    matched = true;
                }
                i += 1;
            }
        }
    }
    Some((matched != not, i))
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn patterns_match_as_redis_keys_does() {
        let m = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes(), false);
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("s*", "stream"));
        assert!(!m("s*", "xs"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("*a*b*c*", "xxaxxbxxcxx"));
        assert!(!m("*a*b*c*d", "xxaxxbxxcxx"));
        assert!(glob_match(b"APPEND*", b"appendonly", true));
    }

    /// The edges where redis-server 7.0's matcher answers otherwise than
    /// a plain reading would (each checked against redis-server 7.0.15).
    #[test]
    fn edges_match_as_redis_server_7_0() {
        let m = |p: &[u8], t: &[u8]| glob_match(p, t, false);
        // The empty name: only `""` and `*` (KEYS' "every name").
        assert!(m(b"", b"") && m(b"*", b""));
        assert!(!m(b"**", b"") && !m(b"***", b"") && !m(b"?", b""));
        assert!(m(b"a**", b"a"), "trailing stars after the last byte");
        // Ranges compare as signed bytes: 0x80..=0xff sort below 0x00.
        let keys: [&[u8]; 7] = [b"\xff", b"\x80", b"\x7f", b"\xfe", b"a", b"z", b"\x00"];
        let matching =
            |p: &[u8]| -> Vec<&[u8]> { keys.iter().copied().filter(|k| m(p, k)).collect() };
        assert_eq!(matching(b"[a-\xff]"), [&b"\xff"[..], b"a", b"\x00"]);
        assert_eq!(matching(b"[\x00-\xff]"), [&b"\xff"[..], b"\x00"]);
        assert_eq!(matching(b"[\x7f-\x80]").len(), 7);
        assert_eq!(
            matching(b"[^a-\xff]"),
            [&b"\x80"[..], b"\x7f", b"\xfe", b"z"]
        );
        // An escaped byte in a class keeps its case under NOCASE.
        assert!(glob_match(b"[\\A]", b"A", true) && !glob_match(b"[\\A]", b"a", true));
        assert!(glob_match(b"[A]", b"a", true));
    }

    #[test]
    fn more_than_a_thousand_nested_stars_match_nothing() {
        let text = vec![b'a'; 1001];
        let mut pat = b"*a".repeat(1000);
        assert!(glob_match(&pat, &text, false));
        pat.extend_from_slice(b"*a");
        assert!(!glob_match(&pat, &text, false), "1001 nested");
        // A trailing star nests nothing; stars in a class or quoted are bytes.
        let mut pat = b"*a".repeat(1000);
        pat.push(b'*');
        assert!(glob_match(&pat, &text, false));
        let mut pat = b"[*]\\*".repeat(1001);
        pat.extend_from_slice(b"*a");
        let mut text = b"**".repeat(1001);
        text.push(b'a');
        assert!(glob_match(&pat, &text, false));
        let mut pat = b"*".to_vec();
        pat.extend_from_slice(&b"a*".repeat(1000));
        pat.push(b'a');
        assert!(!glob_match(&pat, &vec![b'a'; 1001], false));
        // `[a-]*]` is a class (the range `]`..`a` and a `*`), no star.
        assert!(glob_match(
            &b"[a-]*]".repeat(1001),
            &vec![b'a'; 1001],
            false
        ));
    }

    #[test]
    fn a_hostile_pattern_finishes() {
        let text = vec![b'a'; 10_000];
        let mut pat = b"*a".repeat(50);
        pat.push(b'b');
        assert!(!glob_match(&pat, &text, false));
    }
}
