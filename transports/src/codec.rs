//! Framing on `bytes`: the [`Codec`] trait a session's connection decodes
//! with and encodes with, and the stock codecs: [`LengthDelimited`],
//! [`Lines`] and [`RawBytes`].
//!
//! A decoder takes frames off the front of the connection's read buffer. A
//! frame that arrived whole is split off that buffer (`BytesMut::split_to`),
//! never copied; a frame that announces more than the codec's maximum is
//! refused as soon as its header is read, before its body is buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Why a frame could not be decoded or encoded. Each closes only the
/// connection it concerns (see `CloseReason::BadFrame`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A frame announced (or, for delimited frames, reached) more bytes than
    /// the codec accepts.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLong {
        /// The announced (or buffered) length.
        len: usize,
        /// The codec's maximum.
        max: usize,
    },
    /// The bytes are not a frame of this codec.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Decoding frames from a read buffer and encoding frames into a write
/// buffer; one value per connection side (the server clones the one it was
/// given).
///
/// ```
/// use bytes::BytesMut;
/// use mailring_transports::codec::{Codec, LengthDelimited};
///
/// let mut codec = LengthDelimited::new();
/// let mut wire = BytesMut::new();
/// codec.encode(bytes::Bytes::from_static(b"hello"), &mut wire).unwrap();
/// assert_eq!(&wire[..], b"\0\0\0\x05hello");
/// let frame = codec.decode(&mut wire).unwrap().unwrap();
/// assert_eq!(&frame[..], b"hello");
/// assert!(wire.is_empty());
/// ```
pub trait Codec: Clone + Send + Sync + 'static {
    /// A decoded frame.
    type In: Send + 'static;
    /// A frame to encode.
    type Out: 'static;

    /// Takes one frame off the front of `buf`, or `Ok(None)` when `buf` does
    /// not hold a whole frame yet (it may reserve room for the rest).
    ///
    /// # Errors
    ///
    /// A frame this codec refuses; the connection is closed.
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::In>, CodecError>;

    /// Appends `frame`'s encoding to `dst`.
    ///
    /// # Errors
    ///
    /// A frame this codec cannot encode (e.g. longer than its header allows).
    fn encode(&mut self, frame: Self::Out, dst: &mut BytesMut) -> Result<(), CodecError>;
}

/// Frames preceded by their length: a big-endian unsigned header of 1, 2, 4
/// (the default) or 8 bytes counting the body only.
///
/// ```
/// use mailring_transports::codec::LengthDelimited;
/// let codec = LengthDelimited::new().header_len(2).max_frame(1024);
/// assert_eq!(codec.max_frame_len(), 1024);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LengthDelimited {
    header: usize,
    max: usize,
}

/// The default maximum body of a [`LengthDelimited`] frame: 8 MiB.
pub const DEFAULT_MAX_FRAME: usize = 8 << 20;

impl Default for LengthDelimited {
    fn default() -> Self {
        Self::new()
    }
}

impl LengthDelimited {
    /// A 4-byte header and a maximum of [`DEFAULT_MAX_FRAME`].
    pub fn new() -> Self {
        LengthDelimited {
            header: 4,
            max: DEFAULT_MAX_FRAME,
        }
    }

    /// Sets the header's length in bytes.
    ///
    /// # Panics
    ///
    /// When `bytes` is not 1, 2, 4 or 8.
    pub fn header_len(mut self, bytes: usize) -> Self {
        assert!(
            matches!(bytes, 1 | 2 | 4 | 8),
            "LengthDelimited::header_len: {bytes} is not 1, 2, 4 or 8"
        );
        self.header = bytes;
        self
    }

    /// Sets the longest body accepted (decoding) and produced (encoding).
    pub fn max_frame(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// The longest body accepted.
    pub fn max_frame_len(&self) -> usize {
        self.max
    }

    fn header_max(&self) -> u64 {
        if self.header == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * self.header)) - 1
        }
    }
}

impl Codec for LengthDelimited {
    type In = Bytes;
    type Out = Bytes;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, CodecError> {
        if buf.len() < self.header {
            return Ok(None);
        }
        let announced = (&buf[..self.header]).get_uint(self.header);
        let len = usize::try_from(announced).unwrap_or(usize::MAX);
        if len > self.max {
            return Err(CodecError::TooLong { len, max: self.max });
        }
        let whole = self.header + len;
        if buf.len() < whole {
            buf.reserve(whole - buf.len());
            return Ok(None);
        }
        buf.advance(self.header);
        Ok(Some(buf.split_to(len).freeze()))
    }

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        let len = frame.len();
        if len > self.max || len as u64 > self.header_max() {
            return Err(CodecError::TooLong {
                len,
                max: self
                    .max
                    .min(usize::try_from(self.header_max()).unwrap_or(usize::MAX)),
            });
        }
        dst.reserve(self.header + len);
        dst.put_uint(len as u64, self.header);
        dst.extend_from_slice(&frame);
        Ok(())
    }
}

/// Lines ended by `\n` (a `\r` before it is dropped too); frames are the
/// line's bytes without the ending, and encoding appends `\n`.
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    max: usize,
    /// How far the buffer was searched for `\n` already.
    scanned: usize,
}

impl Default for Lines {
    fn default() -> Self {
        Self::new()
    }
}

impl Lines {
    /// Lines of at most 64 KiB.
    pub fn new() -> Self {
        Lines {
            max: 64 << 10,
            scanned: 0,
        }
    }

    /// Sets the longest line accepted, without its ending.
    pub fn max_line(mut self, max: usize) -> Self {
        self.max = max;
        self
    }
}

impl Codec for Lines {
    type In = Bytes;
    type Out = Bytes;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, CodecError> {
        let start = self.scanned.min(buf.len());
        match buf[start..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = start + at;
                self.scanned = 0;
                let mut line = buf.split_to(end + 1);
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.len() > self.max {
                    return Err(CodecError::TooLong {
                        len: line.len(),
                        max: self.max,
                    });
                }
                Ok(Some(line.freeze()))
            }
            None => {
                // One more byte may be a `\r` of the ending.
                if buf.len() > self.max + 1 {
                    return Err(CodecError::TooLong {
                        len: buf.len(),
                        max: self.max,
                    });
                }
                self.scanned = buf.len();
                Ok(None)
            }
        }
    }

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        if frame.contains(&b'\n') {
            return Err(CodecError::Malformed(
                "a line to send contains `\\n`".into(),
            ));
        }
        dst.reserve(frame.len() + 1);
        dst.extend_from_slice(&frame);
        dst.put_u8(b'\n');
        Ok(())
    }
}

/// No framing: each read's bytes as they came (at most `max` at a time),
/// and frames sent as they are.
#[derive(Debug, Clone, Copy)]
pub struct RawBytes {
    max: usize,
}

impl Default for RawBytes {
    fn default() -> Self {
        RawBytes { max: 64 << 10 }
    }
}

impl RawBytes {
    /// Chunks of at most 64 KiB.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the largest chunk handed out at once.
    pub fn max_chunk(mut self, max: usize) -> Self {
        self.max = max.max(1);
        self
    }
}

impl Codec for RawBytes {
    type In = Bytes;
    type Out = Bytes;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, CodecError> {
        if buf.is_empty() {
            return Ok(None);
        }
        let n = buf.len().min(self.max);
        Ok(Some(buf.split_to(n).freeze()))
    }

    fn encode(&mut self, frame: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        dst.extend_from_slice(&frame);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_delimited_waits_for_the_whole_frame_and_splits_without_copying() {
        let mut c = LengthDelimited::new();
        let mut buf = BytesMut::from(&b"\0\0\0\x03ab"[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"c\0\0\0\x01z");
        let base = buf.as_ptr();
        let frame = c.decode(&mut buf).unwrap().unwrap();
        assert_eq!(&frame[..], b"abc");
        // The frame is the buffer's own bytes, past the header.
        assert_eq!(frame.as_ptr(), base.wrapping_add(4));
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"z");
        assert_eq!(c.decode(&mut buf).unwrap(), None);
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header_alone() {
        let mut c = LengthDelimited::new().max_frame(16);
        let mut buf = BytesMut::from(&b"\0\0\0\x11"[..]);
        assert_eq!(
            c.decode(&mut buf),
            Err(CodecError::TooLong { len: 17, max: 16 })
        );
        // A header claiming u32::MAX does not make it reserve 4 GiB either.
        let mut buf = BytesMut::from(&b"\xff\xff\xff\xff"[..]);
        assert!(c.decode(&mut buf).is_err());
        assert!(buf.capacity() < 1024);
    }

    #[test]
    fn header_lengths_round_trip_and_encoding_checks_the_header_fits() {
        for h in [1, 2, 4, 8] {
            let mut c = LengthDelimited::new().header_len(h);
            let mut wire = BytesMut::new();
            c.encode(Bytes::from_static(b"xyz"), &mut wire).unwrap();
            assert_eq!(wire.len(), h + 3);
            assert_eq!(&c.decode(&mut wire).unwrap().unwrap()[..], b"xyz");
        }
        let mut c = LengthDelimited::new().header_len(1);
        let err = c.encode(Bytes::from(vec![0u8; 256]), &mut BytesMut::new());
        assert!(matches!(
            err,
            Err(CodecError::TooLong { len: 256, max: 255 })
        ));
    }

    #[test]
    fn lines_strip_their_ending_and_refuse_an_endless_line() {
        let mut c = Lines::new().max_line(8);
        let mut buf = BytesMut::from(&b"PING\r\nab"[..]);
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"PING");
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"c\n");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"abc");
        let mut long = BytesMut::from(&b"0123456789"[..]);
        assert!(matches!(
            c.decode(&mut long),
            Err(CodecError::TooLong { max: 8, .. })
        ));
        let mut wire = BytesMut::new();
        assert!(c.encode(Bytes::from_static(b"a\nb"), &mut wire).is_err());
    }

    #[test]
    fn raw_bytes_hands_out_at_most_a_chunk() {
        let mut c = RawBytes::new().max_chunk(3);
        let mut buf = BytesMut::from(&b"abcde"[..]);
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"abc");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"de");
        assert_eq!(c.decode(&mut buf).unwrap(), None);
    }
}
