//! Owned buffers for completion I/O: [`IoBuf`] (the kernel reads it) and
//! [`IoBufMut`] (the kernel writes into it).
//!
//! Operations take the buffer by value and hand it back with the result, so
//! the buffer cannot be touched (or freed) while the kernel uses it; a dropped
//! operation keeps it until the kernel is done.
//!
//! Reads fill a buffer from its start, up to its capacity
//! ([`IoBufMut::bytes_total`]); afterwards its initialised length is the
//! number of bytes read. Writes send its initialised bytes.

use bytes::{Bytes, BytesMut};

mod ring;

pub use self::ring::{BufRing, RecvBuf};

/// A buffer the kernel may read from while an operation is in flight.
///
/// # Safety
///
/// `stable_ptr` must point to `bytes_init` initialised bytes that stay valid,
/// and at the same address, while the value is not used mutably, including
/// after the value itself is moved.
pub unsafe trait IoBuf: 'static {
    /// Start of the buffer.
    fn stable_ptr(&self) -> *const u8;
    /// Number of initialised bytes (what a write sends).
    fn bytes_init(&self) -> usize;
}

/// A buffer the kernel may write into while an operation is in flight.
///
/// # Safety
///
/// `stable_mut_ptr` must point to `bytes_total` writable bytes at an address
/// that does not change when the value is moved; `set_init(n)` is only called
/// with `n <= bytes_total` after the kernel initialised the first `n` bytes.
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the writable region.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Capacity the kernel may fill.
    fn bytes_total(&mut self) -> usize;
    /// Records that the first `n` bytes are initialised.
    ///
    /// # Safety
    ///
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved; `len`
// bytes are initialised.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the spare capacity belongs to the Vec's allocation; `set_init`
// only shrinks or grows `len` within the capacity.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: `n <= capacity` and the first `n` bytes were written (caller).
        unsafe { self.set_len(n) };
    }
}

// SAFETY: a boxed slice's allocation does not move with the box.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the whole slice is initialised and writable; its length is fixed.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.len()
    }
    unsafe fn set_init(&mut self, _n: usize) {}
}

// SAFETY: `Bytes` is an immutable view of a heap allocation that does not
// move with the handle.
unsafe impl IoBuf for Bytes {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: a `BytesMut` owns its view (`..capacity`) exclusively: handles
// split from the same allocation cover disjoint ranges, and only `&mut`
// methods (which an op holding it excludes) reallocate. Moving the handle
// does not move the bytes.
unsafe impl IoBuf for BytesMut {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: as above; `set_len` stays within the capacity.
unsafe impl IoBufMut for BytesMut {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: `n <= capacity` and the first `n` bytes were written (caller).
        unsafe { self.set_len(n) };
    }
}

/// A `BytesMut` that a read fills after the bytes it already holds: the
/// kernel writes into its spare capacity, and its length grows by what was
/// read (a plain `BytesMut` is filled from its start).
///
/// # Examples
///
/// ```
/// use bytes::BytesMut;
/// use mailring::buf::{Appending, IoBufMut};
///
/// let mut held = BytesMut::with_capacity(64);
/// held.extend_from_slice(b"kept");
/// let mut buf = Appending::new(held);
/// assert_eq!(buf.bytes_total(), 60);
/// assert_eq!(buf.into_inner(), &b"kept"[..]);
/// ```
#[derive(Debug)]
pub struct Appending {
    buf: BytesMut,
    /// The length when it was wrapped: where the kernel's bytes begin.
    base: usize,
}

impl Appending {
    /// Wraps `buf`; a read fills `buf.len()..buf.capacity()`.
    pub fn new(buf: BytesMut) -> Self {
        let base = buf.len();
        Appending { buf, base }
    }

    /// The buffer: what it held, then what was read.
    pub fn into_inner(self) -> BytesMut {
        self.buf
    }
}

// SAFETY: as for `BytesMut`; the handle is owned and moving it does not
// move the bytes.
unsafe impl IoBuf for Appending {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.buf.len()
    }
}

// SAFETY: the writable region is the spare capacity past `base`, inside
// the handle's own view; `set_init(n)` with `n <= capacity - base` keeps
// the length within the capacity, and `base` bytes were initialised when
// the buffer was wrapped.
unsafe impl IoBufMut for Appending {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `base <= capacity`: in bounds of the allocation or one past.
        unsafe { self.buf.as_mut_ptr().add(self.base) }
    }
    fn bytes_total(&mut self) -> usize {
        self.buf.capacity() - self.base
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: `base + n <= capacity`, and those bytes are initialised
        // (the caller's promise for the last `n`, the wrap for the rest).
        unsafe { self.buf.set_len(self.base + n) };
    }
}

/// A heap buffer with a chosen alignment, for `O_DIRECT` files (which need
/// block-aligned memory, offsets and lengths).
///
/// # Examples
///
/// ```
/// let mut buf = mailring::buf::AlignedBuf::new(4096, 4096);
/// assert_eq!(buf.as_ptr() as usize % 4096, 0);
/// assert!(buf.is_empty());
/// ```
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `capacity` bytes aligned to `align`; its length starts at 0.
    ///
    /// # Panics
    ///
    /// When `align` is not a power of two or `capacity` is zero or too large.
    pub fn new(capacity: usize, align: usize) -> AlignedBuf {
        assert!(capacity > 0, "AlignedBuf needs a non-zero capacity");
        let layout = std::alloc::Layout::from_size_align(capacity, align)
            .expect("valid size and power-of-two alignment");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len: 0,
            layout,
        }
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// Sets the length to 0.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Shortens the buffer to `len` bytes (nothing if it is not longer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends `data`.
    ///
    /// # Panics
    ///
    /// When the bytes would not fit in the capacity.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self
            .len
            .checked_add(data.len())
            .filter(|&end| end <= self.capacity())
            .expect("AlignedBuf::extend_from_slice past the capacity");
        // SAFETY: `len..end` lies within the allocation (checked above) and
        // cannot overlap `data`, which `&mut self` keeps from aliasing it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                data.len(),
            );
        }
        self.len = end;
    }

    /// Grows the buffer to `len` bytes with zeros (nothing if it is not
    /// shorter).
    ///
    /// # Panics
    ///
    /// When `len` exceeds the capacity.
    pub fn resize_zeroed(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "AlignedBuf::resize_zeroed past the capacity"
        );
        if len > self.len {
            // SAFETY: `self.len..len` lies within the allocation.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, len - self.len) };
            self.len = len;
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the first `len <= capacity` bytes are initialised (zeroed at
        // allocation, then written by reads).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.layout.size())
            .field("align", &self.layout.align())
            .finish()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the allocation does not move with the handle; `len` bytes are initialised.
unsafe impl IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: the whole allocation is writable (and zero-initialised); `set_init`
// stays within the capacity.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_total(&mut self) -> usize {
        self.layout.size()
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.len = n.min(self.layout.size());
    }
}
