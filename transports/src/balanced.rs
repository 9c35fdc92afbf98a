//! A TCP listener on every shard that keeps the shards' connections even:
//! what serves hyper, tonic or any other handler of plain connections
//! (wrapped in [`CompatStream`](crate::compat::CompatStream) or used as
//! they are) on all of a runtime's shards.
//!
//! One `SO_REUSEPORT` listener per shard (steered by source port where the
//! kernel takes the program, as [`Server`](crate::Server)'s are) accepts;
//! the kernel's spread of a few connections is uneven (8 split 5 and 3
//! more often than 4 and 4), and a connection stays on the shard that
//! serves it, so a fresh connection whose shard serves more of this
//! listener's connections than another moves there once, before a byte of
//! it is read, and its handler runs there.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mailring_actors::mailring::net::{TcpListener, TcpStream};
use mailring_actors::mailring::{self, Handle, JoinHandle, ShardId};

/// How long an accept loop waits, at first, after an accept that failed
/// for a reason that is not the connection's own (out of descriptors or
/// memory, a listener that fails for good) before it tries again; the wait
/// doubles while they go on failing.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between failed accepts, while they go on failing.
const ACCEPT_ERROR_PAUSE_MAX: Duration = Duration::from_secs(1);

/// What the accept loops and the handlers share.
struct Shared<F> {
    serve: F,
    /// This listener's connections being served, per shard.
    open: Arc<[AtomicUsize]>,
    moved: AtomicU64,
    accept_errors: AtomicU64,
}

/// TCP connections accepted on every shard, each served by a handler on
/// the shard with the fewest of them (see the `balanced` module's doc).
///
/// Dropping it (or [`close`](Self::close)) stops accepting; connections
/// being served go on until their handlers return.
///
/// ```
/// use mailring_transports::BalancedListener;
///
/// let rt = mailring_actors::Runtime::builder().shards(2).build()?;
/// let listener = BalancedListener::bind(
///     rt.handle(),
///     "127.0.0.1:0".parse().unwrap(),
///     |stream, _peer| async move {
///         // Runs on the connection's shard: echo one message.
///         let (n, buf) = stream.recv(Vec::with_capacity(64)).await;
///         if n.is_ok() {
///             let _ = stream.send_all(buf).await;
///         }
///     },
/// )?;
/// let mut c = std::net::TcpStream::connect(listener.local_addr())?;
/// use std::io::{Read, Write};
/// c.write_all(b"ping")?;
/// let mut got = [0u8; 4];
/// c.read_exact(&mut got)?;
/// assert_eq!(&got, b"ping");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BalancedListener {
    local_addr: SocketAddr,
    steered: bool,
    counts: Arc<dyn Counts>,
    loops: Vec<JoinHandle<()>>,
}

/// The counters of a [`BalancedListener`], whatever its handler's type.
trait Counts: Send + Sync {
    fn open(&self) -> Vec<usize>;
    fn moved(&self) -> u64;
    fn accept_errors(&self) -> u64;
}

impl<F: Send + Sync> Counts for Shared<F> {
    fn open(&self) -> Vec<usize> {
        self.open
            .iter()
            .map(|n| n.load(Ordering::Acquire))
            .collect()
    }
    fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }
    fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }
}

impl BalancedListener {
    /// Binds `addr` on every shard of the runtime of `handle` and serves
    /// each connection with `serve(stream, peer)` on its shard.
    ///
    /// # Errors
    ///
    /// The OS error of a bind (`AddrInUse` where anything listens on
    /// `addr`, reuseport group or not).
    pub fn bind<F, Fut>(handle: &Handle, addr: SocketAddr, serve: F) -> io::Result<Self>
    where
        F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let shards = handle.shards();
        if addr.port() != 0 {
            // A reuseport group would share the port with another
            // process's group and split its connections: refuse as a
            // single listener would.
            drop(crate::server::probe_port(addr)?);
        }
        let mut sockets = Vec::with_capacity(shards);
        let mut bound = addr;
        for _ in 0..shards {
            let socket = TcpListener::bind_std(bound, true)?;
            bound = socket.local_addr()?;
            sockets.push(socket);
        }
        let steered = {
            use std::os::fd::AsFd;
            match mailring::net::steer_by_source_port(sockets[0].as_fd(), shards) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("mailring-transports: source-port steering (running unsteered): {e}");
                    false
                }
            }
        };
        let shared = Arc::new(Shared {
            serve,
            open: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            moved: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
        });
        let loops = sockets
            .into_iter()
            .enumerate()
            .map(|(i, socket)| {
                let shared = shared.clone();
                let handle_for_moves = handle.clone();
                handle.spawn_local_on(ShardId::new(i), move || {
                    accept_loop(shared, handle_for_moves, socket, ShardId::new(i))
                })
            })
            .collect();
        Ok(BalancedListener {
            local_addr: bound,
            steered,
            counts: shared,
            loops,
        })
    }

    /// The address the listeners are bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the kernel steers connections by source port (see
    /// [`ServerConfig::source_port_steering`](crate::ServerConfig)).
    pub fn is_steered(&self) -> bool {
        self.steered
    }

    /// This listener's connections being served now, per shard.
    pub fn open_per_shard(&self) -> Vec<usize> {
        self.counts.open()
    }

    /// Connections moved from the shard that accepted them to a shard
    /// that served fewer.
    pub fn moved(&self) -> u64 {
        self.counts.moved()
    }

    /// Accepts that failed (each for a reason not the connection's own,
    /// such as a want of descriptors or memory, followed by a pause of
    /// 10 ms that doubles, up to a second, while they go on).
    pub fn accept_errors(&self) -> u64 {
        self.counts.accept_errors()
    }

    /// Stops accepting: the listeners close once their shards see it.
    /// Connections being served go on.
    pub fn close(&self) {
        for l in &self.loops {
            l.abort();
        }
    }
}

impl Drop for BalancedListener {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for BalancedListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancedListener")
            .field("local_addr", &self.local_addr)
            .field("open_per_shard", &self.open_per_shard())
            .finish_non_exhaustive()
    }
}

async fn accept_loop<F, Fut>(
    shared: Arc<Shared<F>>,
    handle: Handle,
    socket: std::net::TcpListener,
    here: ShardId,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let listener = match TcpListener::from_std(socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mailring-transports: a balanced listener on {here:?}: {e}");
            return;
        }
    };
    let mut pause = ACCEPT_ERROR_PAUSE;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                pause = ACCEPT_ERROR_PAUSE;
                accepted
            }
            Err(e) => {
                shared.accept_errors.fetch_add(1, Ordering::Relaxed);
                // Out of descriptors or memory, or a listener that fails
                // for good: breathe before the next, longer while it
                // lasts. A connection the peer reset before it was taken
                // (ECONNABORTED) concerns only itself.
                if crate::server::accept_error_concerns_one_connection(&e) {
                    pause = ACCEPT_ERROR_PAUSE;
                } else {
                    mailring::time::sleep(pause).await;
                    pause = (pause * 2).min(ACCEPT_ERROR_PAUSE_MAX);
                }
                continue;
            }
        };
        let to = less_loaded(shared.open.len(), here, |i| {
            shared.open[i].load(Ordering::Acquire)
        })
        .unwrap_or(here);
        if to != here {
            match stream.into_std() {
                Ok(std_stream) => {
                    shared.moved.fetch_add(1, Ordering::Relaxed);
                    // Counted there now, so the next accepts see it.
                    let counted = Served::new(&shared.open, to);
                    let shared = shared.clone();
                    drop(handle.spawn_local_on(to, move || async move {
                        match TcpStream::from_std(std_stream) {
                            Ok(stream) => (shared.serve)(stream, peer).await,
                            Err(e) => {
                                eprintln!("mailring-transports: a moved connection: {e}");
                            }
                        }
                        drop(counted);
                    }));
                    continue;
                }
                // An operation in flight (none on a fresh stream): serve
                // it here.
                Err(stream) => serve_here(&shared, stream, peer, here),
            }
        } else {
            serve_here(&shared, stream, peer, here);
        }
    }
}

fn serve_here<F, Fut>(shared: &Arc<Shared<F>>, stream: TcpStream, peer: SocketAddr, here: ShardId)
where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let counted = Served::new(&shared.open, here);
    let shared = shared.clone();
    drop(mailring::spawn_local(async move {
        (shared.serve)(stream, peer).await;
        drop(counted);
    }));
}

/// The shard with the least `load` of `shards`, when `here`'s load is
/// more than it (the first such shard on a tie); each load read once.
/// What both balancers ask of a fresh connection: this listener's and
/// `Server`'s.
pub(crate) fn less_loaded(
    shards: usize,
    here: ShardId,
    load: impl Fn(usize) -> usize,
) -> Option<ShardId> {
    let mut mine = 0;
    let mut best = (here.index(), usize::MAX);
    for i in 0..shards {
        let n = load(i);
        if i == here.index() {
            mine = n;
        }
        if n < best.1 {
            best = (i, n);
        }
    }
    (mine > best.1).then(|| ShardId::new(best.0))
}

/// Counts a connection as served on a shard until its handler returns,
/// panics, or its task is dropped unrun (a runtime shutting down).
struct Served {
    open: Arc<[AtomicUsize]>,
    shard: usize,
}

impl Served {
    fn new(open: &Arc<[AtomicUsize]>, shard: ShardId) -> Self {
        open[shard.index()].fetch_add(1, Ordering::AcqRel);
        Served {
            open: open.clone(),
            shard: shard.index(),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.open[self.shard].fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_moves_only_from_a_shard_more_loaded_than_the_least() {
        let at = |loads: &'static [usize], here: usize| {
            less_loaded(loads.len(), ShardId::new(here), |i| loads[i]).map(|s| s.index())
        };
        assert_eq!(at(&[2, 2], 0), None, "a tie stays");
        assert_eq!(at(&[1, 3], 0), None, "the least stays");
        assert_eq!(at(&[3, 1], 0), Some(1));
        assert_eq!(at(&[4, 1, 1], 0), Some(1), "the first least");
        assert_eq!(at(&[0, 5, 0], 1), Some(0));
        assert_eq!(at(&[usize::MAX, 0], 0), Some(1));
        assert_eq!(at(&[7], 0), None, "one shard");
    }
}
