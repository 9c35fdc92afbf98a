//! Stream entry ids (`<ms>-<seq>`) and the ways commands name them: the
//! id argument of `XADD` (`*`, `<ms>-*`, `<ms>`, `<ms>-<seq>`) and range
//! bounds (`-`, `+`, incomplete ids, `(` for an exclusive bound).

use crate::command::c_string;
use std::fmt;

use crate::resp::Reply;

/// A stream entry id: milliseconds and a sequence number within them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId {
    /// Milliseconds part.
    pub ms: u64,
    /// Sequence part.
    pub seq: u64,
}

impl StreamId {
    /// `0-0`, below every entry.
    pub const MIN: StreamId = StreamId { ms: 0, seq: 0 };
    /// The largest id.
    pub const MAX: StreamId = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    /// An id from its parts.
    pub const fn new(ms: u64, seq: u64) -> Self {
        StreamId { ms, seq }
    }

    /// The next id, `None` after [`StreamId::MAX`].
    pub fn next(self) -> Option<StreamId> {
        match self.seq.checked_add(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => self.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
        }
    }

    /// The previous id, `None` before [`StreamId::MIN`].
    pub fn prev(self) -> Option<StreamId> {
        match self.seq.checked_sub(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => self
                .ms
                .checked_sub(1)
                .map(|ms| StreamId { ms, seq: u64::MAX }),
        }
    }

    /// The id as a bulk reply.
    pub fn reply(self) -> Reply {
        Reply::Id(self)
    }

    /// The id's 16-byte big-endian form (sorts as the id does).
    pub fn to_be_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.ms.to_be_bytes());
        b[8..].copy_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// The id from [`StreamId::to_be_bytes`].
    pub fn from_be_bytes(b: [u8; 16]) -> Self {
        let (ms, seq) = b.split_at(8);
        StreamId {
            ms: u64::from_be_bytes(ms.try_into().expect("8 bytes")),
            seq: u64::from_be_bytes(seq.try_into().expect("8 bytes")),
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// The error text for an id that does not parse.
pub const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";

/// An id argument as Redis reads it: refused past 127 bytes, and then a
/// C string (what follows a NUL is not read).
fn id_text(arg: &[u8]) -> Option<&[u8]> {
    (arg.len() <= 127).then(|| c_string(arg))
}

/// A part of an id as Redis's `string2ull` reads it: a canonical decimal
/// `i64` that is not negative (`string2ll`), or else what C's `strtoull`
/// takes whole: leading blanks, a sign (a negative wraps around), digits
/// (leading zeros too) and nothing after them, within `u64`.
fn parse_u64(s: &[u8]) -> Option<u64> {
    match crate::resp::parse_int(s) {
        Some(v) => u64::try_from(v).ok(),
        None => crate::resp::strtoull_whole(s),
    }
}

/// The id argument of `XADD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddId {
    /// `*`: the time now, or after the last id.
    Auto,
    /// `<ms>-*`: this millisecond, the next sequence in it.
    Partial(u64),
    /// `<ms>-<seq>`, or `<ms>` (sequence 0).
    Explicit(StreamId),
}

impl AddId {
    /// Parses `XADD`'s id argument.
    ///
    /// # Errors
    ///
    /// The Redis error reply for an invalid id.
    pub fn parse(arg: &[u8]) -> Result<AddId, Reply> {
        if c_string(arg) == b"*" {
            return Ok(AddId::Auto);
        }
        let invalid = || Reply::Error(INVALID_ID.to_owned());
        let arg = id_text(arg).ok_or_else(invalid)?;
        match arg.iter().position(|&b| b == b'-') {
            None => Ok(AddId::Explicit(StreamId::new(
                parse_u64(arg).ok_or_else(invalid)?,
                0,
            ))),
            Some(dash) => {
                let ms = parse_u64(&arg[..dash]).ok_or_else(invalid)?;
                let rest = &arg[dash + 1..];
                if rest == b"*" {
                    return Ok(AddId::Partial(ms));
                }
                let seq = parse_u64(rest).ok_or_else(invalid)?;
                Ok(AddId::Explicit(StreamId::new(ms, seq)))
            }
        }
    }
}

/// Parses an id where `-` and `+` stand for the smallest and largest, and
/// an id without a sequence takes `missing_seq`. With `strict`, `-` and
/// `+` are refused (an exclusive bound may not be one).
///
/// # Errors
///
/// The Redis error reply for an invalid id.
pub fn parse_id(arg: &[u8], missing_seq: u64, strict: bool) -> Result<StreamId, Reply> {
    let invalid = || Reply::Error(INVALID_ID.to_owned());
    let arg = id_text(arg).ok_or_else(invalid)?;
    if !strict {
        if arg == b"-" {
            return Ok(StreamId::MIN);
        }
        if arg == b"+" {
            return Ok(StreamId::MAX);
        }
    }
    match arg.iter().position(|&b| b == b'-') {
        None => Ok(StreamId::new(
            parse_u64(arg).ok_or_else(invalid)?,
            missing_seq,
        )),
        Some(dash) => Ok(StreamId::new(
            parse_u64(&arg[..dash]).ok_or_else(invalid)?,
            parse_u64(&arg[dash + 1..]).ok_or_else(invalid)?,
        )),
    }
}

/// The bounds of `XRANGE start end` (for `XREVRANGE`, pass them swapped
/// back into start/end order): inclusive ids after `(` is applied.
///
/// # Errors
///
/// An invalid id, or an exclusive bound past the end of the id space.
pub fn parse_range(start: &[u8], end: &[u8]) -> Result<(StreamId, StreamId), Reply> {
    let (start, start_ex) = match start.strip_prefix(b"(") {
        Some(rest) if !rest.is_empty() => (rest, true),
        _ => (start, false),
    };
    let (end, end_ex) = match end.strip_prefix(b"(") {
        Some(rest) if !rest.is_empty() => (rest, true),
        _ => (end, false),
    };
    let mut lo = parse_id(start, 0, start_ex)?;
    if start_ex {
        lo = lo
            .next()
            .ok_or_else(|| Reply::err("invalid start ID for the interval"))?;
    }
    let mut hi = parse_id(end, u64::MAX, end_ex)?;
    if end_ex {
        hi = hi
            .prev()
            .ok_or_else(|| Reply::err("invalid end ID for the interval"))?;
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_as_c_strings_up_to_127_bytes() {
        assert_eq!(parse_id(b"1\x001", 0, false), Ok(StreamId::new(1, 0)));
        assert_eq!(parse_id(b"1-2\x00-3", 0, false), Ok(StreamId::new(1, 2)));
        assert_eq!(AddId::parse(b"*\x00x"), Ok(AddId::Auto));
        assert_eq!(
            AddId::parse(b"7\x00"),
            Ok(AddId::Explicit(StreamId::new(7, 0)))
        );
        assert!(parse_id(b"\x001", 0, false).is_err());
        let long = [&b"1"[..], &[0u8; 127]].concat();
        assert!(parse_id(&long, 0, false).is_err(), "past 127 bytes");
        assert!(parse_id(&long[..127], 0, false).is_ok());
    }

    #[test]
    fn add_ids_parse_in_their_four_forms() {
        assert_eq!(AddId::parse(b"*"), Ok(AddId::Auto));
        assert_eq!(AddId::parse(b"5-*"), Ok(AddId::Partial(5)));
        assert_eq!(AddId::parse(b"5"), Ok(AddId::Explicit(StreamId::new(5, 0))));
        assert_eq!(
            AddId::parse(b"5-3"),
            Ok(AddId::Explicit(StreamId::new(5, 3)))
        );
        for bad in [
            &b"-"[..],
            b"+",
            b"5-",
            b"-5",
            b"a-1",
            b"1-2-3",
            b"18446744073709551616",
        ] {
            assert_eq!(
                AddId::parse(bad),
                Err(Reply::Error(INVALID_ID.to_owned())),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn range_bounds_take_specials_incomplete_ids_and_exclusion() {
        assert_eq!(parse_range(b"-", b"+"), Ok((StreamId::MIN, StreamId::MAX)));
        assert_eq!(
            parse_range(b"5", b"7"),
            Ok((StreamId::new(5, 0), StreamId::new(7, u64::MAX)))
        );
        assert_eq!(
            parse_range(b"(5-1", b"(7-0"),
            Ok((StreamId::new(5, 2), StreamId::new(6, u64::MAX)))
        );
        assert!(parse_range(b"(-", b"+").is_err());
        assert_eq!(
            parse_range(b"(18446744073709551615-18446744073709551615", b"+"),
            Err(Reply::err("invalid start ID for the interval"))
        );
        assert_eq!(
            parse_range(b"-", b"(0-0"),
            Err(Reply::err("invalid end ID for the interval"))
        );
    }

    #[test]
    fn next_and_prev_carry_across_the_millisecond() {
        assert_eq!(StreamId::new(1, u64::MAX).next(), Some(StreamId::new(2, 0)));
        assert_eq!(StreamId::new(2, 0).prev(), Some(StreamId::new(1, u64::MAX)));
        assert_eq!(StreamId::MAX.next(), None);
        assert_eq!(StreamId::MIN.prev(), None);
        let id = StreamId::new(7, 9);
        assert_eq!(StreamId::from_be_bytes(id.to_be_bytes()), id);
    }
}
