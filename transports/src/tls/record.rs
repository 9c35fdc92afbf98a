//! The record layer of a TLS connection once its handshake is done.
//!
//! rustls runs the handshake; then the connection becomes a rustls
//! `KernelConnection` (the API meant for kTLS), which keeps only what
//! needs rustls later: new traffic secrets at a key update, and session
//! tickets a server sends a client. Records are protected here with the
//! negotiated suite's own rustls encrypter and decrypter:
//!
//! - a received record is decrypted where the kernel put it, in the
//!   connection's receive buffer, and its plaintext is copied once, into
//!   the caller's buffer (rustls's buffered API copies the ciphertext into
//!   its own buffer, the plaintext into a queue, then into the caller's);
//! - plaintext is copied once, into the send buffer, where the record is
//!   sealed ([`super::seal`]).
//!
//! What rustls would do after the handshake is done here too: alerts
//! (`close_notify` is the clean end, any other fatal alert fails the
//! connection; a failure of ours sends the fatal alert that says why), the
//! peer's TLS 1.3 key updates (and the answer when it asks for one),
//! session tickets on a client, a refused TLS 1.2 renegotiation, and a key
//! update of our own before the suite's confidentiality limit (TLS 1.2 has
//! none: the connection fails there instead, as rustls's does).

use bytes::{Buf, BytesMut};
use rustls::client::ClientConnectionData;
use rustls::crypto::cipher::{InboundOpaqueMessage, MessageDecrypter, MessageEncrypter};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, ExtractedSecrets, ProtocolVersion,
    SupportedCipherSuite,
};

use super::seal::Sealer;
use super::TlsFailure;

/// A record header: type, version, length.
const HEADER_LEN: usize = 5;
/// The most plaintext one record carries (RFC 8446 §5.1).
pub(super) const MAX_PLAINTEXT: usize = 1 << 14;
/// The most ciphertext one record may carry (TLS 1.2's bound, RFC 5246
/// §6.2.3; TLS 1.3's is 256 bytes past the plaintext).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 2048;
/// TLS 1.3's bound on one record's ciphertext (RFC 8446 §5.2): a longer
/// one is refused with `record_overflow` from its header, before its body
/// is buffered or decrypted.
const MAX_CIPHERTEXT_TLS13: usize = MAX_PLAINTEXT + 256;
/// The most bytes of post-handshake messages held while they are split
/// over records.
const MAX_HANDSHAKE_MESSAGE: usize = 64 << 10;

const HANDSHAKE_HELLO_REQUEST: u8 = 0;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
const ALERT_LEVEL_WARNING: u8 = 1;
/// Key updates taken between two records of data (BoringSSL's and
/// rustls's bound): more is a peer wasting our CPU.
const KEY_UPDATES_BETWEEN_DATA: u8 = 32;
/// Warning alerts taken in a connection's life (the same bound).
const WARNING_ALERTS: u8 = 4;
/// Empty records taken in a row (rustls's bound).
const EMPTY_RECORDS_IN_A_ROW: u8 = 32;
const ALERT_LEVEL_FATAL: u8 = 2;

/// rustls's side of a connection after the handshake.
enum Kernel {
    Server(KernelConnection<ServerConnectionData>),
    Client(KernelConnection<ClientConnectionData>),
}

impl Kernel {
    fn update_tx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Server(k) => k.update_tx_secret(),
            Kernel::Client(k) => k.update_tx_secret(),
        }
    }

    fn update_rx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Server(k) => k.update_rx_secret(),
            Kernel::Client(k) => k.update_rx_secret(),
        }
    }
}

/// The plaintext of the record at the front of the receive buffer,
/// decrypted in place and not yet all taken.
#[derive(Debug, Clone, Copy)]
struct OpenRecord {
    /// Where the plaintext not yet taken starts, in the buffer.
    start: usize,
    /// Where it ends.
    end: usize,
    /// The whole record's length, header included (dropped from the
    /// buffer once its plaintext is taken).
    record_len: usize,
}

/// What a read of records gave.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// This many plaintext bytes went into the caller's buffer (more than
    /// none).
    Plaintext(usize),
    /// The peer ended cleanly (`close_notify`), and every byte before it
    /// was taken.
    End,
    /// No whole record is at hand.
    NeedMore,
}

/// Encrypts and decrypts a connection's records after its handshake.
pub(super) struct RecordLayer {
    kernel: Kernel,
    suite: SupportedCipherSuite,
    sealer: Sealer,
    decrypter: Box<dyn MessageDecrypter>,
    tx_seq: u64,
    rx_seq: u64,
    /// Records sent under one key before a key update (TLS 1.3) or the
    /// end (TLS 1.2).
    tx_limit: u64,
    open: Option<OpenRecord>,
    /// A failure met after plaintext a read gave: said at the next read.
    failed: Option<TlsFailure>,
    /// Post-handshake handshake bytes while a message is split over
    /// records.
    handshake_in: Vec<u8>,
    close_notify_received: bool,
    close_notify_sent: bool,
    /// Key updates the peer may still send before its next data.
    key_updates_left: u8,
    /// A KeyUpdate of ours answering the peer's request is queued and not
    /// taken to be sent yet: a further request is answered by it (one
    /// answer, however many requests come while our sends are blocked).
    answer_queued: bool,
    /// Warning alerts the peer may still send.
    warnings_left: u8,
    /// A TLS 1.2 request to renegotiate was refused once.
    renegotiation_refused: bool,
    /// Empty records the peer may still send before one that is not.
    empty_records_left: u8,
}

impl std::fmt::Debug for RecordLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLayer")
            .field("suite", &self.suite)
            .field("tx_seq", &self.tx_seq)
            .field("rx_seq", &self.rx_seq)
            .finish_non_exhaustive()
    }
}

fn protocol(message: impl Into<String>) -> TlsFailure {
    TlsFailure::Protocol(message.into())
}

fn key_and_iv(
    secrets: ConnectionTrafficSecrets,
) -> Result<(rustls::crypto::cipher::AeadKey, rustls::crypto::cipher::Iv), TlsFailure> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv)),
        _ => Err(protocol(
            "the negotiated cipher suite's keys cannot be used outside rustls",
        )),
    }
}

fn encrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
) -> Result<Box<dyn MessageEncrypter>, TlsFailure> {
    let (key, iv) = key_and_iv(secrets)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.encrypter(key, iv),
        SupportedCipherSuite::Tls12(s) => {
            // The secrets carry the fixed part of the IV, then the first
            // explicit nonce.
            let shape = s.aead_alg.key_block_shape();
            let iv = iv.as_ref();
            let fixed = shape.fixed_iv_len;
            let explicit = &iv[fixed..fixed + shape.explicit_nonce_len];
            s.aead_alg.encrypter(key, &iv[..fixed], explicit)
        }
    })
}

fn decrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
) -> Result<Box<dyn MessageDecrypter>, TlsFailure> {
    let (key, iv) = key_and_iv(secrets)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.decrypter(key, iv),
        SupportedCipherSuite::Tls12(s) => {
            let fixed = s.aead_alg.key_block_shape().fixed_iv_len;
            s.aead_alg.decrypter(key, &iv.as_ref()[..fixed])
        }
    })
}

impl RecordLayer {
    pub(super) fn for_server(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<ServerConnectionData>,
    ) -> Result<Self, TlsFailure> {
        let suite = kernel.negotiated_cipher_suite();
        Self::new(secrets, Kernel::Server(kernel), suite)
    }

    pub(super) fn for_client(
        secrets: ExtractedSecrets,
        kernel: KernelConnection<ClientConnectionData>,
    ) -> Result<Self, TlsFailure> {
        let suite = kernel.negotiated_cipher_suite();
        Self::new(secrets, Kernel::Client(kernel), suite)
    }

    fn new(
        secrets: ExtractedSecrets,
        kernel: Kernel,
        suite: SupportedCipherSuite,
    ) -> Result<Self, TlsFailure> {
        let ExtractedSecrets {
            tx: (tx_seq, tx),
            rx: (rx_seq, rx),
        } = secrets;
        Ok(RecordLayer {
            kernel,
            suite,
            sealer: Sealer::new(suite, tx, |s| encrypter(suite, s))?,
            decrypter: decrypter(suite, rx)?,
            tx_seq,
            rx_seq,
            tx_limit: match suite {
                SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
                SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
            },
            open: None,
            failed: None,
            handshake_in: Vec::new(),
            close_notify_received: false,
            close_notify_sent: false,
            key_updates_left: KEY_UPDATES_BETWEEN_DATA,
            answer_queued: false,
            warnings_left: WARNING_ALERTS,
            renegotiation_refused: false,
            empty_records_left: EMPTY_RECORDS_IN_A_ROW,
        })
    }

    fn is_tls13(&self) -> bool {
        matches!(self.suite, SupportedCipherSuite::Tls13(_))
    }

    /// Makes the key updates (TLS 1.3) or the end (TLS 1.2) come after
    /// `records` records under one key, for tests of what happens there.
    #[cfg(test)]
    pub(super) fn set_tx_limit(&mut self, records: u64) {
        self.tx_limit = records;
    }

    /// Queues a fatal alert as a failure would, and gives the error its
    /// peer reports.
    #[cfg(test)]
    pub(super) fn encrypt_fatal_alert_for_test(&mut self, out: &mut BytesMut) -> String {
        let _ = self.fail(AlertDescription::AccessDenied, protocol("test"), out);
        "received fatal alert: AccessDenied".into()
    }

    /// Records are sealed in the send buffer (not by the provider's
    /// encrypter).
    #[cfg(test)]
    pub(super) fn seals_in_place(&self) -> bool {
        self.sealer.is_in_place()
    }

    /// Encrypts a handshake message as a peer would send it after the
    /// handshake.
    #[cfg(test)]
    pub(super) fn encrypt_handshake_for_test(&mut self, message: &[u8], out: &mut BytesMut) {
        self.encrypt(ContentType::Handshake, message, out).unwrap();
    }

    /// Encrypts `plain` as application data records, onto `out`.
    pub(super) fn encrypt_data(
        &mut self,
        plain: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), TlsFailure> {
        if self.close_notify_sent {
            return Err(protocol("data written after close_notify"));
        }
        let records = plain.len().div_ceil(MAX_PLAINTEXT).max(1);
        // TLS 1.2 has no key update: a write its keys cannot cover whole
        // is refused whole (its first records sent, then the end, would
        // read as a clean end after part of it).
        let sealed = plain.len().div_ceil(MAX_PLAINTEXT) as u64;
        if !self.is_tls13() && sealed > 0 && self.tx_seq.saturating_add(sealed) >= self.tx_limit {
            return Err(self.end_at_limit(out));
        }
        out.reserve(plain.len() + records * Sealer::OVERHEAD);
        for chunk in plain.chunks(MAX_PLAINTEXT) {
            self.encrypt(ContentType::ApplicationData, chunk, out)?;
        }
        Ok(())
    }

    /// Encrypts `close_notify`, once; nothing is sent after it.
    pub(super) fn encrypt_close_notify(&mut self, out: &mut BytesMut) -> Result<(), TlsFailure> {
        if self.close_notify_sent {
            return Ok(());
        }
        self.encrypt(
            ContentType::Alert,
            &[ALERT_LEVEL_WARNING, u8::from(AlertDescription::CloseNotify)],
            out,
        )?;
        self.close_notify_sent = true;
        Ok(())
    }

    /// Encrypts the fatal alert for `failure` (best effort: a connection
    /// whose keys are spent sends none) and gives the failure back.
    fn fail(
        &mut self,
        alert: AlertDescription,
        failure: TlsFailure,
        out: &mut BytesMut,
    ) -> TlsFailure {
        if !self.close_notify_sent {
            let _ = self.encrypt(
                ContentType::Alert,
                &[ALERT_LEVEL_FATAL, u8::from(alert)],
                out,
            );
            self.close_notify_sent = true;
        }
        failure
    }

    /// TLS 1.2's end at its record limit (it has no key update): said
    /// cleanly, with `close_notify` (the last record the keys allow), as
    /// rustls does; the failure to give back.
    fn end_at_limit(&mut self, out: &mut BytesMut) -> TlsFailure {
        if !self.close_notify_sent {
            self.close_notify_sent = true;
            let _ = self.encrypt_one(
                ContentType::Alert,
                &[ALERT_LEVEL_WARNING, u8::from(AlertDescription::CloseNotify)],
                out,
            );
        }
        protocol("the cipher suite's confidentiality limit was reached")
    }

    /// One record, under the current key (after a key update of our own
    /// if the limit is reached).
    fn encrypt(
        &mut self,
        typ: ContentType,
        payload: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), TlsFailure> {
        // The key changes one record before the limit, as rustls's does,
        // so the KeyUpdate itself is within it.
        if self.tx_seq.saturating_add(1) >= self.tx_limit {
            if !self.is_tls13() {
                return Err(self.end_at_limit(out));
            }
            self.update_tx_key(out)?;
        }
        self.encrypt_one(typ, payload, out)
    }

    fn encrypt_one(
        &mut self,
        typ: ContentType,
        payload: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), TlsFailure> {
        let seq = self.tx_seq;
        self.tx_seq = seq
            .checked_add(1)
            .ok_or_else(|| protocol("the record sequence number is spent"))?;
        self.sealer.seal(typ, payload, seq, out)
    }

    /// Sends `KeyUpdate(update_not_requested)` under the current key and
    /// moves to the next (TLS 1.3).
    fn update_tx_key(&mut self, out: &mut BytesMut) -> Result<(), TlsFailure> {
        self.encrypt_one(
            ContentType::Handshake,
            &[HANDSHAKE_KEY_UPDATE, 0, 0, 1, 0],
            out,
        )?;
        let (seq, secrets) = self
            .kernel
            .update_tx_secret()
            .map_err(|e| protocol(e.to_string()))?;
        let suite = self.suite;
        self.sealer = Sealer::new(suite, secrets, |s| encrypter(suite, s))?;
        self.tx_seq = seq;
        Ok(())
    }

    /// Decrypts the records at the front of `cipher_in` into `buf`'s spare
    /// room, until it is full or no whole record is left. Records to send
    /// in answer (a key update, an alert) go onto `out`; the caller sends
    /// them. A failure met after some plaintext waits for the next call.
    pub(super) fn read(
        &mut self,
        cipher_in: &mut BytesMut,
        buf: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<Read, TlsFailure> {
        let mut total = 0;
        loop {
            if let Some(open) = &mut self.open {
                let room = buf.capacity() - buf.len();
                if room == 0 {
                    return Ok(Read::Plaintext(total));
                }
                let n = room.min(open.end - open.start);
                buf.extend_from_slice(&cipher_in[open.start..open.start + n]);
                open.start += n;
                total += n;
                if open.start == open.end {
                    cipher_in.advance(open.record_len);
                    self.open = None;
                }
                continue;
            }
            if total == 0 {
                if let Some(failure) = self.failed.take() {
                    return Err(failure);
                }
            }
            let outcome = if self.close_notify_received {
                Read::End
            } else {
                match self.open_record(cipher_in, out) {
                    Ok(true) => continue,
                    Ok(false) => Read::NeedMore,
                    Err(e) if total == 0 => return Err(e),
                    Err(e) => {
                        self.failed = Some(e);
                        Read::NeedMore
                    }
                }
            };
            return Ok(if total > 0 {
                Read::Plaintext(total)
            } else {
                outcome
            });
        }
    }

    /// Decrypts the record at the front of `cipher_in`: `Ok(false)` when
    /// it has not all arrived.
    fn open_record(
        &mut self,
        cipher_in: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<bool, TlsFailure> {
        let Some(header) = cipher_in.get(..HEADER_LEN) else {
            return Ok(false);
        };
        let typ = ContentType::from(header[0]);
        let version = ProtocolVersion::from(u16::from_be_bytes([header[1], header[2]]));
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let max = if self.is_tls13() {
            MAX_CIPHERTEXT_TLS13
        } else {
            MAX_CIPHERTEXT
        };
        if len > max {
            return Err(self.fail(
                AlertDescription::RecordOverflow,
                protocol(format!("a record of {len} bytes, over the limit")),
                out,
            ));
        }
        let record_len = HEADER_LEN + len;
        if cipher_in.len() < record_len {
            return Ok(false);
        }
        if typ != ContentType::ApplicationData && self.is_tls13() {
            return Err(self.fail(
                AlertDescription::UnexpectedMessage,
                protocol(format!("an unprotected {typ:?} record after the handshake")),
                out,
            ));
        }
        let base = cipher_in.as_ptr() as usize;
        let seq = self.rx_seq;
        let body = &mut cipher_in[HEADER_LEN..record_len];
        let opened = self
            .decrypter
            .decrypt(InboundOpaqueMessage::new(typ, version, body), seq)
            .map(|plain| {
                let start = plain.payload.as_ptr() as usize - base;
                (plain.typ, start, start + plain.payload.len())
            });
        let (typ, start, end) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                // The alert rustls would send for the same failure.
                let alert = match &e {
                    rustls::Error::PeerSentOversizedRecord => AlertDescription::RecordOverflow,
                    rustls::Error::PeerMisbehaved(_) => AlertDescription::UnexpectedMessage,
                    _ => AlertDescription::BadRecordMac,
                };
                return Err(self.fail(alert, protocol(e.to_string()), out));
            }
        };
        self.rx_seq = seq
            .checked_add(1)
            .ok_or_else(|| protocol("the record sequence number is spent"))?;
        if end - start > MAX_PLAINTEXT {
            return Err(self.fail(
                AlertDescription::RecordOverflow,
                protocol("a record's plaintext over 16 KiB"),
                out,
            ));
        }
        // A handshake message split over records must not have another
        // record between its parts (RFC 8446 §5.1).
        if !self.handshake_in.is_empty() && typ != ContentType::Handshake {
            return Err(self.fail(
                AlertDescription::UnexpectedMessage,
                protocol("a record inside a handshake message split over records"),
                out,
            ));
        }
        if start == end {
            if self.empty_records_left == 0 {
                return Err(self.fail(
                    AlertDescription::UnexpectedMessage,
                    protocol("too many empty records in a row"),
                    out,
                ));
            }
            self.empty_records_left -= 1;
        } else {
            self.empty_records_left = EMPTY_RECORDS_IN_A_ROW;
        }
        match typ {
            ContentType::ApplicationData if start < end => {
                self.key_updates_left = KEY_UPDATES_BETWEEN_DATA;
                self.open = Some(OpenRecord {
                    start,
                    end,
                    record_len,
                });
                return Ok(true);
            }
            ContentType::ApplicationData => {}
            ContentType::Alert => self.alert(&cipher_in[start..end], out)?,
            ContentType::Handshake => {
                if self.handshake_in.len() + (end - start) > MAX_HANDSHAKE_MESSAGE {
                    return Err(self.fail(
                        AlertDescription::DecodeError,
                        protocol("a post-handshake message over 64 KiB"),
                        out,
                    ));
                }
                self.handshake_in.extend_from_slice(&cipher_in[start..end]);
                cipher_in.advance(record_len);
                self.handshake_messages(out)?;
                return Ok(true);
            }
            other => {
                return Err(self.fail(
                    AlertDescription::UnexpectedMessage,
                    protocol(format!("a {other:?} record after the handshake")),
                    out,
                ));
            }
        }
        cipher_in.advance(record_len);
        Ok(true)
    }

    fn alert(&mut self, alert: &[u8], out: &mut BytesMut) -> Result<(), TlsFailure> {
        let &[level, description] = alert else {
            return Err(self.fail(
                AlertDescription::DecodeError,
                protocol("an alert that is not two bytes"),
                out,
            ));
        };
        let description = AlertDescription::from(description);
        if description == AlertDescription::CloseNotify {
            self.close_notify_received = true;
            return Ok(());
        }
        // TLS 1.2's warnings are passed over, as rustls does (1.3 has
        // none but close_notify and user_canceled).
        if level == ALERT_LEVEL_WARNING
            && (!self.is_tls13() || description == AlertDescription::UserCanceled)
        {
            if self.warnings_left == 0 {
                return Err(self.fail(
                    AlertDescription::UnexpectedMessage,
                    protocol("too many warning alerts"),
                    out,
                ));
            }
            self.warnings_left -= 1;
            return Ok(());
        }
        match level {
            ALERT_LEVEL_FATAL => Err(protocol(format!("received fatal alert: {description:?}"))),
            // A TLS 1.3 warning that is no close_notify or user_canceled.
            ALERT_LEVEL_WARNING => Err(self.fail(
                AlertDescription::DecodeError,
                protocol(format!("received warning alert {description:?} in TLS 1.3")),
                out,
            )),
            _ => Err(self.fail(
                AlertDescription::IllegalParameter,
                protocol(format!("an alert of unknown level {level}")),
                out,
            )),
        }
    }

    /// Acts on every whole post-handshake message received.
    fn handshake_messages(&mut self, out: &mut BytesMut) -> Result<(), TlsFailure> {
        while let &[typ, a, b, c, ..] = self.handshake_in.as_slice() {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            if len > MAX_HANDSHAKE_MESSAGE {
                return Err(self.fail(
                    AlertDescription::DecodeError,
                    protocol("a post-handshake message over 64 KiB"),
                    out,
                ));
            }
            if self.handshake_in.len() < 4 + len {
                return Ok(());
            }
            let body: Vec<u8> = self.handshake_in.drain(..4 + len).skip(4).collect();
            match (self.is_tls13(), typ) {
                (true, HANDSHAKE_KEY_UPDATE) => self.key_update(&body, out)?,
                (true, HANDSHAKE_NEW_SESSION_TICKET) => {
                    let stored = match &mut self.kernel {
                        Kernel::Client(k) => k.handle_new_session_ticket(&body),
                        Kernel::Server(_) => Err(rustls::Error::General(
                            "a client sent a session ticket".into(),
                        )),
                    };
                    if let Err(e) = stored {
                        return Err(self.fail(
                            AlertDescription::UnexpectedMessage,
                            protocol(e.to_string()),
                            out,
                        ));
                    }
                }
                // A TLS 1.2 peer asks to renegotiate (a server with a
                // HelloRequest, a client with a ClientHello): refused once
                // with a warning, as rustls does.
                (false, HANDSHAKE_HELLO_REQUEST | HANDSHAKE_CLIENT_HELLO)
                    if self.may_refuse_renegotiation(typ, &body) =>
                {
                    self.renegotiation_refused = true;
                    self.encrypt(
                        ContentType::Alert,
                        &[
                            ALERT_LEVEL_WARNING,
                            u8::from(AlertDescription::NoRenegotiation),
                        ],
                        out,
                    )?;
                }
                _ => {
                    return Err(self.fail(
                        AlertDescription::UnexpectedMessage,
                        protocol(format!("handshake message {typ} after the handshake")),
                        out,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Notes that rustls refused a TLS 1.2 renegotiation before the record
    /// layer took the connection: a second request fails it.
    pub(super) fn renegotiation_was_refused(&mut self) {
        self.renegotiation_refused = true;
    }

    /// A TLS 1.2 request to renegotiate that is refused with a warning (the
    /// first one): an empty HelloRequest from a server, a ClientHello from
    /// a client.
    fn may_refuse_renegotiation(&self, typ: u8, body: &[u8]) -> bool {
        let from_the_right_side = match &self.kernel {
            Kernel::Client(_) => typ == HANDSHAKE_HELLO_REQUEST && body.is_empty(),
            Kernel::Server(_) => typ == HANDSHAKE_CLIENT_HELLO,
        };
        from_the_right_side && !self.renegotiation_refused
    }

    /// The peer's `KeyUpdate`: its next records come under a new key, and
    /// if it asks, ours do too (after a `KeyUpdate` of our own).
    fn key_update(&mut self, body: &[u8], out: &mut BytesMut) -> Result<(), TlsFailure> {
        // It must end its record (RFC 8446 §5.1): the next record is under
        // the new key.
        if !self.handshake_in.is_empty() {
            return Err(self.fail(
                AlertDescription::UnexpectedMessage,
                protocol("a KeyUpdate not at the end of its record"),
                out,
            ));
        }
        if self.key_updates_left == 0 {
            return Err(self.fail(
                AlertDescription::UnexpectedMessage,
                protocol("too many KeyUpdates without data between them"),
                out,
            ));
        }
        self.key_updates_left -= 1;
        let requested = match body {
            [0] => false,
            [1] => true,
            _ => {
                return Err(self.fail(
                    AlertDescription::IllegalParameter,
                    protocol("a malformed KeyUpdate"),
                    out,
                ));
            }
        };
        let (seq, secrets) = self
            .kernel
            .update_rx_secret()
            .map_err(|e| protocol(e.to_string()))?;
        self.decrypter = decrypter(self.suite, secrets)?;
        self.rx_seq = seq;
        if requested && !self.close_notify_sent && !self.answer_queued {
            self.update_tx_key(out)?;
            self.answer_queued = true;
        }
        Ok(())
    }

    /// The records queued so far were taken to be sent: a later request
    /// for a KeyUpdate gets an answer of its own.
    pub(super) fn records_taken(&mut self) {
        self.answer_queued = false;
    }
}
