//! The broker's live connections as `CLIENT LIST` shows them and `CLIENT
//! KILL` ends them: each session keeps a card here, readable from every
//! shard, with what it changes rarely (name, protocol, transaction,
//! blocked) and its last command, and a handle that closes its connection
//! from anywhere.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use mailring_transports::SessionCloser;

use crate::actor::Notify;
use crate::command::{self, COMMANDS, SUBCOMMANDS};
use crate::resp::{parse_int, Reply};
use crate::server::Shared;

/// Every live connection's card, by client id (Redis lists its clients
/// in the order they connected: ids ascend).
#[derive(Debug, Default)]
pub(crate) struct Clients {
    by_id: Mutex<BTreeMap<u64, Arc<ClientCard>>>,
    /// Commands of the connections that ended.
    retired_commands: AtomicU64,
}

impl Clients {
    fn cards(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ClientCard>>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, card: Arc<ClientCard>) {
        self.cards().insert(card.id, card);
    }

    pub(crate) fn remove(&self, id: u64) {
        if let Some(card) = self.cards().remove(&id) {
            self.retired_commands
                .fetch_add(card.commands.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Commands received since the broker started (`INFO`'s
    /// `total_commands_processed`).
    pub(crate) fn commands(&self) -> u64 {
        let cards = self.cards();
        let live: u64 = cards
            .values()
            .map(|c| c.commands.load(Ordering::Relaxed))
            .sum();
        live + self.retired_commands.load(Ordering::Relaxed)
    }

    /// Every card, in id order.
    pub(crate) fn all(&self) -> Vec<Arc<ClientCard>> {
        self.cards().values().cloned().collect()
    }

    /// The card of client `id`.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<ClientCard>> {
        self.cards().get(&id).cloned()
    }
}

/// What `CLIENT LIST` shows of one connection. Its session writes it; any
/// session reads it.
#[derive(Debug)]
pub(crate) struct ClientCard {
    pub(crate) id: u64,
    /// Set when the connection opens.
    peer: OnceLock<SocketAddr>,
    /// The address it was accepted on (set when it opens).
    local: OnceLock<SocketAddr>,
    opened: Instant,
    /// Closes the connection from any shard (set when it opens).
    closer: OnceLock<SessionCloser>,
    name: Mutex<Option<Bytes>>,
    /// 2 or 3.
    resp: AtomicU8,
    /// Commands queued in `MULTI`, or -1 outside one.
    multi: AtomicI64,
    blocked: AtomicBool,
    /// The wake-up of the read it is blocked on, for `CLIENT UNBLOCK`.
    blocked_on: Mutex<Option<std::sync::Weak<Notify>>>,
    /// The last command named (see [`command_code`]).
    command: AtomicU16,
    /// Commands named so far (written by its session only).
    commands: AtomicU64,
    /// Milliseconds from `opened` to the last run of requests handled.
    seen_ms: AtomicU64,
}

impl ClientCard {
    pub(crate) fn new(id: u64) -> Self {
        ClientCard {
            id,
            peer: OnceLock::new(),
            local: OnceLock::new(),
            opened: Instant::now(),
            closer: OnceLock::new(),
            name: Mutex::new(None),
            resp: AtomicU8::new(2),
            multi: AtomicI64::new(-1),
            blocked: AtomicBool::new(false),
            blocked_on: Mutex::new(None),
            command: AtomicU16::new(0),
            commands: AtomicU64::new(0),
            seen_ms: AtomicU64::new(0),
        }
    }

    /// The connection opened, from `peer` to `local` (if the transport
    /// has them); `closer` ends it.
    pub(crate) fn open(
        &self,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
        closer: SessionCloser,
    ) {
        if let Some(peer) = peer {
            let _ = self.peer.set(peer);
        }
        if let Some(local) = local {
            let _ = self.local.set(local);
        }
        let _ = self.closer.set(closer);
    }

    /// Closes the connection (at once, from any shard): `true` for the
    /// call that did.
    fn close(&self) -> bool {
        self.closer.get().is_some_and(SessionCloser::close)
    }

    pub(crate) fn set_name(&self, name: Option<Bytes>) {
        *self.name.lock().unwrap_or_else(|p| p.into_inner()) = name;
    }

    /// The protocol and the transaction as the session has them now.
    pub(crate) fn mirror(&self, resp: u8, multi: Option<usize>) {
        self.resp.store(resp, Ordering::Relaxed);
        self.multi
            .store(multi.map_or(-1, |n| n as i64), Ordering::Relaxed);
    }

    /// The session handles command `args` (`row`: its row in
    /// [`COMMANDS`], if known).
    pub(crate) fn note_command(&self, row: Option<usize>, args: &[Bytes]) {
        self.command
            .store(command_code(row, args), Ordering::Relaxed);
        // One writer: a load and a store, no locked increment.
        let n = self.commands.load(Ordering::Relaxed);
        self.commands.store(n + 1, Ordering::Relaxed);
    }

    /// The session handled a run of requests now.
    pub(crate) fn touch(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.seen_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn set_blocked(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::Relaxed);
    }

    /// Its blocked read waits on `notify` now (`CLIENT UNBLOCK` fires it).
    pub(crate) fn blocks_on(&self, notify: &Arc<Notify>) {
        *self.blocked_on.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(notify));
    }

    /// `CLIENT UNBLOCK`: ends the read this client is blocked on, as if
    /// its time ran out (or with the `UNBLOCKED` error: the reason rides
    /// on the wake-up, so a read that ends otherwise meanwhile never
    /// answers it); whether it was blocked (a read served or timed out
    /// first is not).
    fn unblock(&self, with_error: bool) -> bool {
        let notify = self
            .blocked_on
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(std::sync::Weak::upgrade);
        let Some(notify) = notify.filter(|_| self.blocked.load(Ordering::Relaxed)) else {
            return false;
        };
        notify.fire_first(if with_error {
            Shared::UNBLOCKED_WITH_ERROR
        } else {
            Shared::UNBLOCKED
        })
    }

    /// The address it was accepted on (`CLIENT LIST`'s and `CLIENT KILL
    /// LADDR`'s `laddr`), else `listening`.
    fn laddr(&self, listening: SocketAddr) -> SocketAddr {
        self.local.get().copied().unwrap_or(listening)
    }

    /// The address `CLIENT LIST` and `CLIENT KILL ADDR` name it by.
    pub(crate) fn addr(&self) -> String {
        self.peer
            .get()
            .map_or_else(|| "?".to_owned(), |a| a.to_string())
    }

    /// Its line in `CLIENT LIST` / `CLIENT INFO`, in Redis 7.0's fields
    /// (what the broker does not keep is 0; a connection may have no
    /// process descriptor: `fd=-1`), `listening` the address listened on
    /// (its `laddr` when the transport gave none).
    pub(crate) fn line(&self, listening: SocketAddr) -> String {
        let laddr = self.laddr(listening);
        let name = self
            .name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        let multi = self.multi.load(Ordering::Relaxed);
        let flags = match (multi >= 0, self.blocked.load(Ordering::Relaxed)) {
            (true, true) => "xb",
            (true, false) => "x",
            (false, true) => "b",
            (false, false) => "N",
        };
        let age = self.opened.elapsed();
        let idle_ms = (age.as_millis() as u64).saturating_sub(self.seen_ms.load(Ordering::Relaxed));
        format!(
            "id={} addr={} laddr={laddr} fd=-1 name={name} age={} idle={} flags={flags} db=0 sub=0 psub=0 ssub=0 multi={multi} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={}\n",
            self.id,
            self.addr(),
            age.as_secs(),
            idle_ms / 1000,
            command_name(self.command.load(Ordering::Relaxed)),
            self.resp.load(Ordering::Relaxed),
        )
    }
}

/// Marks its client blocked while it lives (a blocked read's wait).
pub(crate) struct BlockedMark(Arc<ClientCard>);

impl BlockedMark {
    pub(crate) fn new(card: Arc<ClientCard>) -> Self {
        card.set_blocked(true);
        BlockedMark(card)
    }

    pub(crate) fn card(&self) -> &ClientCard {
        &self.0
    }
}

impl Drop for BlockedMark {
    fn drop(&mut self) {
        self.0.set_blocked(false);
    }
}

/// `CLIENT UNBLOCK <id> [TIMEOUT|ERROR]`, as Redis 7.0 checks it: the
/// reason first, then the id; `1` if that client was blocked and is not
/// any more.
pub(crate) fn unblock(clients: &Clients, args: &[Bytes]) -> Reply {
    if args.len() > 4 {
        return command::subcommand_syntax_error("client", &args[1]);
    }
    let with_error = match args.get(3) {
        None => false,
        Some(r) if r.eq_ignore_ascii_case(b"timeout") => false,
        Some(r) if r.eq_ignore_ascii_case(b"error") => true,
        Some(_) => return Reply::err("CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
    };
    let id = match command::int_arg(&args[2]) {
        Ok(id) => id,
        Err(e) => return e,
    };
    let unblocked = u64::try_from(id)
        .ok()
        .and_then(|id| clients.get(id))
        .is_some_and(|card| card.unblock(with_error));
    Reply::Int(i64::from(unblocked))
}

/// `CLIENT LIST [TYPE type | ID id [id ...]]`, as Redis 7.0 reads it;
/// `laddr` is the address listened on (a connection's own when the
/// transport gave none).
pub(crate) fn list(clients: &Clients, args: &[Bytes], laddr: SocketAddr) -> Reply {
    let cards = match args.len() {
        2 => clients.all(),
        4 if args[2].eq_ignore_ascii_case(b"type") => match client_type(&args[3]) {
            Ok(true) => clients.all(),
            Ok(false) => Vec::new(),
            Err(e) => return e,
        },
        n if n >= 4 && args[2].eq_ignore_ascii_case(b"id") => {
            let mut cards = Vec::new();
            for raw in &args[3..] {
                let Some(id) = parse_int(raw) else {
                    return Reply::err("Invalid client ID");
                };
                cards.extend(u64::try_from(id).ok().and_then(|id| clients.get(id)));
            }
            cards
        }
        _ => return command::syntax_error(),
    };
    Reply::Verbatim(cards.iter().map(|c| c.line(laddr)).collect())
}

/// Whether clients of type `raw` are the broker's (every client is
/// `normal`: it has no replicas, masters or subscribers), or Redis's
/// error for a type it does not know.
fn client_type(raw: &[u8]) -> Result<bool, Reply> {
    let t = raw.to_ascii_lowercase();
    match t.as_slice() {
        b"normal" => Ok(true),
        b"master" | b"slave" | b"replica" | b"pubsub" => Ok(false),
        _ => Err(Reply::error_bytes(&[
            b"ERR Unknown client type '",
            command::c_string(raw),
            b"'",
        ])),
    }
}

/// What `CLIENT KILL` did: its reply, and whether the asking client is
/// among those killed (it closes once the reply is written, as Redis's).
pub(crate) struct Killed {
    pub(crate) reply: Reply,
    pub(crate) me: bool,
}

/// `CLIENT KILL addr` (Redis's old form: every client at that address,
/// the asking one too; `OK`, or an error when none is) and `CLIENT KILL
/// <filter> <value> ...` (`ID`, `TYPE`, `USER`, `ADDR`, `LADDR`,
/// `SKIPME`: the clients matching every filter, the asking one `me` only
/// with `SKIPME no`; their count). `laddr` is the address listened on
/// (a connection's own when the transport gave none).
pub(crate) fn kill(clients: &Clients, me: u64, args: &[Bytes], laddr: SocketAddr) -> Killed {
    let refused = |reply| Killed { reply, me: false };
    if args.len() == 3 {
        let (killed, me_too) = kill_matching(clients, me, false, |card| {
            card.addr().as_bytes() == args[2].as_ref()
        });
        return Killed {
            reply: if killed == 0 {
                Reply::err("No such client")
            } else {
                Reply::OK
            },
            me: me_too,
        };
    }
    let mut id = None;
    let mut any_type = true;
    let mut addr = None;
    let mut local = None;
    let mut skip_me = true;
    // Read in order, as Redis reads them: a filter's own error comes
    // before a missing value further on.
    for pair in args[2..].chunks(2) {
        let [filter, value] = pair else {
            return refused(command::syntax_error());
        };
        match filter.to_ascii_lowercase().as_slice() {
            b"id" => match parse_int(value) {
                Some(n) if n >= 1 => id = Some(n as u64),
                _ => return refused(Reply::err("client-id should be greater than 0")),
            },
            b"type" => match client_type(value) {
                Ok(t) => any_type = t,
                Err(e) => return refused(e),
            },
            b"user" => {
                if value.as_ref() != b"default" {
                    return refused(Reply::error_bytes(&[
                        b"ERR No such user '",
                        command::c_string(value),
                        b"'",
                    ]));
                }
            }
            b"addr" => addr = Some(value.clone()),
            b"laddr" => local = Some(value.clone()),
            b"skipme" => {
                skip_me = if value.eq_ignore_ascii_case(b"yes") {
                    true
                } else if value.eq_ignore_ascii_case(b"no") {
                    false
                } else {
                    return refused(command::syntax_error());
                }
            }
            _ => return refused(command::syntax_error()),
        }
    }
    let (killed, me_too) = kill_matching(clients, me, skip_me, |card| {
        any_type
            && id.is_none_or(|id| card.id == id)
            && addr
                .as_ref()
                .is_none_or(|a| card.addr().as_bytes() == a.as_ref())
            && local
                .as_ref()
                .is_none_or(|l| card.laddr(laddr).to_string().as_bytes() == l.as_ref())
    });
    Killed {
        reply: Reply::Int(killed),
        me: me_too,
    }
}

/// Closes every open connection whose card `matches` (the asking one,
/// `me`, only noted: it closes after its reply; skipped with `skip_me`):
/// how many, and whether `me` is among them.
fn kill_matching(
    clients: &Clients,
    me: u64,
    skip_me: bool,
    matches: impl Fn(&ClientCard) -> bool,
) -> (i64, bool) {
    let mut killed = 0;
    let mut me_too = false;
    for card in clients.all() {
        if (skip_me && card.id == me) || !matches(&card) {
            continue;
        }
        if card.id == me {
            killed += 1;
            me_too = true;
        } else if card.close() {
            // Counted by the call that closed it (not one that already
            // ended, nor one another kill closed first).
            killed += 1;
        }
    }
    (killed, me_too)
}

/// A command as a number (`0`: none, Redis's `NULL`, as after an unknown
/// command or subcommand; then the table's commands; then its
/// subcommands), so that a session notes each command with one store.
fn command_code(row: Option<usize>, args: &[Bytes]) -> u16 {
    let Some(spec) = row.and_then(|at| COMMANDS.get(at)) else {
        return 0;
    };
    if command::has_subcommands(spec.name) && args.len() >= 2 {
        return SUBCOMMANDS
            .iter()
            .position(|(c, s, _)| *c == spec.name && args[1].eq_ignore_ascii_case(s.as_bytes()))
            .map_or(0, |i| (1 + COMMANDS.len() + i) as u16);
    }
    (1 + row.unwrap_or(0)) as u16
}

/// [`command_code`]'s name, as `CLIENT LIST`'s `cmd` writes it.
fn command_name(code: u16) -> String {
    let code = usize::from(code);
    match code.checked_sub(1) {
        None => "NULL".to_owned(),
        Some(at) if at < COMMANDS.len() => COMMANDS[at].name.to_owned(),
        Some(at) => SUBCOMMANDS
            .get(at - COMMANDS.len())
            .map_or_else(|| "NULL".to_owned(), |(c, s, _)| format!("{c}|{s}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_and_subcommand_is_named_back() {
        for spec in COMMANDS {
            // Alone, a container is named as itself (its arity error).
            let row = command::lookup_row(spec.name.to_ascii_uppercase().as_bytes());
            let code = command_code(row, &[Bytes::from_static(spec.name.as_bytes())]);
            assert_eq!(command_name(code), spec.name);
        }
        for (c, s, _) in SUBCOMMANDS {
            let row = command::lookup_row(c.as_bytes());
            let args = [
                Bytes::from_static(c.as_bytes()),
                Bytes::from(s.to_ascii_uppercase()),
            ];
            assert_eq!(command_name(command_code(row, &args)), format!("{c}|{s}"));
        }
        let client = command::lookup_row(b"client");
        let unknown = [Bytes::from_static(b"client"), Bytes::from_static(b"nope")];
        assert_eq!(command_name(command_code(client, &unknown)), "NULL");
        assert_eq!(command_name(command_code(None, &unknown)), "NULL");
    }
}
