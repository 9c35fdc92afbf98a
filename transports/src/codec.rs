//! Framing on `bytes`: the [`Codec`] trait a session's connection decodes
//! with and encodes with, and the stock codecs: [`LengthDelimited`],
//! [`Lines`], [`RawBytes`] and [`Bincode`] (serde values).
//!
//! A decoder takes frames off the front of the connection's read buffer. A
//! frame that arrived whole is split off that buffer (`BytesMut::split_to`),
//! never copied; a frame that announces more than the codec's maximum is
//! refused as soon as its header is read, before its body is buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};

mod bounded;

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
    /// A frame this codec refuses: a server closes the connection; a
    /// [`Framed`](crate::Framed) returns the error from its `recv`, and
    /// the caller decides (what the codec consumed is gone).
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::In>, CodecError>;

    /// Appends `frame`'s encoding to `dst`.
    ///
    /// # Errors
    ///
    /// A frame this codec cannot encode (e.g. longer than its header allows).
    fn encode(&mut self, frame: Self::Out, dst: &mut BytesMut) -> Result<(), CodecError>;

    /// Takes a frame that is not written: a reply the session queued while
    /// it discarded its replies ([`crate::SessionCtx::discard_replies`]).
    /// By default it is dropped; a codec that counts what it answers (a
    /// Redis server counts the errors among replies it does not send) sees
    /// it here.
    fn discard(&mut self, frame: Self::Out) {
        drop(frame);
    }
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

/// How much room a decoder makes for the rest of a frame it has the
/// header of, at most.
const RESERVE_AHEAD: usize = 64 << 10;

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
        let Some(whole) = self.header.checked_add(len) else {
            return Err(CodecError::TooLong { len, max: self.max });
        };
        if buf.len() < whole {
            // Room for what is missing, up to a bound: a peer that announces
            // a large frame and sends it slowly (or never) holds only what
            // it sent.
            buf.reserve((whole - buf.len()).min(RESERVE_AHEAD));
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
/// line's bytes without the ending, and encoding appends `\n`: a frame
/// sent with a `\r` at its end goes out ended by `\r\n`, as the lines of a
/// CRLF protocol (SMTP, POP3, IRC) are (a reader drops that `\r` with the
/// ending).
///
/// A `Lines` remembers how far it searched the buffer it was last given
/// (so a long line arriving in pieces is searched once): it decodes one
/// stream. A clone starts fresh, so a template a server clones for each
/// connection may have been used before.
#[derive(Debug)]
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

impl Clone for Lines {
    fn clone(&self) -> Self {
        Lines {
            max: self.max,
            scanned: 0,
        }
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
                if buf.len() > self.max.saturating_add(1) {
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

/// Serde values as bincode (2.0, standard configuration) in
/// [`LengthDelimited`] frames: decodes `In`, encodes `Out` (the same type
/// on both ends of a symmetric protocol).
///
/// A frame's value may claim in memory up to 16 times the frame maximum
/// in its strings and byte buffers, as bincode counts them before it reads
/// them (in steps: at least 1 MiB, at most 8 GiB), and as much again in
/// the elements of its collections (sequences and maps: not the fields of
/// a struct, tuple or array, which are their parent's size), each counted
/// at its size in memory and at least 16 bytes (what the bound allows per
/// byte of the frame: an element of a zero-size type takes none on the
/// wire); it may nest at most [`MAX_BINCODE_DEPTH`] levels. Past any
/// of these the frame is refused as malformed, and its connection closed.
/// A length field is read before the bytes it counts: without a bound, 14
/// bytes claiming a string of 2^50 bytes would make the decoder ask for
/// that much memory, 10 bytes claiming 2^64 `()`s would spin the shard for
/// ever, one byte per level of a recursive type would overflow its stack
/// (all three abort or freeze far more than one connection).
///
/// ```
/// use bytes::BytesMut;
/// use mailring_transports::codec::{Bincode, Codec};
///
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: u64, item: String }
///
/// let mut codec = Bincode::<Order, Order>::new();
/// let mut wire = BytesMut::new();
/// codec.encode(Order { id: 7, item: "tea".into() }, &mut wire).unwrap();
/// assert_eq!(codec.decode(&mut wire).unwrap(), Some(Order { id: 7, item: "tea".into() }));
/// ```
pub struct Bincode<In, Out> {
    frames: LengthDelimited,
    types: std::marker::PhantomData<fn(Out) -> In>,
}

impl<In, Out> std::fmt::Debug for Bincode<In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bincode")
            .field("frames", &self.frames)
            .finish()
    }
}

impl<In, Out> Clone for Bincode<In, Out> {
    fn clone(&self) -> Self {
        Bincode {
            frames: self.frames,
            types: std::marker::PhantomData,
        }
    }
}

impl<In, Out> Default for Bincode<In, Out> {
    fn default() -> Self {
        Self::new()
    }
}

impl<In, Out> Bincode<In, Out> {
    /// Values in frames of the default [`LengthDelimited`] (4-byte header,
    /// 8 MiB at most).
    pub fn new() -> Self {
        Self::with_frames(LengthDelimited::new())
    }

    /// Values in frames of `frames` (its header and maximum).
    pub fn with_frames(frames: LengthDelimited) -> Self {
        Bincode {
            frames,
            types: std::marker::PhantomData,
        }
    }
}

/// What a [`Bincode`] value may claim in memory per byte of the frame
/// maximum (a `u64` collection takes at least a byte on the wire per
/// element, 8 in memory; a `u128` one, 16).
const DECODED_PER_FRAME_BYTE: usize = 16;

/// How deep a [`Bincode`] value may nest (serde_json's limit): each level
/// takes stack frames of the shard's thread, and a stack overflow aborts
/// the process (it is no panic to catch). A recursive message type (a
/// tree, an expression) would otherwise let one frame of `0x01` bytes
/// nest a million levels.
pub const MAX_BINCODE_DEPTH: usize = 128;

/// Decodes `In` from `frame`: its strings and byte buffers claiming at
/// most the first step of bincode's compile-time limits that covers
/// `memory`, its collections' elements taking at most `memory` in
/// all (each at its type's size in memory, and at least 16 bytes:
/// bincode's limit counts bytes read, and an element may take none), nested at
/// most [`MAX_BINCODE_DEPTH`] levels.
fn decode_bounded<In: serde::de::DeserializeOwned>(
    frame: &[u8],
    memory: usize,
) -> Result<(In, usize), bincode::error::DecodeError> {
    use bincode::serde::seed_decode_from_slice as decode;
    let limits = bounded::Limits::new(MAX_BINCODE_DEPTH, memory);
    let seed = BoundedSeed::<In> {
        limits: &limits,
        value: std::marker::PhantomData,
    };
    let standard = bincode::config::standard();
    match memory {
        m if m <= 1 << 20 => decode(seed, frame, standard.with_limit::<{ 1 << 20 }>()),
        m if m <= 1 << 24 => decode(seed, frame, standard.with_limit::<{ 1 << 24 }>()),
        m if m <= 1 << 27 => decode(seed, frame, standard.with_limit::<{ 1 << 27 }>()),
        m if m <= 1 << 30 => decode(seed, frame, standard.with_limit::<{ 1 << 30 }>()),
        _ => decode(seed, frame, standard.with_limit::<{ 1 << 33 }>()),
    }
}

/// Deserializes an `In` held to `limits`.
struct BoundedSeed<'l, In> {
    limits: &'l bounded::Limits,
    value: std::marker::PhantomData<fn() -> In>,
}

impl<'de, In: serde::de::DeserializeOwned> serde::de::DeserializeSeed<'de> for BoundedSeed<'_, In> {
    type Value = In;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<In, D::Error> {
        In::deserialize(bounded::Bounded::new(d, self.limits))
    }
}

impl<In, Out> Codec for Bincode<In, Out>
where
    In: serde::de::DeserializeOwned + Send + 'static,
    Out: serde::Serialize + 'static,
{
    type In = In;
    type Out = Out;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<In>, CodecError> {
        let Some(frame) = self.frames.decode(buf)? else {
            return Ok(None);
        };
        let memory = self.frames.max.saturating_mul(DECODED_PER_FRAME_BYTE);
        let (value, used) = decode_bounded::<In>(&frame, memory)
            .map_err(|e| CodecError::Malformed(format!("bincode: {e}")))?;
        if used != frame.len() {
            return Err(CodecError::Malformed(format!(
                "bincode: {} bytes left over in a frame of {}",
                frame.len() - used,
                frame.len()
            )));
        }
        Ok(Some(value))
    }

    fn encode(&mut self, value: Out, dst: &mut BytesMut) -> Result<(), CodecError> {
        let body = bincode::serde::encode_to_vec(&value, bincode::config::standard())
            .map_err(|e| CodecError::Malformed(format!("bincode: {e}")))?;
        self.frames.encode(Bytes::from(body), dst)
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
        // Nor does a u64::MAX claim under an unbounded maximum overflow.
        let mut unbounded = LengthDelimited::new().header_len(8).max_frame(usize::MAX);
        let mut buf = BytesMut::from(&[0xffu8; 8][..]);
        assert!(matches!(
            unbounded.decode(&mut buf),
            Err(CodecError::TooLong { .. })
        ));
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
    fn lines_refuse_to_send_a_line_break_and_end_a_cr_terminated_line_with_crlf() {
        let mut c = Lines::new();
        let mut wire = BytesMut::new();
        assert!(c.encode(Bytes::from_static(b"a\nb"), &mut wire).is_err());
        c.encode(Bytes::from_static(b"HELO x\r"), &mut wire)
            .unwrap();
        assert_eq!(&wire[..], b"HELO x\r\n");
        assert_eq!(&c.decode(&mut wire).unwrap().unwrap()[..], b"HELO x");
        c.encode(Bytes::from_static(b"a\rb"), &mut wire).unwrap();
        assert_eq!(&c.decode(&mut wire).unwrap().unwrap()[..], b"a\rb");
    }

    /// A codec used as a template (it searched a buffer of its own) hands
    /// its clones no trace of that search: each finds every line of its
    /// own stream.
    #[test]
    fn a_clone_of_lines_searches_its_stream_from_the_start() {
        let mut template = Lines::new();
        assert_eq!(
            template.decode(&mut BytesMut::from("abcdef")).unwrap(),
            None
        );
        let mut c = template.clone();
        let mut buf = BytesMut::from("x\ny\nzzzzzz\n");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"x");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"y");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"zzzzzz");
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
        // No bound at all: a line in two parts waits for its end.
        let mut c = Lines::new().max_line(usize::MAX);
        let mut buf = BytesMut::from(&b"half"[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b" a line\n");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"half a line");
    }

    #[test]
    fn bincode_refuses_garbage_and_trailing_bytes_with_a_typed_error() {
        let mut c = Bincode::<(u32, String), (u32, String)>::new();
        let mut wire = BytesMut::new();
        c.encode((1, "one".into()), &mut wire).unwrap();
        assert_eq!(c.decode(&mut wire).unwrap(), Some((1, "one".to_string())));
        // A string whose length runs past the frame.
        let mut garbage = BytesMut::new();
        LengthDelimited::new()
            .encode(Bytes::from_static(&[1, 200, b'x']), &mut garbage)
            .unwrap();
        assert!(matches!(
            c.decode(&mut garbage),
            Err(CodecError::Malformed(_))
        ));
        // A string claiming 2^50 bytes in a 10-byte frame: refused as
        // malformed (without a bound the decoder asks for that memory,
        // and the process aborts when it is refused).
        let mut huge = vec![7u8, 0xfd];
        huge.extend_from_slice(&(1u64 << 50).to_le_bytes());
        let mut claim = BytesMut::new();
        LengthDelimited::new()
            .encode(Bytes::from(huge), &mut claim)
            .unwrap();
        assert!(matches!(
            c.decode(&mut claim),
            Err(CodecError::Malformed(_))
        ));
        // A whole value followed by junk inside the same frame.
        let mut body =
            bincode::serde::encode_to_vec((2u32, "two"), bincode::config::standard()).unwrap();
        body.push(0xff);
        let mut padded = BytesMut::new();
        LengthDelimited::new()
            .encode(Bytes::from(body), &mut padded)
            .unwrap();
        assert!(matches!(
            c.decode(&mut padded),
            Err(CodecError::Malformed(_))
        ));
    }

    /// A tree of any depth, as a recursive message type is.
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Expr {
        Lit(u8),
        Neg(Box<Expr>),
    }

    fn framed(body: Vec<u8>) -> BytesMut {
        let mut wire = BytesMut::new();
        LengthDelimited::new()
            .encode(Bytes::from(body), &mut wire)
            .unwrap();
        wire
    }

    /// A frame nesting a recursive type a million levels deep would
    /// overflow the shard's stack (an abort, not a panic: every
    /// connection of the process with it); it is refused past
    /// [`MAX_BINCODE_DEPTH`] levels, while a tree within it decodes.
    #[test]
    fn bincode_refuses_values_nested_past_its_depth_limit() {
        let mut c = Bincode::<Expr, Expr>::new();
        let mut deep = Expr::Lit(7);
        for _ in 0..MAX_BINCODE_DEPTH / 2 {
            deep = Expr::Neg(Box::new(deep));
        }
        let mut wire = BytesMut::new();
        c.encode(deep, &mut wire).unwrap();
        assert!(matches!(c.decode(&mut wire), Ok(Some(Expr::Neg(_)))));
        // One level per byte: 0x01 is `Neg`.
        let mut hostile = framed(vec![1u8; 1 << 20]);
        match c.decode(&mut hostile) {
            Err(CodecError::Malformed(e)) => assert!(e.contains("deep"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    /// A sequence of zero-size elements takes no byte on the wire per
    /// element: ten bytes claiming 2^64 of them would spin the shard for
    /// ever. Every element counts against the frame's memory bound.
    #[test]
    fn bincode_counts_zero_size_elements_against_its_bound() {
        let mut c = Bincode::<Vec<()>, Vec<()>>::new();
        let mut body = vec![0xfd];
        body.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            c.decode(&mut framed(body)),
            Err(CodecError::Malformed(_))
        ));
        let mut wire = BytesMut::new();
        c.encode(vec![(); 1000], &mut wire).unwrap();
        assert_eq!(c.decode(&mut wire).unwrap(), Some(vec![(); 1000]));
    }

    /// Elements small on the wire and large in memory (`None` is one byte,
    /// an `Option<[u128; 32]>` 528) are counted at their size in
    /// memory: a frame may not claim more than 16 times the frame maximum
    /// through them.
    #[test]
    fn bincode_counts_elements_at_their_size_in_memory() {
        let frames = LengthDelimited::new().max_frame(1 << 16);
        let mut c =
            Bincode::<Vec<Option<[u128; 32]>>, Vec<Option<[u128; 32]>>>::with_frames(frames);
        // 60,000 `None`s: 60 KB on the wire, about 32 MB in memory.
        let mut body = vec![0xfb];
        body.extend_from_slice(&60_000u16.to_le_bytes());
        body.extend(std::iter::repeat_n(0u8, 60_000));
        let mut wire = BytesMut::new();
        { frames }.encode(Bytes::from(body), &mut wire).unwrap();
        match c.decode(&mut wire) {
            Err(CodecError::Malformed(e)) => assert!(e.contains("memory"), "{e}"),
            other => panic!("{:?}", other.map(|v| v.map(|v| v.len()))),
        }
        // Within the bound: decoded.
        let mut wire = BytesMut::new();
        c.encode(vec![None; 500], &mut wire).unwrap();
        assert_eq!(c.decode(&mut wire).unwrap().map(|v| v.len()), Some(500));
    }

    /// The fields of a struct, tuple or array (which bincode reads as a
    /// sequence too) are not counted again beside their parent: frames
    /// near the maximum of hashes or pairs of small numbers decode.
    #[test]
    fn bincode_counts_a_collections_elements_not_each_of_their_fields() {
        let frames = LengthDelimited::new().max_frame(1 << 16);
        let mut hashes = Bincode::<Vec<[u8; 32]>, Vec<[u8; 32]>>::with_frames(frames);
        let mut wire = BytesMut::new();
        hashes.encode(vec![[7u8; 32]; 2000], &mut wire).unwrap();
        assert_eq!(
            hashes.decode(&mut wire).unwrap().map(|v| v.len()),
            Some(2000)
        );
        let mut pairs = Bincode::<Vec<(u32, u32)>, Vec<(u32, u32)>>::with_frames(frames);
        let mut wire = BytesMut::new();
        pairs.encode(vec![(1, 2); 32_000], &mut wire).unwrap();
        assert_eq!(
            pairs.decode(&mut wire).unwrap().map(|v| v.len()),
            Some(32_000)
        );
    }

    #[test]
    fn raw_bytes_hands_out_at_most_a_chunk() {
        let mut c = RawBytes::new().max_chunk(3);
        let mut buf = BytesMut::from(&b"abcde"[..]);
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"abc");
        assert_eq!(&c.decode(&mut buf).unwrap().unwrap()[..], b"de");
        assert_eq!(c.decode(&mut buf).unwrap(), None);
    }

    /// Decodes `wire` as it arrives in `chunks` (sizes, cycled) with a
    /// fresh codec, up to and with the first error (which closes a
    /// connection): what came out, as text.
    fn decode_in_chunks<C: Codec>(mut codec: C, wire: &[u8], chunks: &[usize]) -> Vec<String>
    where
        C::In: std::fmt::Debug,
    {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut at = 0;
        let mut sizes = chunks.iter().cycle();
        loop {
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(frame)) => out.push(format!("{frame:?}")),
                    Ok(None) => break,
                    Err(e) => {
                        // Its kind: a line's length is how much had come.
                        let kind = format!("{e:?}");
                        let kind = kind.split([' ', '(', '{']).next().unwrap_or_default();
                        out.push(format!("error: {kind}"));
                        return out;
                    }
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

    /// Byte streams of frames, mutated and random (a fixed seed), decode
    /// to the same frames and the same kind of first error however the
    /// reads cut them, with every header length, and never panic.
    #[test]
    fn frames_decode_the_same_however_the_reads_cut_them() {
        let mut next = crate::fuzz::xorshift(0x94d0_49bb_1331_11eb);
        for round in 0..20_000u32 {
            let header = [1usize, 2, 4, 8][(next() % 4) as usize];
            let mut wire = Vec::new();
            for _ in 0..(1 + next() % 5) {
                let len = next() % 40;
                wire.extend_from_slice(&len.to_be_bytes()[8 - header..]);
                wire.extend((0..len).map(|_| [b'a', b'\n', b'\r', 0][(next() % 4) as usize]));
            }
            match round % 3 {
                0 => {}
                1 => {
                    let at = (next() % wire.len().max(1) as u64) as usize;
                    if let Some(b) = wire.get_mut(at) {
                        *b = next() as u8;
                    }
                }
                _ => wire = (0..next() % 120).map(|_| next() as u8).collect(),
            }
            let framed = || LengthDelimited::new().header_len(header).max_frame(32);
            let lines = || Lines::new().max_line(24);
            let whole = decode_in_chunks(framed(), &wire, &[usize::MAX]);
            let whole_lines = decode_in_chunks(lines(), &wire, &[usize::MAX]);
            for chunks in [&[1usize][..], &[2, 5], &[(next() % 30 + 1) as usize, 1]] {
                assert_eq!(
                    decode_in_chunks(framed(), &wire, chunks),
                    whole,
                    "{wire:?} in {chunks:?}"
                );
                assert_eq!(
                    decode_in_chunks(lines(), &wire, chunks),
                    whole_lines,
                    "{wire:?} in {chunks:?}"
                );
            }
        }
    }
}
