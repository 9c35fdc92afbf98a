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

// SAFETY: a `BytesMut` owns its allocation uniquely while we hold it; moving
// the handle does not move the bytes.
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
