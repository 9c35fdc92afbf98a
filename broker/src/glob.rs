//! Glob patterns as `KEYS`, `SCAN MATCH` and `CONFIG GET` read them: `*`,
//! `?`, `[abc]`, `[^a]`, `[a-z]`, and `\` quoting the next byte.

/// Whether `text` matches `pattern` (with `nocase`, ASCII letters match
/// either case).
pub fn glob_match(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    // Iterative with one backtrack point for the last `*`: linear in
    // practice and never recursive, so a hostile pattern cannot blow the
    // stack.
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
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
    let c = fold(c);
    let mut matched = false;
    loop {
        match pattern.get(i) {
            None => break,
            Some(b']') => {
                i += 1;
                break;
            }
            Some(b'\\') if i + 1 < pattern.len() => {
                if fold(pattern[i + 1]) == c {
                    matched = true;
                }
                i += 2;
            }
            Some(&lo) if pattern.get(i + 1) == Some(&b'-') && i + 2 < pattern.len() => {
                let hi = pattern[i + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                if (fold(lo)..=fold(hi)).contains(&c) {
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

    #[test]
    fn a_hostile_pattern_finishes() {
        let text = vec![b'a'; 10_000];
        let mut pat = b"*a".repeat(50);
        pat.push(b'b');
        assert!(!glob_match(&pat, &text, false));
    }
}
