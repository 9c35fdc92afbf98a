//! Under `appendfsync always` every answered write was made durable: on a
//! disk with a volatile write cache, each batch is followed by a cache
//! flush, which the block device's own statistics count
//! (`/sys/dev/block/MAJ:MIN/stat`, "flush I/Os"). Checked for each way of
//! making a direct write durable ([`AlwaysFlush`]), so a way that lost its
//! `RWF_DSYNC` or its `fdatasync` fails here, which comparing bytes on
//! disk cannot show. One test in its own binary: no other test of the
//! crate flushes the disk meanwhile.

use std::path::{Path, PathBuf};

use mailring_broker::{AlwaysFlush, BrokerConfig, Fsync};

mod common;
use common::client::{start_in, Client, R};
use common::TempDir;

/// The sysfs directory of the whole disk that holds `path`, or why the
/// test cannot count its flushes.
fn disk_of(path: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).map_err(|e| e.to_string())?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return Err(format!("{} is not on a block device", path.display()));
    }
    let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    // A partition's queue settings are its disk's.
    Ok(if dir.join("partition").exists() {
        dir.parent().expect("a partition has a disk").to_path_buf()
    } else {
        dir
    })
}

/// The disk's completed flush requests, and its writes (the 16th and 5th
/// fields of its `stat`: reads, writes and discards take four each).
fn counts(disk: &Path) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(disk.join("stat")).ok()?;
    let fields: Vec<u64> = stat
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some((*fields.get(15)?, *fields.get(4)?))
}

fn queue_setting(disk: &Path, name: &str) -> String {
    std::fs::read_to_string(disk.join("queue").join(name))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Whether the filesystem holding `path` was mounted without flushes.
fn mounted_without_barriers(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, _, options) = (f.next()?, f.next()?, f.next()?, f.next()?);
            Some((point.to_owned(), options.to_owned()))
        })
        .filter(|(point, _)| path.starts_with(point))
        .max_by_key(|(point, _)| point.len())
        .is_some_and(|(_, options)| {
            options
                .split(',')
                .any(|o| o == "nobarrier" || o == "barrier=0")
        })
}

#[test]
fn every_answered_write_under_always_was_followed_by_a_cache_flush() {
    const WRITES: u64 = 200;
    let probe = TempDir::new();
    std::fs::create_dir_all(&probe.0).unwrap();
    let disk = match disk_of(&probe.0) {
        Ok(disk) => disk,
        Err(why) => {
            eprintln!("skipping: cannot count the disk's flushes ({why})");
            return;
        }
    };
    if counts(&disk).is_none() {
        eprintln!("skipping: {} has no flush counts", disk.display());
        return;
    }
    if queue_setting(&disk, "write_cache") != "write back" || mounted_without_barriers(&probe.0) {
        eprintln!(
            "skipping: {} needs no cache flushes (write cache: {:?})",
            disk.display(),
            queue_setting(&disk, "write_cache")
        );
        return;
    }
    // With FUA the kernel makes a write-through durable with the write
    // itself, no flush request: that way is counted in writes instead.
    let fua = queue_setting(&disk, "fua") == "1";
    // Each way of a direct write; buffered `O_DSYNC` writes; and, as the
    // control that shows the count is the broker's, `everysec`, whose
    // replies wait for no flush.
    let cases = [
        (AlwaysFlush::WriteThrough, true, Fsync::Always),
        (AlwaysFlush::WriteThenSync, true, Fsync::Always),
        (AlwaysFlush::Adaptive, true, Fsync::Always),
        (AlwaysFlush::Adaptive, false, Fsync::Always),
        (AlwaysFlush::Adaptive, true, Fsync::EverySec),
    ];
    for (flush, direct_io, fsync) in cases {
        let dir = TempDir::new();
        let mut config = BrokerConfig::default();
        config.store.always_flush = flush;
        config.store.direct_io = direct_io;
        config.store.fsync = fsync;
        let broker = start_in(&dir.0, 1, config);
        let mut c = Client::connect(broker.local_addr());
        // The segment is made and zero-filled first.
        assert_eq!(c.cmd(&["XADD", "s", "1-1", "f", "v"]), R::bulk("1-1"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (flushes, writes) = counts(&disk).unwrap();
        // One client at queue depth 1: each write is a batch of its own.
        for i in 2..WRITES + 2 {
            let id = format!("1-{i}");
            assert_eq!(c.cmd(&["XADD", "s", &id, "f", "v"]), R::bulk(&id));
        }
        let (flushes_after, writes_after) = counts(&disk).unwrap();
        broker.shutdown();
        let (flushed, written) = (flushes_after - flushes, writes_after - writes);
        let case = format!("{flush:?}, direct {direct_io}, {fsync:?}");
        if fsync == Fsync::EverySec {
            assert!(
                flushed < WRITES / 2,
                "{case}: {flushed} cache flushes for {WRITES} writes no reply waited on"
            );
        } else if fua && flush != AlwaysFlush::WriteThenSync {
            assert!(
                written >= WRITES,
                "{case}: {written} writes for {WRITES} batches"
            );
        } else {
            assert!(
                flushed >= WRITES,
                "{case}: the disk counted {flushed} cache flushes for {WRITES} answered writes"
            );
        }
    }
}
