//! TLS over the shard's own sockets with `rustls` (the `ring` provider):
//! [`TlsAcceptor`] (a server's certificate, reloadable while it serves, and
//! its handshake timeout), PEM loading, [`TlsInfo`] (what the handshake
//! agreed: SNI, ALPN, version) and the connection layer the driver reads
//! and writes through.
//!
//! The layer is rustls's buffered API over owned-buffer ring I/O: a
//! receive takes ciphertext into a buffer the kernel fills, rustls
//! decrypts it, and the plaintext is copied into the caller's buffer; a
//! send encrypts into rustls's queue and writes the records with one ring
//! send. Records are written by one send at a time (a receive that must
//! answer, a key update or an alert, waits for the send in flight), so
//! records never interleave on the wire.

use std::fmt;
use std::future::Future;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::conn::Conn;

/// Bytes of ciphertext asked of each receive.
const CIPHER_CHUNK: usize = 16 << 10;

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
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
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
    pub fn new(config: rustls::ServerConfig) -> Self {
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
    pub fn reload(&self, config: rustls::ServerConfig) {
        *self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
    }

    /// Replaces the certificate chain and key with those of two PEM files,
    /// keeping every other setting (ALPN, versions); on an error the
    /// configuration in use stays.
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
        let mut config = (*self.config()).clone();
        config.cert_resolver = Arc::new(rustls::sign::SingleCertAndKey::from(certified));
        self.reload(config);
        Ok(())
    }

    /// Runs the server side of a handshake on `stream`, whose first bytes
    /// (`received`) were already read (after a PROXY header).
    pub(crate) async fn accept(
        &self,
        stream: Conn,
        received: BytesMut,
    ) -> Result<(TlsConn, TlsInfo), TlsFailure> {
        let session = rustls::ServerConnection::new(self.config())
            .map_err(|e| TlsFailure::Protocol(e.to_string()))?;
        let conn = TlsConn::new(stream, rustls::Connection::Server(session));
        conn.state().cipher_in = received;
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

/// What a connection's TLS handshake agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsInfo {
    /// The server name the client asked for (SNI), on the server side.
    pub server_name: Option<String>,
    /// The application protocol agreed by ALPN.
    pub alpn: Option<Vec<u8>>,
    /// The TLS version.
    pub version: Option<rustls::ProtocolVersion>,
}

/// A connection's rustls state and the bytes around it; it moves with the
/// connection between shards.
#[derive(Debug)]
pub(crate) struct TlsState {
    tls: rustls::Connection,
    /// Ciphertext received and not yet taken by rustls.
    cipher_in: BytesMut,
    /// Set when the connection can no longer be used: rustls failed, or a
    /// send of records was abandoned part way.
    broken: Option<TlsFailure>,
    /// The socket reported the peer's end.
    peer_eof: bool,
    /// Records are written here before a send takes them; its block comes
    /// back for the next flush once that send is done with it.
    records_out: BytesMut,
    /// Plaintext handed to rustls since the last flush (to size the next).
    queued_plain: usize,
}

impl TlsState {
    fn check(&self) -> io::Result<()> {
        match &self.broken {
            Some(f) => Err(f.clone().into_io()),
            None => Ok(()),
        }
    }

    /// Moves decrypted bytes into `buf`'s spare room, decrypting more of
    /// the ciphertext already received while room is left (one receive of
    /// the caller takes every whole record at hand, not one): `Some(n)`
    /// with `n > 0` for bytes, `Some(0)` at the peer's clean end, `None`
    /// when nothing is at hand. A failure met after some bytes waits for
    /// the next call.
    fn take_plaintext(&mut self, buf: &mut BytesMut) -> io::Result<Option<usize>> {
        let mut total = 0;
        loop {
            if buf.capacity() == buf.len() {
                if total > 0 {
                    return Ok(Some(total));
                }
                buf.reserve(CIPHER_CHUNK);
            }
            let mut reader = self.tls.reader();
            match reader.fill_buf() {
                Ok(chunk) if !chunk.is_empty() => {
                    let n = chunk.len().min(buf.capacity() - buf.len());
                    buf.extend_from_slice(&chunk[..n]);
                    reader.consume(n);
                    total += n;
                }
                // The clean end (after what was taken now, at the next call).
                Ok(_) => return Ok(Some(total)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if total == 0 {
                        return Ok(None);
                    }
                    if self.cipher_in.is_empty() || self.feed().is_err() {
                        return Ok(Some(total));
                    }
                }
                Err(e) if total == 0 => return Err(e),
                Err(_) => return Ok(Some(total)),
            }
        }
    }

    /// Gives rustls the ciphertext received, and processes it.
    fn feed(&mut self) -> io::Result<()> {
        while !self.cipher_in.is_empty() {
            let mut rd: &[u8] = &self.cipher_in;
            let n = self.tls.read_tls(&mut rd)?;
            if n == 0 {
                // rustls takes nothing after the peer's close_notify.
                self.cipher_in.clear();
                break;
            }
            self.cipher_in.advance(n);
            match self.tls.process_new_packets() {
                Err(e) => {
                    let failure = TlsFailure::Protocol(e.to_string());
                    self.broken = Some(failure.clone());
                    return Err(failure.into_io());
                }
                // Plaintext is taken before more ciphertext goes in (rustls
                // bounds the plaintext it holds).
                Ok(io) if io.plaintext_bytes_to_read() > 0 => break,
                Ok(_) => {}
            }
        }
        Ok(())
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
    /// A send of records was dropped part way: nothing more may be sent.
    abandoned: AtomicBool,
}

impl fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConn")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What a receive or a handshake does after looking at the state.
enum Next {
    /// Ciphertext went to rustls, with this outcome.
    Fed(io::Result<()>),
    /// rustls has records to send before anything more is read.
    Flush,
    /// More ciphertext is needed.
    Receive,
}

/// Holds the write side; its drop lets the next writer in.
struct WriteTurn<'a>(&'a TlsConn);

impl Drop for WriteTurn<'_> {
    fn drop(&mut self) {
        self.0.writing.store(false, Ordering::Release);
        let waiters = std::mem::take(
            &mut *self
                .0
                .write_waiters
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for w in waiters {
            w.wake();
        }
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
    fn new(inner: Conn, mut tls: rustls::Connection) -> Self {
        // The driver bounds what it queues (`outbound_limit`): rustls takes
        // every byte it is given.
        tls.set_buffer_limit(None);
        Self::from_state(
            inner,
            TlsState {
                tls,
                cipher_in: BytesMut::new(),
                records_out: BytesMut::new(),
                queued_plain: 0,
                broken: None,
                peer_eof: false,
            },
        )
    }

    pub(crate) fn from_state(inner: Conn, state: TlsState) -> Self {
        TlsConn {
            inner,
            state: Mutex::new(state),
            writing: AtomicBool::new(false),
            write_waiters: Mutex::new(Vec::new()),
            abandoned: AtomicBool::new(false),
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
        if self.abandoned.load(Ordering::Acquire) {
            return Err(abandoned_send().into_io());
        }
        self.state().check()
    }

    /// Runs the client side of a handshake on `stream` for `server_name`.
    pub(crate) async fn connect(
        stream: Conn,
        config: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
    ) -> io::Result<TlsConn> {
        let session = rustls::ClientConnection::new(config, server_name)
            .map_err(|e| TlsFailure::Protocol(e.to_string()).into_io())?;
        let conn = TlsConn::new(stream, rustls::Connection::Client(session));
        conn.handshake().await?;
        Ok(conn)
    }

    /// What the handshake agreed on.
    pub(crate) fn info(&self) -> TlsInfo {
        let state = self.state();
        let server_name = match &state.tls {
            rustls::Connection::Server(s) => s.server_name().map(str::to_owned),
            rustls::Connection::Client(_) => None,
        };
        TlsInfo {
            server_name,
            alpn: state.tls.alpn_protocol().map(<[u8]>::to_vec),
            version: state.tls.protocol_version(),
        }
    }

    /// Reads and writes until the handshake is done.
    async fn handshake(&self) -> io::Result<()> {
        loop {
            if self.state().tls.wants_write() {
                self.flush().await?;
            }
            let next = {
                let mut state = self.state();
                state.check()?;
                if !state.tls.is_handshaking() {
                    return Ok(());
                }
                if !state.cipher_in.is_empty() {
                    Next::Fed(state.feed())
                } else if state.peer_eof {
                    return Err(TlsFailure::PeerClosedInHandshake.into_io());
                } else {
                    Next::Receive
                }
            };
            match next {
                Next::Fed(Ok(())) => {}
                Next::Fed(Err(e)) => return Err(self.fail(e).await),
                // Sent at the top of the loop.
                Next::Flush => {}
                Next::Receive => self.receive_ciphertext().await?,
            }
        }
    }

    /// After rustls refused what came: sends the alert it queued, if the
    /// socket takes it, and gives back the error.
    async fn fail(&self, e: io::Error) -> io::Error {
        let _ = self.flush_ignoring_state().await;
        e
    }

    /// One receive of ciphertext from the socket into the state's buffer.
    async fn receive_ciphertext(&self) -> io::Result<()> {
        let tail = {
            let mut state = self.state();
            let len = state.cipher_in.len();
            state.cipher_in.reserve(CIPHER_CHUNK);
            state.cipher_in.split_off(len)
        };
        let (res, tail) = self.inner.recv_plain(tail).await;
        let mut state = self.state();
        state.cipher_in.unsplit(tail);
        if res? == 0 {
            state.peer_eof = true;
            // rustls learns of the end (a peer that sent close_notify
            // first ended cleanly; one that did not, uncleanly).
            let _ = state.tls.read_tls(&mut io::empty());
        }
        Ok(())
    }

    /// Plaintext into `buf`'s spare capacity: as a socket receive would,
    /// `Ok(0)` at the peer's clean end (`close_notify`), `UnexpectedEof` at
    /// an end without it.
    pub(crate) async fn recv(&self, mut buf: BytesMut) -> (io::Result<usize>, BytesMut) {
        let res = match self.check() {
            Ok(()) => self.recv_into(&mut buf).await,
            Err(e) => Err(e),
        };
        (res, buf)
    }

    async fn recv_into(&self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            let next = {
                let mut state = self.state();
                state.check()?;
                if let Some(n) = state.take_plaintext(buf)? {
                    return Ok(n);
                }
                if !state.cipher_in.is_empty() {
                    Next::Fed(state.feed())
                } else if state.peer_eof {
                    // rustls saw the end and still says "would block".
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed without close_notify",
                    ));
                } else if state.tls.wants_write() {
                    // Something rustls must say first (a key update).
                    Next::Flush
                } else {
                    Next::Receive
                }
            };
            match next {
                Next::Fed(Ok(())) => {}
                Next::Fed(Err(e)) => return Err(self.fail(e).await),
                Next::Flush => {
                    self.flush().await?;
                    self.receive_ciphertext().await?;
                }
                Next::Receive => self.receive_ciphertext().await?,
            }
        }
    }

    /// Encrypts `buf` and sends the records.
    pub(crate) async fn send_all(&self, buf: Bytes) -> (io::Result<()>, Bytes) {
        let queued = self.check().and_then(|()| {
            let mut state = self.state();
            state.queued_plain += buf.len();
            state.tls.writer().write_all(&buf)
        });
        if let Err(e) = queued {
            return (Err(e), buf);
        }
        (self.flush().await, buf)
    }

    /// Sends `close_notify` (the end of what this side sends), unless the
    /// connection already failed.
    pub(crate) async fn close_notify(&self) -> io::Result<()> {
        self.check()?;
        self.state().tls.send_close_notify();
        self.flush().await
    }

    /// Sends `close_notify`, then shuts the socket down as asked.
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        if how != std::net::Shutdown::Read {
            self.state().tls.send_close_notify();
            self.flush().await?;
        }
        self.inner.shutdown_plain(how).await
    }

    /// Waits for the write side to be free.
    fn write_turn(&self) -> impl Future<Output = WriteTurn<'_>> {
        std::future::poll_fn(move |cx| {
            if self.writing.swap(true, Ordering::AcqRel) {
                self.write_waiters
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(cx.waker().clone());
                // Released meanwhile: try again at once.
                if !self.writing.load(Ordering::Acquire) {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            } else {
                Poll::Ready(WriteTurn(self))
            }
        })
    }

    /// Sends every record rustls has queued.
    async fn flush(&self) -> io::Result<()> {
        self.check()?;
        self.flush_ignoring_state().await
    }

    /// [`flush`](Self::flush) on a connection already failed (to send the
    /// alert that says why).
    async fn flush_ignoring_state(&self) -> io::Result<()> {
        let _turn = self.write_turn().await;
        loop {
            if self.abandoned.load(Ordering::Acquire) {
                return Err(abandoned_send().into_io());
            }
            let records = {
                let mut state = self.state();
                if !state.tls.wants_write() {
                    return Ok(());
                }
                let state = &mut *state;
                // Room for the records at once: the plaintext, a header
                // and tag per 16 KiB record, and some handshake or alert
                // bytes (it grows if that was short).
                let plain = std::mem::take(&mut state.queued_plain);
                state
                    .records_out
                    .reserve(plain + plain / (16 << 10) * 64 + 1024);
                let mut out = (&mut state.records_out).writer();
                while state.tls.wants_write() {
                    state.tls.write_tls(&mut out)?;
                }
                state.records_out.split().freeze()
            };
            let mut in_flight = SendInFlight {
                abandoned: &self.abandoned,
                done: false,
            };
            let (res, _) = self.inner.send_all_plain(records).await;
            in_flight.done = true;
            res?;
        }
    }
}
