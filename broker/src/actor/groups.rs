//! The consumer-group commands a stream's actor runs: `XGROUP`, `XACK`,
//! `XPENDING`, `XCLAIM`, `XAUTOCLAIM`, `XINFO`, `XSETID`, and the delivery
//! half of `XREADGROUP`. Each change is logged as an operation and then
//! applied with [`Stream::apply_group`], as recovery replays it.

use bytes::Bytes;

use super::{now_ms, storage_error, Answer, StreamActor};
use crate::command::{c_string, not_an_integer, syntax_error};
use crate::id::{parse_id, parse_range, StreamId};
use crate::log::{Loc, Op};
use crate::resp::{parse_int, Reply};
use crate::server::Shared;
use crate::store::Ticket;
use crate::stream::{entry_reply, Fields, Stream};

/// Redis's error for a subcommand of `command` it does not know or whose
/// arguments do not fit (the name as sent, cut at 128 bytes and a NUL).
fn bad_subcommand(command: &str, sub: &[u8]) -> Reply {
    let sub = c_string(sub);
    Reply::error_bytes(&[
        b"ERR unknown subcommand or wrong number of arguments for '",
        &sub[..sub.len().min(128)],
        b"'. Try ",
        command.as_bytes(),
        b" HELP.",
    ])
}

/// `NOGROUP` for `XGROUP` subcommands (names as sent, up to a NUL).
fn no_group_for_key(group: &[u8], key: &[u8]) -> Reply {
    Reply::error_bytes(&[
        b"NOGROUP No such consumer group '",
        c_string(group),
        b"' for key name '",
        c_string(key),
        b"'",
    ])
}

/// `NOGROUP` for `XPENDING`, `XCLAIM`, `XAUTOCLAIM`, `XINFO CONSUMERS`.
fn no_key_or_group(key: &[u8], group: &[u8]) -> Reply {
    Reply::error_bytes(&[
        b"NOGROUP No such key '",
        c_string(key),
        b"' or consumer group '",
        c_string(group),
        b"'",
    ])
}

/// `NOGROUP` for `XREADGROUP`.
pub(crate) fn no_group_in_readgroup(key: &[u8], group: &[u8]) -> Reply {
    Reply::error_bytes(&[
        b"NOGROUP No such key '",
        c_string(key),
        b"' or consumer group '",
        c_string(group),
        b"' in XREADGROUP with GROUP option",
    ])
}

/// What a claim logs: the pending entries of deleted entries dropped, and
/// the claimed ones moved (the consumer is made only when one is).
fn claim_ops(
    group: &Bytes,
    consumer: &Bytes,
    now: u64,
    gone: Vec<StreamId>,
    claimed: Vec<(StreamId, u64, u64)>,
    raise: Option<StreamId>,
) -> Vec<Op> {
    let mut ops = Vec::new();
    if !gone.is_empty() {
        ops.push(Op::Ack {
            group: group.clone(),
            ids: gone,
        });
    }
    if !claimed.is_empty() || raise.is_some() {
        ops.push(Op::Claim {
            group: group.clone(),
            consumer: consumer.clone(),
            time: now,
            entries: claimed,
            last_id: raise,
        });
    }
    ops
}

fn int(arg: &[u8]) -> Result<i64, Reply> {
    parse_int(arg).ok_or_else(not_an_integer)
}

/// Where an `XREADGROUP` reads one stream from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupFrom {
    /// `>`: entries never delivered to the group.
    New,
    /// The consumer's own pending entries after this id.
    History(Bytes),
}

/// What one stream gave an `XREADGROUP`.
#[derive(Debug)]
pub enum GroupRead {
    /// Entries (a deleted one, from history, without fields).
    Entries(Vec<(StreamId, Option<Fields>)>),
    /// The command's error (no group, a bad id).
    Error(Reply),
}

impl StreamActor {
    /// Logs `op` and applies it to the stream.
    fn change(&mut self, op: Op) -> Result<Ticket, Reply> {
        let ticket = self.log(op.clone()).map_err(|e| storage_error(&e))?;
        if let Some(s) = self.stream.as_mut() {
            s.apply_group(op);
        }
        Ok(ticket)
    }

    /// Like [`StreamActor::change`] for several operations; the ticket of
    /// the last covers them all.
    fn changes(&mut self, ops: Vec<Op>) -> Result<Option<Ticket>, Reply> {
        let mut last = None;
        for op in ops {
            last = Some(self.change(op)?);
        }
        Ok(last)
    }

    pub(super) fn xgroup(&mut self, args: &[Bytes], shared: &Shared) -> Answer {
        match self.xgroup_inner(args, shared) {
            Ok(a) => a,
            Err(e) => e.into(),
        }
    }

    fn xgroup_inner(&mut self, args: &[Bytes], shared: &Shared) -> Result<Answer, Reply> {
        // The session checks each subcommand's arity before a stream sees
        // the command; a command too short to name its stream and group
        // (one that reached here by another way, as `XGROUP HELP` once
        // did) is refused here too.
        let [_, sub, key, group, ..] = args else {
            return Err(bad_subcommand("XGROUP", args.get(1).map_or(&[][..], |a| a)));
        };
        let sub = sub.to_ascii_lowercase();
        let bad_options = || bad_subcommand("XGROUP", &args[1]);
        let mut mkstream = false;
        let mut entries_read: Option<i64> = None;
        let mut i = 5;
        while i < args.len() {
            if sub == b"create" && args[i].eq_ignore_ascii_case(b"mkstream") {
                mkstream = true;
                i += 1;
            } else if (sub == b"create" || sub == b"setid")
                && args[i].eq_ignore_ascii_case(b"entriesread")
                && i + 1 < args.len()
            {
                let n = int(&args[i + 1])?;
                if n < 0 && n != -1 {
                    return Err(Reply::err("value for ENTRIESREAD must be positive or -1"));
                }
                entries_read = Some(n);
                i += 2;
            } else {
                return Err(bad_options());
            }
        }
        if self.stream.is_none() && !mkstream {
            return Err(Reply::err(
                "The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.",
            ));
        }
        if matches!(
            sub.as_slice(),
            b"setid" | b"createconsumer" | b"delconsumer"
        ) && !self.has_group(group)
        {
            return Err(no_group_for_key(group, key));
        }
        let now = now_ms();
        let read = match entries_read {
            Some(-1) | None => None,
            Some(n) => Some(n as u64),
        };
        match sub.as_slice() {
            b"create" => {
                if args.len() > 8 {
                    return Err(bad_options());
                }
                let last = self.stream.as_ref().map_or(StreamId::MIN, Stream::last_id);
                let id = if args[4].as_ref() == b"$" {
                    last
                } else {
                    parse_id(&args[4], 0, true)?
                };
                if self.stream.is_none() {
                    // MKSTREAM: the group's record, after it, covers its flush.
                    let made = self
                        .log(Op::SetId {
                            last_id: StreamId::MIN,
                            entries_added: 0,
                            max_deleted_id: StreamId::MIN,
                        })
                        .map_err(|e| storage_error(&e))?;
                    self.stream = Some(Stream::new());
                    self.tell_catalog(shared, &made);
                }
                if self.has_group(group) {
                    return Err(Reply::Error(
                        "BUSYGROUP Consumer Group name already exists".to_owned(),
                    ));
                }
                let ticket = self.change(Op::GroupCreate {
                    group: group.clone(),
                    last_id: id,
                    entries_read: read,
                })?;
                Ok(Answer {
                    reply: Reply::OK,
                    durable: Some(ticket),
                })
            }
            b"setid" => {
                if args.len() != 5 && args.len() != 7 {
                    return Err(bad_options());
                }
                let last = self.stream.as_ref().map_or(StreamId::MIN, Stream::last_id);
                let id = if args[4].as_ref() == b"$" {
                    last
                } else {
                    parse_id(&args[4], 0, false)?
                };
                let ticket = self.change(Op::GroupSetId {
                    group: group.clone(),
                    last_id: id,
                    entries_read: read,
                })?;
                Ok(Answer {
                    reply: Reply::OK,
                    durable: Some(ticket),
                })
            }
            b"destroy" => {
                if !self.has_group(group) {
                    return Ok(Reply::Int(0).into());
                }
                let ticket = self.change(Op::GroupDestroy {
                    group: group.clone(),
                })?;
                // Its blocked readers fail (Redis signals the key).
                self.signal(super::Signal::Ready);
                Ok(Answer {
                    reply: Reply::Int(1),
                    durable: Some(ticket),
                })
            }
            b"createconsumer" => {
                let g = self.group(group).expect("checked above");
                if g.consumers.contains_key(&args[4]) {
                    return Ok(Reply::Int(0).into());
                }
                let ticket = self.change(Op::ConsumerCreate {
                    group: group.clone(),
                    consumer: args[4].clone(),
                    time: now,
                })?;
                Ok(Answer {
                    reply: Reply::Int(1),
                    durable: Some(ticket),
                })
            }
            b"delconsumer" => {
                let g = self.group(group).expect("checked above");
                let Some(c) = g.consumers.get(&args[4]) else {
                    return Ok(Reply::Int(0).into());
                };
                let pending = c.pel.len() as i64;
                let ticket = self.change(Op::ConsumerDelete {
                    group: group.clone(),
                    consumer: args[4].clone(),
                })?;
                Ok(Answer {
                    reply: Reply::Int(pending),
                    durable: Some(ticket),
                })
            }
            _ => Err(syntax_error()),
        }
    }

    fn has_group(&self, group: &[u8]) -> bool {
        self.group(group).is_some()
    }

    fn group(&self, group: &[u8]) -> Option<&crate::group::Group> {
        self.stream.as_ref()?.groups.get(group)
    }

    /// `XREADGROUP`'s read of this stream.
    pub(super) fn read_group(
        &mut self,
        group: &Bytes,
        consumer: &Bytes,
        from: &GroupFrom,
        count: Option<u64>,
        noack: bool,
    ) -> (GroupRead, Option<Ticket>) {
        let Some(g) = self.group(group) else {
            return (
                GroupRead::Error(no_group_in_readgroup(&self.name, group)),
                None,
            );
        };
        let now = now_ms();
        let stream = self.stream.as_ref().expect("a group has a stream");
        match from {
            GroupFrom::History(raw) => {
                let after = match parse_id(raw, 0, true) {
                    Ok(id) => id,
                    Err(e) => return (GroupRead::Error(e), None),
                };
                let take = count.map_or(usize::MAX, |c| c as usize);
                let entries: Vec<(StreamId, Option<Fields>)> = g
                    .consumers
                    .get(consumer)
                    .map(|c| {
                        c.pel
                            .range(after..)
                            .filter(|id| **id > after)
                            .take(take)
                            .map(|id| (*id, stream.get(*id)))
                            .collect()
                    })
                    .unwrap_or_default();
                // A history read is always served: it makes the consumer,
                // and each entry still in the stream counts as delivered
                // again.
                let redelivered: Vec<(StreamId, u64, u64)> = entries
                    .iter()
                    .filter(|(_, f)| f.is_some())
                    .map(|(id, _)| (*id, now, g.pel[id].delivery_count.saturating_add(1)))
                    .collect();
                let mut ops = Vec::new();
                if !g.consumers.contains_key(consumer) {
                    ops.push(Op::ConsumerCreate {
                        group: group.clone(),
                        consumer: consumer.clone(),
                        time: now,
                    });
                }
                if !redelivered.is_empty() {
                    ops.push(Op::Claim {
                        group: group.clone(),
                        consumer: consumer.clone(),
                        time: now,
                        entries: redelivered,
                        last_id: None,
                    });
                }
                let ticket = match self.changes(ops) {
                    Ok(t) => t,
                    Err(e) => return (GroupRead::Error(e), None),
                };
                if let Some(c) = self
                    .stream
                    .as_mut()
                    .and_then(|s| s.groups.get_mut(group))
                    .and_then(|g| g.consumers.get_mut(consumer))
                {
                    c.seen_time = now;
                }
                (GroupRead::Entries(entries), ticket)
            }
            GroupFrom::New => {
                let after = g.last_id;
                let entries: Vec<(StreamId, Fields)> = match after.next() {
                    Some(lo) => stream.range(lo, StreamId::MAX, count, false),
                    None => Vec::new(),
                };
                let mut entries_read = g.entries_read;
                for (id, _) in &entries {
                    entries_read = stream.entries_read_after(entries_read, *id);
                }
                if entries.is_empty() {
                    // Nothing new: the consumer is not made (Redis 7.0).
                    return (GroupRead::Entries(Vec::new()), None);
                }
                let last = entries.last().expect("not empty").0;
                let ids = if noack {
                    Vec::new()
                } else {
                    entries.iter().map(|(id, _)| *id).collect()
                };
                match self.change(Op::Deliver {
                    group: group.clone(),
                    consumer: consumer.clone(),
                    time: now,
                    last_id: last,
                    entries_read,
                    ids,
                }) {
                    Ok(t) => (
                        GroupRead::Entries(
                            entries.into_iter().map(|(i, f)| (i, Some(f))).collect(),
                        ),
                        Some(t),
                    ),
                    Err(e) => (GroupRead::Error(e), None),
                }
            }
        }
    }

    /// A blocked reader of `group` woken with nothing new for it: served
    /// all the same (with no entry) when the stream's last id passed the
    /// group's, an entry added and removed at once, as Redis serves it;
    /// its consumer is made then. `None`: not served, it blocks on.
    pub(super) fn serve_blocked_empty(
        &mut self,
        group: &Bytes,
        consumer: &Bytes,
    ) -> Option<Result<Option<Ticket>, Reply>> {
        let stream = self.stream.as_ref()?;
        let g = stream.groups.get(group)?;
        if stream.last_id() <= g.last_id {
            return None;
        }
        if g.consumers.contains_key(consumer) {
            // Seen now (Redis refreshes it as it serves the reader).
            if let Some(c) = self
                .stream
                .as_mut()
                .and_then(|s| s.groups.get_mut(group))
                .and_then(|g| g.consumers.get_mut(consumer))
            {
                c.seen_time = now_ms();
            }
            return Some(Ok(None));
        }
        Some(
            self.change(Op::ConsumerCreate {
                group: group.clone(),
                consumer: consumer.clone(),
                time: now_ms(),
            })
            .map(Some),
        )
    }

    pub(super) fn xack(&mut self, args: &[Bytes]) -> Answer {
        let Some(g) = self.group(&args[2]) else {
            return Reply::Int(0).into();
        };
        let ids = match args[3..]
            .iter()
            .map(|a| parse_id(a, 0, true))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(ids) => ids,
            Err(e) => return e.into(),
        };
        let mut acked: Vec<StreamId> = ids
            .into_iter()
            .filter(|id| g.pel.contains_key(id))
            .collect();
        acked.sort_unstable();
        acked.dedup();
        if acked.is_empty() {
            return Reply::Int(0).into();
        }
        let n = acked.len() as i64;
        match self.change(Op::Ack {
            group: args[2].clone(),
            ids: acked,
        }) {
            Ok(t) => Answer {
                reply: Reply::Int(n),
                durable: Some(t),
            },
            Err(e) => e.into(),
        }
    }

    pub(super) fn xpending(&mut self, args: &[Bytes]) -> Answer {
        self.xpending_inner(args).unwrap_or_else(Answer::from)
    }

    fn xpending_inner(&mut self, args: &[Bytes]) -> Result<Answer, Reply> {
        let (key, group) = (&args[1], &args[2]);
        let argc = args.len();
        if argc != 3 && !(6..=9).contains(&argc) {
            return Err(syntax_error());
        }
        // Extended form: [IDLE min-idle] start end count [consumer];
        // arguments after the consumer are ignored, as Redis does.
        let mut min_idle = 0i64;
        let mut at = 3;
        if argc >= 6 && args[3].eq_ignore_ascii_case(b"idle") {
            min_idle = int(&args[4])?;
            if argc < 8 {
                return Err(syntax_error());
            }
            at = 5;
        }
        let extended = if argc >= 6 {
            let count = int(&args[at + 2])?.max(0) as usize;
            let (lo, hi) = parse_range(&args[at], &args[at + 1])?;
            let consumer = args.get(at + 3).cloned();
            Some((lo, hi, count, consumer))
        } else {
            None
        };
        let Some(g) = self.group(group) else {
            return Err(no_key_or_group(key, group));
        };
        let now = now_ms();
        let Some((lo, hi, count, consumer)) = extended else {
            if g.pel.is_empty() {
                return Ok(Reply::Array(vec![
                    Reply::Int(0),
                    Reply::Nil,
                    Reply::Nil,
                    Reply::NilArray,
                ])
                .into());
            }
            let first = *g.pel.keys().next().expect("not empty");
            let last = *g.pel.keys().next_back().expect("not empty");
            let per_consumer = g
                .consumers
                .iter()
                .filter(|(_, c)| !c.pel.is_empty())
                .map(|(name, c)| {
                    Reply::Array(vec![
                        Reply::Bulk(name.clone()),
                        Reply::bulk(c.pel.len().to_string()),
                    ])
                })
                .collect();
            return Ok(Reply::Array(vec![
                Reply::Int(g.pel.len() as i64),
                first.reply(),
                last.reply(),
                Reply::Array(per_consumer),
            ])
            .into());
        };
        if lo > hi || count == 0 {
            return Ok(Reply::Array(Vec::new()).into());
        }
        let nack_reply = |id: &StreamId, n: &crate::group::Nack| {
            let idle = now.saturating_sub(n.delivery_time);
            (min_idle == 0 || idle as i64 >= min_idle).then(|| {
                Reply::Array(vec![
                    id.reply(),
                    Reply::Bulk(n.consumer.clone()),
                    Reply::Int(idle as i64),
                    Reply::Int(n.delivery_count as i64),
                ])
            })
        };
        let rows: Vec<Reply> = match &consumer {
            Some(name) => match g.consumers.get(name) {
                Some(c) => c
                    .pel
                    .range(lo..=hi)
                    .filter_map(|id| g.pel.get(id).and_then(|n| nack_reply(id, n)))
                    .take(count)
                    .collect(),
                None => Vec::new(),
            },
            None => g
                .pel
                .range(lo..=hi)
                .filter_map(|(id, n)| nack_reply(id, n))
                .take(count)
                .collect(),
        };
        Ok(Reply::Array(rows).into())
    }

    pub(super) fn xclaim(&mut self, args: &[Bytes]) -> Answer {
        self.xclaim_inner(args).unwrap_or_else(Answer::from)
    }

    fn xclaim_inner(&mut self, args: &[Bytes]) -> Result<Answer, Reply> {
        let (key, group, consumer) = (&args[1], &args[2], &args[3]);
        if !self.has_group(group) {
            return Err(no_key_or_group(key, group));
        }
        let min_idle = parse_int(&args[4])
            .ok_or_else(|| Reply::err("Invalid min-idle-time argument for XCLAIM"))?
            .max(0) as u64;
        let mut ids = Vec::new();
        let mut i = 5;
        while i < args.len() {
            match parse_id(&args[i], 0, true) {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
            i += 1;
        }
        let now = now_ms();
        let mut delivery_time: i64 = now as i64;
        let mut retry_count = None;
        let mut force = false;
        let mut justid = false;
        let mut last_id = None;
        while i < args.len() {
            let more = args.len() - i - 1;
            let opt = args[i].to_ascii_lowercase();
            match opt.as_slice() {
                b"force" => force = true,
                b"justid" => justid = true,
                b"idle" if more >= 1 => {
                    i += 1;
                    let ms = parse_int(&args[i])
                        .ok_or_else(|| Reply::err("Invalid IDLE option argument for XCLAIM"))?;
                    delivery_time = (now as i64).saturating_sub(ms);
                }
                b"time" if more >= 1 => {
                    i += 1;
                    delivery_time = parse_int(&args[i])
                        .ok_or_else(|| Reply::err("Invalid TIME option argument for XCLAIM"))?;
                }
                b"retrycount" if more >= 1 => {
                    i += 1;
                    let n = parse_int(&args[i]).ok_or_else(|| {
                        Reply::err("Invalid RETRYCOUNT option argument for XCLAIM")
                    })?;
                    // Negative: as if not given (Redis).
                    retry_count = u64::try_from(n).ok();
                }
                b"lastid" if more >= 1 => {
                    i += 1;
                    last_id = Some(parse_id(&args[i], 0, true)?);
                }
                _ => {
                    return Err(Reply::error_bytes(&[
                        b"ERR Unrecognized XCLAIM option '",
                        c_string(&args[i]),
                        b"'",
                    ]))
                }
            }
            i += 1;
        }
        // A time in the future, or before the epoch, means now.
        let delivery_time = if delivery_time < 0 || delivery_time as u64 > now {
            now
        } else {
            delivery_time as u64
        };
        let g = self.group(group).expect("checked above");
        let stream = self.stream.as_ref().expect("a group has a stream");
        let mut claimed = Vec::new();
        let mut gone = Vec::new();
        let mut replies = Vec::new();
        // Each id sees what the claims before it in this command did (an
        // id named twice is claimed against its first claim), as Redis
        // updates its pending entry in place: id -> (delivery time, count),
        // `None` once removed.
        let mut so_far: std::collections::HashMap<StreamId, Option<(u64, u64)>> =
            std::collections::HashMap::new();
        for id in ids {
            let pending = match so_far.get(&id) {
                Some(state) => *state,
                None => g.pel.get(&id).map(|n| (n.delivery_time, n.delivery_count)),
            };
            if !stream.contains(id) {
                // Deleted from the stream: its pending entry goes.
                if pending.is_some() {
                    gone.push(id);
                    so_far.insert(id, None);
                }
                continue;
            }
            let count = match pending {
                Some((time, count)) => {
                    let idle = now.saturating_sub(time);
                    if min_idle > 0 && idle < min_idle {
                        continue;
                    }
                    count
                }
                // FORCE makes a pending entry (delivered once, no owner).
                None if force => 1,
                None => continue,
            };
            let count = match retry_count {
                Some(n) => n,
                None if justid => count,
                None => count.saturating_add(1),
            };
            so_far.insert(id, Some((delivery_time, count)));
            claimed.push((id, delivery_time, count));
            replies.push(if justid {
                id.reply()
            } else {
                entry_reply(id, &stream.get(id).expect("checked above"))
            });
        }
        let raise = last_id.filter(|id| *id > g.last_id);
        let ticket = self.changes(claim_ops(group, consumer, now, gone, claimed, raise))?;
        Ok(Answer {
            reply: Reply::Array(replies),
            durable: ticket,
        })
    }

    pub(super) fn xautoclaim(&mut self, args: &[Bytes]) -> Answer {
        self.xautoclaim_inner(args).unwrap_or_else(Answer::from)
    }

    fn xautoclaim_inner(&mut self, args: &[Bytes]) -> Result<Answer, Reply> {
        let (key, group, consumer) = (&args[1], &args[2], &args[3]);
        let min_idle = parse_int(&args[4])
            .ok_or_else(|| Reply::err("Invalid min-idle-time argument for XAUTOCLAIM"))?
            .max(0) as u64;
        let (start, _) = parse_range(&args[5], b"+")?;
        let mut count: u64 = 100;
        let mut justid = false;
        let mut i = 6;
        while i < args.len() {
            if args[i].eq_ignore_ascii_case(b"count") && i + 1 < args.len() {
                let n = parse_int(&args[i + 1]).unwrap_or(0);
                if !(1..=i64::MAX / 16).contains(&n) {
                    return Err(Reply::err("COUNT must be > 0"));
                }
                count = n as u64;
                i += 2;
            } else if args[i].eq_ignore_ascii_case(b"justid") {
                justid = true;
                i += 1;
            } else {
                return Err(syntax_error());
            }
        }
        let Some(g) = self.group(group) else {
            return Err(no_key_or_group(key, group));
        };
        let stream = self.stream.as_ref().expect("a group has a stream");
        let now = now_ms();
        let mut attempts = count * 10;
        let mut claimed = Vec::new();
        let mut gone = Vec::new();
        let mut replies = Vec::new();
        let mut next = StreamId::MIN;
        let mut iter = g.pel.range(start..);
        for (id, nack) in iter.by_ref() {
            if count == 0 || attempts == 0 {
                next = *id;
                break;
            }
            attempts -= 1;
            if !stream.contains(*id) {
                gone.push(*id);
                count -= 1;
                continue;
            }
            if now.saturating_sub(nack.delivery_time) < min_idle {
                continue;
            }
            let n = if justid {
                nack.delivery_count
            } else {
                nack.delivery_count.saturating_add(1)
            };
            claimed.push((*id, now, n));
            replies.push(if justid {
                id.reply()
            } else {
                entry_reply(*id, &stream.get(*id).expect("checked above"))
            });
            count -= 1;
        }
        let deleted: Vec<Reply> = gone.iter().map(|id| id.reply()).collect();
        let ticket = self.changes(claim_ops(group, consumer, now, gone, claimed, None))?;
        Ok(Answer {
            reply: Reply::Array(vec![
                next.reply(),
                Reply::Array(replies),
                Reply::Array(deleted),
            ]),
            durable: ticket,
        })
    }

    pub(super) fn xinfo(&mut self, args: &[Bytes]) -> Answer {
        self.xinfo_inner(args).unwrap_or_else(Answer::from)
    }

    fn xinfo_inner(&mut self, args: &[Bytes]) -> Result<Answer, Reply> {
        // The session checks each subcommand's arity before a stream sees
        // the command; a command too short to name its stream (one that
        // reached here by another way, as `XINFO HELP` once did) is
        // refused here too.
        let [_, sub, key, ..] = args else {
            return Err(bad_subcommand("XINFO", args.get(1).map_or(&[][..], |a| a)));
        };
        let sub = sub.to_ascii_lowercase();
        let Some(stream) = self.stream.as_ref() else {
            return Err(Reply::err("no such key"));
        };
        let b = |s: &'static str| Reply::bulk(s);
        let now = now_ms();
        match sub.as_slice() {
            b"groups" => Ok(Reply::Array(
                stream
                    .groups
                    .iter()
                    .map(|(name, g)| {
                        Reply::Map(vec![
                            (b("name"), Reply::Bulk(name.clone())),
                            (b("consumers"), Reply::Int(g.consumers.len() as i64)),
                            (b("pending"), Reply::Int(g.pel.len() as i64)),
                            (b("last-delivered-id"), g.last_id.reply()),
                            (
                                b("entries-read"),
                                g.entries_read.map_or(Reply::Nil, |n| Reply::Int(n as i64)),
                            ),
                            (b("lag"), stream.lag(g).map_or(Reply::Nil, Reply::Int)),
                        ])
                    })
                    .collect(),
            )
            .into()),
            b"consumers" => {
                let Some(g) = stream.groups.get(&args[3]) else {
                    return Err(no_group_for_key(&args[3], key));
                };
                Ok(Reply::Array(
                    g.consumers
                        .iter()
                        .map(|(name, c)| {
                            Reply::Map(vec![
                                (b("name"), Reply::Bulk(name.clone())),
                                (b("pending"), Reply::Int(c.pel.len() as i64)),
                                (
                                    b("idle"),
                                    Reply::Int(now.saturating_sub(c.seen_time) as i64),
                                ),
                            ])
                        })
                        .collect(),
                )
                .into())
            }
            b"stream" => {
                let full = match args.len() {
                    3 => None,
                    4 if args[3].eq_ignore_ascii_case(b"full") => Some(10),
                    6 if args[3].eq_ignore_ascii_case(b"full")
                        && args[4].eq_ignore_ascii_case(b"count") =>
                    {
                        let n = int(&args[5])?;
                        Some(if n < 0 { 10 } else { n as usize })
                    }
                    _ => return Err(bad_subcommand("XINFO", &args[1])),
                };
                let head = vec![
                    (b("length"), Reply::Int(stream.len() as i64)),
                    (b("radix-tree-keys"), Reply::Int(stream.node_count() as i64)),
                    (
                        b("radix-tree-nodes"),
                        Reply::Int(stream.radix_tree_nodes() as i64),
                    ),
                    (b("last-generated-id"), stream.last_id().reply()),
                    (b("max-deleted-entry-id"), stream.max_deleted_id().reply()),
                    (
                        b("entries-added"),
                        Reply::Int(stream.entries_added() as i64),
                    ),
                    (b("recorded-first-entry-id"), stream.first_id().reply()),
                ];
                let Some(n) = full else {
                    let edge = |e: Option<(StreamId, Fields)>| {
                        e.map_or(Reply::Nil, |(id, f)| entry_reply(id, &f))
                    };
                    let mut map = head;
                    map.push((b("groups"), Reply::Int(stream.groups.len() as i64)));
                    map.push((b("first-entry"), edge(stream.first())));
                    map.push((b("last-entry"), edge(stream.last())));
                    return Ok(Reply::Map(map).into());
                };
                // FULL: the first n (0: all) entries, and each group with
                // its first n pending entries and consumers.
                let limit = if n == 0 { usize::MAX } else { n };
                let entries = stream
                    .range(StreamId::MIN, StreamId::MAX, Some(limit as u64), false)
                    .iter()
                    .map(|(id, f)| entry_reply(*id, f))
                    .collect();
                let groups = stream
                    .groups
                    .iter()
                    .map(|(name, g)| {
                        let pending = g
                            .pel
                            .iter()
                            .take(limit)
                            .map(|(id, nack)| {
                                Reply::Array(vec![
                                    id.reply(),
                                    Reply::Bulk(nack.consumer.clone()),
                                    Reply::Int(nack.delivery_time as i64),
                                    Reply::Int(nack.delivery_count as i64),
                                ])
                            })
                            .collect();
                        let consumers = g
                            .consumers
                            .iter()
                            .map(|(cname, c)| {
                                let pending = c
                                    .pel
                                    .iter()
                                    .take(limit)
                                    .map(|id| {
                                        let nack = &g.pel[id];
                                        Reply::Array(vec![
                                            id.reply(),
                                            Reply::Int(nack.delivery_time as i64),
                                            Reply::Int(nack.delivery_count as i64),
                                        ])
                                    })
                                    .collect();
                                Reply::Map(vec![
                                    (b("name"), Reply::Bulk(cname.clone())),
                                    (b("seen-time"), Reply::Int(c.seen_time as i64)),
                                    (b("pel-count"), Reply::Int(c.pel.len() as i64)),
                                    (b("pending"), Reply::Array(pending)),
                                ])
                            })
                            .collect();
                        Reply::Map(vec![
                            (b("name"), Reply::Bulk(name.clone())),
                            (b("last-delivered-id"), g.last_id.reply()),
                            (
                                b("entries-read"),
                                g.entries_read.map_or(Reply::Nil, |n| Reply::Int(n as i64)),
                            ),
                            (b("lag"), stream.lag(g).map_or(Reply::Nil, Reply::Int)),
                            (b("pel-count"), Reply::Int(g.pel.len() as i64)),
                            (b("pending"), Reply::Array(pending)),
                            (b("consumers"), Reply::Array(consumers)),
                        ])
                    })
                    .collect();
                let mut map = head;
                map.push((b("entries"), Reply::Array(entries)));
                map.push((b("groups"), Reply::Array(groups)));
                Ok(Reply::Map(map).into())
            }
            _ => Err(syntax_error()),
        }
    }

    pub(super) fn xsetid(&mut self, args: &[Bytes], shared: &Shared) -> Answer {
        let _ = shared;
        self.xsetid_inner(args).unwrap_or_else(Answer::from)
    }

    fn xsetid_inner(&mut self, args: &[Bytes]) -> Result<Answer, Reply> {
        let id = parse_id(&args[2], 0, true)?;
        let mut entries_added = None;
        let mut max_deleted = None;
        let mut i = 3;
        while i < args.len() {
            if args[i].eq_ignore_ascii_case(b"entriesadded") && i + 1 < args.len() {
                let n = int(&args[i + 1])?;
                if n < 0 {
                    return Err(Reply::err("entries_added must be positive"));
                }
                entries_added = Some(n as u64);
                i += 2;
            } else if args[i].eq_ignore_ascii_case(b"maxdeletedid") && i + 1 < args.len() {
                let m = parse_id(&args[i + 1], 0, true)?;
                if id < m {
                    return Err(Reply::err(
                        "The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
                    ));
                }
                max_deleted = Some(m);
                i += 2;
            } else {
                return Err(syntax_error());
            }
        }
        let Some(stream) = self.stream.as_ref() else {
            return Err(Reply::err("no such key"));
        };
        if let Some(last) = stream.last_entry_id() {
            if id < last {
                return Err(Reply::err(
                    "The ID specified in XSETID is smaller than the target stream top item",
                ));
            }
            if entries_added.is_some_and(|n| n < stream.len()) {
                return Err(Reply::err(
                    "The entries_added specified in XSETID is smaller than the target stream length",
                ));
            }
        }
        let max_deleted = max_deleted.filter(|m| *m != StreamId::MIN);
        let op = Op::SetId {
            last_id: id,
            entries_added: entries_added.unwrap_or(stream.entries_added()),
            max_deleted_id: max_deleted.unwrap_or(stream.max_deleted_id()),
        };
        let ticket = self.log(op.clone()).map_err(|e| storage_error(&e))?;
        if let (
            Some(s),
            Op::SetId {
                last_id,
                entries_added,
                max_deleted_id,
            },
        ) = (self.stream.as_mut(), op)
        {
            s.set_last_id(last_id);
            s.set_counters(entries_added, max_deleted_id);
        }
        Ok(Answer {
            reply: Reply::OK,
            durable: Some(ticket),
        })
    }
}

impl StreamActor {
    /// The evicted entries a group command or `XINFO` with these
    /// arguments may read (a superset: what it reads depends on checks
    /// made when it runs), to fetch them before it runs.
    pub(super) fn plan_group_reads(&self, name: &str, args: &[Bytes]) -> Vec<(StreamId, Loc)> {
        let Some(stream) = self.stream.as_ref() else {
            return Vec::new();
        };
        let justid = || args.iter().any(|a| a.eq_ignore_ascii_case(b"justid"));
        match name {
            "xclaim" if args.len() > 5 && !justid() => {
                let ids: Vec<StreamId> = args[5..]
                    .iter()
                    .map_while(|a| parse_id(a, 0, true).ok())
                    .collect();
                stream.missing_of(&ids)
            }
            "xautoclaim" if args.len() > 5 && !justid() => {
                let (Some(g), Ok((start, _))) =
                    (stream.groups.get(&args[2]), parse_range(&args[5], b"+"))
                else {
                    return Vec::new();
                };
                let count = args
                    .iter()
                    .position(|a| a.eq_ignore_ascii_case(b"count"))
                    .and_then(|i| args.get(i + 1))
                    .and_then(|n| parse_int(n))
                    .filter(|n| (1..=i64::MAX / 16).contains(n))
                    .map_or(100, |n| n as usize);
                // XAUTOCLAIM looks at ten pending entries per one it may
                // claim.
                stream.missing_of(
                    g.pel
                        .range(start..)
                        .take(count.saturating_mul(10))
                        .map(|(id, _)| id),
                )
            }
            "xinfo" if args.len() > 2 && args[1].eq_ignore_ascii_case(b"stream") => {
                let mut ids: Vec<StreamId> = stream
                    .first_entry_id()
                    .into_iter()
                    .chain(stream.last_entry_id())
                    .collect();
                if args.len() > 3 && args[3].eq_ignore_ascii_case(b"full") {
                    let n = match args.get(5).and_then(|n| parse_int(n)) {
                        Some(n) if n >= 0 => n as u64,
                        _ => 10,
                    };
                    let count = (n != 0).then_some(n);
                    ids.extend(
                        stream
                            .missing_in_range(StreamId::MIN, StreamId::MAX, count, false)
                            .into_iter()
                            .map(|(id, _)| id),
                    );
                }
                stream.missing_of(&ids)
            }
            _ => Vec::new(),
        }
    }

    /// The evicted entries an `XREADGROUP` of one stream reads.
    pub(super) fn plan_read_group(
        &self,
        group: &[u8],
        consumer: &[u8],
        from: &GroupFrom,
        count: Option<u64>,
    ) -> Vec<(StreamId, Loc)> {
        let Some(stream) = self.stream.as_ref() else {
            return Vec::new();
        };
        let Some(g) = stream.groups.get(group) else {
            return Vec::new();
        };
        match from {
            GroupFrom::New => match g.last_id.next() {
                Some(lo) => stream.missing_in_range(lo, StreamId::MAX, count, false),
                None => Vec::new(),
            },
            GroupFrom::History(raw) => {
                let (Ok(after), Some(c)) = (parse_id(raw, 0, true), g.consumers.get(consumer))
                else {
                    return Vec::new();
                };
                let take = count.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
                stream.missing_of(c.pel.range(after..).filter(|id| **id > after).take(take))
            }
        }
    }
}
