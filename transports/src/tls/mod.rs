//! TLS over the shard's own sockets with `rustls` (the `ring` provider):
//! [`TlsAcceptor`] (a server's certificate, reloadable while it serves, and
//! its handshake timeout), PEM loading, [`TlsInfo`] (what the handshake
//! agreed: SNI, ALPN, version) and the connection layer the driver reads
//! and writes through.
//!
//! The handshake is rustls's unbuffered API over owned-buffer ring I/O:
//! rustls reads the records where the kernel put them and encodes its own
//! into a buffer one ring send takes. rustls goes on protecting the
//! connection's first records (`opening`), so that a short connection
//! does not pay for a second derivation of its keys; then `record`
//! protects the records with them (rustls keeps the key schedule): a received
//! record is decrypted in place and copied once, into the caller's buffer;
//! a send copies the plaintext once, into the send buffer, where
//! `seal` seals it. Records are written
//! by one send at a time (a receive that must answer, a key update or an
//! alert, waits for the send in flight), so records never interleave on
//! the wire.

/// Offers `$offered` to rustls on whichever side `$handshake` is, and
/// runs `$then` with the state it gives (`$state`): `(discard, $then)`.
macro_rules! process_records {
    ($handshake:expr, $offered:expr, |$state:ident| $then:expr) => {
        match $handshake {
            Handshake::Server(conn) => {
                let status = conn.process_tls_records($offered);
                let $state = status.state;
                (status.discard, $then)
            }
            Handshake::Client(conn) => {
                let status = conn.process_tls_records($offered);
                let $state = status.state;
                (status.discard, $then)
            }
        }
    };
}

mod client_hello;
mod opening;
mod record;
mod seal;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::conn::Conn;
use mailring_actors::mailring::buf::Appending;
use record::{Read, RecordLayer};

/// The most ciphertext offered to rustls at once while it joins a
/// handshake message: the largest message rustls takes (64 KiB) in
/// full-size records, their headers and padding, with room to spare.
pub(super) const MAX_HANDSHAKE_HELD: usize = 128 << 10;

/// Bytes of ciphertext asked of a receive after a receive that took less
/// than a quarter of its room, until receives are small for a while.
const CIPHER_CHUNK: usize = 16 << 10;
/// What a receive asks for once [`SMALL_RECEIVES_TO_SHRINK`] receives in a
/// row brought less than this (a fresh connection starts there): a
/// connection waiting for its next small request holds a buffer this
/// size, not a whole [`CIPHER_CHUNK`]. A receive that fills it makes the
/// next ask for a whole [`CIPHER_CHUNK`] at once.
const CIPHER_SMALL: usize = 2 << 10;
/// See [`CIPHER_SMALL`].
const SMALL_RECEIVES_TO_SHRINK: u8 = 4;
/// The most asked of one receive: a receive that fills its room doubles
/// the next one's, up to this, so a busy connection takes several records
/// a receive and an idle one holds only [`CIPHER_SMALL`] while it waits.
const CIPHER_CHUNK_MAX: usize = 64 << 10;

/// The room to ask of the next receive of ciphertext and the small
/// receives in a row, after a receive asked for `asked` bytes, had `room`
/// (its buffer's spare capacity, at least that) and brought `received`,
/// with `small` small ones before it: a full receive doubles the room
/// (from [`CIPHER_CHUNK`] up to [`CIPHER_CHUNK_MAX`]); a connection whose
/// receives are small for a while asks for [`CIPHER_SMALL`]; one that
/// took little of a big room asks for [`CIPHER_CHUNK`].
fn next_receive_room(asked: usize, room: usize, received: usize, small: u8) -> (usize, u8) {
    let small = if received < CIPHER_SMALL {
        small.saturating_add(1)
    } else {
        0
    };
    let next = if received == room {
        (room * 2).clamp(CIPHER_CHUNK, CIPHER_CHUNK_MAX)
    } else if small >= SMALL_RECEIVES_TO_SHRINK {
        CIPHER_SMALL
    } else if received < room / 4 {
        CIPHER_CHUNK
    } else {
        asked
    };
    (next, small)
}

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A certificate file held no certificate.
    #[error("{0}: no certificate in the file")]
    NoCertificate(PathBuf),
    /// rustls refused the configuration (a key that does not match the
    /// certificate, an unsupported key type, a bad CA certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Why a connection's TLS failed; the connection closes with
/// [`CloseReason::Tls`](crate::CloseReason::Tls).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The handshake did not finish within the acceptor's timeout.
    HandshakeTimeout,
    /// The peer closed the connection during the handshake.
    PeerClosedInHandshake,
    /// rustls refused what the peer sent, or the peer sent an alert (an
    /// unknown CA, an expired certificate, bytes that are no TLS record):
    /// rustls's description.
    Protocol(String),
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFailure::HandshakeTimeout => f.write_str("TLS handshake timed out"),
            TlsFailure::PeerClosedInHandshake => {
                f.write_str("peer closed during the TLS handshake")
            }
            TlsFailure::Protocol(e) => write!(f, "TLS: {e}"),
        }
    }
}

impl std::error::Error for TlsFailure {}

impl TlsFailure {
    /// The failure carried by an I/O error of the TLS layer, if it is one.
    pub(crate) fn of(e: &io::Error) -> Option<TlsFailure> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<TlsFailure>())
            .cloned()
    }

    fn into_io(self) -> io::Error {
        let kind = match self {
            TlsFailure::HandshakeTimeout => io::ErrorKind::TimedOut,
            TlsFailure::PeerClosedInHandshake => io::ErrorKind::UnexpectedEof,
            TlsFailure::Protocol(_) => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, self)
    }
}

/// The `ring` crypto provider every configuration here is built with.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(path: &Path, e: impl fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The certificates of a PEM file, in order (the end-entity certificate
/// first, then its chain).
///
/// # Errors
///
/// [`TlsError::Pem`] for an unreadable file or a malformed section,
/// [`TlsError::NoCertificate`] for a file without one.
pub fn certificates_from_pem_file(
    path: impl AsRef<Path>,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let path = path.as_ref();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
///
/// # Errors
///
/// [`TlsError::Pem`] for an unreadable file or one without a key.
pub fn private_key_from_pem_file(
    path: impl AsRef<Path>,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    let path = path.as_ref();
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error(path, e))
}

/// A server configuration for one certificate chain and key, TLS 1.2 and
/// 1.3, no client authentication. Set `alpn_protocols` on it before
/// [`TlsAcceptor::new`] to offer ALPN.
///
/// # Errors
///
/// A file's [`TlsError`], or rustls's refusal of the key (one that does
/// not match the certificate).
pub fn server_config_from_pem_files(
    cert: impl AsRef<Path>,
    key: impl AsRef<Path>,
) -> Result<rustls::ServerConfig, TlsError> {
    let certified = certified_key_from_pem_files(cert.as_ref(), key.as_ref())?;
    Ok(rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified))))
}

fn certified_key_from_pem_files(
    cert: &Path,
    key: &Path,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let certs = certificates_from_pem_file(cert)?;
    let key = private_key_from_pem_file(key)?;
    Ok(rustls::sign::CertifiedKey::from_der(
        certs,
        key,
        &provider(),
    )?)
}

/// A client configuration that trusts the CA certificates of a PEM file
/// (and nothing else), TLS 1.2 and 1.3. Set `alpn_protocols` on it to
/// offer ALPN.
///
/// # Errors
///
/// A file's [`TlsError`], or rustls's refusal of a CA certificate.
pub fn client_config_from_ca_pem_file(
    ca: impl AsRef<Path>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates_from_pem_file(ca)? {
        roots.add(cert)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.enable_secret_extraction = true;
    Ok(config)
}

/// A server's TLS side: its rustls configuration, replaceable while the
/// server runs ([`reload`](Self::reload): connections accepted afterwards
/// use the new one, those open keep theirs), and the time a client has to
/// finish its handshake. Clones share the configuration (a reload through
/// one is seen by all), also those given another handshake timeout.
///
/// ```no_run
/// use mailring_transports::tls::TlsAcceptor;
///
/// let acceptor = TlsAcceptor::from_pem_files("cert.pem", "key.pem")?;
/// // Later, after the files were renewed:
/// acceptor.reload_pem_files("cert.pem", "key.pem")?;
/// # Ok::<(), mailring_transports::tls::TlsError>(())
/// ```
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<RwLock<Arc<rustls::ServerConfig>>>,
    handshake_timeout: Duration,
}

impl fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// The handshake timeout unless one is set.
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

    /// An acceptor for `config` (its certificates, ALPN list, versions).
    /// Two settings are forced: `enable_secret_extraction` (the record
    /// layer takes the keys after the handshake) and `max_early_data_size
    /// = 0` (no 0-RTT data: it can be replayed).
    pub fn new(mut config: rustls::ServerConfig) -> Self {
        prepare_server_config(&mut config);
        TlsAcceptor {
            config: Arc::new(RwLock::new(Arc::new(config))),
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// An acceptor for the certificate chain and key of two PEM files
    /// ([`server_config_from_pem_files`]).
    ///
    /// # Errors
    ///
    /// As [`server_config_from_pem_files`].
    pub fn from_pem_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self, TlsError> {
        Ok(Self::new(server_config_from_pem_files(cert, key)?))
    }

    /// The same acceptor with another handshake timeout: a client that has
    /// not finished its handshake by then is closed with
    /// [`TlsFailure::HandshakeTimeout`].
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// The configuration new connections get.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// Replaces the configuration for connections accepted from now on.
    pub fn reload(&self, mut config: rustls::ServerConfig) {
        prepare_server_config(&mut config);
        *self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
    }

    /// Replaces the certificate chain and key with those of two PEM files,
    /// keeping every other setting (ALPN, versions); on an error the
    /// configuration in use stays. The certificate resolver becomes this
    /// one certificate (a resolver choosing among several by SNI is
    /// replaced: give the whole configuration to [`reload`](Self::reload)
    /// for that). A [`reload`](Self::reload) running meanwhile is not
    /// undone: the configuration is read and replaced under one lock.
    ///
    /// # Errors
    ///
    /// As [`server_config_from_pem_files`].
    pub fn reload_pem_files(
        &self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<(), TlsError> {
        let certified = certified_key_from_pem_files(cert.as_ref(), key.as_ref())?;
        let mut in_use = self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut config = (**in_use).clone();
        config.cert_resolver = Arc::new(rustls::sign::SingleCertAndKey::from(certified));
        prepare_server_config(&mut config);
        *in_use = Arc::new(config);
        Ok(())
    }

    /// Runs the server side of a handshake on `stream`, whose first bytes
    /// (`received`) were already read (after a PROXY header).
    pub(crate) async fn accept(
        &self,
        stream: Conn,
        received: BytesMut,
    ) -> Result<(TlsConn, TlsInfo), TlsFailure> {
        let session = rustls::server::UnbufferedServerConnection::new(self.config())
            .map_err(|e| TlsFailure::Protocol(e.to_string()))?;
        let conn = TlsConn::new(stream, Handshake::Server(session), received);
        match mailring_actors::mailring::time::timeout(self.handshake_timeout, conn.handshake())
            .await
        {
            Ok(Ok(())) => {
                let info = conn.info();
                Ok((conn, info))
            }
            Ok(Err(e)) => Err(TlsFailure::of(&e).unwrap_or(TlsFailure::Protocol(e.to_string()))),
            Err(_) => Err(TlsFailure::HandshakeTimeout),
        }
    }
}

/// What every server configuration is given: the record layer takes the
/// keys once the handshake is done, and 0-RTT data is refused (it can be
/// replayed, and a session could not tell it from the rest).
fn prepare_server_config(config: &mut rustls::ServerConfig) {
    config.enable_secret_extraction = true;
    config.max_early_data_size = 0;
}

/// What a connection's TLS handshake agreed on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsInfo {
    /// The server name the client asked for (SNI), on the server side, in
    /// lower case and without a trailing dot. The client chooses it (any
    /// DNS name, whatever the certificate served names): a hint of the
    /// tenant for placement, not an identity to trust.
    pub server_name: Option<String>,
    /// The application protocol agreed by ALPN.
    pub alpn: Option<Vec<u8>>,
    /// The TLS version.
    pub version: Option<rustls::ProtocolVersion>,
    /// The handshake resumed an earlier session (a ticket or session id).
    pub resumed: bool,
}

/// A connection's handshake, rustls's unbuffered API over the
/// connection's own buffers.
enum Handshake {
    Server(rustls::server::UnbufferedServerConnection),
    Client(rustls::client::UnbufferedClientConnection),
}

/// Where a connection is in its life.
enum Phase {
    Handshake(Box<Handshake>),
    /// The handshake is done and rustls still protects the records
    /// ([`opening`]).
    Opening(Box<Handshake>),
    Traffic(Box<RecordLayer>),
    /// Between the two, or after the move from one to the other failed.
    Spent,
}

/// What the handshake needs next.
enum Step {
    /// Records to send are in `records_out`.
    Send,
    /// More ciphertext.
    Receive,
    /// It is done: the record layer has the connection.
    Done,
    /// It failed; the alert that says why (if any) is queued.
    Failed(io::Error),
}

/// What a handshake state asks for, before the caller looks at the
/// connection again.
enum HandshakeNext {
    Continue,
    Send,
    Receive,
    /// rustls would let application data be sent.
    Writable,
    PeerClosed,
}

/// Encodes a handshake record into `out`: rustls says its size (asked
/// with no room), then writes it into exactly that much.
fn encode<Data>(
    enc: &mut rustls::unbuffered::EncodeTlsData<'_, Data>,
    out: &mut BytesMut,
) -> Result<(), rustls::Error> {
    let size = match enc.encode(&mut []) {
        Ok(_) => return Ok(()),
        Err(rustls::unbuffered::EncodeError::InsufficientSize(e)) => e.required_size,
        Err(e) => return Err(rustls::Error::General(e.to_string())),
    };
    let len = out.len();
    out.resize(len + size, 0);
    match enc.encode(&mut out[len..]) {
        Ok(n) => {
            out.truncate(len + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(len);
            Err(rustls::Error::General(e.to_string()))
        }
    }
}

/// Acts on one state of an unbuffered connection in its handshake.
fn on_handshake_state<Data>(
    state: Result<rustls::unbuffered::ConnectionState<'_, '_, Data>, rustls::Error>,
    records_out: &mut BytesMut,
    early_plain: &mut BytesMut,
    record_discard: &mut usize,
) -> Result<HandshakeNext, rustls::Error> {
    use rustls::unbuffered::ConnectionState;
    Ok(match state? {
        ConnectionState::EncodeTlsData(mut enc) => {
            encode(&mut enc, records_out)?;
            HandshakeNext::Continue
        }
        ConnectionState::TransmitTlsData(transmit) => {
            // The records are in `records_out`; the caller sends them
            // before it asks rustls for anything more.
            transmit.done();
            HandshakeNext::Send
        }
        // Application data that came with the handshake's last flight.
        ConnectionState::ReadTraffic(mut read) => {
            while let Some(record) = read.next_record() {
                let record = record?;
                early_plain.extend_from_slice(record.payload);
                // Bytes the record asks to drop besides the call's own
                // (none in rustls 0.23, which copies the plaintext out).
                *record_discard += record.discard;
            }
            HandshakeNext::Continue
        }
        ConnectionState::BlockedHandshake => HandshakeNext::Receive,
        ConnectionState::WriteTraffic(_) => HandshakeNext::Writable,
        ConnectionState::PeerClosed | ConnectionState::Closed => HandshakeNext::PeerClosed,
        _ => {
            return Err(rustls::Error::General(
                "an unexpected state of the TLS handshake".into(),
            ));
        }
    })
}

/// A connection's TLS state and the bytes around it; it moves with the
/// connection between shards.
pub(crate) struct TlsState {
    phase: Phase,
    /// Ciphertext received and not yet taken.
    cipher_in: BytesMut,
    /// Room asked of the next receive of ciphertext (see
    /// [`CIPHER_CHUNK_MAX`] and [`CIPHER_SMALL`]).
    receive_room: usize,
    /// Receives in a row that brought less than [`CIPHER_SMALL`].
    small_receives: u8,
    /// Bytes the last receive of ciphertext brought.
    last_received: usize,
    /// Plaintext rustls decrypted (data that came with the handshake's
    /// last records, or the first records it protects) and the caller has
    /// not taken yet.
    early_plain: BytesMut,
    /// Set when the connection can no longer be used: rustls failed, or a
    /// send of records was abandoned part way.
    broken: Option<TlsFailure>,
    /// The socket reported the peer's end.
    peer_eof: bool,
    /// Records are encoded or sealed here before a send takes them; its
    /// block comes back for the next flush once that send is done with it.
    records_out: BytesMut,
    /// What the handshake agreed on, once it is done (the server name
    /// once the ClientHello is read).
    info: TlsInfo,
    /// The ClientHello's server name was looked for (servers).
    hello_read: bool,
    /// The ClientHello's record payloads as they came, joined, until its
    /// name is read.
    hello_bytes: Vec<u8>,
    /// How many bytes at the front of `cipher_in` rustls has been offered
    /// and not dropped, in the handshake or while it protects the first
    /// records (whole records, see `handshake_step`).
    hs_offered: usize,
    /// The last `offer_next_record` offered more.
    hs_grew: bool,
    /// Bytes that are no record were offered to rustls once.
    hs_bad_offered: bool,
    /// Records of data a connection carries under rustls's protection
    /// before the record layer takes the keys (0: at the handshake's end).
    hand_over_after: u32,
    /// Records of data carried so far under rustls's protection.
    records_carried: u32,
    /// The peer's `close_notify` came while rustls protected the records.
    opening_peer_closed: bool,
    /// Ours went while rustls protected the records.
    opening_close_notify_sent: bool,
    /// rustls sent a record of its own while it protected the records
    /// (see `opening::Given`).
    opening_sent_unasked: bool,
}

impl fmt::Debug for TlsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match &self.phase {
            Phase::Handshake(_) => "handshake",
            Phase::Opening(_) => "opening",
            Phase::Traffic(_) => "traffic",
            Phase::Spent => "spent",
        };
        f.debug_struct("TlsState")
            .field("phase", &phase)
            .field("broken", &self.broken)
            .field("peer_eof", &self.peer_eof)
            .finish_non_exhaustive()
    }
}

impl TlsState {
    fn new(handshake: Handshake, received: BytesMut) -> Self {
        TlsState {
            phase: Phase::Handshake(Box::new(handshake)),
            cipher_in: received,
            receive_room: CIPHER_SMALL,
            small_receives: SMALL_RECEIVES_TO_SHRINK,
            last_received: usize::MAX,
            early_plain: BytesMut::new(),
            broken: None,
            peer_eof: false,
            records_out: BytesMut::new(),
            info: TlsInfo::default(),
            hello_read: false,
            hello_bytes: Vec::new(),
            hs_offered: 0,
            hs_grew: false,
            hs_bad_offered: false,
            hand_over_after: opening::HAND_OVER_AFTER_RECORDS,
            records_carried: 0,
            opening_peer_closed: false,
            opening_close_notify_sent: false,
            opening_sent_unasked: false,
        }
    }

    fn check(&self) -> io::Result<()> {
        match &self.broken {
            Some(f) => Err(f.clone().into_io()),
            None => Ok(()),
        }
    }

    /// Records wait to be sent.
    fn wants_write(&self) -> bool {
        !self.records_out.is_empty()
    }

    /// Marks the connection failed, and gives the error to return.
    fn broke(&mut self, failure: TlsFailure) -> io::Error {
        self.broken = Some(failure.clone());
        failure.into_io()
    }

    /// The records to send now, as one buffer.
    fn take_outgoing(&mut self) -> Bytes {
        if let Phase::Traffic(layer) = &mut self.phase {
            layer.records_taken();
        }
        self.records_out.split().freeze()
    }

    /// Drives the handshake over the ciphertext at hand.
    ///
    /// rustls is offered one whole record at a time (a prefix of the
    /// buffer that grows by a record once it has taken what it was
    /// offered), so it never reads past the record that ends the
    /// handshake: what follows (a key update, data, `close_notify`, a
    /// ticket split over records) is left, untouched, to what protects the
    /// records after it.
    fn handshake_step(&mut self) -> Step {
        loop {
            let Phase::Handshake(handshake) = &mut self.phase else {
                return Step::Done;
            };
            let records_out = &mut self.records_out;
            let early_plain = &mut self.early_plain;
            let mut record_discard = 0;
            let offered = &mut self.cipher_in[..self.hs_offered];
            let (discard, next) = process_records!(&mut **handshake, offered, |state| {
                on_handshake_state(state, records_out, early_plain, &mut record_discard)
            });
            let handshaking = match &**handshake {
                Handshake::Server(conn) => conn.is_handshaking(),
                Handshake::Client(conn) => conn.is_handshaking(),
            };
            self.drop_offered(discard + record_discard);
            match next {
                Ok(HandshakeNext::Continue) => {}
                Ok(HandshakeNext::Send) => return Step::Send,
                Ok(HandshakeNext::PeerClosed) => {
                    return Step::Failed(self.broke(TlsFailure::PeerClosedInHandshake));
                }
                Ok(HandshakeNext::Writable) if !handshaking => {
                    // rustls took every byte it was offered whole; a byte
                    // it still holds would be a message split around the
                    // end of the handshake.
                    if self.hs_offered != 0 {
                        let failure = TlsFailure::Protocol(
                            "a handshake message split around the end of the handshake".into(),
                        );
                        return Step::Failed(self.broke(failure));
                    }
                    return match self.end_handshake() {
                        Ok(()) => Step::Done,
                        Err(failure) => Step::Failed(self.broke(failure)),
                    };
                }
                // rustls took what it was offered (a server may write
                // before the client's Finished): the next record, if whole.
                Ok(HandshakeNext::Receive | HandshakeNext::Writable) => {
                    if let Err(failure) = self.offer_next_record() {
                        self.queue_rustls_alert();
                        return Step::Failed(self.broke(failure));
                    }
                    if !self.hs_grew {
                        return Step::Receive;
                    }
                }
                Err(e) => {
                    self.queue_rustls_alert();
                    return Step::Failed(self.broke(TlsFailure::Protocol(e.to_string())));
                }
            }
        }
    }

    /// Drops what rustls is done with from the front of the bytes it was
    /// offered.
    fn drop_offered(&mut self, discard: usize) {
        let discard = discard.min(self.hs_offered);
        self.cipher_in.advance(discard);
        self.hs_offered -= discard;
    }

    /// Plaintext rustls decrypted and the caller has not taken, into
    /// `buf`'s spare room, if there is any.
    fn take_early_plain(&mut self, buf: &mut BytesMut) -> Option<Read> {
        if self.early_plain.is_empty() {
            return None;
        }
        let n = self.early_plain.len().min(buf.capacity() - buf.len());
        buf.extend_from_slice(&self.early_plain[..n]);
        self.early_plain.advance(n);
        Some(Read::Plaintext(n))
    }

    /// Grows the bytes offered to rustls by the next whole record, if one
    /// is at hand (`hs_grew` says so). A header that can be no record's
    /// (bytes that are no TLS) is offered as it is, for rustls to refuse
    /// with its alert; if it does not, it fails here.
    fn offer_next_record(&mut self) -> Result<(), TlsFailure> {
        self.hs_grew = false;
        let at = self.hs_offered;
        let Some(header) = self.cipher_in.get(at..at + 5) else {
            return Ok(());
        };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let plausible = (20..=24).contains(&header[0]) && header[1] == 3 && len <= 18 << 10;
        if !plausible {
            if self.hs_bad_offered {
                return Err(TlsFailure::Protocol("bytes that are no TLS record".into()));
            }
            self.hs_bad_offered = true;
            self.hs_offered = self.cipher_in.len();
            self.hs_grew = true;
            return Ok(());
        }
        let end = at + 5 + len;
        if end > MAX_HANDSHAKE_HELD {
            // rustls holds every record of a message it is joining: a
            // message sent a byte a record, each padded to 16 KiB, would
            // hold a gigabyte.
            return Err(TlsFailure::Protocol(
                "a handshake message spread over more records than one message can take".into(),
            ));
        }
        if self.cipher_in.len() < end {
            return Ok(());
        }
        let is_server =
            matches!(&self.phase, Phase::Handshake(h) if matches!(**h, Handshake::Server(_)));
        if is_server && !self.hello_read {
            self.read_server_name(at, end);
        }
        self.hs_offered = end;
        self.hs_grew = true;
        Ok(())
    }

    /// Looks for the ClientHello's server name in the record at
    /// `at..end`, before rustls sees it: rustls joins a message's fragments
    /// in place, so the name is read from a copy of the payloads, taken a
    /// record at a time and read once the message is whole.
    fn read_server_name(&mut self, at: usize, end: usize) {
        let record = &self.cipher_in[at..end];
        if !client_hello::is_handshake_record(record)
            || self.hello_bytes.len() + record.len() > client_hello::MAX_HELLO_BYTES
        {
            self.hello_read = true;
            self.hello_bytes = Vec::new();
            return;
        }
        self.hello_bytes.extend_from_slice(&record[5..]);
        if let client_hello::Sni::Read(name) =
            client_hello::server_name_in_message(&self.hello_bytes)
        {
            self.info.server_name = name;
            self.hello_read = true;
            self.hello_bytes = Vec::new();
        }
    }

    /// After rustls refused what it was given (in the handshake, or while
    /// it protects the first records): encodes the alert it queued.
    fn queue_rustls_alert(&mut self) {
        use rustls::unbuffered::ConnectionState;
        /// `true`: plaintext was drained and the alert comes next.
        fn drain<Data>(
            state: Result<ConnectionState<'_, '_, Data>, rustls::Error>,
            out: &mut BytesMut,
        ) -> bool {
            match state {
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    let _ = encode(&mut enc, out);
                    false
                }
                Ok(ConnectionState::ReadTraffic(mut read)) => {
                    while read.next_record().is_some() {}
                    true
                }
                _ => false,
            }
        }
        // rustls queued one alert, which the next call gives before it
        // reads any more records (reading the bytes that failed again
        // would fail again, and trip rustls's debug assertion that it
        // sends one fatal alert), after any plaintext it holds. It is given
        // the same bytes: its handshake deframer keeps places in them.
        // (While rustls protects the first records and holds the answer to
        // a peer's key update, that answer goes first and the alert is
        // not encoded: the connection still fails.)
        for _ in 0..2 {
            let (Phase::Handshake(handshake) | Phase::Opening(handshake)) = &mut self.phase else {
                return;
            };
            let offered = &mut self.cipher_in[..self.hs_offered];
            let (discard, again) = process_records!(&mut **handshake, offered, |state| {
                drain(state, &mut self.records_out)
            });
            self.drop_offered(discard);
            if !again {
                return;
            }
        }
    }

    /// The handshake is done: notes what it agreed, and leaves the records
    /// to rustls for the connection's first ones ([`opening`]) or gives
    /// the connection to the record layer at once.
    fn end_handshake(&mut self) -> Result<(), TlsFailure> {
        let Phase::Handshake(handshake) = std::mem::replace(&mut self.phase, Phase::Spent) else {
            return Err(TlsFailure::Protocol("the TLS handshake ended twice".into()));
        };
        let (alpn, version, kind) = match &*handshake {
            Handshake::Server(conn) => (
                conn.alpn_protocol().map(<[u8]>::to_vec),
                conn.protocol_version(),
                conn.handshake_kind(),
            ),
            Handshake::Client(conn) => (
                conn.alpn_protocol().map(<[u8]>::to_vec),
                conn.protocol_version(),
                conn.handshake_kind(),
            ),
        };
        self.info = TlsInfo {
            server_name: match &*handshake {
                Handshake::Server(_) => self.info.server_name.take(),
                Handshake::Client(_) => None,
            },
            alpn,
            version,
            resumed: kind == Some(rustls::HandshakeKind::Resumed),
        };
        self.phase = Phase::Opening(handshake);
        if self.hand_over_after == 0 {
            self.start_traffic()?;
        }
        Ok(())
    }

    /// Gives the connection to the record layer: rustls derives the
    /// traffic keys once more and keeps only what it needs later.
    fn start_traffic(&mut self) -> Result<(), TlsFailure> {
        let Phase::Opening(conn) = std::mem::replace(&mut self.phase, Phase::Spent) else {
            return Err(TlsFailure::Protocol(
                "the TLS record layer took the connection twice".into(),
            ));
        };
        let to_failure = |e: rustls::Error| TlsFailure::Protocol(e.to_string());
        let mut layer = match *conn {
            Handshake::Server(conn) => {
                let (secrets, kernel) = conn
                    .dangerous_into_kernel_connection()
                    .map_err(to_failure)?;
                RecordLayer::for_server(secrets, kernel)?
            }
            Handshake::Client(conn) => {
                let (secrets, kernel) = conn
                    .dangerous_into_kernel_connection()
                    .map_err(to_failure)?;
                RecordLayer::for_client(secrets, kernel)?
            }
        };
        if self.opening_sent_unasked {
            // rustls refused a TLS 1.2 renegotiation: the next one fails.
            layer.renegotiation_was_refused();
        }
        self.phase = Phase::Traffic(Box::new(layer));
        Ok(())
    }

    /// Decrypted bytes into `buf`'s spare room (grown if it has none).
    fn read(&mut self, buf: &mut BytesMut) -> io::Result<Read> {
        if buf.capacity() == buf.len() {
            buf.reserve(CIPHER_CHUNK);
        }
        if let Some(read) = self.take_early_plain(buf) {
            return Ok(read);
        }
        let read = match &self.phase {
            Phase::Opening(_) => self.opening_read(buf),
            Phase::Traffic(_) => self.traffic_read(buf),
            _ => return Err(handshake_not_done()),
        };
        read.map_err(|failure| self.broke(failure))
    }

    /// Encrypts `plain` into records to send.
    fn encrypt(&mut self, plain: &[u8]) -> io::Result<()> {
        let queued = match &self.phase {
            Phase::Opening(_) => self.opening_encrypt(plain),
            Phase::Traffic(_) => self.traffic_encrypt(plain),
            _ => return Err(handshake_not_done()),
        };
        queued.map_err(|failure| self.broke(failure))
    }

    /// Queues `close_notify` (once).
    fn queue_close_notify(&mut self) -> io::Result<()> {
        let queued = match &mut self.phase {
            Phase::Opening(_) => self.opening_close_notify(),
            Phase::Traffic(layer) => layer.encrypt_close_notify(&mut self.records_out),
            _ => return Err(handshake_not_done()),
        };
        queued.map_err(|failure| self.broke(failure))
    }

    /// A read through the record layer.
    fn traffic_read(&mut self, buf: &mut BytesMut) -> Result<Read, TlsFailure> {
        let Phase::Traffic(layer) = &mut self.phase else {
            return Err(TlsFailure::Protocol(
                "the TLS record layer does not have the connection".into(),
            ));
        };
        layer.read(&mut self.cipher_in, buf, &mut self.records_out)
    }

    /// Records of data sealed by the record layer.
    fn traffic_encrypt(&mut self, plain: &[u8]) -> Result<(), TlsFailure> {
        let Phase::Traffic(layer) = &mut self.phase else {
            return Err(TlsFailure::Protocol(
                "the TLS record layer does not have the connection".into(),
            ));
        };
        layer.encrypt_data(plain, &mut self.records_out)
    }
}

/// A TLS connection over a plain one, on the current shard.
///
/// Its state sits behind uncontended locks rather than cells, so that the
/// connection is `Sync` and an adapter may hold it in an `Arc` (hyper boxes
/// upgraded I/O as `Send`); only its own shard ever takes them.
pub(crate) struct TlsConn {
    inner: Conn,
    state: Mutex<TlsState>,
    /// A send of records is in flight.
    writing: AtomicBool,
    /// Who waits for it to end.
    write_waiters: Mutex<Vec<Waker>>,
    /// A send of records was dropped part way, or failed after the
    /// records were sealed: nothing more may be sent (the peer would find
    /// a gap in the record numbers).
    abandoned: AtomicBool,
    /// The shard the connection lives on: used from another thread, each
    /// operation fails before it changes anything (a record sealed there
    /// and then refused by the socket would be a gap).
    home: Option<mailring_actors::ShardId>,
}

impl TlsConn {
    /// The connection the records travel over.
    pub(crate) fn inner(&self) -> &Conn {
        &self.inner
    }

    /// Whether part of a record is held (its rest not received yet).
    pub(crate) fn has_partial_record(&self) -> bool {
        !self.state().cipher_in.is_empty()
    }

    /// For a connection at rest between exchanges (a pool's idle one):
    /// takes the records the peer sent unasked, as far as they are queued
    /// on the socket now, through the record layer without waiting, and
    /// says whether it may serve another exchange: only if they held no
    /// data (session tickets, a key update: their answers go before the
    /// next data sent), no end and no part of a record, and the connection
    /// did not fail. Data there would be read as the next caller's reply.
    pub(crate) fn at_rest_without_data(&self) -> bool {
        if self.check().is_err() || self.writing.load(Ordering::Acquire) {
            return false;
        }
        let mut state = self.state();
        if state.peer_eof {
            return false;
        }
        let mut chunk = [0u8; 4096];
        let mut taken = 0usize;
        loop {
            match self.inner.recv_plain_now(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    state.cipher_in.extend_from_slice(&chunk[..n]);
                    taken += n;
                    // Far more than tickets or key updates take.
                    if taken > AT_REST_UNASKED {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        // A read takes every whole record at hand that holds no data, and
        // stops at the first that does (or at the end). Part of a record
        // left over (the rest on its way) may be data too: its next reply
        // would be read behind it.
        let mut plain = BytesMut::new();
        matches!(state.read(&mut plain), Ok(Read::NeedMore)) && state.cipher_in.is_empty()
    }
}

/// Bytes of records a connection at rest may have been sent unasked
/// ([`TlsConn::at_rest_without_data`]): past them it is not used again.
const AT_REST_UNASKED: usize = 64 << 10;

impl fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConn")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Holds the write side; its drop lets the next writer in.
struct WriteTurn<'a> {
    conn: &'a TlsConn,
    released: bool,
}

impl WriteTurn<'_> {
    /// Lets the next writer in (at once, rather than at the drop).
    fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.conn.writing.store(false, Ordering::Release);
        let waiters = std::mem::take(
            &mut *self
                .conn
                .write_waiters
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for w in waiters {
            w.wake();
        }
    }
}

impl Drop for WriteTurn<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Marks the connection broken if a send of records is dropped before it
/// finished (the peer may have part of a record).
struct SendInFlight<'a> {
    abandoned: &'a AtomicBool,
    done: bool,
}

impl Drop for SendInFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.abandoned.store(true, Ordering::Release);
        }
    }
}

fn abandoned_send() -> TlsFailure {
    TlsFailure::Protocol("a send of TLS records was abandoned part way".into())
}

impl TlsConn {
    fn new(inner: Conn, handshake: Handshake, received: BytesMut) -> Self {
        Self::from_state(inner, TlsState::new(handshake, received))
    }

    pub(crate) fn from_state(inner: Conn, state: TlsState) -> Self {
        TlsConn {
            inner,
            state: Mutex::new(state),
            writing: AtomicBool::new(false),
            write_waiters: Mutex::new(Vec::new()),
            abandoned: AtomicBool::new(false),
            home: mailring_actors::mailring::current_shard(),
        }
    }

    /// The TLS state (only this connection's shard takes the lock).
    fn state(&self) -> MutexGuard<'_, TlsState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The plain connection and the TLS state, for a move.
    pub(crate) fn into_parts(self) -> (Conn, TlsState) {
        let mut state = self
            .state
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.abandoned.load(Ordering::Acquire) {
            state.broken = Some(abandoned_send());
        }
        (self.inner, state)
    }

    /// The state's failure, or an abandoned send's.
    fn check(&self) -> io::Result<()> {
        if mailring_actors::mailring::current_shard() != self.home {
            return Err(io::Error::other(
                "mailring: this TLS connection belongs to another shard (or no shard runs this thread); use it from the shard that opened it",
            ));
        }
        if self.abandoned.load(Ordering::Acquire) {
            return Err(abandoned_send().into_io());
        }
        self.state().check()
    }

    /// Runs the client side of a handshake on `stream` for `server_name`,
    /// within [`TlsAcceptor::DEFAULT_HANDSHAKE_TIMEOUT`].
    pub(crate) async fn connect(
        stream: Conn,
        config: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
    ) -> io::Result<TlsConn> {
        let session = rustls::client::UnbufferedClientConnection::new(
            with_secret_extraction(config),
            server_name,
        )
        .map_err(|e| TlsFailure::Protocol(e.to_string()).into_io())?;
        let conn = TlsConn::new(stream, Handshake::Client(session), BytesMut::new());
        // A server that never finishes its side holds no client forever.
        match mailring_actors::mailring::time::timeout(
            TlsAcceptor::DEFAULT_HANDSHAKE_TIMEOUT,
            conn.handshake(),
        )
        .await
        {
            Ok(res) => res.map(|()| conn),
            Err(_) => Err(TlsFailure::HandshakeTimeout.into_io()),
        }
    }

    /// What the handshake agreed on.
    pub(crate) fn info(&self) -> TlsInfo {
        self.state().info.clone()
    }

    /// Reads and writes until the handshake is done.
    async fn handshake(&self) -> io::Result<()> {
        loop {
            let step = {
                let mut state = self.state();
                state.check()?;
                state.handshake_step()
            };
            match step {
                Step::Send => self.flush().await?,
                Step::Receive => {
                    if self.state().peer_eof {
                        let failure = TlsFailure::PeerClosedInHandshake;
                        return Err(self.state().broke(failure));
                    }
                    self.receive_ciphertext().await?;
                }
                Step::Done => return Ok(()),
                Step::Failed(e) => return Err(self.fail(e).await),
            }
        }
    }

    /// After a failure: sends the alert queued for it, if the socket takes
    /// it, and gives back the error.
    async fn fail(&self, e: io::Error) -> io::Error {
        // A flush in flight sends the alert with what it has (it goes on
        // while records wait); a receive never waits behind it, whose
        // writer may not be polled again (a task that only reads), nor for
        // room the peer may never make.
        let _ = self.flush_now();
        e
    }

    /// One receive of ciphertext from the socket into the state's buffer.
    ///
    /// The kernel gets a buffer of its own, so a receive dropped in flight
    /// takes nothing the state still needs: the state's whole buffer when
    /// every record in it was taken; else, what is left (a part record;
    /// while rustls protects the first records, also the whole ones of a
    /// handshake message it has not all seen, at most
    /// [`MAX_HANDSHAKE_HELD`]) is copied into a new one when the last
    /// receive brought at least as much (a bulk transfer: the received
    /// bytes are never copied again), and otherwise the new one's bytes are
    /// appended to it (a peer sending a byte at a time would cost a copy of
    /// the whole part record per byte).
    async fn receive_ciphertext(&self) -> io::Result<()> {
        let (landing, kept) = {
            let mut state = self.state();
            let room = state.receive_room;
            let kept = state.cipher_in.len();
            let landing = if kept == 0 {
                let mut landing = std::mem::take(&mut state.cipher_in);
                landing.reserve(room);
                if landing.capacity() > 2 * room {
                    // A busy spell's big buffer goes back while the
                    // connection waits with little to read.
                    landing = BytesMut::with_capacity(room);
                }
                landing
            } else if kept <= state.last_received {
                let mut landing = BytesMut::with_capacity(kept + room);
                landing.extend_from_slice(&state.cipher_in);
                landing
            } else {
                BytesMut::with_capacity(room)
            };
            (landing, kept)
        };
        let room = landing.capacity() - landing.len();
        let (res, landing) = self.inner.recv_plain(Appending::new(landing)).await;
        let landing = landing.into_inner();
        let mut state = self.state();
        let received = res?;
        state.last_received = received;
        if landing.len() - received == kept && state.cipher_in.len() == kept {
            // It holds what was left, then what came.
            state.cipher_in = landing;
        } else {
            // After what is left (or, should the state's bytes have
            // changed meanwhile, which no second reader does today, after
            // them): what came.
            let came = &landing[landing.len() - received..];
            state.cipher_in.extend_from_slice(came);
        }
        (state.receive_room, state.small_receives) =
            next_receive_room(state.receive_room, room, received, state.small_receives);
        if received == 0 {
            state.peer_eof = true;
        }
        Ok(())
    }

    /// Plaintext into `buf`'s spare capacity: as a socket receive would,
    /// `Ok(0)` at the peer's clean end (`close_notify`), `UnexpectedEof` at
    /// an end without it. One reader at a time; like a receive on the
    /// ring, a receive dropped while in flight may lose what the kernel
    /// gave it (the drivers keep theirs until the connection closes).
    pub(crate) async fn recv(&self, mut buf: BytesMut) -> (io::Result<usize>, BytesMut) {
        let res = match self.check() {
            Ok(()) => self.recv_into(&mut buf).await,
            Err(e) => Err(e),
        };
        (res, buf)
    }

    async fn recv_into(&self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            let (read, must_flush, peer_eof) = {
                let mut state = self.state();
                state.check()?;
                let read = state.read(buf);
                // Records the receive queued (a key update's answer, an
                // alert) go out with a flush of our own, unless one is
                // going (see `flush_ignoring_state`): a receive never
                // waits behind a send the peer is slow to take.
                let must_flush = state.wants_write() && !self.writing.load(Ordering::Acquire);
                (read, must_flush, state.peer_eof)
            };
            // Records the read queued go out as far as the socket takes
            // them now; the rest goes before anything the caller sends
            // next (an answer to a key update need only precede our next
            // data). A receive never waits for room: the peer may be
            // reading nothing until its own bytes are read.
            if must_flush {
                self.flush_now()?;
            }
            match read {
                Err(e) => return Err(self.fail(e).await),
                Ok(Read::Plaintext(n)) => return Ok(n),
                Ok(Read::End) => return Ok(0),
                Ok(Read::NeedMore) if peer_eof => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed without close_notify",
                    ));
                }
                Ok(Read::NeedMore) => self.receive_ciphertext().await?,
            }
        }
    }

    /// Encrypts `buf` and sends the records.
    pub(crate) async fn send_all(&self, buf: Bytes) -> (io::Result<()>, Bytes) {
        if let Err(e) = self.check() {
            return (Err(e), buf);
        }
        let queued = self.state().encrypt(&buf);
        if let Err(e) = queued {
            // What the failure queued (an alert, TLS 1.2's close_notify at
            // its limit) still goes.
            return (Err(self.fail(e).await), buf);
        }
        (self.flush().await, buf)
    }

    /// Sends `close_notify` (the end of what this side sends), unless the
    /// connection already failed.
    pub(crate) async fn close_notify(&self) -> io::Result<()> {
        self.check()?;
        let queued = self.state().queue_close_notify();
        if let Err(e) = queued {
            return Err(self.fail(e).await);
        }
        self.flush().await
    }

    /// Sends `close_notify`, then shuts the socket down as asked.
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        if how != std::net::Shutdown::Read {
            self.close_notify().await?;
        }
        self.inner.shutdown_plain(how).await
    }

    /// Sealed records did not all go: nothing more may be sent (a later
    /// record would follow a gap). Gives back `e`.
    fn records_lost(&self, e: io::Error) -> io::Error {
        self.abandoned.store(true, Ordering::Release);
        e
    }

    /// Waits for the write side to be free.
    fn write_turn(&self) -> impl Future<Output = WriteTurn<'_>> {
        std::future::poll_fn(move |cx| {
            if self.writing.swap(true, Ordering::AcqRel) {
                // Once per waiting task: a writer polled again and again
                // while a send is under way (woken by something else) adds
                // nothing more.
                let mut waiters = self
                    .write_waiters
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
                drop(waiters);
                // Released meanwhile: try again at once.
                if !self.writing.load(Ordering::Acquire) {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            } else {
                Poll::Ready(WriteTurn {
                    conn: self,
                    released: false,
                })
            }
        })
    }

    /// Sends every record queued.
    async fn flush(&self) -> io::Result<()> {
        self.check()?;
        self.flush_ignoring_state().await
    }

    /// Sends what the socket takes of `records` now, with a non-blocking
    /// send (TCP or Unix; none for a direct descriptor): how many bytes it
    /// took. A failure other than a full socket loses the records.
    fn send_what_fits(&self, records: &[u8]) -> io::Result<usize> {
        match self.inner.try_send_plain(records) {
            Some(Ok(n)) => Ok(n),
            Some(Err(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Some(Err(e)) => Err(self.records_lost(e)),
            None => Ok(0),
        }
    }

    /// Sends what the socket takes of the queued records now, without
    /// waiting, unless a flush is going on (it sends them too); the rest
    /// stays queued for the next send or flush. Works on a failed
    /// connection too (an alert that says why).
    fn flush_now(&self) -> io::Result<()> {
        if self.abandoned.load(Ordering::Acquire) {
            return Err(abandoned_send().into_io());
        }
        if self.writing.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut turn = WriteTurn {
            conn: self,
            released: false,
        };
        let mut state = self.state();
        let res = if state.wants_write() {
            self.send_what_fits(&state.records_out).map(|n| {
                if n == state.records_out.len() {
                    state.take_outgoing();
                } else {
                    state.records_out.advance(n);
                }
            })
        } else {
            Ok(())
        };
        drop(state);
        turn.release();
        res
    }

    /// [`flush`](Self::flush) on a connection already failed (to send the
    /// alert that says why).
    async fn flush_ignoring_state(&self) -> io::Result<()> {
        let mut turn = self.write_turn().await;
        loop {
            if self.abandoned.load(Ordering::Acquire) {
                return Err(abandoned_send().into_io());
            }
            let mut records = {
                let mut state = self.state();
                if !state.wants_write() {
                    // Let go under the state's lock: a receive that queues
                    // an answer either sees this flush still going (which
                    // then sends it) or the turn free (and flushes).
                    turn.release();
                    return Ok(());
                }
                state.take_outgoing()
            };
            // What the socket takes at once goes with a non-blocking send
            // (TCP or Unix; this flush holds the write turn, so no send of
            // ours is on the ring): no operation to complete, and no
            // wake-up of this task for it. The rest goes through the ring.
            let sent = self.send_what_fits(&records)?;
            if sent == records.len() {
                continue;
            }
            records.advance(sent);
            let mut in_flight = SendInFlight {
                abandoned: &self.abandoned,
                done: false,
            };
            let (res, _) = self.inner.send_all_plain(records).await;
            in_flight.done = true;
            res.map_err(|e| self.records_lost(e))?;
        }
    }
}

/// The error of reading or writing data before the handshake is done.
fn handshake_not_done() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the TLS handshake is not done")
}

/// `config`, or a copy of it that lets the record layer take the
/// connection's keys after the handshake.
pub(crate) fn with_secret_extraction(
    config: Arc<rustls::ClientConfig>,
) -> Arc<rustls::ClientConfig> {
    if config.enable_secret_extraction {
        return config;
    }
    let mut config = (*config).clone();
    config.enable_secret_extraction = true;
    Arc::new(config)
}
