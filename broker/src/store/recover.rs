//! Recovery at start: finds the data directory's current generation of
//! logs, reads every segment (cutting torn or corrupt tails), and replays
//! each stream; when the logs were written with another shard count, it
//! rewrites every stream into a new generation laid out for this one.
//!
//! A data directory holds generations `gen-GGGGG/`, each with one log per
//! shard (`log-NNN/`) and, once whole, a `COMPLETE` file naming its log
//! count. Within a generation a stream's records all sit in one log (the
//! one its shard writes), which is what lets segments be removed: a
//! stream's records in a log form a history whose prefix can go once a
//! later snapshot and its live entries no longer need it
//! ([`super::retention`]).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::reader::SegmentSource;
use super::retention::{need_of, Need};
use crate::id::StreamId;
use crate::log::{self, Loc, Op, Record, Snapshot, Tail};
use crate::stream::Stream;

/// The file that marks a generation whole.
const COMPLETE: &str = "COMPLETE";

/// A stream rebuilt from the logs, waiting for its actor.
#[derive(Debug)]
pub struct RecoveredStream {
    /// Its state (`None`: its last record deleted it).
    pub stream: Option<Stream>,
    /// Its last operation number.
    pub op_no: u64,
    /// The log its records are in.
    pub log: u16,
    /// The segment its replay starts at, but for its entries: its last
    /// snapshot's, or its first record's.
    pub meta_segment: u32,
    /// Where its entries sit: each run starts at an id, in a segment.
    pub runs: VecDeque<(StreamId, u32)>,
}

impl RecoveredStream {
    /// A stream with no records yet, in log `log`.
    pub fn empty(log: u16) -> Self {
        RecoveredStream {
            stream: None,
            op_no: 0,
            log,
            meta_segment: 0,
            runs: VecDeque::new(),
        }
    }

    /// The oldest segment of its log this stream needs (`small`: see
    /// [`need_of`]).
    pub fn need(&mut self, small: u64) -> Option<Need> {
        need_of(
            self.stream.as_ref(),
            self.meta_segment,
            &mut self.runs,
            small,
        )
    }
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The generation's directory (the logs are under it).
    pub dir: PathBuf,
    /// Streams by name.
    pub streams: crate::NameMap<RecoveredStream>,
    /// The segments of each log, oldest first.
    pub segments: HashMap<u16, Vec<u32>>,
    /// Records replayed.
    pub records: u64,
    /// Bytes of valid records read.
    pub bytes: u64,
    /// Segments whose tails were cut, with the bytes cut.
    pub cut: Vec<(PathBuf, u64)>,
    /// Copies of the cut tails that held anything but zeros, kept in the
    /// data directory's `salvage` directory as
    /// `<generation>-<log>-<segment>.cut`.
    pub saved: Vec<PathBuf>,
    /// Whether the logs were rewritten for another shard count.
    pub migrated: bool,
    /// How long recovery took.
    pub elapsed: Duration,
}

pub(super) fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// The data directory's directory of cut tails (see [`salvage_dir`]).
const SALVAGE: &str = "salvage";

/// The mark a log's directory gets when a write or flush of it failed:
/// after a failed flush the kernel may have dropped the unwritten pages'
/// dirt, keeping their bytes in its cache, so the next start would read
/// back, and build on, records that never reached the disk. A start that
/// finds it writes its last segment again before flushing it, then takes
/// the mark away.
const WRITE_FAILED: &str = "write-failed";

/// In a log directory: the segments `--repair-log` agreed to go on without
/// (one number a line), so later starts do not refuse the same gap.
const SEGMENTS_LOST: &str = "segments-lost";

/// Takes the mark of [`WRITE_FAILED`] away once the log's last segment
/// was written again and flushed.
fn clear_write_failed(log_dir: &Path) -> io::Result<()> {
    let mark = log_dir.join(WRITE_FAILED);
    std::fs::remove_file(&mark).map_err(at(&mark))?;
    sync_dir(log_dir)
}

/// Marks log directory `log_dir` as having had a failed write or flush
/// (see [`WRITE_FAILED`]); best effort: the disk may be failing.
pub(crate) fn mark_write_failed(log_dir: &Path) {
    let mark = log_dir.join(WRITE_FAILED);
    if let Ok(f) = File::create(&mark) {
        let _ = f.sync_all();
        let _ = sync_dir(log_dir);
    }
}

fn gen_dir_name(gen: u32) -> String {
    format!("gen-{gen:05}")
}

fn parse_gen_dir_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gen-")?;
    if digits.len() != 5 {
        return None;
    }
    digits.parse().ok()
}

/// A generation's log count, if it is whole.
fn complete_logs(gen_dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(gen_dir.join(COMPLETE)).ok()?;
    text.trim().strip_prefix("logs ")?.parse().ok()
}

/// Marks `gen_dir` whole, with `logs` logs, durably.
fn mark_complete(gen_dir: &Path, logs: usize) -> io::Result<()> {
    let path = gen_dir.join(COMPLETE);
    let mut f = File::create(&path)?;
    f.write_all(format!("logs {logs}\n").as_bytes())?;
    f.sync_all()?;
    sync_dir(gen_dir)
}

/// The log a rewrite for `shards` shards puts stream `name` in (and so the
/// shard it lives on after): a stable hash of the name, as sticky keyed
/// actors are placed. New streams go to their first sender's shard.
pub fn home_log(name: &Bytes, shards: usize) -> u16 {
    let hash = mailring_actors::route_hash(name);
    mailring::shard_for_hash(hash, shards).index() as u16
}

/// Reads the data directory `dir` (made if missing) for a broker of
/// `shards` shards: cuts torn or corrupt tails and replays each stream.
/// Logs written with another shard count (or by an older layout) are
/// rewritten first into a new generation, in segments of
/// `segment_bytes`.
///
/// # Errors
///
/// I/O errors, or a file in a log directory that is not a segment.
pub fn recover(
    dir: &Path,
    shards: usize,
    segment_bytes: u64,
    cache_bytes: u64,
    repair: bool,
) -> io::Result<Recovered> {
    recover_or_rewrite(dir, shards, segment_bytes, cache_bytes, repair, true)
}

/// [`recover`]; `may_rewrite`: false for the read after a rewrite, which
/// must find everything laid out.
fn recover_or_rewrite(
    dir: &Path,
    shards: usize,
    segment_bytes: u64,
    cache_bytes: u64,
    repair: bool,
    may_rewrite: bool,
) -> io::Result<Recovered> {
    let started = Instant::now();
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(at(dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let mut complete: Vec<(u32, PathBuf, usize)> = Vec::new();
    let mut partial: Vec<PathBuf> = Vec::new();
    let mut legacy = false;
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(gen) = parse_gen_dir_name(name) {
            match complete_logs(&entry.path()) {
                Some(logs) => complete.push((gen, entry.path(), logs)),
                None => partial.push(entry.path()),
            }
        } else if log::parse_log_dir_name(name).is_some() {
            legacy = true;
        }
    }
    complete.sort();
    // A generation without its mark is a rewrite that did not finish (the
    // logs it was made from still hold everything), or a first start that
    // stopped before any segment: either goes. One with segments and
    // nothing else to read is refused rather than dropped.
    let mut removed = false;
    for p in partial {
        if complete.is_empty() && !legacy && holds_segments(&p)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds segments but no {COMPLETE} mark, and there is no other generation: not starting (restore the mark, `logs N` with its log count, if the generation is whole)",
                    p.display()
                ),
            ));
        }
        std::fs::remove_dir_all(p)?;
        removed = true;
    }
    let current = complete.pop();
    if current.is_some() {
        // Older whole generations are left from a rewrite that finished.
        for (_, p, _) in complete.drain(..) {
            std::fs::remove_dir_all(p)?;
            removed = true;
        }
        if legacy {
            remove_legacy_logs(dir)?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    let (gen, source, logs) = match current {
        Some(c) => c,
        None if legacy => (0, dir.to_path_buf(), 0),
        None => {
            let gen_dir = dir.join(gen_dir_name(1));
            std::fs::create_dir(&gen_dir).map_err(at(&gen_dir))?;
            mark_complete(&gen_dir, shards)?;
            sync_dir(dir)?;
            return Ok(Recovered {
                dir: gen_dir,
                elapsed: started.elapsed(),
                ..Recovered::default()
            });
        }
    };
    // A generation keeps each stream's records in one log, in order: it
    // replays as it reads, keeping only each stream's newest entries in
    // memory. The older layout (or a stream found in two logs) is read
    // whole and ordered first.
    let streamed = if gen == 0 {
        Err(Recovered::default())
    } else {
        read_generation_streamed(&source, cache_bytes, repair)?
    };
    let mut out = match streamed {
        Ok(out) => out,
        // What the streamed read cut and kept before it gave up is cut
        // already: the whole read finds it so, and says it here.
        Err(partial) => {
            let mut out = read_generation(&source, repair)?;
            let (mut cut, mut saved) = (partial.cut, partial.saved);
            cut.append(&mut out.cut);
            saved.append(&mut out.saved);
            (out.cut, out.saved) = (cut, saved);
            out
        }
    };
    out.dir = source.clone();
    // A stream lives on the shard of the log that holds it, whichever
    // that is; only a stream found in two logs (the older layout) has none.
    let unplaced = out.streams.values().any(|s| usize::from(s.log) >= shards);
    // Two names with one route hash live on one shard (the placement
    // directory keeps hashes); a layout from before that, with them in
    // two logs, cannot be placed back as it is: it is rewritten, and the
    // rewrite puts both in their hash's log.
    let split = split_by_route_hash(out.streams.iter().map(|(name, s)| (name, s.log)));
    if gen == 0 || logs != shards || unplaced || split {
        if !may_rewrite {
            return Err(io::Error::other(format!(
                "{}: a rewritten generation is not laid out for {shards} shards",
                source.display()
            )));
        }
        let next = dir.join(gen_dir_name(gen + 1));
        rewrite(&out, &next, shards, segment_bytes)?;
        // The new generation's entry is durable before the old one goes.
        sync_dir(dir)?;
        if gen == 0 {
            remove_legacy_logs(dir)?;
        } else {
            std::fs::remove_dir_all(&source)?;
        }
        sync_dir(dir)?;
        let mut again = recover_or_rewrite(dir, shards, segment_bytes, cache_bytes, repair, false)?;
        again.migrated = true;
        again.cut = out.cut;
        again.saved = out.saved;
        again.elapsed = started.elapsed();
        return Ok(again);
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

/// Whether two of the streams (name, log) share a route hash but not a
/// log.
fn split_by_route_hash<'a>(streams: impl Iterator<Item = (&'a Bytes, u16)>) -> bool {
    let mut logs: HashMap<u64, u16> = HashMap::new();
    for (name, log) in streams {
        let hash = mailring_actors::route_hash(name);
        if *logs.entry(hash).or_insert(log) != log {
            return true;
        }
    }
    false
}

/// Whether a generation directory holds any segment file.
fn holds_segments(gen_dir: &Path) -> io::Result<bool> {
    for log in std::fs::read_dir(gen_dir).map_err(at(gen_dir))? {
        let log = log?;
        if !log.file_type()?.is_dir() {
            continue;
        }
        let log_dir = log.path();
        for seg in std::fs::read_dir(&log_dir).map_err(at(&log_dir))? {
            let name = seg?.file_name();
            if name
                .to_str()
                .and_then(log::parse_segment_file_name)
                .is_some()
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn remove_legacy_logs(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry?;
        if entry
            .file_name()
            .to_str()
            .and_then(log::parse_log_dir_name)
            .is_some()
        {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

/// Entries a rewrite reads back and writes at a time.
const REWRITE_CHUNK: u64 = 4096;

/// Reads one segment file for recovery, handing each record (decoded
/// from its own copy) and its offset to `f`: cuts a torn or corrupt tail
/// of its log's last segment (`last`) and flushes the file.
///
/// Only the last segment can be torn by a crash: a segment is flushed
/// before its successor takes a record. A bad record in an earlier one is
/// damage to flushed data (the disk, or a hand that changed the file),
/// and what follows it in that segment was acknowledged: recovery stops
/// there with an error, changing nothing, unless `repair` (the
/// `--repair-log` flag) says to cut that segment at the bad record too.
/// Names `path` in an error about it (`Not a directory` says nothing of
/// where).
fn at(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The directory that keeps cut tails: `salvage` in the data directory,
/// which no rewrite, generation change or removal of old logs touches.
/// `segment` is `<data>/<generation>/<log>/<file>` (or `<data>/<log>/<file>`
/// in the older layout).
fn salvage_dir(segment: &Path) -> PathBuf {
    let log_dir = segment.parent().unwrap_or(Path::new("."));
    let above = log_dir.parent().unwrap_or(Path::new("."));
    let is_generation = above
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_gen_dir_name)
        .is_some();
    let data = if is_generation {
        above.parent().unwrap_or(Path::new("."))
    } else {
        above
    };
    data.join(SALVAGE)
}

/// Keeps `tail`, cut from segment `path`, in the data directory's
/// [`salvage_dir`] as `<generation>-<log>-<segment>.cut` (or `.cut-2` and
/// on if that is taken), flushed with its directory entry before the
/// segment is cut.
fn save_cut_tail(path: &Path, tail: &[u8]) -> io::Result<PathBuf> {
    use std::io::Write;
    let salvage = salvage_dir(path);
    std::fs::create_dir_all(&salvage).map_err(at(&salvage))?;
    if let Some(data) = salvage.parent() {
        sync_dir(data)?;
    }
    // The segment's place, from the data directory down (the names are
    // the broker's own: ASCII).
    let mut origin = Vec::new();
    let mut at_path = Some(path);
    while let Some(p) = at_path {
        match p.file_name().and_then(|n| n.to_str()) {
            Some(name) if origin.len() < 3 => origin.push(name.to_owned()),
            _ => break,
        }
        at_path = p.parent();
    }
    if origin.len() == 3 && parse_gen_dir_name(&origin[2]).is_none() {
        origin.pop();
    }
    origin.reverse();
    let stem = origin.join("-");
    let mut n = 1;
    let (saved, mut file) = loop {
        let candidate = salvage.join(match n {
            1 => format!("{stem}.cut"),
            n => format!("{stem}.cut-{n}"),
        });
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(file) => break (candidate, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(at(&candidate)(e)),
        }
    };
    let written = file
        .write_all(tail)
        .and_then(|()| file.sync_all())
        .and_then(|()| sync_dir(&salvage));
    if let Err(e) = written {
        // No half copy left to be taken for the whole.
        drop(file);
        let _ = std::fs::remove_file(&saved);
        return Err(at(&saved)(e));
    }
    Ok(saved)
}

fn read_segment(
    path: &Path,
    place: (u16, u32),
    last: bool,
    repair: bool,
    refresh: bool,
    out: &mut Recovered,
    mut f: impl FnMut(u64, Record),
) -> io::Result<()> {
    let data = Bytes::from(std::fs::read(path).map_err(at(path))?);
    check_header_place(path, &data, place, repair)?;
    let len = data.len() as u64;
    let mut records = 0;
    let scan = match log::scan_segment_each(data.clone(), |at, r| {
        records += 1;
        f(at, r);
    }) {
        Ok(scan) => scan,
        // The last segment's header is flushed before any record goes in:
        // a crash while the segment was made can leave its block without
        // the header (zeros), and no record there was acknowledged. Such
        // a header is read as an empty segment, cut whole (its bytes
        // kept if not all zeros, as a cut tail is). A header that holds
        // anything else is damage, or another format: refused as in any
        // other segment (its records may have been acknowledged).
        Err(log::BadHeader)
            if last
                && data[..log::HEADER_LEN.min(data.len())]
                    .iter()
                    .all(|&b| b == 0) =>
        {
            log::Scan {
                valid_after: None,
                records: Vec::new(),
                valid_len: 0,
                tail: log::Tail::Corrupt,
            }
        }
        Err(e) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            ))
        }
    };
    // A tail about to be cut (the last segment's, or any under repair) is
    // kept first unless it is all zeros (a preallocated end): a torn
    // write was never acknowledged, but damaged flushed records were,
    // and recovery cannot always tell them apart (a length the damage
    // made larger reads as a torn end). Nothing is destroyed.
    let cut_off = &data[scan.valid_len as usize..];
    // Up to its last byte that is not zero (a preallocated end is not
    // kept).
    let cut_off = &cut_off[..cut_off.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
    if scan.tail != Tail::Clean && (last || repair) && !cut_off.is_empty() {
        let saved = match save_cut_tail(path, cut_off) {
            Ok(saved) => Some(saved),
            // A crash's torn write, with nothing valid after it, was not
            // acknowledged: a disk too full (or failing) to keep it does
            // not stop the start. Anything else is not cut unkept.
            Err(e)
                if scan.tail == Tail::Torn
                    && scan.valid_after.is_none()
                    && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) =>
            {
                eprintln!(
                    "mailring-broker: {}: the {} bytes of a torn write at its end could not be kept ({e}); cut unkept",
                    path.display(),
                    cut_off.len()
                );
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(saved) = saved {
            match scan.valid_after {
            // Valid records after a corrupt one: the blocks of a write
            // never flushed, made durable out of order by a crash (not
            // acknowledged), or damage to flushed data (acknowledged).
            Some(next) => eprintln!(
                "mailring-broker: {}: a corrupt record at byte {} of {len}, with a valid one after it at byte {next}; the {} bytes from the corrupt record on were cut (a crash's out-of-order write, or damaged data: if they held acknowledged writes, the disk lost them) and kept in {} (up to the last byte that is not zero, {} bytes)",
                path.display(),
                scan.valid_len,
                len - scan.valid_len,
                saved.display(),
                cut_off.len(),
            ),
            None => eprintln!(
                "mailring-broker: {}: a {} record at byte {} of {len}; the {} bytes from it on were cut (most likely a write a crash left unfinished, never acknowledged) and kept in {} (up to the last byte that is not zero, {} bytes)",
                path.display(),
                if scan.tail == Tail::Torn { "truncated" } else { "corrupt" },
                scan.valid_len,
                len - scan.valid_len,
                saved.display(),
                cut_off.len(),
            ),
        }
            out.saved.push(saved);
        }
    }
    if scan.tail != Tail::Clean && !last && !repair {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a {} record at byte {} of {len}, in a segment that is not its log's last (flushed before its successor was written: not a crash's torn write); nothing was changed. Restore the file, or start with --repair-log to cut this segment there (losing the {} bytes after it)",
                path.display(),
                if scan.tail == Tail::Torn { "truncated" } else { "corrupt" },
                scan.valid_len,
                len - scan.valid_len,
            ),
        ));
    }
    // A clean end may be followed by zeros (a preallocated segment): only
    // a torn or corrupt tail is cut.
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    if scan.tail != Tail::Clean {
        file.set_len(scan.valid_len)?;
        out.cut.push((path.to_path_buf(), len - scan.valid_len));
    }
    // A log whose last run failed a write or flush (`refresh`): the cache
    // may hold bytes that never reached the disk, as clean pages a flush
    // would not write. They are written again, so the flush below makes
    // durable what was read (or fails, and the start with it).
    if refresh {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&data[..scan.valid_len as usize], 0)
            .map_err(at(path))?;
    }
    // What is read here is built on (needs move, segments go), so it
    // must be durable: a killed process leaves its writes in the page
    // cache only (a no-op for a clean file).
    file.sync_all()?;
    out.bytes += scan.valid_len;
    out.records += records;
    Ok(())
}

/// Refuses a segment whose header names another log or segment than the
/// place it is read from (`place`: its log directory's number, its file
/// name's): a file copied or renamed by hand into the wrong place, whose
/// records would be replayed as the ones that belong there. Under
/// `repair` the place wins, with a message (a header damaged there).
fn check_header_place(path: &Path, data: &[u8], place: (u16, u32), repair: bool) -> io::Result<()> {
    let Some(named) = log::header_place(data) else {
        // No header (short, zeros, another format): the scan decides.
        return Ok(());
    };
    if named == place {
        return Ok(());
    }
    let said = format!(
        "{}: its header names segment {} of log {}, but the file is segment {} of log {}",
        path.display(),
        named.1,
        named.0,
        place.1,
        place.0
    );
    if repair {
        // Written so, once: later starts find it as its place says.
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(at(path))?;
        file.write_all_at(&log::segment_header(place.0, place.1), 0)
            .and_then(|()| file.sync_all())
            .map_err(at(path))?;
        eprintln!(
            "mailring-broker: {said}; its header now says what its place does (--repair-log)"
        );
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{said} (copied or renamed into another's place?): nothing was changed. Put it back where its header says, or start once with --repair-log to take it for what its place says (its header is written so)"
        ),
    ))
}

/// Refuses a log whose segments skip a number: a log's segments are
/// removed oldest first only, so a missing one between two others was
/// lost (deleted by hand, or by the filesystem) with acknowledged
/// records. Under `repair` the log is read without it, with a message.
fn check_no_gap(log_dir: &Path, segments: &[(u32, PathBuf)], repair: bool) -> io::Result<()> {
    let lost_file = log_dir.join(SEGMENTS_LOST);
    let mut lost: Vec<u32> = match std::fs::read_to_string(&lost_file) {
        Ok(text) => text.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(at(&lost_file)(e)),
    };
    let known = lost.len();
    for pair in segments.windows(2) {
        let (before, after) = (pair[0].0, pair[1].0);
        if after == before + 1 || (before + 1..after).all(|n| lost.contains(&n)) {
            continue;
        }
        let missing = log_dir.join(log::segment_file_name(before + 1));
        let said = format!(
            "{}: missing, between {} and {} ({} segment{} lost from the middle of the log, with the records they held)",
            missing.display(),
            log::segment_file_name(before),
            log::segment_file_name(after),
            after - before - 1,
            if after - before - 1 == 1 { "" } else { "s" },
        );
        if !repair {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{said}: nothing was changed. Restore it, or start once with --repair-log to go on without it for good (it is noted in {SEGMENTS_LOST})"
                ),
            ));
        }
        eprintln!("mailring-broker: {said}; read without it from now on (--repair-log)");
        lost.extend(before + 1..after);
    }
    if lost.len() > known {
        // Kept, so later starts go on without them too.
        let text: String = lost.iter().map(|n| format!("{n}\n")).collect();
        let mut file = File::create(&lost_file).map_err(at(&lost_file))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(at(&lost_file))?;
        sync_dir(log_dir)?;
    }
    Ok(())
}

/// The segment files of log `log_no`, in order, listed in `out`, and
/// whether its last run failed a write or flush (its last segment is
/// written again as it is read); a gap between them refused (see
/// [`check_no_gap`]).
fn log_segments(
    log_no: u16,
    log_dir: &Path,
    repair: bool,
    out: &mut Recovered,
) -> io::Result<(Vec<(u32, PathBuf)>, bool)> {
    let segments = segment_files(log_dir)?;
    check_no_gap(log_dir, &segments, repair)?;
    out.segments
        .insert(log_no, segments.iter().map(|(s, _)| *s).collect());
    Ok((segments, log_dir.join(WRITE_FAILED).exists()))
}

/// The log directories of a generation, in order.
fn log_dirs(gen_dir: &Path) -> io::Result<Vec<(u16, PathBuf)>> {
    numbered_entries(gen_dir, log::parse_log_dir_name, |name| {
        name.starts_with("log-")
    })
}

/// The segment files of a log directory, in order.
fn segment_files(log_dir: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    numbered_entries(log_dir, log::parse_segment_file_name, |name| {
        name.to_ascii_lowercase().ends_with(".seg")
    })
}

/// The entries of `dir` whose names `parse` numbers, by number. One that
/// `looks_like` such a name but is not spelled as the broker spells it
/// (a log directory or segment restored by hand as `log-1`, `…A.SEG`)
/// stops the start: skipped, its records would not be replayed, and a
/// rewrite would remove it with its generation.
fn numbered_entries<N: Ord>(
    dir: &Path,
    parse: impl Fn(&str) -> Option<N>,
    looks_like: impl Fn(&str) -> bool,
) -> io::Result<Vec<(N, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let entry = entry?;
        let name = entry.file_name();
        match name.to_str().and_then(&parse) {
            Some(n) => found.push((n, entry.path())),
            None if name.to_str().is_some_and(&looks_like) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: not a name the broker gives (a log directory is `log-000`, a segment `0000000000000001.seg`): rename it so, or move it out of the data directory; nothing was changed",
                        entry.path().display()
                    ),
                ));
            }
            None => {}
        }
    }
    found.sort();
    Ok(found)
}

/// Reads a generation whose streams each sit in one log, replaying each
/// record as it is read and keeping at most `cache_bytes` of each
/// stream's newest entries in memory (the rest are read back from the
/// segments when needed). `Err` (with what was read so far, whose cut
/// tails are cut) if a stream turns up in two logs or out of order: that
/// generation is read whole ([`read_generation`]).
fn read_generation_streamed(
    gen_dir: &Path,
    cache_bytes: u64,
    repair: bool,
) -> io::Result<Result<Recovered, Recovered>> {
    let mut out = Recovered::default();
    for (log_no, log_dir) in log_dirs(gen_dir)? {
        let source = SegmentSource::new(log_dir.clone());
        let (segments, refresh) = log_segments(log_no, &log_dir, repair, &mut out)?;
        let count = segments.len();
        for (i, (seg, path)) in segments.into_iter().enumerate() {
            let mut streams = std::mem::take(&mut out.streams);
            let mut mixed = false;
            let last = i + 1 == count;
            read_segment(
                &path,
                (log_no, seg),
                last,
                repair,
                refresh && last,
                &mut out,
                |offset, record| {
                    if mixed {
                        return;
                    }
                    let r = match streams.get_mut(&record.stream) {
                        Some(r) => r,
                        None => {
                            // Its own copy: the name outlives the record.
                            let name = Bytes::copy_from_slice(&record.stream);
                            streams
                                .entry(name)
                                .or_insert_with(|| RecoveredStream::empty(log_no))
                        }
                    };
                    if r.log != log_no || (r.op_no != 0 && record.op_no <= r.op_no) {
                        mixed = true;
                        return;
                    }
                    r.op_no = record.op_no;
                    replay(r, record.op, Loc::new(seg, offset));
                    if let Some(s) = r.stream.as_mut() {
                        if !s.has_source() {
                            s.set_source(source.clone());
                        }
                        // Settled now and then, not per record.
                        let slack = (cache_bytes / 16).max(64 << 10);
                        if s.cached_bytes() > cache_bytes.saturating_add(slack) {
                            s.settle(cache_bytes, Loc::MAX);
                        }
                    }
                },
            )?;
            if mixed {
                return Ok(Err(out));
            }
            out.streams = streams;
        }
        if refresh {
            clear_write_failed(&log_dir)?;
        }
    }
    for r in out.streams.values_mut() {
        if let Some(s) = r.stream.as_mut() {
            s.settle(cache_bytes, Loc::MAX);
        }
    }
    Ok(Ok(out))
}

/// One stream's records as read: operation number, log, segment, op.
type Located = (u64, u16, u32, Op);

/// Reads every log of one generation and replays its streams.
fn read_generation(gen_dir: &Path, repair: bool) -> io::Result<Recovered> {
    let mut out = Recovered::default();
    let mut per_stream: crate::NameMap<Vec<Located>> = crate::NameMap::default();
    for (log_no, log_dir) in log_dirs(gen_dir)? {
        let (segments, refresh) = log_segments(log_no, &log_dir, repair, &mut out)?;
        let count = segments.len();
        for (i, (seg, path)) in segments.into_iter().enumerate() {
            let last = i + 1 == count;
            read_segment(
                &path,
                (log_no, seg),
                last,
                repair,
                refresh && last,
                &mut out,
                |_, r| {
                    per_stream
                        .entry(r.stream)
                        .or_default()
                        .push((r.op_no, log_no, seg, r.op));
                },
            )?;
        }
        if refresh {
            clear_write_failed(&log_dir)?;
        }
    }
    for (name, mut ops) in per_stream {
        // Each log holds a stream's records in order; across logs (the
        // older layout, or a stream that moved) the operation numbers
        // order them.
        ops.sort_by_key(|(n, ..)| *n);
        let mut r = RecoveredStream::empty(ops.first().map_or(0, |o| o.1));
        let mut mixed = false;
        for (n, log, seg, op) in ops {
            r.op_no = n;
            mixed |= log != r.log;
            // Not placed: a stream in two logs keeps its entries in memory
            // until the rewrite.
            replay(&mut r, op, Loc::new(seg, 0));
        }
        if mixed {
            // In two logs (the older layout): only a rewrite lays it out
            // again; no log is its own.
            r.log = u16::MAX;
        }
        out.streams.insert(name, r);
    }
    Ok(out)
}

/// Applies one logged operation, found in segment `seg`, to a stream
/// being rebuilt, keeping track of where its history and entries are.
pub(super) fn replay(r: &mut RecoveredStream, op: Op, at: Loc) {
    let seg = at.segment;
    if r.stream.is_none() {
        // The first record of this life of the stream.
        r.meta_segment = seg;
        r.runs.clear();
    }
    match op {
        Op::Batch(ops) => {
            for op in ops {
                replay(r, op, at);
            }
        }
        Op::Snapshot(snap) => {
            r.meta_segment = seg;
            apply(&mut r.stream, Op::Snapshot(snap));
        }
        Op::Add { id, fields } => {
            let s = r.stream.get_or_insert_with(Stream::new);
            if id > s.last_id() {
                // Offset 0 is inside the header: no record's place.
                let loc = if at.offset == 0 { Loc::NONE } else { at };
                s.insert(id, fields, loc);
                if r.runs.back().is_none_or(|run| run.1 != seg) {
                    r.runs.push_back((id, seg));
                }
            }
        }
        op => apply(&mut r.stream, op),
    }
}

/// Applies one logged operation to a stream being rebuilt.
pub(crate) fn apply(stream: &mut Option<Stream>, op: Op) {
    match op {
        Op::Add { id, fields } => {
            let s = stream.get_or_insert_with(Stream::new);
            if id > s.last_id() {
                s.insert(id, fields, Loc::NONE);
            }
        }
        Op::Delete { ids } => {
            if let Some(s) = stream {
                s.delete(&ids);
            }
        }
        Op::TrimThrough { through } => {
            if let Some(s) = stream {
                s.trim_through(through);
            }
        }
        Op::SetId {
            last_id,
            entries_added,
            max_deleted_id,
        } => {
            let s = stream.get_or_insert_with(Stream::new);
            s.set_last_id(last_id);
            s.set_counters(entries_added, max_deleted_id);
        }
        Op::Drop => *stream = None,
        Op::Batch(ops) => {
            for op in ops {
                apply(stream, op);
            }
        }
        Op::Snapshot(snap) => {
            let s = stream.get_or_insert_with(Stream::new);
            s.set_last_id(snap.last_id);
            s.set_counters(snap.entries_added, snap.max_deleted_id);
            s.groups = snap.groups.into_iter().collect();
        }
        group_op => {
            if let Some(s) = stream {
                s.apply_group(group_op);
            }
        }
    }
}

/// A stream's snapshot record's operation.
pub fn snapshot_of(stream: &Stream) -> Op {
    Op::Snapshot(Box::new(Snapshot {
        last_id: stream.last_id(),
        entries_added: stream.entries_added(),
        max_deleted_id: stream.max_deleted_id(),
        groups: stream
            .groups
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect(),
    }))
}

/// Writes one log of a rewrite, rolling segments at a size.
struct Writer {
    dir: PathBuf,
    log: u16,
    segment: u32,
    file: Option<File>,
    pos: u64,
    limit: u64,
    /// The largest record body it writes ([`log::MAX_RECORD`], what
    /// recovery reads).
    max_record: usize,
    buf: BytesMut,
}

impl Writer {
    fn new(gen_dir: &Path, log: u16, limit: u64) -> io::Result<Writer> {
        let dir = gen_dir.join(log::log_dir_name(log));
        std::fs::create_dir(&dir).map_err(at(&dir))?;
        Ok(Writer {
            dir,
            log,
            segment: 0,
            file: None,
            pos: 0,
            limit,
            max_record: log::MAX_RECORD,
            buf: BytesMut::new(),
        })
    }

    fn write(&mut self, record: &Record) -> io::Result<()> {
        self.buf.clear();
        record.encode(&mut self.buf);
        // Recovery would take a larger record for corrupt and cut the
        // segment there: the rewrite stops first, before the generation
        // it was made from is touched.
        if !log::record_fits(self.buf.len(), self.max_record) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "rewriting the logs for another shard count: stream {:?}'s record of {} bytes is over the {} bytes a record may hold (its groups' pending entries); start with the shard count the logs were written for",
                    String::from_utf8_lossy(&record.stream),
                    self.buf.len(),
                    self.max_record,
                ),
            ));
        }
        let len = self.buf.len() as u64;
        if self.file.is_none() || (self.pos > log::HEADER_LEN as u64 && self.pos + len > self.limit)
        {
            self.finish_segment()?;
            self.segment += 1;
            let mut f = File::create_new(self.dir.join(log::segment_file_name(self.segment)))?;
            f.write_all(&log::segment_header(self.log, self.segment))?;
            self.file = Some(f);
            self.pos = log::HEADER_LEN as u64;
        }
        self.file
            .as_mut()
            .expect("opened above")
            .write_all(&self.buf)?;
        self.pos += len;
        Ok(())
    }

    fn finish_segment(&mut self) -> io::Result<()> {
        if let Some(f) = self.file.take() {
            f.sync_all()?;
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        self.finish_segment()?;
        sync_dir(&self.dir)
    }
}

/// Writes every stream of `from` into the new generation `gen_dir`, each
/// into its home log for `shards` shards: its live entries, then a
/// snapshot of its counters and groups. The generation is marked whole
/// only once all of it is flushed.
fn rewrite(from: &Recovered, gen_dir: &Path, shards: usize, limit: u64) -> io::Result<()> {
    if gen_dir.exists() {
        std::fs::remove_dir_all(gen_dir)?;
    }
    std::fs::create_dir(gen_dir).map_err(at(gen_dir))?;
    let mut writers = (0..shards)
        .map(|log| Writer::new(gen_dir, log as u16, limit))
        .collect::<io::Result<Vec<_>>>()?;
    let mut names: Vec<&Bytes> = from.streams.keys().collect();
    names.sort();
    for name in names {
        let r = &from.streams[name];
        let Some(stream) = &r.stream else { continue };
        let w = &mut writers[usize::from(home_log(name, shards))];
        let mut op_no = r.op_no;
        // In chunks: entries read back from the old logs are held only
        // while they are written.
        let mut from = StreamId::MIN;
        loop {
            let chunk = stream.range(from, StreamId::MAX, Some(REWRITE_CHUNK), false);
            let Some(&(last, _)) = chunk.last() else {
                break;
            };
            for (id, fields) in chunk {
                op_no += 1;
                w.write(&Record {
                    stream: name.clone(),
                    op_no,
                    op: Op::Add { id, fields },
                })?;
            }
            match last.next() {
                Some(next) => from = next,
                None => break,
            }
        }
        op_no += 1;
        w.write(&Record {
            stream: name.clone(),
            op_no,
            op: snapshot_of(stream),
        })?;
    }
    for w in writers {
        w.finish()?;
    }
    sync_dir(gen_dir)?;
    mark_complete(gen_dir, shards)
}

#[cfg(test)]
mod tests {
    use std::hash::Hasher;

    use bytes::Bytes;
    use mailring_actors::{route_hash, RouteHasher};

    use super::{split_by_route_hash, Writer};
    use crate::id::StreamId;
    use crate::log::{self, Op, Record};
    use crate::stream::Fields;

    #[test]
    fn a_rewrite_refuses_a_record_recovery_would_take_for_corrupt() {
        let dir = std::env::temp_dir().join(format!("mailring-rewrite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = Writer::new(&dir, 0, 1 << 20).unwrap();
        w.max_record = 64;
        let record = |value: &[u8]| Record {
            stream: Bytes::from_static(b"s"),
            op_no: 1,
            op: Op::Add {
                id: StreamId::new(1, 0),
                fields: Fields::from_parts(&[&b"f"[..], value]),
            },
        };
        w.write(&record(b"small"))
            .expect("a record within the limit");
        let e = w.write(&record(&[b'x'; 100])).expect_err("over the limit");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("shard count"), "{e}");
        w.finish().unwrap();
        // Nothing of the refused record reached the segment.
        let data = std::fs::read(
            dir.join(log::log_dir_name(0))
                .join(log::segment_file_name(1)),
        )
        .unwrap();
        let scan = log::scan_segment(bytes::Bytes::from(data)).unwrap();
        assert_eq!(scan.records.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two 16-byte names with one route hash: the hasher mixes a word at
    /// a time into its state, so a second word that cancels the first
    /// words' difference gives both the same state.
    fn colliding_names() -> (Bytes, Bytes) {
        let state_after = |w: u64| {
            let mut h = RouteHasher::default();
            h.write(&w.to_le_bytes());
            h.finish()
        };
        let (a0, a1, b0) = (0x6161_6161_6161_6161u64, 7u64, 0x6262_6262_6262_6262u64);
        let b1 = state_after(a0) ^ a1 ^ state_after(b0);
        let name = |w0: u64, w1: u64| {
            let mut v = w0.to_le_bytes().to_vec();
            v.extend_from_slice(&w1.to_le_bytes());
            Bytes::from(v)
        };
        (name(a0, a1), name(b0, b1))
    }

    #[test]
    fn names_sharing_a_route_hash_in_two_logs_are_found() {
        let (a, b) = colliding_names();
        assert_ne!(a, b);
        assert_eq!(route_hash(&a), route_hash(&b));
        assert!(split_by_route_hash([(&a, 0), (&b, 1)].into_iter()));
        assert!(!split_by_route_hash([(&a, 1), (&b, 1)].into_iter()));
        let c = Bytes::from_static(b"other");
        assert!(!split_by_route_hash([(&a, 0), (&c, 1)].into_iter()));
    }
}
