//! Which segments of a log are still needed, and which can go.
//!
//! A stream's records in its log are a history replayed in order. The
//! oldest segment it needs is the older of two:
//!
//! - its *meta* segment: where its last snapshot (counters and groups,
//!   [`crate::log::Snapshot`]) is, or its first record if it has none;
//!   replay from there rebuilds everything but older entries;
//! - the segment of its first live entry's `Add` record (entries are
//!   added in id order, so each segment holds a run of ids).
//!
//! Every record after a needed one is kept too (only a log's oldest
//! segments are removed), so a kept `Add` is always followed by the
//! deletes and trims that concern it. A need moves forward only once the
//! record that moved it (the trim, the snapshot, the `DEL`) is flushed:
//! until then a power loss could bring back the older state, which the
//! older segments hold.

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;

use crate::id::StreamId;
use crate::stream::Stream;
use crate::NameMap;

/// Segments a stream may stay behind the log's head before it is asked
/// to move up (when it can cheaply: see [`Need::movable`]).
pub const SNAPSHOT_LAG: u32 = 4;

/// Bytes an entry takes in a record besides its fields' and values'
/// (its id, counts and lengths), counted when deciding whether a stream
/// is small enough to write again: many empty entries are not small.
const ENTRY_OVERHEAD: u64 = 40;

/// The oldest segment of its log a stream needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The segment.
    pub segment: u32,
    /// Whether its history (not an entry) is what needs it: a snapshot
    /// would let it go.
    pub by_history: bool,
    /// Whether the stream can let it go cheaply: by a snapshot, or by
    /// rewriting its few live entries at the head of the log.
    pub movable: bool,
}

/// The need of a stream whose history starts at `meta_segment` and whose
/// entries sit in `runs` (each run: its first id, its segment), dropping
/// runs whose entries are all gone; a stream whose entries take less than
/// `small` bytes in a record may rewrite them. `None`: the stream does not exist.
pub fn need_of(
    stream: Option<&Stream>,
    meta_segment: u32,
    runs: &mut VecDeque<(StreamId, u32)>,
    small: u64,
) -> Option<Need> {
    let stream = stream?;
    let entries = match stream.first_entry_id() {
        Some(first) => {
            while runs.len() >= 2 && runs[1].0 <= first {
                runs.pop_front();
            }
            runs.front().map(|r| r.1)
        }
        None => {
            runs.clear();
            None
        }
    };
    Some(match entries {
        Some(segment) if segment <= meta_segment => Need {
            segment,
            by_history: false,
            movable: stream
                .live_bytes()
                .saturating_add(stream.len().saturating_mul(ENTRY_OVERHEAD))
                < small,
        },
        _ => Need {
            segment: meta_segment,
            by_history: true,
            movable: true,
        },
    })
}

/// One stream's need as the log counts it.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The need in force.
    now: Option<Need>,
    /// Later needs not in force yet, each once the segment of the record
    /// that moved it (given beside it) is flushed, oldest first. At most
    /// two, and each holds at least what every later move needs: a crash
    /// once a move is in force may leave any later record on disk, whose
    /// replay needs what it needed. A move between the two is folded into
    /// the first, so a stream that moves its need in every segment (a
    /// snapshot asked for at each roll) still sees its oldest move come
    /// into force, instead of a newer one taking its place each time and
    /// none ever being reached.
    pending: [Option<(Option<Need>, u32)>; 2],
    /// The newest segment holding one of its records. A deleted stream
    /// (needing nothing) stays known while a segment up to this one is on
    /// disk: its records there carry its operation numbers, which an actor
    /// that makes it again must go on from.
    last_by: u32,
    /// The operation number of its last record, as last told (by a need
    /// or by a record that made it).
    op_no: u64,
    /// The segment of a record that made the stream (it did not exist
    /// before it) while the stream's need since is not told yet: the
    /// segment stays (its records are replayed from there, whatever later
    /// records a crash keeps), and an actor restarted meanwhile reads the
    /// stream back instead of going on from `op_no` as for a deleted one.
    making: Option<u32>,
}

/// A need's rank: the segment it holds (needing nothing: none).
fn rank(need: Option<Need>) -> u32 {
    need.map_or(u32::MAX, |n| n.segment)
}

impl Held {
    fn new(now: Option<Need>, last_by: u32, op_no: u64) -> Held {
        Held {
            now,
            pending: [None, None],
            last_by,
            op_no,
            making: None,
        }
    }

    /// Notes a move to `need` by a record in segment `by` (not flushed
    /// yet, and needing less than the need in force).
    fn defer(&mut self, need: Option<Need>, by: u32) {
        fn lower(slot: &mut (Option<Need>, u32), need: Option<Need>) {
            if rank(need) < rank(slot.0) {
                slot.0 = need;
            }
        }
        match &mut self.pending {
            [None, _] => self.pending[0] = Some((need, by)),
            // The same segment: once it is flushed, the newer record's
            // need is the one (no crash leaves half a flushed segment).
            [Some(first), None] if first.1 == by => first.0 = need,
            [Some(first), None] => {
                lower(first, need);
                self.pending[1] = Some((need, by));
            }
            [Some(first), Some(last)] => {
                // The first held at least what `last` needed already.
                lower(first, need);
                *last = (need, by);
            }
        }
    }

    /// Brings into force the moves whose records are flushed (up to
    /// segment `done`).
    fn advance(&mut self, done: u32) {
        while let Some((need, by)) = self.pending[0] {
            if by > done {
                break;
            }
            self.now = need;
            self.pending = [self.pending[1], None];
        }
    }

    /// The need once every move noted is in force.
    fn newest(&self) -> Option<Need> {
        match self.pending {
            [_, Some((need, _))] | [Some((need, _)), None] => need,
            [None, None] => self.now,
        }
    }
}

/// A log's segments and its streams' needs.
#[derive(Debug, Default)]
pub struct Retention {
    /// Segment files on disk.
    segments: BTreeSet<u32>,
    needs: NameMap<Held>,
    /// Every segment up to this one is whole and flushed.
    flushed: u32,
}

/// What [`Retention::collect`] decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Segments no stream needs, oldest first.
    pub remove: Vec<u32>,
    /// Streams to ask for a snapshot.
    pub lagging: Vec<Bytes>,
}

impl Retention {
    /// A log with these segments on disk, these streams' needs, and these
    /// deleted streams whose records are still on disk, with the operation
    /// number of each one's last record (all flushed: read back at start).
    pub fn new(
        segments: impl IntoIterator<Item = u32>,
        needs: Vec<(Bytes, Need)>,
        deleted: Vec<(Bytes, u64)>,
    ) -> Self {
        let segments: BTreeSet<u32> = segments.into_iter().collect();
        let last = segments.last().copied().unwrap_or(0);
        let mut map: NameMap<Held> = deleted
            .into_iter()
            .map(|(name, op_no)| (name, Held::new(None, last, op_no)))
            .collect();
        map.extend(
            needs
                .into_iter()
                .map(|(name, need)| (name, Held::new(Some(need), last, 0))),
        );
        Retention {
            flushed: last,
            segments,
            needs: map,
        }
    }

    /// A segment file made.
    pub fn created(&mut self, segment: u32) {
        self.segments.insert(segment);
    }

    /// Stream `name` now needs `need` (`None`: nothing, it was deleted),
    /// moved there by a record in segment `by`; its last record is its
    /// operation `op_no`. A stream made since its need was last told (see
    /// [`Retention::making`]) holds the segment that made it until this
    /// need is in force: made and deleted between two tellings, it holds
    /// it until the deletion is flushed. Telling a deleted stream deleted
    /// again moves nothing.
    pub fn set(&mut self, name: &Bytes, need: Option<Need>, by: u32, op_no: u64) {
        match self.needs.get_mut(name) {
            None => {
                if need.is_some() {
                    // A new stream: its records are all ahead.
                    self.needs.insert(name.clone(), Held::new(need, by, op_no));
                }
            }
            Some(held) => {
                held.last_by = held.last_by.max(by);
                held.op_no = held.op_no.max(op_no);
                if let Some(made) = held.making.take() {
                    let hold = Some(Need {
                        segment: made,
                        by_history: true,
                        movable: false,
                    });
                    if rank(hold) < rank(held.now) {
                        held.now = hold;
                    }
                    for (need, _) in held.pending.iter_mut().flatten() {
                        if rank(hold) < rank(*need) {
                            *need = hold;
                        }
                    }
                }
                if need.is_none() && held.newest().is_none() {
                    // Deleted already (in force or not): nothing moves.
                    return;
                }
                let flushed =
                    by <= self.flushed && held.pending.iter().flatten().all(|(_, b)| *b <= by);
                if rank(need) <= rank(held.now) || flushed {
                    // Needing more holds at once; needing less only once
                    // what says so is flushed (and every move before it).
                    held.now = need;
                    held.pending = [None, None];
                } else {
                    held.defer(need, by);
                }
            }
        }
    }

    /// Stream `name` was made by its record `op_no` in segment `by`, its
    /// need not told yet (it is, after the command): until then the log
    /// knows the name as having records to read back, so an actor
    /// restarted meanwhile (a panic later in the same run of commands)
    /// reads them instead of numbering from a deletion or from 1 again.
    pub fn making(&mut self, name: &Bytes, by: u32, op_no: u64) {
        let held = self
            .needs
            .entry(name.clone())
            .or_insert_with(|| Held::new(None, by, op_no));
        held.last_by = held.last_by.max(by);
        held.op_no = held.op_no.max(op_no);
        held.making = Some(held.making.map_or(by, |m| m.min(by)));
    }

    /// For a stream this log knows as deleted (its newest need, in force
    /// or not yet, is none, and no record made it since): the operation
    /// number of its last record, from which an actor that makes it again
    /// goes on. `None`: the log does not know the stream, or it exists, or
    /// it may (a record made it and its need is not told yet).
    pub fn gone_op_no(&self, name: &[u8]) -> Option<u64> {
        let held = self.needs.get(name)?;
        (held.newest().is_none() && held.making.is_none()).then_some(held.op_no)
    }

    /// Segment `flushed` and every one before it are whole and flushed,
    /// and `current` takes the appends: which segments can go (all below
    /// every need), and which streams hold old ones by their history
    /// alone.
    pub fn collect(&mut self, flushed: u32, current: u32) -> Collected {
        self.flushed = self.flushed.max(flushed);
        let done = self.flushed;
        let mut oldest = current;
        let mut lagging = Vec::new();
        let first_on_disk = self.segments.first().copied();
        self.needs.retain(|name, held| {
            held.advance(done);
            if let Some(need) = held.now {
                oldest = oldest.min(need.segment);
            }
            if let Some(made) = held.making {
                oldest = oldest.min(made);
                // Not told for long (its actor panicked before it could):
                // a checkpoint wakes the actor, which tells it.
                if made + SNAPSHOT_LAG <= current {
                    lagging.push(name.clone());
                }
            }
            // Asked again only if the moves already noted leave it behind.
            if let Some(need) = held.newest() {
                if need.movable && need.segment + SNAPSHOT_LAG <= current {
                    lagging.push(name.clone());
                }
            }
            held.now.is_some()
                || held.pending[0].is_some()
                || held.making.is_some()
                || first_on_disk.is_some_and(|first| first <= held.last_by)
        });
        let keep_from = oldest.min(done + 1);
        let remove: Vec<u32> = self.segments.range(..keep_from).copied().collect();
        Collected { remove, lagging }
    }

    /// A segment file removed.
    pub fn removed(&mut self, segment: u32) {
        self.segments.remove(&segment);
    }

    /// Whether stream `name` may have records in this log (it exists, its
    /// deletion is not flushed yet, or a segment holding its records is
    /// still on disk).
    pub fn knows(&self, name: &[u8]) -> bool {
        self.needs.contains_key(name)
    }

    /// The segment files on disk, oldest first.
    pub fn segment_list(&self) -> Vec<u32> {
        self.segments.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Loc;

    fn need(segment: u32, by_history: bool) -> Option<Need> {
        Some(Need {
            segment,
            by_history,
            movable: by_history,
        })
    }

    #[test]
    fn segments_below_every_need_go_once_what_moved_the_needs_is_flushed() {
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        let mut r = Retention::new(1..=3, vec![(a.clone(), need(1, true).unwrap())], vec![]);
        r.set(&b, need(2, false), 2, 0);
        // `a` snapshots in segment 4, not flushed yet: 1 stays.
        r.created(4);
        r.set(&a, need(4, true), 4, 0);
        assert_eq!(r.collect(3, 4).remove, Vec::<u32>::new());
        // Segment 4 flushed: a's need moves; b's entries hold 2.
        r.created(5);
        assert_eq!(r.collect(4, 5).remove, vec![1]);
        r.removed(1);
        // b deleted (its DEL in 5): nothing below 4 once 5 is flushed.
        r.set(&b, None, 5, 0);
        assert_eq!(r.collect(4, 5).remove, Vec::<u32>::new());
        r.created(6);
        assert_eq!(r.collect(5, 6).remove, vec![2, 3]);
        // Needing an older segment again holds at once.
        r.set(&a, need(2, false), 6, 0);
        assert!(r.collect(5, 6).remove.is_empty());
    }

    #[test]
    fn a_deleted_stream_is_known_while_a_segment_with_its_records_is_on_disk() {
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        let gone = Bytes::from_static(b"gone");
        // `gone` deleted before the start, its records up to segment 3.
        let mut r = Retention::new(
            1..=3,
            vec![(a.clone(), need(1, false).unwrap())],
            vec![(gone.clone(), 7)],
        );
        assert!(r.knows(&gone));
        assert_eq!(r.gone_op_no(&gone), Some(7));
        // `b` made in 3 and deleted in 4; `a` holds segment 1 on.
        r.set(&b, need(3, false), 3, 1);
        assert_eq!(r.gone_op_no(&b), None, "it exists");
        r.created(4);
        r.set(&b, None, 4, 2);
        assert_eq!(r.gone_op_no(&b), Some(2), "deleted, not flushed yet");
        // Made and deleted again in one transaction.
        r.making(&b, 4, 3);
        r.set(&b, None, 4, 3);
        r.created(5);
        assert!(r.collect(4, 5).remove.is_empty());
        assert!(r.knows(&b) && r.knows(&gone), "their records are on disk");
        assert_eq!(r.gone_op_no(&b), Some(3));
        assert_eq!(r.gone_op_no(&a), None);
        assert_eq!(r.gone_op_no(b"never"), None);
        // `a` moves up to 5: segments 1-4 go, and with them what `b` and
        // `gone` had.
        r.set(&a, need(5, false), 5, 0);
        r.created(6);
        assert_eq!(r.collect(5, 6).remove, vec![1, 2, 3, 4]);
        for s in 1..=4 {
            r.removed(s);
        }
        r.created(7);
        r.collect(6, 7);
        assert!(!r.knows(&b) && !r.knows(&gone));
        assert_eq!(r.gone_op_no(&b), None);
        assert!(r.knows(&a));
    }

    #[test]
    fn a_need_that_moves_in_every_segment_still_lets_old_segments_go() {
        let a = Bytes::from_static(b"a");
        let mut r = Retention::new(1..=2, vec![(a.clone(), need(1, true).unwrap())], vec![]);
        // Each roll: the segment before is flushed, and the stream moves
        // its need into the new one (a record there, not flushed yet).
        for current in 3..=12 {
            r.created(current);
            r.set(&a, need(current, true), current, 0);
            let c = r.collect(current - 1, current);
            for s in &c.remove {
                r.removed(*s);
            }
        }
        let left = r.segment_list();
        assert!(left.len() <= 3, "segments kept: {left:?}");
        assert_eq!(left.last(), Some(&12));
    }

    #[test]
    fn a_move_folded_between_two_others_holds_what_it_needed() {
        let a = Bytes::from_static(b"a");
        let mut r = Retention::new(1..=10, vec![(a.clone(), need(1, false).unwrap())], vec![]);
        r.created(11);
        r.created(12);
        r.created(13);
        // Moves by records in 11, 12 and 13; the one in 12 needs 4,
        // more than the one in 11 (6).
        r.set(&a, need(6, false), 11, 0);
        r.set(&a, need(4, false), 12, 0);
        r.set(&a, need(9, false), 13, 0);
        // 11 flushed: the first move holds 4 (folded), not 6.
        assert_eq!(r.collect(11, 13).remove, vec![1, 2, 3]);
        for s in 1..=3 {
            r.removed(s);
        }
        // 13 flushed: the newest is in force.
        assert_eq!(r.collect(13, 13).remove, vec![4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_move_in_force_holds_what_any_later_move_needs() {
        let a = Bytes::from_static(b"a");
        let mut r = Retention::new(1..=10, vec![(a.clone(), need(1, false).unwrap())], vec![]);
        r.created(11);
        r.created(12);
        // Two moves: the later (in 12) needs 4, more than the first (6).
        r.set(&a, need(6, false), 11, 0);
        r.set(&a, need(4, false), 12, 0);
        // 11 flushed, 12 not: a crash may keep the record in 12, whose
        // replay needs segment 4.
        assert_eq!(r.collect(11, 12).remove, vec![1, 2, 3]);
    }

    #[test]
    fn a_deletion_waiting_for_its_flush_stays_waiting_whatever_is_told_after() {
        let a = Bytes::from_static(b"a");
        let keep = Bytes::from_static(b"keep");
        let mut r = Retention::new(
            1..=4,
            vec![
                (a.clone(), need(2, false).unwrap()),
                (keep.clone(), need(3, false).unwrap()),
            ],
            vec![],
        );
        r.created(5);
        // `a` deleted by a record in 5, not flushed yet.
        r.set(&a, None, 5, 3);
        // A fresh actor for the deleted name tells the same, from an
        // older segment: the deletion is still not in force.
        r.set(&a, None, 0, 3);
        assert_eq!(r.collect(4, 5).remove, vec![1], "segment 2 holds `a`");
        assert_eq!(r.gone_op_no(&a), Some(3));
        // Made by a record whose need is not told yet: read back, not
        // numbered on from the deletion.
        r.making(&a, 5, 4);
        assert_eq!(r.gone_op_no(&a), None);
        assert!(r.knows(&a));
        r.set(&a, need(5, false), 5, 4);
        assert_eq!(r.gone_op_no(&a), None);
    }

    #[test]
    fn a_stream_made_and_deleted_between_tellings_holds_where_it_was_made() {
        let a = Bytes::from_static(b"a");
        let keep = Bytes::from_static(b"keep");
        let mut r = Retention::new(1..=4, vec![(keep.clone(), need(4, false).unwrap())], vec![]);
        // `a` made by a record in 5; the log rolls; more of it and its
        // deletion go into 6; then its actor tells the log (no need).
        r.created(5);
        r.making(&a, 5, 1);
        assert_eq!(r.gone_op_no(&a), None, "made: read back, not numbered on");
        r.created(6);
        assert!(r.collect(5, 6).remove.iter().all(|s| *s < 4));
        r.set(&a, None, 6, 3);
        // 5 flushed, 6 not: a crash may keep the add in 6 without the
        // deletion; its replay starts in 5 (`keep` moves on to 6 too).
        r.set(&keep, need(6, false), 6, 9);
        r.created(7);
        assert_eq!(r.collect(5, 7).remove, vec![1, 2, 3]);
        for s in 1..=3 {
            r.removed(s);
        }
        assert_eq!(r.gone_op_no(&a), Some(3));
        // 6 flushed: the deletion is in force, 4 and 5 go.
        assert_eq!(r.collect(6, 7).remove, vec![4, 5]);
    }

    #[test]
    fn a_made_stream_whose_need_is_never_told_is_asked_for_a_checkpoint() {
        let a = Bytes::from_static(b"a");
        let mut r = Retention::new(1..=2, vec![], vec![]);
        r.making(&a, 2, 1);
        assert!(r.collect(2, 3).lagging.is_empty());
        let c = r.collect(5, 6);
        assert_eq!(c.lagging, vec![a.clone()]);
        assert!(c.remove.is_empty() || c.remove == vec![1], "{c:?}");
        // Told (its actor woke for the checkpoint): no longer held by it.
        r.set(&a, need(2, false), 2, 1);
        assert!(r.collect(5, 6).lagging.is_empty());
    }

    #[test]
    fn a_pending_snapshot_is_not_asked_for_again() {
        let a = Bytes::from_static(b"a");
        let mut r = Retention::new(1..=6, vec![(a.clone(), need(1, true).unwrap())], vec![]);
        assert_eq!(r.collect(6, 7).lagging, vec![a.clone()]);
        r.created(7);
        r.set(&a, need(7, true), 7, 0);
        assert!(r.collect(6, 7).lagging.is_empty());
        assert_eq!(r.collect(7, 8).remove, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn history_far_behind_the_head_asks_for_a_snapshot() {
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        let mut r = Retention::new(
            1..=6,
            vec![
                (a.clone(), need(1, true).unwrap()),
                (b.clone(), need(1, false).unwrap()),
            ],
            vec![],
        );
        let c = r.collect(6, 7);
        assert_eq!(c.lagging, vec![a]);
        assert!(c.remove.is_empty());
    }

    #[test]
    fn runs_follow_the_first_live_entry() {
        let mut s = Stream::new();
        let f = crate::stream::Fields::from_parts(&[&b"f"[..]]);
        for ms in 1..=6 {
            s.insert(StreamId::new(ms, 0), f.clone(), Loc::NONE);
        }
        let mut runs: VecDeque<(StreamId, u32)> = [
            (StreamId::new(1, 0), 1),
            (StreamId::new(3, 0), 2),
            (StreamId::new(5, 0), 3),
        ]
        .into_iter()
        .collect();
        assert_eq!(need_of(Some(&s), 1, &mut runs, 0), need(1, false));
        s.delete(&[
            StreamId::new(1, 0),
            StreamId::new(2, 0),
            StreamId::new(3, 0),
        ]);
        assert_eq!(need_of(Some(&s), 3, &mut runs, 0), need(2, false));
        assert_eq!(need_of(Some(&s), 1, &mut runs, 0), need(1, true));
        s.delete(&[
            StreamId::new(4, 0),
            StreamId::new(5, 0),
            StreamId::new(6, 0),
        ]);
        assert_eq!(need_of(Some(&s), 3, &mut runs, 0), need(3, true));
        assert!(runs.is_empty());
        s.insert(StreamId::new(7, 0), f.clone(), Loc::NONE);
        runs.push_back((StreamId::new(7, 0), 4));
        // One entry: 1 byte of field, 40 of record.
        let small = need_of(Some(&s), 5, &mut runs, 42).unwrap();
        assert!(!small.by_history && small.movable);
        assert!(!need_of(Some(&s), 5, &mut runs, 41).unwrap().movable);
        assert_eq!(need_of(None, 3, &mut runs, 0), None);
    }
}
