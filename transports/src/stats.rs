//! Per-shard server counters: [`ServerStats`], read while the server runs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::session::CloseKind;

/// One shard's counters (atomics: a connection's shard writes them, any
/// thread reads).
#[derive(Debug, Default)]
pub(crate) struct ShardCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) attached_in: AtomicU64,
    pub(crate) handed_off: AtomicU64,
    pub(crate) frames_in: AtomicU64,
    pub(crate) recv_ops: AtomicU64,
    pub(crate) send_ops: AtomicU64,
    pub(crate) io_off_owner: AtomicU64,
    pub(crate) accept_paused: AtomicU64,
    pub(crate) accept_errors: AtomicU64,
    pub(crate) pushes_delivered: AtomicU64,
    pub(crate) push_dead_letters: AtomicU64,
    pub(crate) pushes_dropped: AtomicU64,
    pub(crate) direct_refused: AtomicU64,
    pub(crate) tls_handshakes: AtomicU64,
    pub(crate) handshakes_moved: AtomicU64,
    /// Connections running on the shard now (a gauge).
    pub(crate) open: AtomicU64,
    pub(crate) balanced_away: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    closed: [AtomicU64; CloseKind::ALL.len()],
}

impl ShardCounters {
    pub(crate) fn closed(&self, kind: CloseKind) -> &AtomicU64 {
        &self.closed[kind.index()]
    }

    pub(crate) fn snapshot(&self) -> SessionShardStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SessionShardStats {
            accepted: get(&self.accepted),
            attached: get(&self.attached_in),
            handed_off: get(&self.handed_off),
            frames_in: get(&self.frames_in),
            recv_ops: get(&self.recv_ops),
            send_ops: get(&self.send_ops),
            io_off_owner: get(&self.io_off_owner),
            accept_paused: get(&self.accept_paused),
            accept_errors: get(&self.accept_errors),
            pushes_delivered: get(&self.pushes_delivered),
            push_dead_letters: get(&self.push_dead_letters),
            pushes_dropped: get(&self.pushes_dropped),
            direct_refused: get(&self.direct_refused),
            tls_handshakes: get(&self.tls_handshakes),
            handshakes_moved: get(&self.handshakes_moved),
            open: get(&self.open),
            balanced_away: get(&self.balanced_away),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            closed: std::array::from_fn(|i| get(&self.closed[i])),
        }
    }
}

/// A snapshot of one shard's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionShardStats {
    /// Connections this shard's listener accepted.
    pub accepted: u64,
    /// Sessions that attached here: their key's shard is this one (moved
    /// in, or accepted here with a key of this shard).
    pub attached: u64,
    /// Connections that left this shard for their key's shard.
    pub handed_off: u64,
    /// Frames handled here.
    pub frames_in: u64,
    /// Receives submitted for sessions on this shard.
    pub recv_ops: u64,
    /// Sends submitted for sessions on this shard.
    pub send_ops: u64,
    /// Receives and sends of a session submitted from a shard other than
    /// its own (always 0: the check that I/O follows the connection).
    pub io_off_owner: u64,
    /// Times the listener stopped accepting at its connection limit.
    pub accept_paused: u64,
    /// Failed accepts (e.g. out of descriptors).
    pub accept_errors: u64,
    /// Pushes queued for a session of this shard (one per session
    /// reached); one its connection ended before it ran counts in
    /// `pushes_dropped` as well.
    pub pushes_delivered: u64,
    /// Pushes to a key with no live session on this shard, its shard.
    pub push_dead_letters: u64,
    /// Pushes a session of this shard did not run: its queue of pushes
    /// was full ([`ServerConfig::push_queue`](crate::ServerConfig::push_queue)),
    /// or its connection ended before it got to them (one per session).
    pub pushes_dropped: u64,
    /// Connections that stayed or became plain descriptors under
    /// `HandOff::Direct` (no table, or the table full: this shard's when
    /// accepted, the owner's when moved).
    pub direct_refused: u64,
    /// TLS handshakes completed by this shard's listener (failed ones are
    /// counted under [`CloseKind::Tls`]).
    pub tls_handshakes: u64,
    /// Fresh TLS connections this shard's listener handed to a less busy
    /// shard for their handshake.
    pub handshakes_moved: u64,
    /// Connections running on this shard now (a gauge: those that moved
    /// here count, those that moved away or closed do not).
    pub open: u64,
    /// Fresh plain connections this shard's listener handed to a less
    /// loaded shard ([`ServerConfig::balance_plain_connections`](crate::ServerConfig::balance_plain_connections)).
    pub balanced_away: u64,
    /// Bytes received from the connections of this shard, as their
    /// sessions read them (a TLS connection's once decrypted).
    pub bytes_in: u64,
    /// Bytes sent to them (a TLS connection's before encryption).
    pub bytes_out: u64,
    closed: [u64; CloseKind::ALL.len()],
}

impl SessionShardStats {
    /// Connections closed on this shard for reasons of `kind`.
    pub fn closed(&self, kind: CloseKind) -> u64 {
        self.closed[kind.index()]
    }
}

/// Counters of a server, per shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// One entry per shard, by index.
    pub shards: Vec<SessionShardStats>,
}

impl ServerStats {
    /// Connections closed for reasons of `kind`, over all shards.
    pub fn closed(&self, kind: CloseKind) -> u64 {
        self.shards.iter().map(|s| s.closed(kind)).sum()
    }

    /// Sum of a counter over all shards.
    pub fn total(&self, field: impl Fn(&SessionShardStats) -> u64) -> u64 {
        self.shards.iter().map(field).sum()
    }
}
