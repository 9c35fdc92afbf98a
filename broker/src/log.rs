//! The commit log's bytes: records, segments, and the scan that recovery
//! runs over them.
//!
//! A data directory holds one log per shard, `log-NNN/`, each a run of
//! segment files `SSSSSSSSSSSSSSSS.seg` (the segment number in hex, so
//! names sort in order). A segment starts with a 16-byte header (magic,
//! format version, the log and segment numbers) and holds records:
//!
//! ```text
//! len: u32 LE | crc: u32 LE (CRC32C of len's 4 bytes and the body) | body: len bytes
//! body = kind: u8 | stream name: u32 LE length + bytes | op: u64 LE | kind's fields
//! ```
//!
//! `op` numbers one stream's records in order across every log, so a
//! stream that moved to another shard (a restart with another shard
//! count) replays in order. Stream names are record fields, never paths.
//! A record that fails its checksum, or is cut short, ends the segment's
//! valid part: recovery truncates the file there.
//!
//! A `MULTI`/`EXEC` transaction over several streams is written as a
//! *group*: one record per stream, back to back in one append (so in one
//! segment), each a part record whose `rest` field counts the parts after
//! it:
//!
//! ```text
//! part body = 22 | stream name | op: u64 LE | rest: u32 LE | ops: u32 LE count + (kind | fields)...
//! ```
//!
//! The scan hands a group's records on only once its last part (`rest`
//! 0) is read whole and valid; a group cut short ends the valid part at
//! its first record, so after a crash all of a transaction's streams have
//! its changes or none has (Redis drops an incomplete `MULTI` block).

use crate::fields::Fields;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::group::{Group, Nack};
use crate::id::StreamId;

/// The segment header's magic.
pub const MAGIC: &[u8; 8] = b"MRBROKER";
/// The record format's version.
pub const VERSION: u32 = 1;
/// Bytes of a segment header.
pub const HEADER_LEN: usize = 16;
/// Bytes of a record's length and checksum.
pub const FRAME_LEN: usize = 8;
/// Largest record body accepted by the scan (a bigger length is corrupt).
pub const MAX_RECORD: usize = 1 << 30;

/// Whether a framed record of `framed_len` bytes (length and checksum
/// included) has a body of at most `max_body` bytes (at most
/// [`MAX_RECORD`], what the scan accepts).
pub fn record_fits(framed_len: usize, max_body: usize) -> bool {
    framed_len.saturating_sub(FRAME_LEN) <= max_body.min(MAX_RECORD)
}

/// The header of segment `segment` of log `log`.
pub fn segment_header(log: u16, segment: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&(VERSION as u16).to_le_bytes());
    h[10..12].copy_from_slice(&log.to_le_bytes());
    h[12..16].copy_from_slice(&segment.to_le_bytes());
    h
}

/// The log and segment numbers a segment header names, if `data` starts
/// with one (magic and version as [`segment_header`] writes them).
pub fn header_place(data: &[u8]) -> Option<(u16, u32)> {
    let h = data.get(..HEADER_LEN)?;
    if &h[..8] != MAGIC || u16::from_le_bytes([h[8], h[9]]) != VERSION as u16 {
        return None;
    }
    Some((
        u16::from_le_bytes([h[10], h[11]]),
        u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
    ))
}

/// The file name of segment `segment`.
pub fn segment_file_name(segment: u32) -> String {
    format!("{segment:016x}.seg")
}

/// The segment number of a file name, if it is one: only the name
/// [`segment_file_name`] gives (`…A.seg` or `+…` would name a segment
/// twice: replayed twice, or refused at its making).
pub fn parse_segment_file_name(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(".seg")?;
    if hex.len() != 16 {
        return None;
    }
    let n = u32::try_from(u64::from_str_radix(hex, 16).ok()?).ok()?;
    (segment_file_name(n) == name).then_some(n)
}

/// The directory name of log `log`.
pub fn log_dir_name(log: u16) -> String {
    format!("log-{log:03}")
}

/// The log number of a directory name, if it is one: only the name
/// [`log_dir_name`] gives (`log-1` beside `log-001` would be one log read
/// twice).
pub fn parse_log_dir_name(name: &str) -> Option<u16> {
    let n = name.strip_prefix("log-")?.parse().ok()?;
    (log_dir_name(n) == name).then_some(n)
}

/// What a record does to its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `XADD`: an entry (the stream exists from its first entry on).
    Add {
        /// The entry's id.
        id: StreamId,
        /// Field-value pairs, flattened (shared with the stream's copy).
        fields: Fields,
    },
    /// `XDEL`: entries deleted.
    Delete {
        /// The ids (those that existed).
        ids: Vec<StreamId>,
    },
    /// A trim: every entry up to `through` is gone.
    TrimThrough {
        /// The last id removed.
        through: StreamId,
    },
    /// The stream's counters set (`XSETID`), or the stream made empty
    /// (`XGROUP CREATE ... MKSTREAM`).
    SetId {
        /// The last id.
        last_id: StreamId,
        /// Entries ever added.
        entries_added: u64,
        /// The largest deleted id.
        max_deleted_id: StreamId,
    },
    /// `DEL`: the stream is gone (a later record makes a new one).
    Drop,
    /// `XGROUP CREATE`.
    GroupCreate {
        /// The group.
        group: Bytes,
        /// Its last delivered id.
        last_id: StreamId,
        /// Its read counter, when known.
        entries_read: Option<u64>,
    },
    /// `XGROUP SETID`.
    GroupSetId {
        /// The group.
        group: Bytes,
        /// Its new last delivered id.
        last_id: StreamId,
        /// Its read counter, when known.
        entries_read: Option<u64>,
    },
    /// `XGROUP DESTROY`.
    GroupDestroy {
        /// The group.
        group: Bytes,
    },
    /// A consumer made (`XGROUP CREATECONSUMER`, or its first read).
    ConsumerCreate {
        /// The group.
        group: Bytes,
        /// The consumer.
        consumer: Bytes,
        /// When (Unix ms).
        time: u64,
    },
    /// `XGROUP DELCONSUMER`.
    ConsumerDelete {
        /// The group.
        group: Bytes,
        /// The consumer.
        consumer: Bytes,
    },
    /// `XREADGROUP ... >`: new entries delivered to a consumer.
    Deliver {
        /// The group.
        group: Bytes,
        /// The consumer.
        consumer: Bytes,
        /// When (Unix ms).
        time: u64,
        /// The group's last delivered id after it.
        last_id: StreamId,
        /// The group's read counter after it.
        entries_read: Option<u64>,
        /// The ids now pending (none with `NOACK`).
        ids: Vec<StreamId>,
    },
    /// `XACK` (and pending entries of deleted entries dropped by a claim).
    Ack {
        /// The group.
        group: Bytes,
        /// The ids no longer pending.
        ids: Vec<StreamId>,
    },
    /// `XCLAIM` / `XAUTOCLAIM`: pending entries given to a consumer.
    Claim {
        /// The group.
        group: Bytes,
        /// The consumer.
        consumer: Bytes,
        /// When (Unix ms): the consumer's last activity.
        time: u64,
        /// Each entry with its delivery time and count.
        entries: Vec<(StreamId, u64, u64)>,
        /// `LASTID`: the group's last delivered id raised to it.
        last_id: Option<StreamId>,
    },
    /// A `MULTI`/`EXEC` transaction's changes: one record, so after a crash
    /// all of them are there or none.
    Batch(Vec<Op>),
    /// The stream's state apart from its entries (which stay in their
    /// `Add` records): replay sets the counters and the groups to it, so
    /// no record of the stream before it is needed but its live entries'.
    Snapshot(Box<Snapshot>),
}

/// A stream's counters and consumer groups at one point of its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The last id.
    pub last_id: StreamId,
    /// Entries ever added.
    pub entries_added: u64,
    /// The largest deleted id.
    pub max_deleted_id: StreamId,
    /// Every group, by name, whole (pending entries and consumers).
    pub groups: Vec<(Bytes, Group)>,
}

const KIND_ADD: u8 = 1;
const KIND_DELETE: u8 = 2;
const KIND_TRIM: u8 = 3;
const KIND_SET_ID: u8 = 4;
const KIND_DROP: u8 = 5;
const KIND_GROUP_CREATE: u8 = 10;
const KIND_GROUP_SET_ID: u8 = 11;
const KIND_GROUP_DESTROY: u8 = 12;
const KIND_CONSUMER_CREATE: u8 = 13;
const KIND_CONSUMER_DELETE: u8 = 14;
const KIND_DELIVER: u8 = 15;
const KIND_ACK: u8 = 16;
const KIND_CLAIM: u8 = 17;
const KIND_BATCH: u8 = 20;
const KIND_SNAPSHOT: u8 = 21;
/// One stream's part of a transaction over several streams (a group).
const KIND_PART: u8 = 22;

/// `None` on disk.
const NO_COUNT: u64 = u64::MAX;

fn put_opt(dst: &mut BytesMut, v: Option<u64>) {
    dst.put_u64_le(v.unwrap_or(NO_COUNT));
}

fn op_kind(op: &Op) -> u8 {
    match op {
        Op::Add { .. } => KIND_ADD,
        Op::Delete { .. } => KIND_DELETE,
        Op::TrimThrough { .. } => KIND_TRIM,
        Op::SetId { .. } => KIND_SET_ID,
        Op::Drop => KIND_DROP,
        Op::GroupCreate { .. } => KIND_GROUP_CREATE,
        Op::GroupSetId { .. } => KIND_GROUP_SET_ID,
        Op::GroupDestroy { .. } => KIND_GROUP_DESTROY,
        Op::ConsumerCreate { .. } => KIND_CONSUMER_CREATE,
        Op::ConsumerDelete { .. } => KIND_CONSUMER_DELETE,
        Op::Deliver { .. } => KIND_DELIVER,
        Op::Ack { .. } => KIND_ACK,
        Op::Claim { .. } => KIND_CLAIM,
        Op::Batch(_) => KIND_BATCH,
        Op::Snapshot(_) => KIND_SNAPSHOT,
    }
}

/// An operation's fields, after its kind.
fn put_op_fields(op: &Op, dst: &mut BytesMut) {
    match op {
        Op::Add { id, fields } => {
            put_id(dst, *id);
            // Its encoding is the log's: one copy.
            dst.put_slice(fields.encoded());
        }
        Op::Delete { ids } => put_ids(dst, ids),
        Op::TrimThrough { through } => put_id(dst, *through),
        Op::SetId {
            last_id,
            entries_added,
            max_deleted_id,
        } => {
            put_id(dst, *last_id);
            dst.put_u64_le(*entries_added);
            put_id(dst, *max_deleted_id);
        }
        Op::Drop => {}
        Op::Snapshot(snap) => put_snapshot(dst, snap),
        Op::Batch(ops) => {
            dst.put_u32_le(ops.len() as u32);
            for op in ops {
                dst.put_u8(op_kind(op));
                put_op_fields(op, dst);
            }
        }
        Op::GroupCreate {
            group,
            last_id,
            entries_read,
        }
        | Op::GroupSetId {
            group,
            last_id,
            entries_read,
        } => {
            put_bytes(dst, group);
            put_id(dst, *last_id);
            put_opt(dst, *entries_read);
        }
        Op::GroupDestroy { group } => put_bytes(dst, group),
        Op::ConsumerCreate {
            group,
            consumer,
            time,
        } => {
            put_bytes(dst, group);
            put_bytes(dst, consumer);
            dst.put_u64_le(*time);
        }
        Op::ConsumerDelete { group, consumer } => {
            put_bytes(dst, group);
            put_bytes(dst, consumer);
        }
        Op::Deliver {
            group,
            consumer,
            time,
            last_id,
            entries_read,
            ids,
        } => {
            put_bytes(dst, group);
            put_bytes(dst, consumer);
            dst.put_u64_le(*time);
            put_id(dst, *last_id);
            put_opt(dst, *entries_read);
            put_ids(dst, ids);
        }
        Op::Ack { group, ids } => {
            put_bytes(dst, group);
            put_ids(dst, ids);
        }
        Op::Claim {
            group,
            consumer,
            time,
            entries,
            last_id,
        } => {
            put_bytes(dst, group);
            put_bytes(dst, consumer);
            dst.put_u64_le(*time);
            dst.put_u32_le(entries.len() as u32);
            for (id, t, n) in entries {
                put_id(dst, *id);
                dst.put_u64_le(*t);
                dst.put_u64_le(*n);
            }
            match last_id {
                Some(id) => {
                    dst.put_u8(1);
                    put_id(dst, *id);
                }
                None => dst.put_u8(0),
            }
        }
    }
}

/// A snapshot: the counters, then each group with its consumers, each with
/// its seen time and its pending entries (id, delivery time, count).
fn put_snapshot(dst: &mut BytesMut, snap: &Snapshot) {
    put_id(dst, snap.last_id);
    dst.put_u64_le(snap.entries_added);
    put_id(dst, snap.max_deleted_id);
    dst.put_u32_le(snap.groups.len() as u32);
    for (name, g) in &snap.groups {
        put_bytes(dst, name);
        put_id(dst, g.last_id);
        put_opt(dst, g.entries_read);
        dst.put_u32_le(g.consumers.len() as u32);
        for (consumer, c) in &g.consumers {
            put_bytes(dst, consumer);
            dst.put_u64_le(c.seen_time);
            let pending: Vec<(&StreamId, &Nack)> = c
                .pel
                .iter()
                .filter_map(|id| Some((id, g.pel.get(id)?)))
                .collect();
            dst.put_u32_le(pending.len() as u32);
            for (id, nack) in pending {
                put_id(dst, *id);
                dst.put_u64_le(nack.delivery_time);
                dst.put_u64_le(nack.delivery_count);
            }
        }
    }
}

/// Elements a decoded count reserves room for before they decode.
const UP_FRONT: usize = 64;

fn read_snapshot(b: &mut Bytes) -> Option<Snapshot> {
    let last_id = read_id(b)?;
    let entries_added = read_u64(b)?;
    let max_deleted_id = read_id(b)?;
    let n = read_u32(b)? as usize;
    if n > b.remaining() {
        return None;
    }
    // Room grows with what decodes: a group in memory is larger than its
    // shortest encoding, so a crafted count must not reserve up front.
    let mut groups = Vec::with_capacity(n.min(UP_FRONT));
    for _ in 0..n {
        let name = read_bytes(b)?;
        let mut g = Group::new(read_id(b)?, read_opt(b)?);
        let consumers = read_u32(b)? as usize;
        if consumers > b.remaining() / 16 {
            return None;
        }
        for _ in 0..consumers {
            let consumer = read_bytes(b)?;
            let seen_time = read_u64(b)?;
            g.create_consumer(&consumer, seen_time);
            let pending = read_u32(b)? as usize;
            if pending > b.remaining() / 32 {
                return None;
            }
            for _ in 0..pending {
                let id = read_id(b)?;
                let (time, count) = (read_u64(b)?, read_u64(b)?);
                g.claim(id, &consumer, time, count);
            }
        }
        groups.push((name, g));
    }
    Some(Snapshot {
        last_id,
        entries_added,
        max_deleted_id,
        groups,
    })
}

fn put_ids(dst: &mut BytesMut, ids: &[StreamId]) {
    dst.put_u32_le(ids.len() as u32);
    for id in ids {
        put_id(dst, *id);
    }
}

/// One record: an operation on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The stream's name.
    pub stream: Bytes,
    /// The stream's operation number (orders its records across logs).
    pub op_no: u64,
    /// The operation.
    pub op: Op,
}

fn put_id(dst: &mut BytesMut, id: StreamId) {
    dst.put_u64_le(id.ms);
    dst.put_u64_le(id.seq);
}

fn put_bytes(dst: &mut BytesMut, b: &[u8]) {
    dst.put_u32_le(b.len() as u32);
    dst.put_slice(b);
}

/// CRC-32C (Castagnoli, reflected) of one byte value, for [`crc_of_len`].
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// `crc32c::crc32c(&len.to_le_bytes())`: a record's checksum starts with
/// its length field. Four table steps cost less than a call that is
/// built for long buffers (most records are a few dozen bytes).
fn crc_of_len(len: u32) -> u32 {
    let mut crc = !0u32;
    for b in len.to_le_bytes() {
        crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Appends the record of `Op::Add { id, fields }` for `stream`, framed
/// (what [`Record::encode`] writes for it, from borrowed parts: the
/// common record, with room reserved once and four appends).
pub fn encode_add(dst: &mut BytesMut, stream: &[u8], op_no: u64, id: StreamId, fields: &Fields) {
    let start = dst.len();
    // The frame and body headers in one append (each `BytesMut` append
    // checks its room: an entry's record was ten of them).
    let mut head = [0u8; 8 + 1 + 4];
    head[8] = KIND_ADD;
    head[9..].copy_from_slice(&(stream.len() as u32).to_le_bytes());
    dst.reserve(head.len() + stream.len() + 8 + 16 + fields.encoded().len());
    dst.put_slice(&head);
    dst.put_slice(stream);
    let mut nums = [0u8; 8 + 16];
    nums[..8].copy_from_slice(&op_no.to_le_bytes());
    nums[8..16].copy_from_slice(&id.ms.to_le_bytes());
    nums[16..].copy_from_slice(&id.seq.to_le_bytes());
    dst.put_slice(&nums);
    dst.put_slice(fields.encoded());
    seal(dst, start);
}

/// Fills in the length and checksum of the record framed from `start`.
fn seal(dst: &mut BytesMut, start: usize) {
    let body = start + 8;
    let len = (dst.len() - body) as u32;
    dst[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc_of_len(len), &dst[body..]);
    dst[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

impl Record {
    /// Appends the record, framed (length, checksum, body), to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        if let Op::Add { id, fields } = &self.op {
            return encode_add(dst, &self.stream, self.op_no, *id, fields);
        }
        let start = dst.len();
        let mut head = [0u8; 8 + 1 + 4];
        head[8] = op_kind(&self.op);
        head[9..].copy_from_slice(&(self.stream.len() as u32).to_le_bytes());
        dst.put_slice(&head);
        dst.put_slice(&self.stream);
        dst.put_u64_le(self.op_no);
        put_op_fields(&self.op, dst);
        seal(dst, start);
    }

    /// Decodes a checked body; `None` if it is malformed. A group's part
    /// decodes as an [`Op::Batch`] record, with the count of parts after
    /// it (`None`: not a part).
    fn decode_body(mut b: Bytes) -> Option<(Record, Option<u32>)> {
        if !b.has_remaining() {
            return None;
        }
        let kind = b.get_u8();
        let stream = read_bytes(&mut b)?;
        let op_no = read_u64(&mut b)?;
        let (op, rest) = if kind == KIND_PART {
            let rest = read_u32(&mut b)?;
            (read_op(KIND_BATCH, &mut b, 0)?, Some(rest))
        } else {
            (read_op(kind, &mut b, 0)?, None)
        };
        if b.has_remaining() {
            return None;
        }
        Some((Record { stream, op_no, op }, rest))
    }
}

/// Appends a transaction's records as one group (see the module's
/// documentation), framed, to `dst`; returns each record's offset from
/// where the group starts. A group of one record is that record alone.
///
/// # Panics
///
/// A record whose operation is not an [`Op::Batch`] in a group of more
/// than one (a transaction's changes to one stream are a batch).
pub fn encode_group(records: &[Record], dst: &mut BytesMut) -> Vec<u64> {
    let base = dst.len();
    if let [one] = records {
        one.encode(dst);
        return vec![0];
    }
    let mut offsets = Vec::with_capacity(records.len());
    for (i, record) in records.iter().enumerate() {
        let Op::Batch(ops) = &record.op else {
            panic!("a transaction's part is a batch of operations");
        };
        let start = dst.len();
        offsets.push((start - base) as u64);
        let mut head = [0u8; 8 + 1 + 4];
        head[8] = KIND_PART;
        head[9..].copy_from_slice(&(record.stream.len() as u32).to_le_bytes());
        dst.put_slice(&head);
        dst.put_slice(&record.stream);
        dst.put_u64_le(record.op_no);
        dst.put_u32_le((records.len() - 1 - i) as u32);
        dst.put_u32_le(ops.len() as u32);
        for op in ops {
            dst.put_u8(op_kind(op));
            put_op_fields(op, dst);
        }
        seal(dst, start);
    }
    offsets
}

fn read_id(b: &mut Bytes) -> Option<StreamId> {
    (b.remaining() >= 16).then(|| StreamId::new(b.get_u64_le(), b.get_u64_le()))
}
fn read_u32(b: &mut Bytes) -> Option<u32> {
    (b.remaining() >= 4).then(|| b.get_u32_le())
}
fn read_u64(b: &mut Bytes) -> Option<u64> {
    (b.remaining() >= 8).then(|| b.get_u64_le())
}
fn read_bytes(b: &mut Bytes) -> Option<Bytes> {
    let n = read_u32(b)? as usize;
    (b.remaining() >= n).then(|| b.split_to(n))
}
fn read_opt(b: &mut Bytes) -> Option<Option<u64>> {
    let v = read_u64(b)?;
    Some((v != NO_COUNT).then_some(v))
}
fn read_ids(b: &mut Bytes) -> Option<Vec<StreamId>> {
    let n = read_u32(b)? as usize;
    if n > b.remaining() / 16 {
        return None;
    }
    (0..n).map(|_| read_id(b)).collect()
}

/// One operation's fields, after its kind (a batch nests one level).
fn read_op(kind: u8, b: &mut Bytes, depth: u8) -> Option<Op> {
    let op = match kind {
        KIND_ADD => {
            let id = read_id(b)?;
            let (fields, len) = Fields::decode(b)?;
            b.advance(len);
            Op::Add { id, fields }
        }
        KIND_DELETE => Op::Delete { ids: read_ids(b)? },
        KIND_TRIM => Op::TrimThrough {
            through: read_id(b)?,
        },
        KIND_SET_ID => Op::SetId {
            last_id: read_id(b)?,
            entries_added: read_u64(b)?,
            max_deleted_id: read_id(b)?,
        },
        KIND_DROP => Op::Drop,
        KIND_SNAPSHOT => Op::Snapshot(Box::new(read_snapshot(b)?)),
        KIND_GROUP_CREATE => Op::GroupCreate {
            group: read_bytes(b)?,
            last_id: read_id(b)?,
            entries_read: read_opt(b)?,
        },
        KIND_GROUP_SET_ID => Op::GroupSetId {
            group: read_bytes(b)?,
            last_id: read_id(b)?,
            entries_read: read_opt(b)?,
        },
        KIND_GROUP_DESTROY => Op::GroupDestroy {
            group: read_bytes(b)?,
        },
        KIND_CONSUMER_CREATE => Op::ConsumerCreate {
            group: read_bytes(b)?,
            consumer: read_bytes(b)?,
            time: read_u64(b)?,
        },
        KIND_CONSUMER_DELETE => Op::ConsumerDelete {
            group: read_bytes(b)?,
            consumer: read_bytes(b)?,
        },
        KIND_DELIVER => Op::Deliver {
            group: read_bytes(b)?,
            consumer: read_bytes(b)?,
            time: read_u64(b)?,
            last_id: read_id(b)?,
            entries_read: read_opt(b)?,
            ids: read_ids(b)?,
        },
        KIND_ACK => Op::Ack {
            group: read_bytes(b)?,
            ids: read_ids(b)?,
        },
        KIND_CLAIM => {
            let group = read_bytes(b)?;
            let consumer = read_bytes(b)?;
            let time = read_u64(b)?;
            let n = read_u32(b)? as usize;
            if n > b.remaining() / 32 {
                return None;
            }
            let entries = (0..n)
                .map(|_| Some((read_id(b)?, read_u64(b)?, read_u64(b)?)))
                .collect::<Option<Vec<_>>>()?;
            let last_id = match b.has_remaining().then(|| b.get_u8())? {
                0 => None,
                1 => Some(read_id(b)?),
                _ => return None,
            };
            Op::Claim {
                group,
                consumer,
                time,
                entries,
                last_id,
            }
        }
        KIND_BATCH if depth == 0 => {
            let n = read_u32(b)? as usize;
            if n > b.remaining() {
                return None;
            }
            // As a snapshot's groups: room grows with what decodes.
            let mut ops = Vec::with_capacity(n.min(UP_FRONT));
            for _ in 0..n {
                let kind = b.has_remaining().then(|| b.get_u8())?;
                ops.push(read_op(kind, b, depth + 1)?);
            }
            Op::Batch(ops)
        }
        _ => return None,
    };
    Some(op)
}

/// Where a record sits in its log: the segment's number and the byte
/// offset of the record's frame in it. Segments are numbered from 1, so
/// [`Loc::NONE`] is no place (a record not yet appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Loc {
    /// The segment.
    pub segment: u32,
    /// The record's offset in it.
    pub offset: u32,
}

impl Loc {
    /// No place yet.
    pub const NONE: Loc = Loc {
        segment: 0,
        offset: 0,
    };
    /// Past every place (everything before it is written).
    pub const MAX: Loc = Loc {
        segment: u32::MAX,
        offset: u32::MAX,
    };

    /// Record `offset` of `segment`.
    pub fn new(segment: u32, offset: u64) -> Loc {
        Loc {
            segment,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
        }
    }

    /// Whether it names a place.
    pub fn is_some(self) -> bool {
        self.segment != 0
    }
}

/// What [`decode_framed`] found at the start of a buffer.
#[derive(Debug)]
pub enum Framed {
    /// A whole, valid record, and its framed length.
    Record(Record, usize),
    /// The buffer holds only part of it: this many bytes would hold it.
    Short(usize),
    /// No valid record starts there.
    Bad,
}

/// Decodes the framed record at the start of `buf` (checked against its
/// checksum); its fields share `buf`'s memory.
pub fn decode_framed(buf: &Bytes) -> Framed {
    match decode_frame(buf, false) {
        Frame::Record(r, _, len) => Framed::Record(r, len),
        Frame::Short(n) => Framed::Short(n),
        Frame::Bad => Framed::Bad,
    }
}

/// What [`decode_frame`] found: [`Framed`], with a group part's count of
/// parts after it.
enum Frame {
    Record(Record, Option<u32>, usize),
    Short(usize),
    Bad,
}

/// [`decode_framed`]; `detach`: the record is decoded from its own copy
/// of its bytes, so what it is kept for does not hold `buf`.
fn decode_frame(buf: &Bytes, detach: bool) -> Frame {
    if buf.len() < FRAME_LEN {
        return Frame::Short(FRAME_LEN);
    }
    let len_bytes: [u8; 4] = buf[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD {
        return Frame::Bad;
    }
    if buf.len() - FRAME_LEN < len {
        return Frame::Short(FRAME_LEN + len);
    }
    let body = buf.slice(FRAME_LEN..FRAME_LEN + len);
    if crc32c::crc32c_append(crc_of_len(u32::from_le_bytes(len_bytes)), &body) != crc {
        return Frame::Bad;
    }
    let body = if detach {
        Bytes::copy_from_slice(&body)
    } else {
        body
    };
    match Record::decode_body(body) {
        Some((r, rest)) => Frame::Record(r, rest, FRAME_LEN + len),
        None => Frame::Bad,
    }
}

/// Why a segment's scan stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// The segment ended on a record boundary.
    Clean,
    /// A record was cut short (a torn write).
    Torn,
    /// A record failed its checksum or did not decode.
    Corrupt,
}

/// What a segment holds.
#[derive(Debug)]
pub struct Scan {
    /// The records, in file order, each with its offset in the file.
    pub records: Vec<(u64, Record)>,
    /// Bytes from the start of the file that hold the header and whole,
    /// valid records: the file's length after recovery.
    pub valid_len: u64,
    /// How the valid part ended.
    pub tail: Tail,
    /// Where a valid record starts right after a corrupt one whose length
    /// still reads: the corrupt one was damaged in place (a crash tears
    /// only the end of what was being written), and what follows was
    /// written, flushed and maybe acknowledged after it.
    pub valid_after: Option<u64>,
}

/// The segment header's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a broker segment (bad header)")]
pub struct BadHeader;

/// Scans a whole segment file's bytes.
///
/// # Errors
///
/// A file whose header is not a segment's. A file shorter than a header
/// (created, never written) scans as empty.
pub fn scan_segment(data: Bytes) -> Result<Scan, BadHeader> {
    scan(data, false)
}

fn scan(data: Bytes, detach: bool) -> Result<Scan, BadHeader> {
    let mut records = Vec::new();
    let mut scan = scan_each(data, detach, |at, r| records.push((at, r)))?;
    scan.records = records;
    Ok(scan)
}

/// Scans a whole segment file's bytes, handing each valid record (and its
/// offset) to `f` as it is decoded, each from its own copy of its bytes
/// (so what `f` keeps holds only its records); the [`Scan`] it returns has
/// no records.
///
/// # Errors
///
/// As [`scan_segment`].
pub fn scan_segment_each(data: Bytes, f: impl FnMut(u64, Record)) -> Result<Scan, BadHeader> {
    scan_each(data, true, f)
}

fn scan_each(data: Bytes, detach: bool, mut f: impl FnMut(u64, Record)) -> Result<Scan, BadHeader> {
    if data.len() < HEADER_LEN {
        return Ok(Scan {
            valid_after: None,
            records: Vec::new(),
            valid_len: 0,
            tail: if data.is_empty() {
                Tail::Clean
            } else {
                Tail::Torn
            },
        });
    }
    if &data[..8] != MAGIC || u16::from_le_bytes([data[8], data[9]]) != VERSION as u16 {
        return Err(BadHeader);
    }
    let mut pos = HEADER_LEN;
    // The parts of a group read so far, and where it starts: handed on
    // once its last part is read.
    let mut group: Vec<(u64, Record)> = Vec::new();
    let mut group_at = pos;
    let mut awaiting: Option<u32> = None;
    let mut valid_after = None;
    let tail = loop {
        let rest = data.len() - pos;
        if rest == 0 {
            break Tail::Clean;
        }
        if rest < FRAME_LEN {
            // Fewer zeros than a frame: the end of a full segment's last
            // block (a direct write pads its block with zeros).
            break if data[pos..].iter().all(|&b| b == 0) {
                Tail::Clean
            } else {
                Tail::Torn
            };
        }
        if data[pos..pos + FRAME_LEN].iter().all(|&b| b == 0) {
            // Zeroes: preallocated space, or a length never written.
            break if data[pos..].iter().all(|&b| b == 0) {
                Tail::Clean
            } else {
                Tail::Corrupt
            };
        }
        match decode_frame(&data.slice(pos..), detach) {
            Frame::Record(record, rest, framed) => {
                match (awaiting, rest) {
                    (None, None) => f(pos as u64, record),
                    (None, Some(rest)) => {
                        group_at = pos;
                        group.push((pos as u64, record));
                        awaiting = Some(rest);
                    }
                    // A group's next part: the count of parts after it
                    // goes down by one.
                    (Some(n), Some(rest)) if n > 0 && rest == n - 1 => {
                        group.push((pos as u64, record));
                        awaiting = Some(rest);
                    }
                    // A part out of place, or a plain record inside a
                    // group: the group is not whole.
                    _ => break Tail::Corrupt,
                }
                if awaiting == Some(0) {
                    awaiting = None;
                    for (at, r) in group.drain(..) {
                        f(at, r);
                    }
                }
                pos += framed;
            }
            Frame::Short(_) => break Tail::Torn,
            Frame::Bad => {
                valid_after = valid_record_after_bad(&data, pos);
                break Tail::Corrupt;
            }
        }
    };
    // A group cut short: its parts are not valid, whatever their checks
    // say (written in one append, they end in one crash).
    let (valid_len, tail) = if group.is_empty() {
        (pos, tail)
    } else if tail == Tail::Clean {
        (group_at, Tail::Torn)
    } else {
        (group_at, tail)
    };
    Ok(Scan {
        records: Vec::new(),
        valid_len: valid_len as u64,
        tail,
        valid_after,
    })
}

/// Where a valid record starts right after the corrupt frame at `pos`, if
/// that frame's length reads as one (within bounds, and its end inside the
/// data).
fn valid_record_after_bad(data: &Bytes, pos: usize) -> Option<u64> {
    let len = u32::from_le_bytes(data.get(pos..pos + 4)?.try_into().ok()?) as usize;
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let next = pos.checked_add(FRAME_LEN + len)?;
    if next >= data.len() {
        return None;
    }
    match decode_frame(&data.slice(next..), false) {
        Frame::Record(..) => Some(next as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_checksum_is_the_crc32c_of_its_bytes() {
        for len in [
            0u32,
            1,
            13,
            255,
            256,
            65_535,
            1 << 20,
            0xdead_beef,
            u32::MAX,
        ] {
            assert_eq!(crc_of_len(len), crc32c::crc32c(&len.to_le_bytes()), "{len}");
        }
    }

    /// A record's counts are checked against its length (one byte an
    /// element at least), but an element in memory is larger than its
    /// encoding: a crafted count reserved its size times the count up
    /// front (200 M operations: 25.6 GB, past this machine's memory, and
    /// the process aborted). Room grows with what is decoded instead.
    #[test]
    fn a_crafted_count_reserves_no_more_than_what_decodes() {
        const N: usize = 200_000_000;
        let mut body = BytesMut::with_capacity(4 + N);
        body.put_u32_le(N as u32);
        body.resize(4 + N, 0xff);
        let mut b = body.freeze();
        assert!(read_op(KIND_BATCH, &mut b, 0).is_none());
        let mut body = BytesMut::new();
        put_id(&mut body, StreamId::new(1, 0));
        body.put_u64_le(0);
        put_id(&mut body, StreamId::new(0, 0));
        body.put_u32_le(N as u32);
        body.resize(body.len() + N, 0xff);
        let mut b = body.freeze();
        assert!(read_snapshot(&mut b).is_none());
    }

    fn add(stream: &str, op_no: u64, ms: u64) -> Record {
        Record {
            stream: Bytes::copy_from_slice(stream.as_bytes()),
            op_no,
            op: Op::Add {
                id: StreamId::new(ms, 0),
                fields: Fields::from_parts(&[&b"f"[..], b"value"]),
            },
        }
    }

    fn segment(records: &[Record]) -> BytesMut {
        let mut b = BytesMut::new();
        b.extend_from_slice(&segment_header(3, 9));
        for r in records {
            r.encode(&mut b);
        }
        b
    }

    #[test]
    fn every_record_kind_round_trips() {
        let records = vec![
            add("a\0../x", 1, 5),
            Record {
                stream: Bytes::from_static(b"s"),
                op_no: 2,
                op: Op::Delete {
                    ids: vec![StreamId::new(1, 2), StreamId::new(3, 4)],
                },
            },
            Record {
                stream: Bytes::from_static(b"s"),
                op_no: 3,
                op: Op::TrimThrough {
                    through: StreamId::new(9, 0),
                },
            },
            Record {
                stream: Bytes::from_static(b"s"),
                op_no: 4,
                op: Op::SetId {
                    last_id: StreamId::new(10, 1),
                    entries_added: 7,
                    max_deleted_id: StreamId::new(3, 4),
                },
            },
            Record {
                stream: Bytes::from_static(b""),
                op_no: 5,
                op: Op::Drop,
            },
        ];
        let g = || Bytes::from_static(b"group");
        let c = || Bytes::from_static(b"consumer");
        let ops = [
            Op::GroupCreate {
                group: g(),
                last_id: StreamId::new(1, 1),
                entries_read: None,
            },
            Op::GroupSetId {
                group: g(),
                last_id: StreamId::new(2, 2),
                entries_read: Some(3),
            },
            Op::GroupDestroy { group: g() },
            Op::ConsumerCreate {
                group: g(),
                consumer: c(),
                time: 77,
            },
            Op::ConsumerDelete {
                group: g(),
                consumer: c(),
            },
            Op::Deliver {
                group: g(),
                consumer: c(),
                time: 5,
                last_id: StreamId::new(9, 9),
                entries_read: Some(4),
                ids: vec![StreamId::new(9, 8), StreamId::new(9, 9)],
            },
            Op::Ack {
                group: g(),
                ids: vec![StreamId::new(9, 8)],
            },
            Op::Claim {
                group: g(),
                consumer: c(),
                time: 6,
                entries: vec![(StreamId::new(9, 9), 6, 2)],
                last_id: Some(StreamId::new(10, 0)),
            },
            Op::Claim {
                group: g(),
                consumer: c(),
                time: 6,
                entries: Vec::new(),
                last_id: None,
            },
            Op::Batch(vec![
                Op::Add {
                    id: StreamId::new(11, 0),
                    fields: Fields::from_parts(&[&b"k"[..], b"v"]),
                },
                Op::Ack {
                    group: g(),
                    ids: vec![StreamId::new(9, 9)],
                },
            ]),
            Op::Batch(Vec::new()),
            Op::Snapshot(Box::new(Snapshot {
                last_id: StreamId::new(12, 3),
                entries_added: 40,
                max_deleted_id: StreamId::new(2, 0),
                groups: vec![(g(), {
                    let mut group = Group::new(StreamId::new(11, 0), Some(9));
                    group.create_consumer(&Bytes::from_static(b"idle"), 3);
                    group.deliver(StreamId::new(9, 9), &c(), 4);
                    group.claim(StreamId::new(11, 0), &c(), 8, 3);
                    group
                })],
            })),
        ];
        let records: Vec<Record> = records
            .into_iter()
            .chain(ops.into_iter().enumerate().map(|(i, op)| Record {
                stream: Bytes::from_static(b"s"),
                op_no: 10 + i as u64,
                op,
            }))
            .collect();
        let bytes = segment(&records).freeze();
        let scan = scan_segment(bytes.clone()).unwrap();
        assert_eq!(scan.tail, Tail::Clean);
        assert_eq!(scan.valid_len, bytes.len() as u64);
        let got: Vec<Record> = scan.records.into_iter().map(|(_, r)| r).collect();
        assert_eq!(got, records);
    }

    #[test]
    fn a_torn_tail_is_cut_at_the_last_whole_record() {
        let records = [add("s", 1, 1), add("s", 2, 2), add("s", 3, 3)];
        let whole = segment(&records).freeze();
        let two = segment(&records[..2]).len();
        for cut in two + 1..whole.len() {
            let scan = scan_segment(whole.slice(..cut)).unwrap();
            assert_eq!(scan.records.len(), 2, "cut at {cut}");
            assert_eq!(scan.valid_len, two as u64);
            assert_eq!(scan.tail, Tail::Torn);
        }
    }

    fn part(stream: &str, op_no: u64, ms: u64) -> Record {
        let Op::Add { id, fields } = add(stream, op_no, ms).op else {
            unreachable!()
        };
        Record {
            stream: Bytes::copy_from_slice(stream.as_bytes()),
            op_no,
            op: Op::Batch(vec![
                Op::Add { id, fields },
                Op::TrimThrough {
                    through: StreamId::new(ms, 0),
                },
            ]),
        }
    }

    /// A segment of `before`, then `group` as a group, then `after`;
    /// with the offsets of the group's records and where it ends.
    fn with_group(
        before: &[Record],
        group: &[Record],
        after: &[Record],
    ) -> (BytesMut, Vec<u64>, usize) {
        let mut b = segment(before);
        let base = b.len() as u64;
        let offsets = encode_group(group, &mut b)
            .into_iter()
            .map(|o| o + base)
            .collect();
        let end = b.len();
        for r in after {
            r.encode(&mut b);
        }
        (b, offsets, end)
    }

    #[test]
    fn a_group_scans_as_its_records_at_their_offsets() {
        let group = [part("a", 4, 1), part("b\0", 1, 2), part("c", 9, 3)];
        let (seg, offsets, _) = with_group(&[add("x", 1, 1)], &group, &[add("x", 2, 2)]);
        let scan = scan_segment(seg.clone().freeze()).unwrap();
        assert_eq!(scan.tail, Tail::Clean);
        assert_eq!(scan.valid_len, seg.len() as u64);
        let got: Vec<_> = scan.records.iter().map(|(_, r)| r.clone()).collect();
        let mut want = vec![add("x", 1, 1)];
        want.extend(group.iter().cloned());
        want.push(add("x", 2, 2));
        assert_eq!(got, want);
        let at: Vec<u64> = scan.records[1..4].iter().map(|(o, _)| *o).collect();
        assert_eq!(at, offsets);
        // The reader finds each part's entries at its own offset.
        for (o, r) in offsets.iter().zip(&group) {
            match decode_framed(&seg.clone().freeze().slice(*o as usize..)) {
                Framed::Record(got, _) => assert_eq!(&got, r),
                other => panic!("{other:?}"),
            }
        }
        // A group of one is its record alone.
        let mut one = BytesMut::new();
        assert_eq!(encode_group(&group[..1], &mut one), vec![0]);
        let mut plain = BytesMut::new();
        group[0].encode(&mut plain);
        assert_eq!(one, plain);
    }

    #[test]
    fn a_group_cut_anywhere_is_dropped_whole() {
        let group = [part("a", 4, 1), part("b", 1, 2), part("c", 9, 3)];
        let (seg, offsets, end) = with_group(&[add("x", 1, 1)], &group, &[]);
        let seg = seg.freeze();
        let start = offsets[0] as usize;
        for cut in start + 1..end {
            let scan = scan_segment(seg.slice(..cut)).unwrap();
            assert_eq!(scan.records.len(), 1, "cut at {cut}");
            assert_eq!(scan.valid_len, start as u64, "cut at {cut}");
            assert_eq!(scan.tail, Tail::Torn, "cut at {cut}");
        }
        // Cut at a part's end, then zeros (preallocated space): torn too.
        let mut zeros = BytesMut::from(&seg[..offsets[2] as usize]);
        zeros.resize(zeros.len() + 4096, 0);
        let scan = scan_segment(zeros.freeze()).unwrap();
        assert_eq!((scan.records.len(), scan.valid_len), (1, start as u64));
        assert_eq!(scan.tail, Tail::Torn);
    }

    #[test]
    fn a_flipped_bit_in_any_part_drops_the_group() {
        let group = [part("a", 4, 1), part("b", 1, 2)];
        let (seg, offsets, end) = with_group(&[add("x", 1, 1)], &group, &[]);
        let start = offsets[0] as usize;
        for byte in (start..end).step_by(3) {
            let mut bad = seg.clone();
            bad[byte] ^= 0x10;
            let scan = scan_segment(bad.freeze()).unwrap();
            assert_eq!(scan.records.len(), 1, "byte {byte}");
            assert_eq!(scan.valid_len, start as u64, "byte {byte}");
            assert_ne!(scan.tail, Tail::Clean);
        }
    }

    #[test]
    fn parts_out_of_place_are_corrupt() {
        let group = [part("a", 4, 1), part("b", 1, 2), part("c", 9, 3)];
        // The middle part left out: the last part's count does not follow.
        let mut b = segment(&[]);
        let mut parts = BytesMut::new();
        let offsets = encode_group(&group, &mut parts);
        b.extend_from_slice(&parts[..offsets[1] as usize]);
        b.extend_from_slice(&parts[offsets[2] as usize..]);
        let scan = scan_segment(b.freeze()).unwrap();
        assert!(scan.records.is_empty());
        assert_eq!(scan.valid_len, HEADER_LEN as u64);
        assert_eq!(scan.tail, Tail::Corrupt);
        // A plain record inside a group.
        let mut b = segment(&[]);
        b.extend_from_slice(&parts[..offsets[1] as usize]);
        add("x", 1, 1).encode(&mut b);
        let scan = scan_segment(b.freeze()).unwrap();
        assert!(scan.records.is_empty());
        assert_eq!(scan.tail, Tail::Corrupt);
    }

    #[test]
    fn a_flipped_bit_anywhere_in_the_last_record_is_caught() {
        let records = [add("s", 1, 1), add("s", 2, 2)];
        let whole = segment(&records);
        let one = segment(&records[..1]).len();
        for byte in one..whole.len() {
            for bit in 0..8 {
                let mut bad = whole.clone();
                bad[byte] ^= 1 << bit;
                let scan = scan_segment(bad.freeze()).unwrap();
                assert_eq!(scan.records.len(), 1, "byte {byte} bit {bit}");
                assert_eq!(scan.valid_len, one as u64);
                assert_ne!(scan.tail, Tail::Clean);
            }
        }
    }

    #[test]
    fn zeroes_after_the_records_are_the_end() {
        let mut b = segment(&[add("s", 1, 1)]);
        let len = b.len();
        b.extend_from_slice(&[0u8; 4096]);
        let scan = scan_segment(b.freeze()).unwrap();
        assert_eq!(scan.tail, Tail::Clean);
        assert_eq!(scan.valid_len, len as u64);
        assert!(scan_segment(Bytes::from_static(b"not a segment...")).is_err());
        // Fewer zeros than a frame's header, as a full segment ends.
        for n in 1..FRAME_LEN {
            let mut b = segment(&[add("s", 1, 1)]);
            b.extend_from_slice(&vec![0u8; n]);
            let scan = scan_segment(b.freeze()).unwrap();
            assert_eq!(scan.tail, Tail::Clean, "{n} zeros");
            assert_eq!(scan.valid_len, len as u64);
        }
    }

    #[test]
    fn a_record_past_the_scan_limit_does_not_fit() {
        assert!(record_fits(FRAME_LEN + MAX_RECORD, MAX_RECORD));
        assert!(!record_fits(FRAME_LEN + MAX_RECORD + 1, MAX_RECORD));
        assert!(!record_fits(FRAME_LEN + MAX_RECORD + 1, usize::MAX));
        assert!(record_fits(0, 0));
        assert!(!record_fits(FRAME_LEN + 4097, 4096));
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_file_name("x.seg"), None);
        // Only the canonical spelling: another would name a segment twice.
        assert_eq!(parse_segment_file_name("000000000000002A.seg"), None);
        assert_eq!(parse_segment_file_name("+00000000000002a.seg"), None);
        assert_eq!(parse_log_dir_name(&log_dir_name(7)), Some(7));
        assert_eq!(parse_log_dir_name("log-7"), None);
        assert_eq!(parse_log_dir_name("log-+07"), None);
        assert_eq!(parse_log_dir_name(&log_dir_name(7)), Some(7));
    }
}
