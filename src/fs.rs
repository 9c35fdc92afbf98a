//! Files on the shard's ring: open, positional reads and writes, fsync, close.
//!
//! A [`File`] belongs to the shard that opened it (or adopted it): its
//! operations are SQEs on that shard's ring. Using it from another thread gives
//! an [`io::ErrorKind::Other`] error naming the rule; it never touches another
//! shard's ring. In-flight operations hold a reference to the descriptor, so
//! it is closed only after the kernel is done with it.
//!
//! # Examples
//!
//! ```
//! use mailring::fs::File;
//! let rt = mailring::Runtime::builder().shards(1).build()?;
//! let path = std::env::temp_dir().join(format!("mailring-doc-{}", std::process::id()));
//! let p = path.clone();
//! let back = rt.block_on(async move {
//!     let file = File::create(&p).await?;
//!     let (n, _) = file.write_all_at(b"hello".to_vec(), 0).await;
//!     n?;
//!     file.sync_data().await?;
//!     let (n, buf) = file.read_at(Vec::with_capacity(16), 0).await;
//!     n?;
//!     file.close().await?;
//!     Ok::<_, std::io::Error>(buf)
//! })?;
//! assert_eq!(back, b"hello");
//! # std::fs::remove_file(path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use io_uring::opcode;
use io_uring::types::{Fd, FsyncFlags};

use crate::buf::{IoBuf, IoBufMut};
use crate::op::{submit_read, submit_write, Op, ShardFd};

/// Options for [`File`]; the same meaning as [`std::fs::OpenOptions`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u32,
    custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// All options off; mode 0o666 (before the umask).
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, read: bool) -> &mut Self {
        self.read = read;
        self
    }

    /// Open for writing.
    pub fn write(&mut self, write: bool) -> &mut Self {
        self.write = write;
        self
    }

    /// Open in append mode.
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.append = append;
        self
    }

    /// Truncate to zero length.
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.truncate = truncate;
        self
    }

    /// Create the file if missing.
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.create = create;
        self
    }

    /// Create the file, failing if it exists.
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.create_new = create_new;
        self
    }

    /// Permission bits for a created file.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// Extra `open(2)` flags, e.g. `libc::O_DIRECT`. The access mode
    /// among them is ignored (`read`/`write` say it), and `O_TRUNC` or
    /// `O_CREAT` is refused without write or append access, as the
    /// builder's own are.
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }

    fn flags(&self) -> io::Result<i32> {
        let access = match (self.read, self.write || self.append) {
            (true, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
            (false, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "open: neither read nor write was requested",
                ))
            }
        };
        // The access mode is this builder's to say (as std masks it).
        let custom = self.custom_flags & !libc::O_ACCMODE;
        // What `std::fs::OpenOptions` refuses: the kernel would truncate
        // (or create) a file opened only to read; asked through the extra
        // flags too.
        let refused = match (self.write, self.append) {
            (true, false) => None,
            (false, false) => (self.truncate
                || self.create
                || self.create_new
                || custom & (libc::O_TRUNC | libc::O_CREAT) != 0)
                .then_some("open: truncate or create without write access"),
            (_, true) => {
                (self.truncate && !self.create_new).then_some("open: truncate in append mode")
            }
        };
        if let Some(why) = refused {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
        }
        let mut flags = access | libc::O_CLOEXEC | custom;
        if self.append {
            flags |= libc::O_APPEND;
        }
        if self.truncate {
            flags |= libc::O_TRUNC;
        }
        if self.create_new {
            flags |= libc::O_CREAT | libc::O_EXCL;
        } else if self.create {
            flags |= libc::O_CREAT;
        }
        Ok(flags)
    }

    /// Opens `path` with `IORING_OP_OPENAT` on the current shard.
    ///
    /// # Errors
    ///
    /// The kernel's error (e.g. `NotFound`, `AlreadyExists`, `PermissionDenied`),
    /// `InvalidInput` for a path with a NUL byte or no access mode, and an
    /// `Other` error outside a mailring shard.
    pub async fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        let flags = self.flags()?;
        let path = path.as_ref();
        let c_path = c_path(path)?;
        let mode = self.mode;
        // SAFETY: the SQE points into the CString's heap buffer, which the op
        // owns until its CQE.
        let op = unsafe {
            Op::submit_offloaded(c_path, Some(close_fd), |p| {
                opcode::OpenAt::new(Fd(libc::AT_FDCWD), p.as_ptr())
                    .flags(flags)
                    .mode(mode)
                    .build()
            })
        }?;
        let (res, _) = op.await;
        let (fd, _) =
            res.map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
        // SAFETY: a successful openat returned a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        File::adopt(fd)
    }
}

/// Closes the fd an abandoned `openat` produced.
fn close_fd(res: i32, _flags: u32, _resources: &dyn std::any::Any) {
    if res >= 0 {
        // SAFETY: `res` is the descriptor this openat created and no poll
        // handed out: the cleanup runs only on an abandoned op's CQE or on a
        // finished op dropped unpolled, so nothing else owns it.
        drop(unsafe { OwnedFd::from_raw_fd(res) });
    }
}

/// An open file whose operations run on its shard's ring.
#[derive(Debug)]
pub struct File {
    inner: ShardFd,
    /// The error (an errno; 0 for none) of a sync whose future was dropped
    /// before it completed: the kernel reports a writeback error once, to
    /// the sync that sees it, so that one going unseen would let the next
    /// sync say the data is safe. The next sync or `close` reports it.
    unreported: Arc<AtomicI32>,
}

impl File {
    /// Opens a file for reading.
    ///
    /// # Errors
    ///
    /// See [`OpenOptions::open`].
    pub async fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path).await
    }

    /// Creates (or truncates) a file for reading and writing.
    ///
    /// # Errors
    ///
    /// See [`OpenOptions::open`].
    pub async fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .await
    }

    /// Adopts an open descriptor on the current shard.
    ///
    /// # Errors
    ///
    /// An `Other` error outside a mailring shard.
    pub fn from_std(file: std::fs::File) -> io::Result<File> {
        File::adopt(OwnedFd::from(file))
    }

    /// Turns the file back into a std file, e.g. to move it to another shard
    /// (`File::from_std` there).
    ///
    /// # Errors
    ///
    /// Gives the file back while an abandoned operation still uses its
    /// descriptor, or while the error of a sync given up is left unreported
    /// (a sync or `close` reports it; a std file would not).
    pub fn into_std(self) -> Result<std::fs::File, File> {
        if self.unreported.load(Ordering::Acquire) != 0 {
            return Err(self);
        }
        self.inner
            .into_owned()
            .map(std::fs::File::from)
            .map_err(|inner| File {
                inner,
                unreported: self.unreported,
            })
    }

    fn adopt(fd: OwnedFd) -> io::Result<File> {
        Ok(File {
            inner: ShardFd::adopt(fd)?,
            unreported: Arc::default(),
        })
    }

    /// The error of a sync given up before it completed, if one is left
    /// unreported (taken: reported once, as the kernel does).
    fn take_unreported(&self) -> io::Result<()> {
        match self.unreported.swap(0, Ordering::AcqRel) {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    fn check_shard(&self) -> io::Result<()> {
        self.inner.check()
    }

    /// Reads into `buf` from offset `pos`, filling it from its start up to its
    /// capacity; returns the byte count (0 at end of file) and the buffer,
    /// whose length is then the byte count. A short read is returned as such.
    pub async fn read_at<B: IoBufMut>(&self, buf: B, pos: u64) -> (io::Result<usize>, B) {
        if let Err(e) = file_offset(pos, 0) {
            return (Err(e), buf);
        }
        // SAFETY: a positional read writes at most `len` bytes at `ptr`.
        unsafe {
            submit_read(&self.inner, buf, 0, |fd, ptr, len| {
                opcode::Read::new(Fd(fd), ptr, len).offset(pos).build()
            })
            .await
        }
    }

    /// Reads until `buf` is full (its [`IoBufMut::bytes_total`] bytes).
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends first (the buffer keeps what was read).
    pub async fn read_exact_at<B: IoBufMut>(&self, mut buf: B, pos: u64) -> (io::Result<()>, B) {
        let total = buf.bytes_total();
        let mut done = 0usize;
        while done < total {
            let at = match file_offset(pos, done) {
                Ok(at) => at,
                Err(e) => return (Err(e), buf),
            };
            // SAFETY: a positional read writes at most `len` bytes at `ptr`.
            let (res, back) = unsafe {
                submit_read(&self.inner, buf, done, |fd, ptr, len| {
                    opcode::Read::new(Fd(fd), ptr, len).offset(at).build()
                })
                .await
            };
            buf = back;
            match res {
                Ok(0) => {
                    return (
                        Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "file ended before the buffer was full",
                        )),
                        buf,
                    )
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Writes `buf`'s bytes at offset `pos`; returns how many were written
    /// (possibly fewer: a short write is returned as such) and the buffer.
    pub async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> (io::Result<usize>, B) {
        self.write_slice_at(buf, 0, pos, 0).await
    }

    /// `rw_flags`: `RWF_*` flags of this write alone (`pwritev2`'s).
    async fn write_slice_at<B: IoBuf>(
        &self,
        buf: B,
        from: usize,
        pos: u64,
        rw_flags: i32,
    ) -> (io::Result<usize>, B) {
        if let Err(e) = file_offset(pos, 0) {
            return (Err(e), buf);
        }
        // SAFETY: a positional write reads at most `len` bytes at `ptr`.
        unsafe {
            submit_write(&self.inner, buf, from, true, (), |fd, ptr, len| {
                opcode::Write::new(Fd(fd), ptr, len)
                    .offset(pos)
                    .rw_flags(rw_flags)
                    .build()
            })
            .await
        }
    }

    /// Writes all of `buf`'s bytes at offset `pos`, continuing after short writes.
    ///
    /// # Errors
    ///
    /// The kernel's error; `WriteZero` if the kernel accepts nothing.
    pub async fn write_all_at<B: IoBuf>(&self, buf: B, pos: u64) -> (io::Result<()>, B) {
        self.write_all_with(buf, pos, 0).await
    }

    /// Writes all of `buf`'s bytes at offset `pos` as a data-synchronous
    /// write (`RWF_DSYNC`): each completes once its data, and the metadata
    /// needed to read it, are on stable storage, as if the write were
    /// followed by `fdatasync` of its range, without opening the file
    /// `O_DSYNC`.
    ///
    /// On an `O_DIRECT` file over allocated blocks the kernel issues the
    /// write from the calling thread. A device with a volatile cache and no
    /// FUA then needs a cache flush after it, which the kernel runs from a
    /// worker on the CPU where the write's completion interrupt lands.
    ///
    /// It makes the file's bytes durable, not its name: a file just created
    /// survives a power loss once its directory is synced too (open the
    /// directory and `sync_all` it, as a log that makes segments does).
    ///
    /// # Errors
    ///
    /// The kernel's error; `WriteZero` if the kernel accepts nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(file: &mailring::fs::File) -> std::io::Result<()> {
    /// let (res, _buf) = file.write_all_at_dsync(b"record".to_vec(), 0).await;
    /// res?; // its bytes on disk now (a file just made also needs its
    ///       // directory synced for its name to survive a power loss)
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_all_at_dsync<B: IoBuf>(&self, buf: B, pos: u64) -> (io::Result<()>, B) {
        self.write_all_with(buf, pos, libc::RWF_DSYNC).await
    }

    async fn write_all_with<B: IoBuf>(
        &self,
        mut buf: B,
        pos: u64,
        rw_flags: i32,
    ) -> (io::Result<()>, B) {
        let total = buf.bytes_init();
        let mut done = 0usize;
        while done < total {
            let at = match file_offset(pos, done) {
                Ok(at) => at,
                Err(e) => return (Err(e), buf),
            };
            let (res, back) = self.write_slice_at(buf, done, at, rw_flags).await;
            buf = back;
            match res {
                Ok(0) => {
                    return (
                        Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
                        buf,
                    )
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Writes all of `buf` at offset `pos` with `pwrite(2)` on the calling
    /// thread, not through the ring.
    ///
    /// For small buffered writes into the page cache. Most filesystems
    /// (ext4 among them) cannot take a buffered write without possibly
    /// blocking, so the ring hands every one to an io-wq worker thread, and
    /// that hand-off (waking the worker, two context switches, the
    /// completion posted back) costs more CPU than the copy itself: a
    /// broker appending a few KiB per tick spent a fifth of its CPU on it.
    ///
    /// The calling thread (a whole shard) blocks for the copy, and for as
    /// long as the kernel throttles dirty pages or the filesystem waits on
    /// its journal. Do not use it for `O_DIRECT` or `O_DSYNC` files (each
    /// write waits for the disk), nor while a flush of the same file is in
    /// flight (some filesystems make the write wait for it).
    ///
    /// # Errors
    ///
    /// The kernel's error; `WriteZero` if the kernel accepts nothing.
    pub fn write_all_at_blocking(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        let fd = self.inner.raw();
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            let at = pos
                .checked_add(done as u64)
                .and_then(|at| libc::off_t::try_from(at).ok())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "file offset out of range")
                })?;
            // SAFETY: `rest` is a live slice of `rest.len()` bytes the kernel
            // only reads during the call; `fd` is open while `self` lives.
            let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), at) };
            match n {
                0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// `fsync` of `range` (`None`: the whole file).
    async fn fsync(&self, flags: FsyncFlags, range: Option<(u64, u32)>) -> io::Result<()> {
        self.check_shard()?;
        // A sync given up earlier failed: the data it covered may be lost,
        // whatever this one finds.
        self.take_unreported()?;
        let fd = self.inner.fd.clone();
        let raw = fd.as_raw_fd();
        let (offset, len) = range.unwrap_or((0, 0));
        let resources: SyncResources = (fd, self.unreported.clone());
        // SAFETY: the fsync uses only the fd, held by the op's `Arc`.
        let op = unsafe {
            Op::submit_offloaded(resources, Some(keep_unseen_sync_error), |_| {
                opcode::Fsync::new(Fd(raw))
                    .flags(flags)
                    .offset(offset)
                    .len(len)
                    .build()
            })
        }?;
        op.await.0.map(drop)
    }

    /// Flushes the data of `len` bytes from `offset` on, and the metadata
    /// needed to read them, to the device: `fdatasync` of a range. Dirty
    /// pages of the file outside the range are not written (a whole-file
    /// `fdatasync` writes them too); the device's cache is flushed as by
    /// [`sync_data`](Self::sync_data). A range longer than 4 GiB, which
    /// one operation cannot name, syncs the whole file.
    ///
    /// # Errors
    ///
    /// The kernel's error; `InvalidInput` for an offset past what a file
    /// can hold.
    pub async fn sync_data_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_shard()?;
        file_offset(offset, 0)?;
        if len == 0 {
            return Ok(());
        }
        self.fsync(FsyncFlags::DATASYNC, fsync_range(offset, len))
            .await
    }

    /// Flushes data and metadata to the device (`fsync`).
    ///
    /// # Errors
    ///
    /// The kernel's error.
    pub async fn sync_all(&self) -> io::Result<()> {
        self.fsync(FsyncFlags::empty(), None).await
    }

    /// Flushes data (and the metadata needed to read it) to the device (`fdatasync`).
    ///
    /// # Errors
    ///
    /// The kernel's error.
    pub async fn sync_data(&self) -> io::Result<()> {
        self.fsync(FsyncFlags::DATASYNC, None).await
    }

    /// Closes the file with `IORING_OP_CLOSE`, reporting the kernel's answer.
    ///
    /// # Errors
    ///
    /// The kernel's error (a close error can mean lost writes on some
    /// filesystems); the error of a sync given up before it completed, left
    /// unreported (the file is closed all the same when nothing else holds
    /// it); `ResourceBusy` when an operation given up on the file is still
    /// in flight: the descriptor then closes when that operation
    /// completes, and neither what that close says nor the error of a sync
    /// still running then is reported.
    pub async fn close(self) -> io::Result<()> {
        self.check_shard()?;
        let unreported = self.take_unreported();
        match Arc::try_unwrap(self.inner.fd) {
            Ok(fd) => {
                let raw = fd.into_raw_fd();
                // SAFETY: the close uses a raw fd we own and no longer use elsewhere.
                let op = unsafe { Op::submit((), None, |_| opcode::Close::new(Fd(raw)).build()) }?;
                let closed = op.await.0.map(drop);
                unreported.and(closed)
            }
            // Operations abandoned earlier still hold it: it closes when they finish.
            Err(_) => unreported.and(Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "an operation given up on this file is still in flight: its descriptor closes when that completes, unreported",
            ))),
        }
    }
}

/// What a sync lends the ring: the descriptor, and the file's place for
/// an error nobody saw.
type SyncResources = (Arc<OwnedFd>, Arc<AtomicI32>);

/// The cleanup of a sync whose future was dropped: keeps its error for the
/// file's next sync or close (see `File::unreported`).
fn keep_unseen_sync_error(res: i32, _flags: u32, resources: &dyn std::any::Any) {
    // Cancelled (the drop asks the ring to cancel it) or interrupted: it
    // synced nothing and lost nothing; the next sync does the work.
    if res >= 0 || res == -libc::ECANCELED || res == -libc::EINTR {
        return;
    }
    if let Some((_, unreported)) = resources.downcast_ref::<SyncResources>() {
        // The first one kept: a later one is most likely the same loss.
        let _ = unreported.compare_exchange(0, -res, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw()
    }
}

/// What `statx` reports about a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    len: u64,
    mode: u32,
    modified: std::time::SystemTime,
    accessed: std::time::SystemTime,
    blocks: u64,
    inode: u64,
}

impl Metadata {
    fn from_statx(st: &libc::statx) -> Metadata {
        // The seconds are signed (before 1970: negative); the nanoseconds
        // count forward from them.
        let time = |t: libc::statx_timestamp| {
            let secs = std::time::Duration::from_secs(t.tv_sec.unsigned_abs());
            let at = if t.tv_sec >= 0 {
                std::time::UNIX_EPOCH + secs
            } else {
                std::time::UNIX_EPOCH - secs
            };
            at + std::time::Duration::from_nanos(u64::from(t.tv_nsec))
        };
        Metadata {
            len: st.stx_size,
            mode: u32::from(st.stx_mode),
            modified: time(st.stx_mtime),
            accessed: time(st.stx_atime),
            blocks: st.stx_blocks,
            inode: st.stx_ino,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// Whether it is a symbolic link (only seen by [`symlink_metadata`]).
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// Permission bits (`st_mode & 0o7777`).
    pub fn permissions_mode(&self) -> u32 {
        self.mode & 0o7777
    }

    /// Last modification time.
    pub fn modified(&self) -> std::time::SystemTime {
        self.modified
    }

    /// Last access time.
    pub fn accessed(&self) -> std::time::SystemTime {
        self.accessed
    }

    /// 512-byte blocks allocated.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Inode number.
    pub fn inode(&self) -> u64 {
        self.inode
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

async fn statx(
    dirfd: RawFd,
    path: CString,
    flags: i32,
    keep: Option<Arc<OwnedFd>>,
) -> io::Result<Metadata> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let buf: Box<libc::statx> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: the SQE points at the CString's and the box's heap memory, both
    // owned by the op until its CQE; `keep` holds the fd for `AT_EMPTY_PATH`.
    let op = unsafe {
        Op::submit((path, buf, keep), None, |(p, b, _)| {
            let out: *mut libc::statx = &mut **b;
            opcode::Statx::new(Fd(dirfd), p.as_ptr(), out.cast())
                .flags(flags)
                .mask(libc::STATX_BASIC_STATS)
                .build()
        })
    }?;
    let (res, (_, buf, _)) = op.await;
    res?;
    Ok(Metadata::from_statx(&buf))
}

impl File {
    /// The file's metadata (`statx` on the open descriptor).
    ///
    /// # Errors
    ///
    /// The kernel's error, or the shard-ownership error.
    pub async fn metadata(&self) -> io::Result<Metadata> {
        self.check_shard()?;
        let fd = self.inner.fd.clone();
        statx(
            fd.as_raw_fd(),
            CString::default(),
            libc::AT_EMPTY_PATH,
            Some(fd),
        )
        .await
    }
}

/// Metadata of `path`, following symbolic links.
///
/// # Errors
///
/// The kernel's error with the path, or an error outside a mailring shard.
pub async fn metadata(path: impl AsRef<Path>) -> io::Result<Metadata> {
    let path = path.as_ref();
    statx(libc::AT_FDCWD, c_path(path)?, 0, None)
        .await
        .map_err(|e| with_path(e, "stat", path))
}

/// Metadata of `path` itself, not following a final symbolic link.
///
/// # Errors
///
/// As [`metadata`].
pub async fn symlink_metadata(path: impl AsRef<Path>) -> io::Result<Metadata> {
    let path = path.as_ref();
    statx(
        libc::AT_FDCWD,
        c_path(path)?,
        libc::AT_SYMLINK_NOFOLLOW,
        None,
    )
    .await
    .map_err(|e| with_path(e, "lstat", path))
}

async fn path_op(
    path: &Path,
    what: &str,
    build: impl FnOnce(*const libc::c_char) -> io_uring::squeue::Entry,
) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: the SQE points into the CString's heap buffer, owned by the op.
    let op = unsafe { Op::submit_offloaded(c, None, |p| build(p.as_ptr())) }?;
    op.await.0.map(drop).map_err(|e| with_path(e, what, path))
}

/// Creates a directory (mode 0o777 before the umask).
///
/// # Errors
///
/// The kernel's error with the path (`AlreadyExists`, `NotFound` for a missing parent, ...).
pub async fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    path_op(path.as_ref(), "mkdir", |p| {
        opcode::MkDirAt::new(Fd(libc::AT_FDCWD), p)
            .mode(0o777)
            .build()
    })
    .await
}

/// Creates a directory and every missing parent.
///
/// # Errors
///
/// The first error other than `AlreadyExists` for a directory.
pub async fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    let mut prefix = std::path::PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        if matches!(
            component,
            std::path::Component::RootDir | std::path::Component::Prefix(_)
        ) {
            continue;
        }
        match create_dir(&prefix).await {
            Ok(()) => {}
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && metadata(&prefix).await?.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Renames `from` to `to`, replacing `to` if it exists.
///
/// # Errors
///
/// The kernel's error with the source path.
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    let (c_from, c_to) = (c_path(from)?, c_path(to)?);
    // SAFETY: the SQE points into both CStrings' heap buffers, owned by the op.
    let op = unsafe {
        Op::submit_offloaded((c_from, c_to), None, |(a, b)| {
            opcode::RenameAt::new(
                Fd(libc::AT_FDCWD),
                a.as_ptr(),
                Fd(libc::AT_FDCWD),
                b.as_ptr(),
            )
            .build()
        })
    }?;
    op.await
        .0
        .map(drop)
        .map_err(|e| with_path(e, "rename", from))
}

/// Removes a file.
///
/// # Errors
///
/// The kernel's error with the path.
pub async fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    path_op(path.as_ref(), "unlink", |p| {
        opcode::UnlinkAt::new(Fd(libc::AT_FDCWD), p).build()
    })
    .await
}

/// Removes an empty directory.
///
/// # Errors
///
/// The kernel's error with the path.
pub async fn remove_dir(path: impl AsRef<Path>) -> io::Result<()> {
    path_op(path.as_ref(), "rmdir", |p| {
        opcode::UnlinkAt::new(Fd(libc::AT_FDCWD), p)
            .flags(libc::AT_REMOVEDIR)
            .build()
    })
    .await
}

/// The `(offset, len)` of an `IORING_OP_FSYNC` that syncs at least the
/// `len > 0` bytes from `offset`, or `None` for the whole file. The kernel
/// syncs from `offset` to `offset + len` inclusive (`vfs_fsync_range`),
/// the whole file where that end is 0, and `len` is 32 bits.
fn fsync_range(offset: u64, len: u64) -> Option<(u64, u32)> {
    let last = u32::try_from(len - 1).ok()?;
    if offset == 0 && last == 0 {
        // End 0 would read as "to the end": the whole file covers it.
        return None;
    }
    Some((offset, last))
}

/// The file offset `done` bytes past `pos`: io_uring reads an offset of
/// `-1` as "the file's current position", so an offset past `i64::MAX`
/// (`u64::MAX` among them) is refused rather than passed on.
fn file_offset(pos: u64, done: usize) -> io::Result<u64> {
    pos.checked_add(done as u64)
        .filter(|&at| i64::try_from(at).is_ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file offset out of range"))
}

/// Reads a whole file.
///
/// # Errors
///
/// The errors of opening and reading it.
pub async fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    let file = File::open(path).await?;
    let hint = file
        .metadata()
        .await
        .map(|m| usize::try_from(m.len()).unwrap_or(usize::MAX))
        .unwrap_or(0);
    // As `std::fs::read`: a size the allocator refuses (a sparse file of a
    // terabyte) is an error, not an abort.
    let mut out = Vec::new();
    out.try_reserve_exact(hint).map_err(|e| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("a {hint}-byte file: {e}"),
        )
    })?;
    let mut chunk = Vec::with_capacity(hint.clamp(4096, 1 << 20));
    loop {
        let (res, back) = file.read_at(chunk, out.len() as u64).await;
        chunk = back;
        match res {
            Ok(0) => break,
            Ok(_) => out.extend_from_slice(&chunk),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    file.close().await?;
    Ok(out)
}

/// Writes `data` to a file, creating or truncating it.
///
/// # Errors
///
/// The errors of creating, writing and closing it.
pub async fn write(path: impl AsRef<Path>, data: impl Into<Vec<u8>>) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .await?;
    let (res, _) = file.write_all_at(data.into(), 0).await;
    res?;
    file.close().await
}

#[cfg(test)]
mod tests {
    use super::{fsync_range, keep_unseen_sync_error, File, SyncResources};

    /// The error of a sync given up before it completed (its future
    /// dropped) is not lost: the kernel reports a writeback error once, to
    /// the sync that sees it, so the next sync would say the data is safe.
    /// It is reported once, by the file's next sync or close. (The
    /// completion is played here: no device at hand fails its syncs.)
    #[test]
    fn the_error_of_a_sync_given_up_is_reported_by_the_next_sync_or_close() {
        let rt = crate::Runtime::builder().shards(1).build().unwrap();
        let path = std::env::temp_dir().join(format!("mailring-unseen-{}", std::process::id()));
        let p = path.clone();
        rt.block_on(async move {
            let file = File::from_std(std::fs::File::create(&p).unwrap()).unwrap();
            let lent: SyncResources = (file.inner.fd.clone(), file.unreported.clone());
            keep_unseen_sync_error(-libc::EIO, 0, &lent);
            // A second failure kept beside it: the first stays.
            keep_unseen_sync_error(-libc::ENOSPC, 0, &lent);
            let e = file.sync_data().await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
            file.sync_data().await.expect("reported once");
            // A sync cancelled by its drop, or interrupted, lost nothing.
            keep_unseen_sync_error(-libc::ECANCELED, 0, &lent);
            keep_unseen_sync_error(-libc::EINTR, 0, &lent);
            file.sync_data().await.expect("nothing kept");
            keep_unseen_sync_error(-libc::EIO, 0, &lent);
            drop(lent);
            // Not turned into a std file, which would not report it.
            let file = file.into_std().expect_err("an error left unreported");
            let e = file.close().await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        });
        let _ = std::fs::remove_file(path);
    }

    /// What the kernel syncs for an SQE's `(offset, len)`: the inclusive
    /// byte range, or `None` for the whole file (`io_fsync`).
    fn kernel_range(sqe: Option<(u64, u32)>) -> Option<(u64, u64)> {
        let (offset, len) = sqe?;
        let end = offset + u64::from(len);
        (end > 0).then_some((offset, end))
    }

    #[test]
    fn a_ranged_sync_covers_exactly_its_bytes_or_the_whole_file() {
        // Exact: first and last byte of the range, nothing past it.
        assert_eq!(kernel_range(fsync_range(4096, 8192)), Some((4096, 12287)));
        assert_eq!(kernel_range(fsync_range(10, 1)), Some((10, 10)));
        assert_eq!(kernel_range(fsync_range(0, 4096)), Some((0, 4095)));
        assert_eq!(
            kernel_range(fsync_range(1 << 40, 1 << 32)),
            Some((1 << 40, (1 << 40) + (1 << 32) - 1))
        );
        // What one SQE cannot name exactly: the whole file, a superset.
        assert_eq!(kernel_range(fsync_range(0, 1)), None);
        assert_eq!(kernel_range(fsync_range(8192, (1 << 32) + 1)), None);
        assert_eq!(kernel_range(fsync_range(8192, 5 << 30)), None);
    }
}
