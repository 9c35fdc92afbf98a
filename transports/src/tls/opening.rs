//! A connection's first records after its handshake, protected by rustls
//! itself (its unbuffered API's traffic states), until the connection has
//! carried enough of them to pay for the record layer's own keys.
//!
//! The record layer ([`super::record`]) takes the traffic keys from rustls,
//! which derives them once more from the traffic secrets: four HKDF-Expand-
//! Label calls, about 43,000 instructions with SHA-384, a few percent of a
//! whole handshake. Its records then cost less than rustls's (rustls copies
//! each received record's plaintext into an allocation of its own, and
//! each sent record into a fresh one before the send buffer). A connection
//! that carries a request and its answer and closes never pays back the
//! derivation, so the keys are taken only after
//! [`HAND_OVER_AFTER_RECORDS`] records of data, at a point where rustls
//! holds nothing: no plaintext, no records to send, no handshake message
//! split over records.
//!
//! Such a point is right after rustls encrypted data of ours. A TLS 1.3
//! peer may ask for a key update of ours; rustls answers it just before
//! the next data it encrypts (RFC 8446 §4.6.3 asks no sooner), holding the
//! answer, sealed under the old key, where taking the keys would not see
//! it. A TLS 1.2 connection has no key updates, and hands over on a read
//! as well.
//!
//! rustls is offered whole records one at a time, as in the handshake,
//! and is idle whenever a read or a write returns: a write reads nothing
//! (it never fails for what the peer sent), a record that fails never
//! costs the plaintext before it, and what rustls still holds once idle
//! (the records of a handshake message it has not all seen) is exactly
//! what it was offered and did not drop.
//!
//! One difference from the record layer is rustls's own: once we sent
//! `close_notify`, a record from the peer that rustls refuses trips a
//! debug assertion of rustls's (it has said its last alert), which panics
//! in a debug build; the connection's task catches it as any panic. A
//! release build sends no alert and fails the connection.

use bytes::BytesMut;
use rustls::unbuffered::{ConnectionState, EncryptError, WriteTraffic};

use super::record::Read;
use super::{encode, Handshake, Phase, TlsFailure, TlsState};

/// Records of data (sent and received) a connection carries under rustls's
/// own protection before the record layer takes its keys.
pub(super) const HAND_OVER_AFTER_RECORDS: u32 = 16;

/// Bytes of room per record, past its plaintext, asked for a record rustls
/// encrypts (header, content type, tag, TLS 1.2's explicit nonce).
const RECORD_OVERHEAD: usize = 64;

/// What a write asks of rustls's traffic state.
#[derive(Clone, Copy)]
enum Write<'p> {
    /// Nothing: the call reads what records are at hand.
    Nothing,
    Data(&'p [u8]),
    CloseNotify,
}

/// Where rustls stands after one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// It has more to give: call again.
    Continue,
    /// It may send data (and did what was asked): it took every record it
    /// was offered.
    Idle,
    /// The peer's `close_notify` came (every record before it was read).
    PeerClosed,
    /// Both sides sent `close_notify`: nothing more is read or written.
    Closed,
}

/// Asks `encrypt` to write into `out`'s spare room, growing it to the size
/// rustls asks for if it has too little.
fn write_records(
    out: &mut BytesMut,
    min: usize,
    mut encrypt: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<(), TlsFailure> {
    let len = out.len();
    let mut room = min;
    for _ in 0..2 {
        out.resize(len + room, 0);
        match encrypt(&mut out[len..]) {
            Ok(n) => {
                out.truncate(len + n);
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(e)) => room = e.required_size,
            Err(e) => {
                out.truncate(len);
                return Err(TlsFailure::Protocol(e.to_string()));
            }
        }
    }
    out.truncate(len);
    Err(TlsFailure::Protocol(
        "rustls asked for ever more room to encrypt a record".into(),
    ))
}

/// Does what `write` asks with rustls's write side.
fn on_writable<Data>(
    traffic: &mut WriteTraffic<'_, Data>,
    write: Write<'_>,
    out: &mut BytesMut,
    records: &mut u32,
) -> Result<(), TlsFailure> {
    match write {
        Write::Nothing => Ok(()),
        Write::Data(plain) => {
            let count = plain.len().div_ceil(super::record::MAX_PLAINTEXT).max(1);
            let min = plain.len() + count * RECORD_OVERHEAD;
            write_records(out, min, |room| traffic.encrypt(plain, room))?;
            *records = records.saturating_add(u32::try_from(count).unwrap_or(u32::MAX));
            Ok(())
        }
        Write::CloseNotify => write_records(out, RECORD_OVERHEAD, |room| {
            traffic.queue_close_notify(room)
        }),
    }
}

/// Where one call on rustls puts what it gives.
struct Given<'a> {
    /// Records to send.
    out: &'a mut BytesMut,
    /// Plaintext read.
    plain: &'a mut BytesMut,
    /// Records of data carried.
    records: &'a mut u32,
    /// Bytes a record read asks to drop besides the call's own (none in
    /// rustls 0.23, which copies the plaintext out).
    discard: &'a mut usize,
    /// Set when rustls sends a record of its own (not data of ours): after
    /// a TLS 1.2 handshake, only its refusal of a renegotiation (or a
    /// fatal alert, which ends the connection).
    refused: &'a mut bool,
}

/// Acts on one state of rustls's connection after the handshake.
fn on_state<Data>(
    state: Result<ConnectionState<'_, '_, Data>, rustls::Error>,
    write: Write<'_>,
    given: Given<'_>,
) -> Result<Next, TlsFailure> {
    let protocol = |e: rustls::Error| TlsFailure::Protocol(e.to_string());
    let Given {
        out,
        plain,
        records,
        discard,
        refused,
    } = given;
    Ok(match state.map_err(protocol)? {
        ConnectionState::EncodeTlsData(mut enc) => {
            encode(&mut enc, out).map_err(protocol)?;
            *refused = true;
            Next::Continue
        }
        ConnectionState::TransmitTlsData(transmit) => {
            // The records are on `out`, sent in order with what follows.
            transmit.done();
            Next::Continue
        }
        ConnectionState::ReadTraffic(mut read) => {
            while let Some(record) = read.next_record() {
                let record = record.map_err(protocol)?;
                plain.extend_from_slice(record.payload);
                *discard += record.discard;
                *records = records.saturating_add(1);
            }
            Next::Continue
        }
        ConnectionState::WriteTraffic(mut traffic) => {
            on_writable(&mut traffic, write, out, records)?;
            Next::Idle
        }
        ConnectionState::PeerClosed => Next::PeerClosed,
        ConnectionState::Closed => Next::Closed,
        _ => {
            return Err(TlsFailure::Protocol(
                "an unexpected state of a TLS connection after its handshake".into(),
            ));
        }
    })
}

impl TlsState {
    /// One call on rustls over the records it was offered (`hs_offered`,
    /// whole records, as in the handshake); `write` is done once rustls
    /// has given all it holds (`Next::Idle`).
    fn opening_step(&mut self, write: Write<'_>) -> Result<Next, TlsFailure> {
        let Phase::Opening(conn) = &mut self.phase else {
            return Err(TlsFailure::Protocol(
                "the TLS connection left rustls's records".into(),
            ));
        };
        let mut record_discard = 0;
        let given = Given {
            out: &mut self.records_out,
            plain: &mut self.early_plain,
            records: &mut self.records_carried,
            discard: &mut record_discard,
            refused: &mut self.opening_sent_unasked,
        };
        let offered = &mut self.cipher_in[..self.hs_offered];
        let (discard, next) =
            process_records!(&mut **conn, offered, |state| on_state(state, write, given));
        self.drop_offered(discard + record_discard);
        next
    }

    /// Calls rustls until it is idle (or the connection ended), then does
    /// `write`. A failure queues rustls's alert.
    fn opening_until_idle(&mut self, write: Write<'_>) -> Result<Next, TlsFailure> {
        loop {
            match self.opening_step(write) {
                Ok(Next::Continue) => {}
                Ok(next) => return Ok(next),
                Err(failure) => {
                    self.queue_rustls_alert();
                    return Err(failure);
                }
            }
        }
    }

    /// The connection has carried enough records for the record layer to
    /// take the keys, and rustls, idle, holds none of what it was offered
    /// (it keeps the records of a handshake message it has not all seen).
    /// The caller knows that rustls holds no key update to send.
    fn may_hand_over(&self) -> bool {
        self.records_carried >= self.hand_over_after
            && !self.opening_peer_closed
            && !self.opening_close_notify_sent
            && self.hs_offered == 0
    }

    /// On a TLS 1.2 connection, gives the connection to the record layer
    /// if it is time (rustls is idle after every read); `Ok(true)` if it
    /// did.
    fn hand_over_on_read_if_due(&mut self) -> Result<bool, TlsFailure> {
        if self.info.version != Some(rustls::ProtocolVersion::TLSv1_2) || !self.may_hand_over() {
            return Ok(false);
        }
        self.start_traffic()?;
        Ok(true)
    }

    /// Decrypted bytes into `buf` while rustls protects the records.
    /// rustls is offered one more whole record once it has taken the last
    /// and its plaintext is given: it is idle whenever a read returns, and
    /// a record that fails never costs the plaintext before it.
    pub(super) fn opening_read(&mut self, buf: &mut BytesMut) -> Result<Read, TlsFailure> {
        loop {
            if let Some(read) = self.take_early_plain(buf) {
                return Ok(read);
            }
            if self.opening_peer_closed {
                return Ok(Read::End);
            }
            if self.hand_over_on_read_if_due()? {
                return self.traffic_read(buf);
            }
            match self.opening_until_idle(Write::Nothing)? {
                Next::PeerClosed | Next::Closed => {
                    self.opening_peer_closed = true;
                    continue;
                }
                Next::Idle | Next::Continue => {}
            }
            if !self.early_plain.is_empty() {
                continue;
            }
            if let Err(failure) = self.offer_next_record() {
                self.queue_rustls_alert();
                return Err(failure);
            }
            if !self.hs_grew {
                return Ok(Read::NeedMore);
            }
        }
    }

    /// Encrypts `plain` into records to send while rustls protects them,
    /// then hands over if it is time: rustls has just sent every record it
    /// held.
    pub(super) fn opening_encrypt(&mut self, plain: &[u8]) -> Result<(), TlsFailure> {
        if plain.is_empty() && !self.opening_close_notify_sent {
            return Ok(());
        }
        self.opening_write(Write::Data(plain))?;
        if self.may_hand_over() {
            self.start_traffic()?;
        }
        Ok(())
    }

    /// Queues `close_notify` while rustls protects the records.
    pub(super) fn opening_close_notify(&mut self) -> Result<(), TlsFailure> {
        if self.opening_close_notify_sent {
            return Ok(());
        }
        self.opening_write(Write::CloseNotify)?;
        self.opening_close_notify_sent = true;
        Ok(())
    }

    /// Calls rustls until it lets `write` be done, then does it. rustls
    /// is offered no more records here (every one offered was taken when
    /// the last read returned): a write never reads, nor fails for what
    /// the peer sent.
    fn opening_write(&mut self, write: Write<'_>) -> Result<(), TlsFailure> {
        let closed = || TlsFailure::Protocol("data written after close_notify".into());
        if self.opening_close_notify_sent {
            return Err(closed());
        }
        // The peer's end does not end ours: rustls, asked again after it
        // said so, lets us write.
        for _ in 0..2 {
            match self.opening_until_idle(write)? {
                Next::Idle => return Ok(()),
                Next::PeerClosed => self.opening_peer_closed = true,
                Next::Closed | Next::Continue => return Err(closed()),
            }
        }
        Err(closed())
    }
}
