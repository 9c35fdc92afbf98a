//! An entry's field-value pairs, packed into one shared allocation in the
//! commit log's own encoding (a count, then each element's length and
//! bytes), so appending an entry to the log is one copy, reading it back
//! is one copy, and a cached entry costs one small allocation.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

/// An entry's field-value pairs, flattened (`f1 v1 f2 v2 ...`); shared by
/// the stream, the log record and the replies that carry it.
///
/// Encoded as the log encodes an entry: `count: u32`, then per element
/// `len: u32` and its bytes (little endian). Cloning shares it.
///
/// ```
/// use mailring_broker::stream::Fields;
///
/// let f = Fields::from_parts(&[&b"name"[..], b"ada"]);
/// assert_eq!(f.len(), 2);
/// assert_eq!(f.iter().collect::<Vec<_>>(), [&b"name"[..], b"ada"]);
/// assert_eq!(Fields::decode(f.encoded()), Some((f.clone(), f.encoded().len())));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Fields(Arc<[u8]>);

thread_local! {
    /// Where an entry is assembled before its one allocation is made.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer past this size is not kept for the next entry.
const SCRATCH_KEEP: usize = 64 << 10;

impl Fields {
    /// Copies `parts` (fields and values, alternating) into one buffer.
    ///
    /// # Panics
    ///
    /// If there are more than `u32::MAX` parts or one is longer than
    /// `u32::MAX` bytes (requests are refused long before: a bulk string
    /// is at most 512 MB).
    pub fn from_parts<B: AsRef<[u8]>>(parts: &[B]) -> Fields {
        let size = 4 + parts.iter().map(|p| 4 + p.as_ref().len()).sum::<usize>();
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.clear();
            s.reserve(size);
            s.extend_from_slice(&len_u32(parts.len()).to_le_bytes());
            for p in parts {
                let p = p.as_ref();
                s.extend_from_slice(&len_u32(p.len()).to_le_bytes());
                s.extend_from_slice(p);
            }
            let fields = Fields(Arc::from(&s[..]));
            if s.capacity() > SCRATCH_KEEP {
                *s = Vec::new();
            }
            fields
        })
    }

    /// Reads an entry encoded as [`Fields::encoded`] gives it from the
    /// front of `b`: the entry and the bytes it took, or `None` if `b` is
    /// cut short (a torn or corrupt record).
    pub fn decode(b: &[u8]) -> Option<(Fields, usize)> {
        let n = read_len(b, 0)?;
        // Each element takes 4 bytes at least: a count beyond that is
        // corrupt, refused before anything is walked.
        if n > (b.len() - 4) / 4 {
            return None;
        }
        let mut at = 4usize;
        for _ in 0..n {
            let len = read_len(b, at)?;
            at = at.checked_add(4 + len).filter(|&end| end <= b.len())?;
        }
        Some((Fields(Arc::from(&b[..at])), at))
    }

    /// The encoding (as the log stores it).
    pub fn encoded(&self) -> &[u8] {
        &self.0
    }

    /// How many fields and values (twice the pairs).
    pub fn len(&self) -> usize {
        read_len(&self.0, 0).expect("a checked encoding")
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fields and values, alternating.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            rest: &self.0[4..],
            left: self.len(),
        }
    }

    /// The field names (every other element, from the first).
    pub fn names(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.iter().step_by(2)
    }

    /// The values (every other element, from the second).
    pub fn values(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.iter().skip(1).step_by(2)
    }

    /// Bytes of the fields and values themselves.
    pub fn data_bytes(&self) -> u64 {
        (self.0.len() - 4 - 4 * self.len()) as u64
    }

    /// Bytes it takes in memory: its buffer and the shared count beside
    /// it.
    pub fn heap_bytes(&self) -> u64 {
        self.0.len() as u64 + 16
    }
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).expect("an entry element or count within u32")
}

fn read_len(b: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(raw)).ok()
}

impl fmt::Debug for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|e| String::from_utf8_lossy(e)))
            .finish()
    }
}

/// The elements of [`Fields`], in order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let len = read_len(self.rest, 0).expect("a checked encoding");
        let (item, rest) = self.rest[4..].split_at(len);
        self.rest = rest;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_come_back_in_order_with_empty_and_binary_ones() {
        let parts: [&[u8]; 4] = [b"f", b"", b"\0\r\n", b"v"];
        let f = Fields::from_parts(&parts);
        assert_eq!(f.len(), 4);
        assert_eq!(f.iter().collect::<Vec<_>>(), parts);
        assert_eq!(f.names().collect::<Vec<_>>(), [&b"f"[..], b"\0\r\n"]);
        assert_eq!(f.values().collect::<Vec<_>>(), [&b""[..], b"v"]);
        assert_eq!(f.data_bytes(), 5);
    }

    #[test]
    fn decoding_takes_one_entry_and_refuses_a_cut_or_lying_one() {
        let f = Fields::from_parts(&[&b"field"[..], b"value"]);
        let mut wire = f.encoded().to_vec();
        wire.extend_from_slice(b"next record");
        assert_eq!(Fields::decode(&wire), Some((f.clone(), f.encoded().len())));
        for cut in 0..f.encoded().len() {
            assert_eq!(Fields::decode(&wire[..cut]), None, "cut at {cut}");
        }
        // A count no buffer this size can hold.
        assert_eq!(Fields::decode(&[255, 255, 255, 255, 0, 0, 0, 0]), None);
        // An element longer than what follows.
        assert_eq!(Fields::decode(&[1, 0, 0, 0, 255, 255, 255, 255, 1]), None);
    }

    #[test]
    fn a_large_entry_leaves_no_large_scratch_behind() {
        let big = vec![7u8; SCRATCH_KEEP * 2];
        let f = Fields::from_parts(&[&b"f"[..], &big]);
        assert_eq!(f.values().next(), Some(&big[..]));
        assert!(SCRATCH.with(|s| s.borrow().capacity()) <= SCRATCH_KEEP);
    }
}
