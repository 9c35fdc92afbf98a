//! Files on the ring: open/create, positional I/O, fsync, close, errors,
//! shard ownership, and cancellation of in-flight operations.

use std::future::Future;
use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mailring::fs::{File, OpenOptions};
use mailring::ShardId;

use crate::rt2;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mailring-fs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A pipe: (read end, write end).
fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

#[test]
fn write_read_roundtrip_with_every_buffer_type() {
    let rt = rt2();
    let path = temp_path("roundtrip");
    let p = path.clone();
    rt.block_on(async move {
        let file = File::create(&p).await.unwrap();
        let (r, _) = file.write_all_at(b"hello ".to_vec(), 0).await;
        r.unwrap();
        let (r, _) = file.write_all_at(Bytes::from_static(b"io_uring "), 6).await;
        r.unwrap();
        let (r, _) = file.write_all_at(BytesMut::from(&b"world"[..]), 15).await;
        r.unwrap();
        let boxed: Box<[u8]> = b"!".to_vec().into_boxed_slice();
        let (r, _) = file.write_all_at(boxed, 20).await;
        r.unwrap();
        file.sync_all().await.unwrap();
        file.sync_data().await.unwrap();

        let (n, buf) = file.read_at(Vec::with_capacity(64), 0).await;
        assert_eq!(n.unwrap(), 21);
        assert_eq!(buf, b"hello io_uring world!");

        let (n, buf) = file.read_at(BytesMut::with_capacity(5), 6).await;
        assert_eq!(n.unwrap(), 5);
        assert_eq!(&buf[..], b"io_ur");

        let (r, buf) = file.read_exact_at(vec![0u8; 0].into_boxed_slice(), 0).await;
        r.unwrap();
        assert!(buf.is_empty());
        let (r, buf) = file.read_exact_at(Vec::with_capacity(11), 10).await;
        r.unwrap();
        assert_eq!(buf, b"ring world!");

        // Reading past the end: zero bytes, and read_exact reports EOF.
        let (n, _) = file.read_at(Vec::with_capacity(8), 1000).await;
        assert_eq!(n.unwrap(), 0);
        let (r, _) = file.read_exact_at(Vec::with_capacity(8), 18).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::UnexpectedEof);
        file.close().await.unwrap();
    });
    assert_eq!(std::fs::read(&path).unwrap(), b"hello io_uring world!");
}

#[test]
fn open_errors_carry_the_errno_and_path() {
    let rt = rt2();
    let missing = temp_path("does-not-exist");
    let existing = temp_path("exists");
    std::fs::write(&existing, b"x").unwrap();
    let (m, e) = (missing.clone(), existing.clone());
    rt.block_on(async move {
        let err = File::open(&m).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("does-not-exist"), "{err}");
        let err = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&e)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists);
        let err = OpenOptions::new().open(&e).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let err = File::open("bad\0path").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        // Writing to a read-only file: the kernel's EBADF comes back as such.
        let ro = File::open(&e).await.unwrap();
        let (r, buf) = ro.write_at(b"y".to_vec(), 0).await;
        assert_eq!(r.unwrap_err().raw_os_error(), Some(9));
        assert_eq!(buf, b"y", "the buffer comes back with the error");
    });
}

#[test]
fn a_file_used_from_another_shard_gives_an_error() {
    let rt = rt2();
    let path = temp_path("other-shard");
    std::fs::write(&path, b"abc").unwrap();
    let handle = rt.handle().clone();
    rt.block_on(async move {
        let file = std::sync::Arc::new(File::open(&path).await.unwrap());
        let f = file.clone();
        let (err, buf) = handle
            .spawn_on(ShardId::new(1), async move {
                let (r, buf) = f.read_at(Vec::with_capacity(3), 0).await;
                (r.unwrap_err(), buf)
            })
            .await
            .unwrap();
        assert!(err.to_string().contains("another shard"), "{err}");
        assert_eq!(buf.capacity(), 3, "the buffer is handed back");
        // The data-synchronous write and the ranged sync alike, even for
        // an empty range.
        let f = file.clone();
        let errs = handle
            .spawn_on(ShardId::new(1), async move {
                let (w, _) = f.write_all_at_dsync(b"x".to_vec(), 0).await;
                let ranged = f.sync_data_range(0, 3).await;
                let empty = f.sync_data_range(0, 0).await;
                [w.unwrap_err(), ranged.unwrap_err(), empty.unwrap_err()]
            })
            .await
            .unwrap();
        for err in errs {
            assert!(err.to_string().contains("another shard"), "{err}");
        }
        let (n, _) = file.read_at(Vec::with_capacity(3), 0).await;
        assert_eq!(n.unwrap(), 3);
    });
}

#[test]
fn dropped_reads_are_cancelled_and_their_buffers_kept_until_completion() {
    // Reads from an empty pipe never complete on their own: dropping them must
    // cancel them, and the slot (with its buffer) is freed when the CQE arrives.
    let rt = rt2();
    rt.block_on(async move {
        let (reader, writer) = pipe();
        let reader = File::from_std(reader).unwrap();
        for _ in 0..1_000 {
            let read = reader.read_at(vec![0u8; 4096], 0);
            assert!(mailring::time::timeout(Duration::ZERO, read).await.is_err());
        }
        // Data written now must be readable by a fresh read (no abandoned read stole it
        // after its cancellation completed).
        let mut settled = false;
        for _ in 0..200 {
            mailring::time::sleep(Duration::from_millis(1)).await;
            let in_flight = mailring::Handle::current().stats().shards[0].ops_in_flight;
            if in_flight <= 2 {
                settled = true;
                break;
            }
        }
        assert!(settled, "cancelled reads are still in flight");
        (&writer).write_all(b"ping").unwrap();
        let (n, buf) = reader.read_at(Vec::with_capacity(16), 0).await;
        assert_eq!(n.unwrap(), 4);
        assert_eq!(buf, b"ping");
    });
}

#[test]
fn offloaded_operations_are_counted_until_the_kernel_is_done_with_them() {
    // A file write is counted as offloaded (an idle shard parks rather than
    // spin while one is in flight): while it waits, and not after its
    // cancellation completes.
    let rt = rt2();
    rt.block_on(async move {
        let (reader, writer) = pipe();
        // Fill the pipe (non-blocking), then make it blocking again so a
        // write through the ring waits.
        // SAFETY: fcntl on a descriptor we own, with integer arguments.
        unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        while (&writer).write(&[0u8; 4096]).is_ok() {}
        // SAFETY: as above.
        unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_SETFL, 0) };
        let writer = File::from_std(writer).unwrap();
        let offloaded = || mailring::Handle::current().stats().shards[0].ops_offloaded;
        assert_eq!(offloaded(), 0);
        let write = writer.write_at(vec![1u8; 16], 0);
        assert!(mailring::time::timeout(Duration::from_millis(500), async {
            let mut write = std::pin::pin!(write);
            // Keep it in flight across idle ticks (which publish the gauge).
            std::future::poll_fn(|cx| {
                let _ = write.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            for _ in 0..100 {
                mailring::time::sleep(Duration::from_millis(1)).await;
                if offloaded() == 1 {
                    break;
                }
            }
            assert_eq!(offloaded(), 1, "a waiting file write is counted");
            std::future::pending::<()>().await
        })
        .await
        .is_err());
        // Dropped: cancelled; the count falls once its CQE arrives.
        let mut settled = false;
        for _ in 0..200 {
            mailring::time::sleep(Duration::from_millis(1)).await;
            if offloaded() == 0 {
                settled = true;
                break;
            }
        }
        assert!(settled, "a cancelled write is still counted");
        // A completed write and sync leave nothing counted.
        let path = temp_path("offloaded");
        let file = File::create(&path).await.unwrap();
        let (r, _) = file.write_all_at(vec![2u8; 8192], 0).await;
        r.unwrap();
        file.sync_data().await.unwrap();
        mailring::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(offloaded(), 0);
        drop(reader);
    });
}

#[test]
fn blocking_writes_land_where_ring_writes_do_and_report_kernel_errors() {
    let rt = rt2();
    let path = temp_path("blocking-write");
    let p = path.clone();
    rt.block_on(async move {
        let file = File::create(&p).await.unwrap();
        file.write_all_at_blocking(b"world", 6).unwrap();
        let (r, _) = file.write_all_at(b"hello ".to_vec(), 0).await;
        r.unwrap();
        // Larger than a pipe or a page: the whole buffer lands.
        let big = vec![b'x'; 3 * 65536 + 7];
        file.write_all_at_blocking(&big, 11).unwrap();
        let (n, buf) = file.read_at(Vec::with_capacity(11), 0).await;
        assert_eq!(n.unwrap(), 11);
        assert_eq!(buf, b"hello world");
        assert_eq!(file.metadata().await.unwrap().len(), 11 + big.len() as u64);
        // A file opened read-only refuses the write with the kernel's error.
        let read_only = File::open(&p).await.unwrap();
        let err = read_only.write_all_at_blocking(b"no", 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        // An offset past what `off_t` holds is refused before the kernel.
        let err = file.write_all_at_blocking(b"no", u64::MAX).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    });
    std::fs::remove_file(path).unwrap();
}

#[test]
fn ring_reads_and_writes_refuse_offsets_past_what_the_kernel_takes_as_a_position() {
    // io_uring reads an offset of -1 as "the file's current position": a
    // write at `u64::MAX` would land at the start of the file.
    let rt = rt2();
    let path = temp_path("far-offsets");
    let p = path.clone();
    rt.block_on(async move {
        let file = File::create(&p).await.unwrap();
        let (r, _) = file.write_all_at(b"keep".to_vec(), 0).await;
        r.unwrap();
        for pos in [u64::MAX, i64::MAX as u64 + 1] {
            let (r, _) = file.write_all_at(b"lost".to_vec(), pos).await;
            assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput, "{pos}");
            let (r, _) = file.write_at(b"lost".to_vec(), pos).await;
            assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput, "{pos}");
            let (r, _) = file.read_at(Vec::with_capacity(4), pos).await;
            assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput, "{pos}");
            let (r, _) = file.read_exact_at(Vec::with_capacity(4), pos).await;
            assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput, "{pos}");
        }
        // A whole read stepping past the last offset is refused too.
        let (r, _) = file
            .read_exact_at(Vec::with_capacity(8), i64::MAX as u64 - 2)
            .await;
        assert!(r.is_err());
        let (n, buf) = file.read_at(Vec::with_capacity(8), 0).await;
        assert_eq!(n.unwrap(), 4);
        assert_eq!(buf, b"keep", "nothing written over the start");
    });
    std::fs::remove_file(path).unwrap();
}

#[test]
fn reading_a_sparse_file_larger_than_memory_is_an_error_not_an_abort() {
    let rt = rt2();
    let path = temp_path("sparse-huge");
    // A sparse file of 8 TiB (no blocks): its size is the read's size hint.
    let f = std::fs::File::create(&path).unwrap();
    if let Err(e) = f.set_len(8 << 40) {
        // A filesystem that refuses that size: nothing to check here.
        eprintln!("skipped: the filesystem refuses an 8 TiB file: {e}");
        std::fs::remove_file(&path).unwrap();
        return;
    }
    drop(f);
    let p = path.clone();
    let err = rt
        .block_on(async move { mailring::fs::read(&p).await })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn metadata_and_path_helpers() {
    let rt = rt2();
    let base = temp_path("tree");
    let b = base.clone();
    rt.block_on(async move {
        let deep = b.join("a/b/c");
        mailring::fs::create_dir_all(&deep).await.unwrap();
        mailring::fs::create_dir_all(&deep).await.unwrap(); // idempotent
        assert!(mailring::fs::metadata(&deep).await.unwrap().is_dir());
        let err = mailring::fs::create_dir(&deep).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists);

        let file = deep.join("data.bin");
        mailring::fs::write(&file, vec![7u8; 10_000]).await.unwrap();
        let md = mailring::fs::metadata(&file).await.unwrap();
        assert!(md.is_file() && !md.is_dir());
        assert_eq!(md.len(), 10_000);
        let opened = File::open(&file).await.unwrap();
        let by_fd = opened.metadata().await.unwrap();
        assert_eq!((by_fd.len(), by_fd.inode()), (10_000, md.inode()));
        opened.close().await.unwrap();
        assert_eq!(mailring::fs::read(&file).await.unwrap(), vec![7u8; 10_000]);

        let moved = deep.join("moved.bin");
        mailring::fs::rename(&file, &moved).await.unwrap();
        assert_eq!(
            mailring::fs::metadata(&file).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        mailring::fs::remove_file(&moved).await.unwrap();
        let err = mailring::fs::remove_file(&moved).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("moved.bin"), "{err}");
        mailring::fs::remove_dir(&deep).await.unwrap();
        assert!(!deep.exists());
    });
}

#[test]
fn large_file_survives_sync_and_reopen() {
    // 8 MiB written in 1 MiB chunks, fdatasync'd, read back through a new descriptor.
    let rt = rt2();
    let path = temp_path("large");
    let p = path.clone();
    let sum = rt.block_on(async move {
        let file = File::create(&p).await.unwrap();
        for i in 0..8u64 {
            let chunk: Vec<u8> = (0..1 << 20).map(|j| ((i * 31 + j) % 251) as u8).collect();
            let (r, _) = file.write_all_at(chunk, i << 20).await;
            r.unwrap();
        }
        file.sync_data().await.unwrap();
        file.close().await.unwrap();
        let back = mailring::fs::read(&p).await.unwrap();
        assert_eq!(back.len(), 8 << 20);
        back.iter().map(|&b| u64::from(b)).sum::<u64>()
    });
    let expected: u64 = std::fs::read(&path)
        .unwrap()
        .iter()
        .map(|&b| u64::from(b))
        .sum();
    assert_eq!(sum, expected);
}

#[test]
fn a_file_moves_to_another_shard_explicitly() {
    let rt = rt2();
    let path = temp_path("move");
    std::fs::write(&path, b"payload").unwrap();
    let handle = rt.handle().clone();
    rt.block_on(async move {
        let file = File::open(&path).await.unwrap();
        let std_file = file.into_std().unwrap();
        let n = handle
            .spawn_on(ShardId::new(1), async move {
                let file = File::from_std(std_file).unwrap();
                let (n, _) = file.read_at(Vec::with_capacity(16), 0).await;
                n.unwrap()
            })
            .await
            .unwrap();
        assert_eq!(n, 7);
    });
}

#[test]
fn o_direct_reads_with_aligned_buffers() {
    use mailring::buf::AlignedBuf;
    let rt = rt2();
    let path = temp_path("direct");
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 247) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let p = path.clone();
    let got = rt.block_on(async move {
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .await;
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("skipping: this filesystem does not support O_DIRECT ({e})");
                return None;
            }
            Err(e) => panic!("{e}"),
        };
        let mut out = Vec::new();
        let mut buf = AlignedBuf::new(4096, 4096);
        for block in 0..16u64 {
            buf.clear();
            let (n, back) = file.read_at(buf, block * 4096).await;
            assert_eq!(n.unwrap(), 4096);
            out.extend_from_slice(&back);
            buf = back;
        }
        Some(out)
    });
    if let Some(got) = got {
        assert!(got == data);
    }
}

#[test]
fn data_synchronous_writes_land_where_asked_buffered_and_direct() {
    use mailring::buf::AlignedBuf;
    let rt = rt2();
    for direct in [false, true] {
        let path = temp_path(if direct { "dsync-direct" } else { "dsync" });
        let _ = std::fs::remove_file(&path);
        let p = path.clone();
        let wrote = rt.block_on(async move {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(&p)
                .await;
            let file = match opened {
                Ok(f) => f,
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!("skipping: this filesystem does not support O_DIRECT ({e})");
                    return false;
                }
                Err(e) => panic!("{e}"),
            };
            // Two blocks, the second first: each lands at its offset.
            for (block, byte) in [(1u64, b'b'), (0, b'a')] {
                let mut buf = AlignedBuf::new(4096, 4096);
                buf.extend_from_slice(&[byte; 4096]);
                let (res, _) = file.write_all_at_dsync(buf, block * 4096).await;
                res.unwrap();
            }
            file.close().await.unwrap();
            true
        });
        if wrote {
            let data = std::fs::read(&path).unwrap();
            assert_eq!(data.len(), 8192);
            assert!(data[..4096].iter().all(|&b| b == b'a'));
            assert!(data[4096..].iter().all(|&b| b == b'b'));
        }
        let _ = std::fs::remove_file(&path);
    }
    // A file open only for reading refuses it with the kernel's error.
    let path = temp_path("dsync-read-only");
    std::fs::write(&path, b"x").unwrap();
    let p = path.clone();
    let err = rt.block_on(async move {
        let file = File::open(&p).await.unwrap();
        let (res, _) = file.write_all_at_dsync(b"y".to_vec(), 0).await;
        res.unwrap_err()
    });
    assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    assert_eq!(std::fs::read(&path).unwrap(), b"x");
}

#[test]
fn ranged_data_syncs_take_any_range_and_refuse_none_in_range() {
    let rt = rt2();
    let path = temp_path("sync-range");
    let _ = std::fs::remove_file(&path);
    let p = path.clone();
    rt.block_on(async move {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&p)
            .await
            .unwrap();
        let (res, _) = file.write_all_at(vec![7u8; 10_000], 0).await;
        res.unwrap();
        // Within the file, past its end, empty, over 4 GiB (the whole file).
        for (offset, len) in [
            (0, 4096),
            (4096, 5904),
            (1 << 30, 10),
            (0, 0),
            (8192, 5 << 30),
        ] {
            file.sync_data_range(offset, len).await.unwrap();
        }
        // An offset no file has, with or without bytes to sync.
        for len in [1, 0] {
            let err = file.sync_data_range(u64::MAX, len).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
        file.close().await.unwrap();
    });
    assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 10_000]);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn times_before_1970_and_after_read_as_the_file_system_has_them() {
    let rt = rt2();
    let path = temp_path("old-times");
    std::fs::write(&path, b"x").unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    let half = std::time::Duration::from_millis(500);
    for (modified, accessed) in [
        // statx's nanoseconds count forward from its (negative) seconds.
        (
            std::time::UNIX_EPOCH - std::time::Duration::from_secs(1) + half,
            std::time::UNIX_EPOCH - std::time::Duration::from_secs(100) - half,
        ),
        (
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000) + half,
            std::time::UNIX_EPOCH,
        ),
    ] {
        f.set_times(
            std::fs::FileTimes::new()
                .set_modified(modified)
                .set_accessed(accessed),
        )
        .unwrap();
        let p = path.clone();
        let md = rt.block_on(async move { mailring::fs::metadata(&p).await.unwrap() });
        assert_eq!(md.modified(), modified);
        assert_eq!(md.accessed(), accessed);
    }
    std::fs::remove_file(&path).unwrap();
}

/// Option sets that `std::fs::OpenOptions` refuses are refused the same
/// way (`InvalidInput`), before the kernel sees them: truncating or creating
/// without write access (which the kernel would carry out on a file opened
/// to read), and truncating in append mode. The file is untouched.
#[test]
fn open_options_std_refuses_are_refused_and_leave_the_file_untouched() {
    let rt = rt2();
    let path = temp_path("refused-options");
    std::fs::write(&path, b"data").unwrap();
    let missing = temp_path("refused-options-missing");
    let _ = std::fs::remove_file(&missing);
    let (p, m) = (path.clone(), missing.clone());
    let results = rt.block_on(async move {
        let mut out = Vec::new();
        out.push(
            OpenOptions::new()
                .read(true)
                .truncate(true)
                .open(&p)
                .await
                .err(),
        );
        out.push(
            OpenOptions::new()
                .read(true)
                .create(true)
                .open(&m)
                .await
                .err(),
        );
        out.push(
            OpenOptions::new()
                .read(true)
                .create_new(true)
                .open(&m)
                .await
                .err(),
        );
        out.push(
            OpenOptions::new()
                .append(true)
                .truncate(true)
                .open(&p)
                .await
                .err(),
        );
        // The same asked through the extra flags.
        for extra in [libc::O_TRUNC, libc::O_CREAT] {
            out.push(
                OpenOptions::new()
                    .read(true)
                    .custom_flags(extra)
                    .open(if extra == libc::O_CREAT { &m } else { &p })
                    .await
                    .err(),
            );
        }
        out
    });
    for (i, err) in results.into_iter().enumerate() {
        let err = err.unwrap_or_else(|| panic!("option set {i} was accepted"));
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "option set {i}: {err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
    assert!(!missing.exists(), "a file was created without write access");
    // What std accepts still opens: append with create_new and truncate.
    let ok = rt.block_on(async move {
        OpenOptions::new()
            .append(true)
            .create_new(true)
            .truncate(true)
            .open(&missing)
            .await
            .map(|_| ())
    });
    assert!(ok.is_ok(), "{ok:?}");
    // An access mode among the extra flags is not taken (as std masks
    // it): a file opened to read is not opened to write.
    let p = path.clone();
    let write = rt.block_on(async move {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_WRONLY)
            .open(&p)
            .await
            .unwrap();
        file.write_all_at(b"over".to_vec(), 0).await.0
    });
    assert!(write.is_err(), "written through a file opened to read");
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
}

/// A close while an operation given up on the file is still in flight
/// cannot close it (that operation holds the descriptor until its
/// completion) and says so, rather than answering `Ok` for a close that
/// has not happened.
#[test]
fn a_close_while_a_given_up_operation_holds_the_file_says_so() {
    let rt = rt2();
    rt.block_on(async move {
        let (reader, _writer) = pipe();
        let file = File::from_std(reader).unwrap();
        // A read of an empty pipe waits: given up, it is cancelled, and
        // holds the descriptor until the cancellation completes.
        let read = file.read_at(vec![0u8; 16], 0);
        assert!(mailring::time::timeout(Duration::ZERO, read).await.is_err());
        let e = file.close().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ResourceBusy, "{e}");
    });
}
