//! Reading entries back from a log's segments: the entries a stream no
//! longer keeps in memory, found by the [`Loc`] of the record that holds
//! them. Records near each other are read together (one read per cluster
//! of nearby records), each checked against its checksum.
//!
//! Two ways in: [`SegmentSource::read`] reads with blocking `pread`s
//! (recovery's rewrite, and a stream command whose reads were not fetched
//! ahead), and [`crate::store::ShardLog::fetch`] reads through the shard's
//! io_uring ring, which the stream actor awaits before a command runs.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::id::StreamId;
use crate::log::{self, Framed, Loc, Op};
use crate::stream::Fields;

/// Segment files kept open for reading back, at most (per log, and per
/// way of reading); past it, an arbitrary one is closed.
pub(crate) const OPEN_FILES: usize = 32;

/// Records whose offsets lie within this many bytes of a cluster's first
/// are read with it.
const CLUSTER_SPAN: u32 = 256 << 10;
/// Bytes read past a cluster's last record's start (most records are
/// shorter; a longer one is read again, whole).
const READ_AHEAD: u32 = 4096;

/// A run of wanted records in one segment, read with one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cluster {
    /// The segment.
    pub segment: u32,
    /// Where the read starts.
    pub start: u32,
    /// Bytes to read.
    pub len: u32,
    /// The records' offsets, ascending.
    pub offsets: Vec<u32>,
}

/// Groups the records at `locs` (any order, repeats allowed) into
/// clusters.
pub(crate) fn clusters(locs: impl IntoIterator<Item = Loc>) -> Vec<Cluster> {
    let mut locs: Vec<Loc> = locs.into_iter().filter(|l| l.is_some()).collect();
    locs.sort_unstable();
    locs.dedup();
    let mut out: Vec<Cluster> = Vec::new();
    for loc in locs {
        match out.last_mut() {
            Some(c) if c.segment == loc.segment && loc.offset - c.start <= CLUSTER_SPAN => {
                c.offsets.push(loc.offset);
                c.len = loc.offset - c.start + READ_AHEAD;
            }
            _ => out.push(Cluster {
                segment: loc.segment,
                start: loc.offset,
                len: READ_AHEAD,
                offsets: vec![loc.offset],
            }),
        }
    }
    out
}

/// The entries a record adds, by id.
fn adds_of(op: Op, out: &mut Vec<(StreamId, Fields)>) {
    match op {
        Op::Add { id, fields } => out.push((id, fields)),
        Op::Batch(ops) => {
            for op in ops {
                adds_of(op, out);
            }
        }
        _ => {}
    }
}

fn corrupt(dir: &Path, loc: Loc, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: the record at segment {} offset {} {what}",
            dir.display(),
            loc.segment,
            loc.offset
        ),
    )
}

/// The entries of the records read so far, by record.
pub(crate) type Decoded = HashMap<Loc, Vec<(StreamId, Fields)>>;

/// Decodes the cluster's records from `buf` (read from `cluster.start`);
/// the records it holds only part of: (where, bytes that would hold it).
pub(crate) fn decode_cluster(
    dir: &Path,
    cluster: &Cluster,
    buf: &Bytes,
    out: &mut Decoded,
) -> io::Result<Vec<(Loc, usize)>> {
    let mut short = Vec::new();
    for &offset in &cluster.offsets {
        let loc = Loc {
            segment: cluster.segment,
            offset,
        };
        let at = ((offset - cluster.start) as usize).min(buf.len());
        if let Some(need) = decode_one(dir, loc, &buf.slice(at..), out)? {
            short.push((loc, need));
        }
    }
    Ok(short)
}

/// Decodes the record at `loc` from `buf` (read from its start); `Some`
/// with the bytes that would hold it if `buf` holds only part of it.
pub(crate) fn decode_one(
    dir: &Path,
    loc: Loc,
    buf: &Bytes,
    out: &mut Decoded,
) -> io::Result<Option<usize>> {
    match log::decode_framed(buf) {
        Framed::Record(record, _) => {
            let mut adds = Vec::new();
            adds_of(record.op, &mut adds);
            out.insert(loc, adds);
            Ok(None)
        }
        Framed::Short(need) => Ok(Some(need.max(READ_AHEAD as usize))),
        Framed::Bad => Err(corrupt(dir, loc, "fails its checksum")),
    }
}

/// One step of reading a record that a first read held only part of:
/// `buf` was read from its start asking for `asked` bytes. `Some` with
/// the bytes to ask for next, `None` once decoded.
///
/// # Errors
///
/// The record is cut short (the file ended first) or invalid.
pub(crate) fn reread_step(
    dir: &Path,
    loc: Loc,
    asked: usize,
    buf: &Bytes,
    out: &mut Decoded,
) -> io::Result<Option<usize>> {
    match decode_one(dir, loc, buf, out)? {
        None => Ok(None),
        // A read that held less than the frame's header asks again,
        // knowing the length.
        Some(more) if buf.len() == asked && more > asked => Ok(Some(more)),
        Some(_) => Err(corrupt(dir, loc, "is cut short")),
    }
}

/// Picks the wanted entries out of what was decoded.
pub(crate) fn pick(
    dir: &Path,
    wanted: &[(StreamId, Loc)],
    decoded: &Decoded,
) -> io::Result<Vec<(StreamId, Fields)>> {
    wanted
        .iter()
        .map(|&(id, loc)| {
            decoded
                .get(&loc)
                .and_then(|adds| adds.iter().find(|(i, _)| *i == id))
                .map(|(_, f)| (id, f.clone()))
                .ok_or_else(|| corrupt(dir, loc, &format!("does not hold entry {id}")))
        })
        .collect()
}

/// Reads entries from one log's segment files with blocking reads
/// (shared between threads; keeps each segment's file open until
/// [`SegmentSource::forget`]).
#[derive(Debug)]
pub struct SegmentSource {
    dir: PathBuf,
    files: Mutex<HashMap<u32, Arc<File>>>,
}

impl SegmentSource {
    /// Reads the segments under the log directory `dir`.
    pub fn new(dir: PathBuf) -> Arc<SegmentSource> {
        Arc::new(SegmentSource {
            dir,
            files: Mutex::new(HashMap::new()),
        })
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, segment: u32) -> io::Result<Arc<File>> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = files.get(&segment) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(self.dir.join(log::segment_file_name(segment)))?);
        if files.len() >= OPEN_FILES {
            if let Some(&any) = files.keys().next() {
                files.remove(&any);
            }
        }
        files.insert(segment, f.clone());
        Ok(f)
    }

    /// Closes segment `segment`'s file (it is being removed).
    pub fn forget(&self, segment: u32) {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&segment);
    }

    fn read_at(&self, segment: u32, start: u32, len: usize) -> io::Result<Bytes> {
        let file = self.file(segment)?;
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = file.read_at(&mut buf[got..], u64::from(start) + got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        Ok(Bytes::from(buf))
    }

    /// Reads the entries `wanted` (id, and the record holding it).
    ///
    /// # Errors
    ///
    /// A read failed, or a record is not there whole and valid.
    pub fn read(&self, wanted: &[(StreamId, Loc)]) -> io::Result<Vec<(StreamId, Fields)>> {
        let mut decoded = Decoded::new();
        for cluster in clusters(wanted.iter().map(|w| w.1)) {
            let buf = self.read_at(cluster.segment, cluster.start, cluster.len as usize)?;
            for (loc, mut need) in decode_cluster(&self.dir, &cluster, &buf, &mut decoded)? {
                loop {
                    let buf = self.read_at(loc.segment, loc.offset, need)?;
                    match reread_step(&self.dir, loc, need, &buf, &mut decoded)? {
                        Some(more) => need = more,
                        None => break,
                    }
                }
            }
        }
        pick(&self.dir, wanted, &decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(ms: u64, value_len: usize) -> crate::log::Record {
        crate::log::Record {
            stream: Bytes::from_static(b"s"),
            op_no: ms,
            op: Op::Add {
                id: StreamId::new(ms, 0),
                fields: Fields::from_parts(&[&b"f"[..], &vec![b'v'; value_len]]),
            },
        }
    }

    #[test]
    fn records_longer_than_the_read_ahead_and_bad_ones() {
        let dir = std::env::temp_dir().join(format!("mailring-reader-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut seg = bytes::BytesMut::new();
        seg.extend_from_slice(&log::segment_header(0, 1));
        let mut wanted = Vec::new();
        for (ms, len) in [(1, 10), (2, 20_000), (3, 5)] {
            let at = seg.len() as u64;
            add(ms, len).encode(&mut seg);
            wanted.push((StreamId::new(ms, 0), Loc::new(1, at)));
        }
        std::fs::write(dir.join(log::segment_file_name(1)), &seg).unwrap();
        let source = SegmentSource::new(dir.clone());
        let found = source.read(&wanted).unwrap();
        let lens: Vec<usize> = found
            .iter()
            .map(|(_, f)| f.values().next().map_or(0, <[u8]>::len))
            .collect();
        assert_eq!(lens, [10, 20_000, 5]);
        // An id its record does not hold, and a place inside a record.
        assert!(source.read(&[(StreamId::new(9, 0), wanted[0].1)]).is_err());
        let inside = Loc::new(1, u64::from(wanted[1].1.offset) + 100);
        assert!(source.read(&[(StreamId::new(2, 0), inside)]).is_err());
        // A record cut short by the end of the file.
        source.forget(1);
        std::fs::write(
            dir.join(log::segment_file_name(1)),
            &seg[..seg.len() - 9_000],
        )
        .unwrap();
        assert!(source.read(&wanted[1..2]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn near_records_share_a_read() {
        let l = |segment, offset| Loc { segment, offset };
        let c = clusters([
            l(2, 100),
            l(1, 16),
            l(1, 5000),
            l(1, 16),
            l(1, 900_000),
            l(0, 0),
        ]);
        assert_eq!(
            c,
            vec![
                Cluster {
                    segment: 1,
                    start: 16,
                    len: 5000 - 16 + READ_AHEAD,
                    offsets: vec![16, 5000]
                },
                Cluster {
                    segment: 1,
                    start: 900_000,
                    len: READ_AHEAD,
                    offsets: vec![900_000]
                },
                Cluster {
                    segment: 2,
                    start: 100,
                    len: READ_AHEAD,
                    offsets: vec![100]
                },
            ]
        );
    }
}
