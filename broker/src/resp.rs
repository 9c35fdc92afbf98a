//! The Redis protocol on the wire: requests (RESP multibulk arrays and
//! inline commands) decoded with Redis's limits and error texts, their
//! arguments sliced out of the read buffer without a copy; replies encoded
//! as RESP2 or RESP3.
//!
//! Requests are parsed here rather than by a general RESP crate because a
//! server must judge a request by its headers before buffering it: a client
//! announcing a 1 GB bulk gets `-ERR Protocol error: invalid bulk length` at
//! once, where a frame decoder waits for the gigabyte to arrive. The parse
//! keeps its place between reads, so a large argument arriving in many
//! pieces is scanned once.

use bytes::{BufMut, Bytes, BytesMut};

mod entries;
use mailring_transports::codec::{Codec, CodecError};

/// Longest inline request, or count line of a multibulk request, without
/// its line end (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const INLINE_MAX: usize = 64 * 1024;
/// Largest bulk argument (Redis's default `proto-max-bulk-len`).
pub const DEFAULT_MAX_BULK: usize = 512 * 1024 * 1024;
/// Most arguments in one request (Redis allows up to `INT_MAX`; each one
/// costs a slot here before its bytes arrive, so the bound is lower).
pub const DEFAULT_MAX_ARGS: usize = 1024 * 1024;
/// Bytes reserved ahead for an announced bulk that has not arrived.
const RESERVE_AHEAD: usize = 64 * 1024;

/// A request that breaks the protocol. Redis answers it with
/// `-ERR Protocol error: <text>` and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A multibulk count line longer than [`INLINE_MAX`].
    #[error("too big mbulk count string")]
    CountLineTooLong,
    /// A multibulk count that is not a number, or too large.
    #[error("invalid multibulk length")]
    InvalidMultibulkLength,
    /// An argument that does not start with `$`.
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk length line longer than [`INLINE_MAX`].
    #[error("too big bulk count string")]
    BulkLineTooLong,
    /// A bulk length that is not a number, negative, or over the limit.
    #[error("invalid bulk length")]
    InvalidBulkLength,
    /// An inline request longer than [`INLINE_MAX`].
    #[error("too big inline request")]
    InlineTooLong,
    /// An inline request with an unclosed quote.
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    /// More than 10 arguments announced by a client that has not
    /// authenticated yet (a password is required).
    #[error("unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// A bulk past 16 KiB announced by a client that has not
    /// authenticated yet.
    #[error("unauthenticated bulk length")]
    UnauthenticatedBulkLength,
}

/// Arguments a request of a client that has not authenticated may have
/// (Redis's limit).
const UNAUTHENTICATED_MAX_ARGS: i64 = 10;

/// Bytes a bulk of a client that has not authenticated may have.
const UNAUTHENTICATED_MAX_BULK: usize = 16 * 1024;

/// One decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A command and its arguments (never empty).
    Command(Vec<Bytes>),
    /// A broken request: answer it and close. Nothing after it is decoded.
    Broken(ProtocolError),
}

/// Where a multibulk request's parse stands between reads.
#[derive(Debug, Clone, Default)]
struct Partial {
    /// Arguments announced.
    argc: usize,
    /// `(start, end)` of each argument parsed so far, from the buffer's start.
    args: Vec<(usize, usize)>,
    /// The first byte not parsed yet.
    pos: usize,
    /// The length of the bulk whose header is parsed and whose body is not.
    bulk: Option<usize>,
}

/// The request decoder and reply encoder of one connection.
#[derive(Debug, Clone)]
pub struct RespCodec {
    max_bulk: usize,
    max_args: usize,
    partial: Option<Partial>,
    /// The argument list of the last request, kept for the next one.
    spare: Vec<(usize, usize)>,
    /// After a protocol error nothing more is read.
    broken: bool,
    /// Set once the connection's client authenticated, when a password is
    /// required: until then requests are held to Redis's small limits, so
    /// a client that has not given the password cannot make the broker
    /// hold a large request.
    authenticated: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Where the error replies written are counted (`INFO errorstats`).
    errors: Option<std::sync::Arc<ErrorCounts>>,
}

impl Default for RespCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl RespCodec {
    /// A codec with Redis's default limits.
    pub fn new() -> Self {
        RespCodec {
            max_bulk: DEFAULT_MAX_BULK,
            max_args: DEFAULT_MAX_ARGS,
            partial: None,
            spare: Vec::new(),
            broken: false,
            authenticated: None,
            errors: None,
        }
    }

    /// Counts every error reply this codec writes in `counts`.
    pub(crate) fn counting_errors(mut self, counts: std::sync::Arc<ErrorCounts>) -> Self {
        self.errors = Some(counts);
        self
    }

    /// Holds requests to Redis's limits for a client that has not
    /// authenticated (10 arguments, 16 KiB a bulk) until `authenticated`
    /// is set (by the connection's session).
    pub fn until_authenticated(
        mut self,
        authenticated: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        self.authenticated = Some(authenticated);
        self
    }

    /// Whether the client must still authenticate.
    fn auth_required(&self) -> bool {
        self.authenticated
            .as_ref()
            .is_some_and(|a| !a.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Sets the largest bulk argument accepted (`proto-max-bulk-len`).
    pub fn max_bulk(mut self, bytes: usize) -> Self {
        self.max_bulk = bytes;
        self
    }

    /// Sets the most arguments accepted in one request.
    pub fn max_args(mut self, n: usize) -> Self {
        self.max_args = n;
        self
    }

    fn fail(&mut self, buf: &mut BytesMut, e: ProtocolError) -> Option<Request> {
        self.broken = true;
        self.partial = None;
        buf.clear();
        Some(Request::Broken(e))
    }

    /// The next request in `buf`, `None` when it is not all there yet.
    fn next_request(&mut self, buf: &mut BytesMut) -> Option<Request> {
        loop {
            if self.broken {
                buf.clear();
                return None;
            }
            if buf.is_empty() {
                return None;
            }
            if self.partial.is_none() && buf[0] != b'*' {
                match self.inline(buf) {
                    Ok(Some(args)) if args.is_empty() => continue,
                    Ok(Some(args)) => return Some(Request::Command(args)),
                    Ok(None) => return None,
                    Err(e) => return self.fail(buf, e),
                }
            }
            match self.multibulk(buf) {
                Ok(Some(args)) if args.is_empty() => continue,
                Ok(Some(args)) => return Some(Request::Command(args)),
                Ok(None) => return None,
                Err(e) => return self.fail(buf, e),
            }
        }
    }

    /// An inline command: one line, arguments split on blanks with quotes.
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let Some(nl) = c_strchr(b'\n', buf) else {
            if buf.len() > INLINE_MAX {
                return Err(ProtocolError::InlineTooLong);
            }
            return Ok(None);
        };
        let line = buf.split_to(nl + 1);
        let mut text = &line[..nl];
        if let Some(stripped) = text.strip_suffix(b"\r") {
            text = stripped;
        }
        split_inline(text).map(Some)
    }

    /// A multibulk request, parsed as far as `buf` allows.
    fn multibulk(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let mut p = match self.partial.take() {
            Some(p) => p,
            None => {
                let (n, pos) = match short_len_line(buf, 1) {
                    Some((n, pos)) => (i64::try_from(n).unwrap_or(i64::MAX), pos),
                    None => {
                        let Some(end) = line_end(buf, 1) else {
                            if buf.len() > INLINE_MAX {
                                return Err(ProtocolError::CountLineTooLong);
                            }
                            return Ok(None);
                        };
                        let n =
                            parse_int(&buf[1..end]).ok_or(ProtocolError::InvalidMultibulkLength)?;
                        (n, end + 2)
                    }
                };
                // Redis's order: past `INT_MAX` invalid, then the
                // unauthenticated bound; the broker's own bound after.
                if n > i64::from(i32::MAX) {
                    return Err(ProtocolError::InvalidMultibulkLength);
                }
                if n > UNAUTHENTICATED_MAX_ARGS && self.auth_required() {
                    return Err(ProtocolError::UnauthenticatedMultibulkLength);
                }
                if n > self.max_args as i64 {
                    return Err(ProtocolError::InvalidMultibulkLength);
                }
                if n <= 0 {
                    // `*0` and `*-1`: an empty request, skipped.
                    let _ = buf.split_to(pos);
                    return Ok(Some(Vec::new()));
                }
                let argc = n as usize;
                Partial {
                    argc,
                    args: {
                        let mut args = std::mem::take(&mut self.spare);
                        args.clear();
                        args.reserve(argc.min(1024));
                        args
                    },
                    pos,
                    bulk: None,
                }
            }
        };
        while p.args.len() < p.argc {
            let len = match p.bulk {
                Some(len) => len,
                None => {
                    if p.pos >= buf.len() {
                        self.partial = Some(p);
                        return Ok(None);
                    }
                    if buf[p.pos] != b'$' {
                        // Redis checks for the `$` once the line is all
                        // there (a `\r` and a byte after it).
                        if line_end(buf, p.pos).is_none() {
                            if buf.len() - p.pos > INLINE_MAX {
                                return Err(ProtocolError::BulkLineTooLong);
                            }
                            self.partial = Some(p);
                            return Ok(None);
                        }
                        // Its error texts keep to one line: a line end
                        // shows as a space.
                        let got = match buf[p.pos] {
                            b'\r' | b'\n' => ' ',
                            b => char::from(b),
                        };
                        return Err(ProtocolError::ExpectedBulk(got));
                    }
                    // The common line (a few digits): one pass.
                    if let Some((n, next)) = short_len_line(buf, p.pos + 1) {
                        if n > self.max_bulk {
                            return Err(ProtocolError::InvalidBulkLength);
                        }
                        if n > UNAUTHENTICATED_MAX_BULK && self.auth_required() {
                            return Err(ProtocolError::UnauthenticatedBulkLength);
                        }
                        p.pos = next;
                        p.bulk = Some(n);
                        n
                    } else {
                        self.slow_bulk_line(buf, &mut p)?
                    }
                }
            };
            if p.bulk.is_none() {
                // The line is not all there yet.
                self.partial = Some(p);
                return Ok(None);
            }
            let need = p.pos + len + 2;
            if buf.len() < need {
                buf.reserve((need - buf.len()).min(RESERVE_AHEAD));
                self.partial = Some(p);
                return Ok(None);
            }
            // Redis reads the two bytes after a bulk as its line end
            // without checking them.
            p.args.push((p.pos, p.pos + len));
            p.pos = need;
            p.bulk = None;
        }
        let frame = buf.split_to(p.pos).freeze();
        let args = p.args.iter().map(|&(s, e)| frame.slice(s..e)).collect();
        if p.args.capacity() <= 64 {
            self.spare = p.args;
        }
        Ok(Some(args))
    }

    /// A bulk length line as Redis reads it (any form `string2ll` takes or
    /// refuses): sets `p.bulk` and moves past the line, or leaves `p.bulk`
    /// unset when the line is not complete.
    fn slow_bulk_line(&self, buf: &[u8], p: &mut Partial) -> Result<usize, ProtocolError> {
        let Some(end) = line_end(buf, p.pos + 1) else {
            if buf.len() - p.pos > INLINE_MAX {
                return Err(ProtocolError::BulkLineTooLong);
            }
            return Ok(0);
        };
        let n = parse_int(&buf[p.pos + 1..end]).ok_or(ProtocolError::InvalidBulkLength)?;
        if n < 0 || n as u64 > self.max_bulk as u64 {
            return Err(ProtocolError::InvalidBulkLength);
        }
        if n as usize > UNAUTHENTICATED_MAX_BULK && self.auth_required() {
            return Err(ProtocolError::UnauthenticatedBulkLength);
        }
        p.pos = end + 2;
        p.bulk = Some(n as usize);
        Ok(n as usize)
    }
}

/// `<digits>\r\n` from `from` when it is the plain form (1 to 18 digits,
/// no sign, no leading zero unless the number is `0`, and the `\n` byte
/// present, unread as Redis leaves it): the number and where the next line
/// starts. Anything else, complete or not, is for the general path.
#[inline]
fn short_len_line(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let rest = buf.get(from..)?;
    // One or two digits, as most of a request's lengths are (an XADD's
    // count and its name, field and value lengths): read without a loop.
    match *rest {
        [d @ b'0'..=b'9', b'\r', _, ..] => return Some((usize::from(d - b'0'), from + 3)),
        [d1 @ b'1'..=b'9', d2 @ b'0'..=b'9', b'\r', _, ..] => {
            return Some((
                usize::from(d1 - b'0') * 10 + usize::from(d2 - b'0'),
                from + 4,
            ))
        }
        _ => {}
    }
    digits_len_line(rest, from)
}

/// [`short_len_line`]'s reading of any plain line of 1 to 18 digits.
#[inline]
fn digits_len_line(rest: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut n = 0usize;
    for (i, &b) in rest.iter().enumerate().take(19) {
        match b {
            b'0'..=b'9' => {
                if i > 0 && n == 0 {
                    // A leading zero.
                    return None;
                }
                n = n * 10 + usize::from(b - b'0');
            }
            b'\r' if i > 0 && i + 1 < rest.len() => return Some((n, from + i + 2)),
            _ => return None,
        }
    }
    None
}

impl Codec for RespCodec {
    type In = Request;
    type Out = (Protocol, Reply);

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, CodecError> {
        Ok(self.next_request(buf))
    }

    #[inline]
    fn encode(&mut self, frame: (Protocol, Reply), dst: &mut BytesMut) -> Result<(), CodecError> {
        // Straight into the connection's write buffer: no frame of its own,
        // in room reserved once.
        self.count_errors(&frame.1);
        dst.reserve(frame.1.size_hint());
        frame.1.encode(frame.0, dst);
        Ok(())
    }

    /// A reply `CLIENT REPLY` drops: its errors count as if it were
    /// written, as Redis counts them.
    fn discard(&mut self, frame: (Protocol, Reply)) {
        self.count_errors(&frame.1);
    }
}

impl RespCodec {
    /// Counts the errors `reply` holds, where errors are counted (the
    /// variant is tested inline; the counting is out of line).
    #[inline]
    fn count_errors(&self, reply: &Reply) {
        if let Some(errors) = &self.errors {
            if reply.may_hold_error() {
                errors.note_reply(reply);
            }
        }
    }
}

/// The most error codes `INFO errorstats` lists (Redis's limit): the
/// errors of codes past them still count in `total_error_replies`.
pub(crate) const MAX_ERROR_CODES: usize = 128;

/// Error replies written to clients, in all and by code (the error's first
/// word: `ERR`, `WRONGTYPE`, `NOGROUP`...), as Redis counts them for
/// `INFO stats`' `total_error_replies` and `INFO errorstats`. The errors
/// of a transaction's `EXEC` reply count one by one.
#[derive(Debug, Default)]
pub(crate) struct ErrorCounts {
    total: std::sync::atomic::AtomicU64,
    by_code: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl ErrorCounts {
    /// Counts the errors in `reply`: itself, or the replies of an array
    /// (a transaction's).
    #[cold]
    fn note_reply(&self, reply: &Reply) {
        match reply {
            Reply::Error(text) => self.note(text.as_bytes()),
            Reply::ErrorBytes(text) => self.note(text),
            Reply::Encoded(b) if b.first() == Some(&b'-') => self.note(&b[1..]),
            Reply::Array(items) => {
                for item in items {
                    match item {
                        Reply::Error(_) | Reply::ErrorBytes(_) | Reply::Encoded(_) => {
                            self.note_reply(item)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// Counts one error whose text (no leading `-`) is `text`.
    fn note(&self, text: &[u8]) {
        use std::sync::atomic::Ordering;
        self.total.fetch_add(1, Ordering::Relaxed);
        let code = error_code(text);
        let mut by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_code.get_mut(code) {
            *n += 1;
        } else if by_code.len() < MAX_ERROR_CODES {
            by_code.insert(code.to_owned(), 1);
        }
    }

    /// `total_error_replies`.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `INFO errorstats`' lines, by code in byte order.
    pub(crate) fn lines(&self) -> Vec<String> {
        let by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        by_code
            .iter()
            .map(|(code, n)| format!("errorstat_{code}:count={n}"))
            .collect()
    }

    /// `CONFIG RESETSTAT`.
    pub(crate) fn reset(&self) {
        let mut by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        by_code.clear();
        self.total.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An error's code as Redis takes it: the text before the first space
/// within its first 31 bytes, `ERR` without one; made printable for the
/// `INFO` line.
fn error_code(text: &[u8]) -> &str {
    let head = &text[..text.len().min(31)];
    match memchr(b' ', head).and_then(|end| std::str::from_utf8(&text[..end]).ok()) {
        Some(code)
            if !code.is_empty() && code.bytes().all(|b| b.is_ascii_graphic() && b != b':') =>
        {
            code
        }
        _ => "ERR",
    }
}

fn memchr(byte: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == byte)
}

/// Where `byte` first is in `hay`, as C's `strchr` finds it: not past a
/// NUL. Redis looks for line ends in its query buffer this way, so a line
/// with a NUL before its end is, to it, not there yet (it waits for more,
/// up to its limit on a line's length).
fn c_strchr(byte: u8, hay: &[u8]) -> Option<usize> {
    hay.iter()
        .position(|&b| b == byte || b == 0)
        .filter(|&at| hay[at] == byte)
}

/// The index of the `\r` ending the line that starts at `from`.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    let cr = c_strchr(b'\r', rest)?;
    // Redis looks for `\r` and then needs one more byte for the `\n`.
    if from + cr + 1 < buf.len() {
        Some(from + cr)
    } else {
        None
    }
}

/// What C's `strtoull` (base 10) reads from `s` when it must take all of
/// it: leading blanks, an optional sign (a negative wraps around), at
/// least one digit and nothing after them, within `u64`.
pub fn strtoull_whole(s: &[u8]) -> Option<u64> {
    let blanks = s.iter().position(|&b| !c_isspace(b)).unwrap_or(s.len());
    let s = &s[blanks..];
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if negative { v.wrapping_neg() } else { v })
}

/// A decimal integer as Redis's `string2ll` reads it: an optional `-`, no
/// `+`, no spaces, no leading zeros except `0` itself, within `i64`.
pub fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    if digits[0] == b'0' && (digits.len() > 1 || neg) {
        return None;
    }
    // At most 20 digits: the magnitude is checked as it grows.
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        0i64.checked_sub_unsigned(v)
    } else {
        i64::try_from(v).ok()
    }
}

/// Splits an inline request as Redis's `sdssplitargs` does: blanks separate
/// arguments; `"..."` takes `\n \r \t \b \a \\ \"` and `\xHH` escapes;
/// `'...'` takes `\'`; a closing quote must be followed by a blank.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    // Redis splits a C string: nothing after a NUL is read (a quote it
    // cuts is unbalanced).
    let line = &line[..memchr(0, line).unwrap_or(line.len())];
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && c_isspace(line[i]) {
            i += 1;
        }
        if i >= n {
            return Ok(args);
        }
        let mut cur = Vec::new();
        let mut in_dq = false;
        let mut in_sq = false;
        loop {
            if in_dq {
                if i >= n {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
                let c = line[i];
                if c == b'\\'
                    && i + 3 < n
                    && line[i + 1] == b'x'
                    && line[i + 2].is_ascii_hexdigit()
                    && line[i + 3].is_ascii_hexdigit()
                {
                    cur.push(hex(line[i + 2]) * 16 + hex(line[i + 3]));
                    i += 3;
                } else if c == b'\\' && i + 1 < n {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                } else if c == b'"' {
                    i = after_closing_quote(line, i)?;
                    break;
                } else {
                    cur.push(c);
                }
            } else if in_sq {
                if i >= n {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
                let c = line[i];
                if c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    i += 1;
                    cur.push(b'\'');
                } else if c == b'\'' {
                    i = after_closing_quote(line, i)?;
                    break;
                } else {
                    cur.push(c);
                }
            } else {
                if i >= n {
                    break;
                }
                match line[i] {
                    b' ' | b'\n' | b'\r' | b'\t' => break,
                    b'"' => in_dq = true,
                    b'\'' => in_sq = true,
                    c => cur.push(c),
                }
            }
            i += 1;
        }
        args.push(Bytes::from(cur));
    }
}

/// The index after a closing quote at `at`, which must end the line or be
/// followed by a blank.
fn after_closing_quote(line: &[u8], at: usize) -> Result<usize, ProtocolError> {
    match line.get(at + 1) {
        Some(&b) if !c_isspace(b) => Err(ProtocolError::UnbalancedQuotes),
        _ => Ok(at + 1),
    }
}

/// C's `isspace` in the "C" locale, which Redis splits inline requests
/// with: Rust's `is_ascii_whitespace` leaves out `\v`.
pub(crate) fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

/// The protocol a connection speaks: RESP2 until `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2: maps are flat arrays, nulls are `$-1` / `*-1`.
    #[default]
    Resp2,
    /// RESP3: maps, sets, `_` nulls, doubles.
    Resp3,
}

/// A reply, encoded for the connection's protocol by [`Reply::encode`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`: a status line (no `\r` or `\n` inside).
    Status(&'static str),
    /// A status line built at run time.
    StatusOwned(String),
    /// `-ERR ...`: the whole line after `-`, prefix included.
    Error(String),
    /// An error whose text carries a client's bytes as they came (Redis
    /// echoes them raw, not as UTF-8): the whole line after `-`, without
    /// `\r` or `\n`.
    ErrorBytes(Bytes),
    /// `:n`.
    Int(i64),
    /// `$n` and the bytes.
    Bulk(Bytes),
    /// A null bulk (`$-1` / `_`).
    Nil,
    /// A null array (`*-1` / `_`): e.g. `XREAD` that timed out.
    NilArray,
    /// `*n` and the items.
    Array(Vec<Reply>),
    /// `%n` (RESP3) or a flat `*2n` array (RESP2).
    Map(Vec<(Reply, Reply)>),
    /// `~n` (RESP3) or `*n` (RESP2).
    Set(Vec<Reply>),
    /// `,d` (RESP3) or its text as a bulk (RESP2).
    Double(f64),
    /// Text shown as is (`INFO`): RESP3 verbatim `=n txt:...`, RESP2 bulk.
    Verbatim(String),
    /// A stream id as a bulk string (`ms-seq`), formatted as it is encoded.
    Id(crate::id::StreamId),
    /// Stream entries, `[[id, [f1, v1, ...]], ...]`, encoded straight from
    /// the stream's shared fields (an entry without fields, deleted and
    /// read from a pending list, is `[id, nil]`).
    Entries(Vec<(crate::id::StreamId, Option<crate::stream::Fields>)>),
    /// A reply encoded already, for the protocol in force when its command
    /// ran: an element of a transaction's reply after a `HELLO` inside it
    /// (Redis writes each reply as its command runs).
    Encoded(Bytes),
    /// Bytes written as they are and counted nowhere: the refusal past
    /// `maxclients`, which Redis writes straight to the socket.
    Raw(&'static [u8]),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Status("OK");

    /// An error reply with the `ERR` prefix.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// An error reply of `parts` joined, as bytes (line ends made spaces,
    /// so the error stays one line).
    pub fn error_bytes(parts: &[&[u8]]) -> Reply {
        let mut text = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            text.extend(
                p.iter()
                    .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
            );
        }
        Reply::ErrorBytes(text.into())
    }

    /// A bulk reply of `text`.
    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    /// Appends the reply's encoding to `dst`.
    pub fn encode(&self, proto: Protocol, dst: &mut BytesMut) {
        match self {
            Reply::Encoded(b) => dst.put_slice(b),
            Reply::Raw(b) => dst.put_slice(b),
            Reply::Status(s) => line(dst, b'+', s.as_bytes()),
            Reply::StatusOwned(s) => line(dst, b'+', s.as_bytes()),
            Reply::Error(s) => line(dst, b'-', s.as_bytes()),
            Reply::ErrorBytes(b) => line(dst, b'-', b),
            Reply::Int(n) => {
                let mut b = itoa::Buffer::new();
                line(dst, b':', b.format(*n).as_bytes());
            }
            Reply::Bulk(b) => bulk(dst, b),
            Reply::Nil => match proto {
                Protocol::Resp2 => dst.put_slice(b"$-1\r\n"),
                Protocol::Resp3 => dst.put_slice(b"_\r\n"),
            },
            Reply::NilArray => match proto {
                Protocol::Resp2 => dst.put_slice(b"*-1\r\n"),
                Protocol::Resp3 => dst.put_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                header(dst, b'*', items.len());
                for item in items {
                    item.encode(proto, dst);
                }
            }
            Reply::Map(pairs) => {
                match proto {
                    Protocol::Resp2 => header(dst, b'*', pairs.len() * 2),
                    Protocol::Resp3 => header(dst, b'%', pairs.len()),
                }
                for (k, v) in pairs {
                    k.encode(proto, dst);
                    v.encode(proto, dst);
                }
            }
            Reply::Set(items) => {
                match proto {
                    Protocol::Resp2 => header(dst, b'*', items.len()),
                    Protocol::Resp3 => header(dst, b'~', items.len()),
                }
                for item in items {
                    item.encode(proto, dst);
                }
            }
            Reply::Entries(entries) => entries::encode(entries, proto, dst),
            Reply::Id(id) => {
                let mut ms = itoa::Buffer::new();
                let mut seq = itoa::Buffer::new();
                let (ms, seq) = (ms.format(id.ms).as_bytes(), seq.format(id.seq).as_bytes());
                // `$<len>\r\n<ms>-<seq>\r\n`, at most 48 bytes: assembled
                // here and appended once.
                let len = ms.len() + 1 + seq.len();
                let mut b = [0u8; 48];
                b[0] = b'$';
                let mut at = 1;
                if len >= 10 {
                    b[at] = b'0' + (len / 10) as u8;
                    at += 1;
                }
                b[at] = b'0' + (len % 10) as u8;
                at += 1;
                for part in [&b"\r\n"[..], ms, b"-", seq, b"\r\n"] {
                    b[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                dst.extend_from_slice(&b[..at]);
            }
            Reply::Verbatim(text) => match proto {
                Protocol::Resp2 => bulk(dst, text.as_bytes()),
                Protocol::Resp3 => {
                    header(dst, b'=', text.len() + 4);
                    dst.put_slice(b"txt:");
                    dst.put_slice(text.as_bytes());
                    dst.put_slice(b"\r\n");
                }
            },
            Reply::Double(d) => {
                let text = format_double(*d);
                match proto {
                    Protocol::Resp2 => bulk(dst, text.as_bytes()),
                    Protocol::Resp3 => line(dst, b',', text.as_bytes()),
                }
            }
        }
    }

    /// About how many bytes the encoding takes (an upper estimate), so a
    /// long reply is written into room reserved once rather than grown.
    pub fn size_hint(&self) -> usize {
        match self {
            Reply::Encoded(b) => b.len(),
            Reply::Raw(b) => b.len(),
            Reply::Status(t) => t.len() + 3,
            Reply::StatusOwned(t) | Reply::Error(t) | Reply::Verbatim(t) => t.len() + 24,
            Reply::ErrorBytes(b) => b.len() + 3,
            Reply::Int(_) | Reply::Double(_) => 32,
            Reply::Bulk(b) => b.len() + 16,
            Reply::Nil | Reply::NilArray => 5,
            Reply::Id(_) => 48,
            Reply::Array(items) | Reply::Set(items) => {
                16 + items.iter().map(Reply::size_hint).sum::<usize>()
            }
            Reply::Map(pairs) => {
                16 + pairs
                    .iter()
                    .map(|(k, v)| k.size_hint() + v.size_hint())
                    .sum::<usize>()
            }
            // The room its encoding makes, so the reserve is enough.
            Reply::Entries(entries) => entries::bound(entries) + entries::SLACK,
        }
    }

    /// The reply as a frame of [`RespCodec`], encoded for `proto` when
    /// it is written.
    pub fn frame(self, proto: Protocol) -> (Protocol, Reply) {
        (proto, self)
    }

    /// An array of `replies`, each encoded for its own protocol
    /// (`protos`, one per reply): a plain array when they all share one.
    pub fn array_in_protocols(replies: Vec<Reply>, protos: &[Protocol]) -> Reply {
        if protos.windows(2).all(|w| w[0] == w[1]) {
            return Reply::Array(replies);
        }
        Reply::Array(
            replies
                .into_iter()
                .zip(protos)
                .map(|(r, p)| Reply::Encoded(r.to_bytes(*p)))
                .collect(),
        )
    }

    /// Whether this is, or may hold at its top, an error reply (what
    /// [`ErrorCounts`] looks at): a test of the variant, on every reply.
    #[inline]
    fn may_hold_error(&self) -> bool {
        match self {
            Reply::Error(_) | Reply::ErrorBytes(_) | Reply::Array(_) => true,
            Reply::Encoded(b) => b.first() == Some(&b'-'),
            _ => false,
        }
    }

    /// The encoding as one buffer.
    pub fn to_bytes(&self, proto: Protocol) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(proto, &mut b);
        b.freeze()
    }
}

/// A double as Redis prints it (`%.17g` without needless digits).
fn format_double(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let s = format!("{d}");
    s
}

fn line(dst: &mut BytesMut, kind: u8, text: &[u8]) {
    dst.reserve(text.len() + 3);
    dst.put_u8(kind);
    dst.put_slice(text);
    dst.put_slice(b"\r\n");
}

fn header(dst: &mut BytesMut, kind: u8, n: usize) {
    if n < 10 {
        // The common case (entry arrays, short fields): no formatting.
        dst.put_slice(&[kind, b'0' + n as u8, b'\r', b'\n']);
        return;
    }
    let mut b = itoa::Buffer::new();
    line(dst, kind, b.format(n).as_bytes());
}

fn bulk(dst: &mut BytesMut, data: &[u8]) {
    header(dst, b'$', data.len());
    dst.reserve(data.len() + 2);
    dst.put_slice(data);
    dst.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Request {
        Request::Command(
            v.iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect(),
        )
    }

    fn decode_all(codec: &mut RespCodec, buf: &mut BytesMut) -> Vec<Request> {
        let mut out = Vec::new();
        while let Some(r) = codec.decode(buf).unwrap() {
            out.push(r);
        }
        out
    }

    #[test]
    fn multibulk_requests_decode_with_their_arguments_sliced_from_the_read() {
        let mut c = RespCodec::new();
        let mut buf =
            BytesMut::from(&b"*3\r\n$4\r\nXADD\r\n$1\r\ns\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n"[..]);
        let base = buf.as_ptr() as usize;
        let reqs = decode_all(&mut c, &mut buf);
        assert_eq!(reqs, vec![args(&["XADD", "s", ""]), args(&["PING"])]);
        // No copy: the first argument points into the read buffer.
        let Request::Command(a) = &reqs[0] else {
            panic!()
        };
        assert_eq!(a[0].as_ptr() as usize, base + 8);
        assert!(buf.is_empty());
    }

    /// Decodes `wire` as it arrives in `chunks` (sizes, cycled), up to
    /// and with the first broken request (after which a connection
    /// closes).
    fn decode_in_chunks(wire: &[u8], chunks: &[usize]) -> Vec<Request> {
        let mut codec = RespCodec::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut at = 0;
        let mut sizes = chunks.iter().cycle();
        loop {
            while let Some(r) = codec.decode(&mut buf).unwrap() {
                let broken = matches!(r, Request::Broken(_));
                out.push(r);
                if broken {
                    return out;
                }
            }
            if at == wire.len() {
                return out;
            }
            let n = (*sizes.next().unwrap()).clamp(1, wire.len() - at);
            buf.extend_from_slice(&wire[at..at + n]);
            at += n;
        }
    }

    /// Streams of requests, well formed, mutated and random (a fixed
    /// seed), decode to the same requests however the reads cut them, and
    /// never panic.
    #[test]
    fn requests_decode_the_same_however_the_reads_cut_them() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let pieces: [&[u8]; 8] = [
            b"*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nf\r\n$5\r\nvalue\r\n",
            b"*1\r\n$4\r\nPING\r\n",
            b"PING hello\r\n",
            b"XLEN \"a b\" 'c'\n",
            b"*0\r\n",
            b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n",
            b"\r\n",
            b"*3\r\n$3\r\nDEL\r\n$3\r\nabc\r\n$2\r\nde\r\n",
        ];
        for round in 0..20_000u32 {
            let mut wire = Vec::new();
            for _ in 0..(1 + next() % 6) {
                wire.extend_from_slice(pieces[(next() % pieces.len() as u64) as usize]);
            }
            match round % 3 {
                0 => {}
                1 => {
                    // A few bytes changed: lengths, types, line ends.
                    for _ in 0..(1 + next() % 3) {
                        let at = (next() % wire.len() as u64) as usize;
                        wire[at] = [
                            b'*',
                            b'$',
                            b'\r',
                            b'\n',
                            b'0',
                            b'9',
                            b'-',
                            b'"',
                            next() as u8,
                        ][(next() % 9) as usize];
                    }
                }
                _ => {
                    let n = (next() % 200) as usize;
                    wire = (0..n).map(|_| next() as u8).collect();
                }
            }
            let whole = decode_in_chunks(&wire, &[usize::MAX]);
            for chunks in [
                &[1usize][..],
                &[2, 3],
                &[7],
                &[(next() % 40 + 1) as usize, 1],
            ] {
                assert_eq!(
                    decode_in_chunks(&wire, chunks),
                    whole,
                    "{:?} read in {chunks:?}",
                    String::from_utf8_lossy(&wire)
                );
            }
        }
    }

    #[test]
    fn a_request_arriving_byte_by_byte_decodes_once_whole() {
        let wire = b"*2\r\n$4\r\nECHO\r\n$11\r\nhello world\r\n";
        let mut c = RespCodec::new();
        let mut buf = BytesMut::new();
        for (i, &b) in wire.iter().enumerate() {
            buf.put_u8(b);
            let r = c.decode(&mut buf).unwrap();
            if i + 1 < wire.len() {
                assert_eq!(r, None, "decoded early at byte {i}");
            } else {
                assert_eq!(r, Some(args(&["ECHO", "hello world"])));
            }
        }
    }

    #[test]
    fn inline_commands_split_on_blanks_and_quotes() {
        let mut c = RespCodec::new();
        let mut buf = BytesMut::from(
            &b"PING\r\n\r\nxadd  s * f \"a b\\x41\\n\" 'it\\'s'\nset k \"x\"y\r\n"[..],
        );
        let reqs = decode_all(&mut c, &mut buf);
        assert_eq!(reqs[0], args(&["PING"]));
        assert_eq!(reqs[1], args(&["xadd", "s", "*", "f", "a bA\n", "it's"]));
        assert_eq!(reqs[2], Request::Broken(ProtocolError::UnbalancedQuotes));
        assert_eq!(reqs.len(), 3);
    }

    #[test]
    fn an_inline_line_ends_at_a_nul_and_its_blanks_are_c_s() {
        // Decoded on a thread of its own: a parser that loops on a NUL
        // fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut c = RespCodec::new();
            let mut buf = BytesMut::from(&b"a\0\r\nPING\r\n"[..]);
            let _ = tx.send((decode_all(&mut c, &mut buf), buf.len()));
        });
        let (reqs, left) = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the parser came back");
        // Redis finds a line's end with `strchr`, which stops at the NUL:
        // the line is not there yet, and nothing is taken.
        assert_eq!((reqs, left), (Vec::new(), 10));
        // Split as Redis's sdssplitargs splits a C string: what follows a
        // NUL is not read, and a quote it cuts is unbalanced.
        assert_eq!(
            split_inline(b"PING\0garbage \"x").unwrap(),
            vec![Bytes::from_static(b"PING")]
        );
        assert_eq!(
            split_inline(b"\"a\0b\""),
            Err(ProtocolError::UnbalancedQuotes)
        );
        // `\v` and `\f` are blanks before an argument and after a closing
        // quote; inside an unquoted word they are its bytes, and a quote
        // there opens a quoted part of the same word.
        let mut c = RespCodec::new();
        let mut buf = BytesMut::from(&b"\x0bECHO 'x'\x0b\x0cb\x0c'y'\r\n"[..]);
        assert_eq!(
            decode_all(&mut c, &mut buf),
            vec![args(&["ECHO", "x", "b\x0cy"])]
        );
    }

    #[test]
    fn length_lines_in_every_form_read_as_redis_reads_them() {
        let one = |wire: &[u8]| {
            let mut c = RespCodec::new().max_bulk(1000);
            let mut buf = BytesMut::from(wire);
            c.decode(&mut buf).unwrap()
        };
        let bad_bulk = Some(Request::Broken(ProtocolError::InvalidBulkLength));
        let bad_count = Some(Request::Broken(ProtocolError::InvalidMultibulkLength));
        assert_eq!(one(b"*1\r\n$0\r\n\r\n"), Some(args(&[""])));
        assert_eq!(
            one(b"*1\r\n$10\r\n0123456789\r\n"),
            Some(args(&["0123456789"]))
        );
        // Leading zeros, signs and blanks go to the general reading, which
        // refuses them as Redis's string2ll does.
        assert_eq!(one(b"*1\r\n$04\r\nPING\r\n"), bad_bulk);
        assert_eq!(one(b"*1\r\n$+4\r\nPING\r\n"), bad_bulk);
        assert_eq!(one(b"*1\r\n$ 4\r\nPING\r\n"), bad_bulk);
        assert_eq!(one(b"*1\r\n$-1\r\n"), bad_bulk);
        assert_eq!(one(b"*01\r\n$4\r\nPING\r\n"), bad_count);
        assert_eq!(one(b"*1\r\n$\r\nPING\r\n"), bad_bulk);
        // Past the limit, in the short form and the long one.
        assert_eq!(one(b"*1\r\n$1001\r\n"), bad_bulk);
        assert_eq!(one(b"*1\r\n$99999999999999999999\r\n"), bad_bulk);
        // A line whose `\n` has not arrived is not read yet.
        assert_eq!(one(b"*1\r\n$4\r"), None);
        assert_eq!(one(b"*1\r"), None);
    }

    #[test]
    fn the_short_length_reading_agrees_with_the_digit_loop_on_every_short_line() {
        // Every line of up to 5 bytes over digits, line ends and others.
        let alphabet = b"0159\r\nx-";
        let mut lines: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = lines
                .iter()
                .filter(|l| l.len() == lines.last().map_or(0, Vec::len))
                .flat_map(|l| {
                    alphabet.iter().map(move |&b| {
                        let mut l = l.clone();
                        l.push(b);
                        l
                    })
                })
                .collect();
            lines.extend(longer);
        }
        for line in &lines {
            for from in 0..2 {
                let mut buf = b"$".repeat(from);
                buf.extend_from_slice(line);
                assert_eq!(
                    short_len_line(&buf, from),
                    buf.get(from..).and_then(|rest| digits_len_line(rest, from)),
                    "{:?}",
                    String::from_utf8_lossy(line)
                );
            }
        }
    }

    #[test]
    fn a_huge_bulk_length_is_refused_from_its_header_alone() {
        let mut c = RespCodec::new();
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nECHO\r\n$1000000000\r\n"[..]);
        assert_eq!(
            c.decode(&mut buf).unwrap(),
            Some(Request::Broken(ProtocolError::InvalidBulkLength))
        );
        // Broken: what follows is never read as a request.
        buf.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert!(buf.is_empty());
    }

    #[test]
    fn an_unauthenticated_count_past_the_broker_s_bound_gets_redis_s_error() {
        // Redis 7.0 refuses counts past `INT_MAX` as invalid, then, before
        // authentication, any past 10; the broker's own bound comes after.
        let locked = || {
            RespCodec::new().until_authenticated(std::sync::Arc::new(
                std::sync::atomic::AtomicBool::new(false),
            ))
        };
        for (wire, want) in [
            (
                &b"*2000000\r\n"[..],
                ProtocolError::UnauthenticatedMultibulkLength,
            ),
            (b"*11\r\n", ProtocolError::UnauthenticatedMultibulkLength),
            (b"*2147483648\r\n", ProtocolError::InvalidMultibulkLength),
        ] {
            let mut buf = BytesMut::from(wire);
            assert_eq!(
                locked().decode(&mut buf).unwrap(),
                Some(Request::Broken(want)),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let mut buf = BytesMut::from(&b"*2000000\r\n"[..]);
        assert_eq!(
            RespCodec::new().decode(&mut buf).unwrap(),
            Some(Request::Broken(ProtocolError::InvalidMultibulkLength)),
            "authenticated: past the broker's bound"
        );
    }

    #[test]
    fn malformed_headers_get_redis_errors() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (b"*x\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*2\r\n+PING\r\n", ProtocolError::ExpectedBulk('+')),
            (b"*2\r\n\r\n", ProtocolError::ExpectedBulk(' ')),
            (b"*1\r\n$-5\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$01\r\n", ProtocolError::InvalidBulkLength),
            (b"*99999999999\r\n", ProtocolError::InvalidMultibulkLength),
        ];
        for (wire, want) in cases {
            let mut c = RespCodec::new();
            let mut buf = BytesMut::from(*wire);
            assert_eq!(
                c.decode(&mut buf).unwrap(),
                Some(Request::Broken(want.clone())),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let mut c = RespCodec::new();
        let mut buf = BytesMut::from(&vec![b'a'; INLINE_MAX + 1][..]);
        assert_eq!(
            c.decode(&mut buf).unwrap(),
            Some(Request::Broken(ProtocolError::InlineTooLong))
        );
        // A header line not all there yet is not judged: Redis waits for
        // its `\r` and the byte after it before looking for the `$`.
        for wire in [&b"*2\r\n+PI"[..], b"*2\r\n+PING\r", b"*5\r\r\n"] {
            let mut c = RespCodec::new();
            let mut buf = BytesMut::from(wire);
            assert_eq!(c.decode(&mut buf).unwrap(), None, "{wire:?}");
        }
        let mut c = RespCodec::new();
        let mut long = b"*1\r\n$".to_vec();
        long.extend(std::iter::repeat_n(b'1', INLINE_MAX + 1));
        let mut buf = BytesMut::from(&long[..]);
        assert_eq!(
            c.decode(&mut buf).unwrap(),
            Some(Request::Broken(ProtocolError::BulkLineTooLong))
        );
    }

    #[test]
    fn empty_multibulks_are_skipped() {
        let mut c = RespCodec::new();
        let mut buf = BytesMut::from(&b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n"[..]);
        assert_eq!(decode_all(&mut c, &mut buf), vec![args(&["PING"])]);
    }

    #[test]
    fn replies_encode_per_protocol() {
        let r = Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]);
        assert_eq!(&r.to_bytes(Protocol::Resp2)[..], b"*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(&r.to_bytes(Protocol::Resp3)[..], b"%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(&Reply::Nil.to_bytes(Protocol::Resp2)[..], b"$-1\r\n");
        let id = crate::id::StreamId::new(1_700_000_000_000, 42);
        assert_eq!(
            &Reply::Id(id).to_bytes(Protocol::Resp2)[..],
            b"$16\r\n1700000000000-42\r\n"
        );
        assert_eq!(&Reply::NilArray.to_bytes(Protocol::Resp2)[..], b"*-1\r\n");
        assert_eq!(&Reply::NilArray.to_bytes(Protocol::Resp3)[..], b"_\r\n");
        assert_eq!(
            &Reply::err("unknown command").to_bytes(Protocol::Resp2)[..],
            b"-ERR unknown command\r\n"
        );
    }

    #[test]
    fn integers_parse_as_redis_reads_them() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"01",
            b"-0",
            b"9223372036854775808",
            b"1a",
        ] {
            assert_eq!(parse_int(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_error_s_code_is_its_first_word_as_redis_takes_it() {
        assert_eq!(error_code(b"ERR unknown command 'x'"), "ERR");
        assert_eq!(error_code(b"NOGROUP No such key"), "NOGROUP");
        assert_eq!(
            error_code(b"BUSYGROUP Consumer Group name already exists"),
            "BUSYGROUP"
        );
        // No space within the first 31 bytes, or nothing before it: ERR.
        assert_eq!(error_code(b"NOSPACEATALL"), "ERR");
        assert_eq!(error_code(&[b'A'; 40]), "ERR");
        assert_eq!(error_code(b" leading space"), "ERR");
        // Bytes that would break an INFO line are not taken as a code.
        assert_eq!(error_code(b"A:B text"), "ERR");
        assert_eq!(error_code(b"\xff\xfe text"), "ERR");
    }

    #[test]
    fn error_replies_are_counted_by_code_and_past_the_limit_in_the_total_only() {
        let counts = ErrorCounts::default();
        counts.note_reply(&Reply::err("one"));
        counts.note_reply(&Reply::Error("NOGROUP no".to_owned()));
        counts.note_reply(&Reply::Int(3));
        // A transaction's replies: each error in it.
        counts.note_reply(&Reply::Array(vec![
            Reply::Int(1),
            Reply::Encoded(Bytes::from_static(b"-ERR two\r\n")),
            Reply::ErrorBytes(Bytes::from_static(b"WRONGTYPE three")),
            Reply::Encoded(Bytes::from_static(b":4\r\n")),
        ]));
        assert_eq!(counts.total(), 4);
        assert_eq!(
            counts.lines(),
            [
                "errorstat_ERR:count=2",
                "errorstat_NOGROUP:count=1",
                "errorstat_WRONGTYPE:count=1"
            ]
        );
        for i in 0..MAX_ERROR_CODES + 10 {
            counts.note(format!("CODE{i} text").as_bytes());
        }
        assert_eq!(counts.lines().len(), MAX_ERROR_CODES);
        assert_eq!(counts.total(), 4 + MAX_ERROR_CODES as u64 + 10);
        counts.reset();
        assert_eq!((counts.total(), counts.lines().len()), (0, 0));
    }
}
