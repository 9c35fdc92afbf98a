//! Outbound client pools: framed connections from each shard to one
//! upstream (TCP, Unix or TLS), kept per shard (a connection is used only
//! on the shard that opened it), with a bound on connections and on
//! callers waiting for one, connect and checkout timeouts, and health: a
//! failed connect puts the shard's pool in backoff (exponential, with
//! jitter), during which callers that find no idle connection fail at once
//! instead of queueing on a dead upstream; the first caller after it tries
//! the upstream again while the others still fail fast, and a connection
//! that serves well starts the next backoff from its first step. An idle
//! connection that the upstream closed, or sent bytes nobody asked for, or
//! that sat idle past [`PoolConfig::idle_timeout`], is dropped rather than
//! handed out, as is one given back by a panic, or dropped in the middle of an
//! exchange (a request whose reply did not come, a send or receive cut
//! off). [`Pool::request`] gives up on an upstream that does not answer
//! after [`PoolConfig::request_timeout`]. A connect or a wait that its
//! caller drops gives its place back; the last clone of a pool dropped
//! closes its idle connections on every shard.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use mailring_actors::mailring::{self, ShardId};

use crate::codec::Codec;
use crate::conn::{Framed, FramedError};

/// Where a pool connects.
#[derive(Clone)]
#[non_exhaustive]
pub enum Upstream {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket's path.
    Unix(PathBuf),
    /// TLS over TCP: the address, the name the certificate must carry, the
    /// client configuration.
    Tls {
        /// The address.
        addr: SocketAddr,
        /// The server name (SNI, and what the certificate must name).
        server_name: String,
        /// Trusted roots, ALPN.
        config: Arc<rustls::ClientConfig>,
    },
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Tcp(a) => write!(f, "tcp://{a}"),
            Upstream::Unix(p) => write!(f, "unix:{}", p.display()),
            Upstream::Tls {
                addr, server_name, ..
            } => write!(f, "tls://{server_name}@{addr}"),
        }
    }
}

/// A pool's limits, per shard.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Connections a shard keeps open at most (checked out, idle or being
    /// made). Default 8.
    pub max_connections: usize,
    /// Callers a shard lets wait for a connection when all are checked
    /// out; past it, [`PoolError::Saturated`] at once. Default 256.
    pub max_waiting: usize,
    /// How long a connect (with its TLS handshake) may take. Default 3 s.
    pub connect_timeout: Duration,
    /// How long a caller waits for a connection before
    /// [`PoolError::CheckoutTimeout`]. Default 3 s.
    pub checkout_timeout: Duration,
    /// The first backoff after a failed connect; each further failure
    /// doubles it up to [`max_backoff`](Self::max_backoff), give or take a
    /// jitter of up to a quarter. Default 100 ms.
    pub initial_backoff: Duration,
    /// The longest backoff. Default 10 s.
    pub max_backoff: Duration,
    /// How long [`Pool::request`] waits for its exchange (the send and the
    /// reply) before [`PoolError::RequestTimeout`]: an upstream that
    /// stopped answering without closing (a hung process, a host gone
    /// from the network) fails its callers instead of holding each
    /// connection for good. The connection is dropped. Default 10 s.
    pub request_timeout: Duration,
    /// How long a connection may sit idle in the pool and still be handed
    /// out: one idle longer is closed at the next checkout instead, as the
    /// upstream (its own idle timeout) or a NAT between (its flow table)
    /// may have ended it without a word, and a caller would wait its whole
    /// request timeout on it. Keep it below the upstream's idle timeout.
    /// Default 60 s.
    pub idle_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_connections: 8,
            max_waiting: 256,
            connect_timeout: Duration::from_secs(3),
            checkout_timeout: Duration::from_secs(3),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a pool gave no connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The upstream failed recently and the shard's pool is backing off:
    /// no connect is tried until `retry_in` has passed.
    #[error("upstream {upstream} unhealthy (last error: {last_error}); retry in {retry_in:?}")]
    Unhealthy {
        /// The upstream.
        upstream: String,
        /// What the last connect said.
        last_error: String,
        /// Until the next connect may be tried.
        retry_in: Duration,
    },
    /// A connect failed (and the pool now backs off).
    #[error("connect to {upstream}: {source}")]
    Connect {
        /// The upstream.
        upstream: String,
        /// The error (`TimedOut` past the connect timeout).
        #[source]
        source: io::Error,
    },
    /// Every connection is checked out and `max_waiting` callers wait.
    #[error("pool saturated: {connections} connections busy, {waiting} callers waiting")]
    Saturated {
        /// Connections open on this shard.
        connections: usize,
        /// Callers waiting on this shard.
        waiting: usize,
    },
    /// No connection came back within the checkout timeout.
    #[error("no connection within the checkout timeout")]
    CheckoutTimeout,
    /// Used outside a mailring shard.
    #[error("a pool is used from the tasks of a mailring shard")]
    OffShard,
    /// The request on a checked-out connection failed (the connection is
    /// dropped, not returned).
    #[error("request failed: {0}")]
    Request(#[from] FramedError),
    /// The upstream closed the connection before replying.
    #[error("upstream closed the connection before replying")]
    Closed,
    /// No reply within [`PoolConfig::request_timeout`] (the connection is
    /// dropped).
    #[error("upstream {upstream} did not answer within {after:?}")]
    RequestTimeout {
        /// The upstream.
        upstream: String,
        /// The timeout.
        after: Duration,
    },
}

/// One shard's pool counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolShardStats {
    /// Connects tried.
    pub connects: u64,
    /// Connects that failed (timeouts included).
    pub connect_failures: u64,
    /// Checkouts served by an idle connection.
    pub reused: u64,
    /// Callers refused at once while backing off.
    pub failed_fast: u64,
    /// Callers refused because too many waited.
    pub saturated: u64,
    /// Connections dropped instead of returned (broken, or discarded).
    pub discarded: u64,
    /// Connections open now.
    pub open: u64,
    /// Idle connections now.
    pub idle: u64,
}

#[derive(Default)]
struct Counters {
    connects: AtomicU64,
    connect_failures: AtomicU64,
    reused: AtomicU64,
    failed_fast: AtomicU64,
    saturated: AtomicU64,
    discarded: AtomicU64,
    open: AtomicU64,
    idle: AtomicU64,
}

struct Shared<C: Codec> {
    id: u64,
    upstream: Upstream,
    codec: C,
    config: PoolConfig,
    counters: Box<[Counters]>,
    /// The shards that made their part of the pool, to drop it there when
    /// the pool goes.
    homes: std::sync::Mutex<Vec<(mailring::Handle, ShardId)>>,
}

impl<C: Codec> Drop for Shared<C> {
    fn drop(&mut self) {
        // No checkout is left (each holds a clone of the pool): each shard
        // drops its part, closing its idle connections, in its next tick.
        let id = self.id;
        let homes = std::mem::take(self.homes.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (handle, shard) in homes {
            handle.run_on(shard, move || {
                let part = LOCALS.with(|l| l.borrow_mut().remove(&id));
                drop(part);
            });
        }
    }
}

/// A pool of framed connections to one upstream, one set per shard.
/// Cheap to clone and `Send`: give it to every shard's tasks; each
/// checks out connections of its own shard.
///
/// ```
/// use mailring_transports::codec::LengthDelimited;
/// use mailring_transports::pool::{Pool, PoolConfig, Upstream};
///
/// let pool = Pool::new(
///     Upstream::Tcp("127.0.0.1:7000".parse()?),
///     LengthDelimited::new(),
///     PoolConfig::default(),
///     2, // the runtime's shards
/// );
/// // On a shard: `pool.request(frame).await` checks a connection out,
/// // sends, reads one reply, and puts the connection back.
/// # let _ = pool;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pool<C: Codec> {
    shared: Arc<Shared<C>>,
}

impl<C: Codec> Clone for Pool<C> {
    fn clone(&self) -> Self {
        Pool {
            shared: self.shared.clone(),
        }
    }
}

impl<C: Codec> fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("upstream", &self.shared.upstream)
            .field("config", &self.shared.config)
            .finish()
    }
}

/// Health of a shard's pool.
enum Health {
    Up,
    /// No connect until `until`, after a connect that failed with `error`.
    Backoff {
        until: Instant,
        error: String,
    },
    /// The backoff is over and one caller is trying the upstream again
    /// (until `until` at the latest, its connect timeout); the others fail
    /// fast meanwhile.
    Trying {
        until: Instant,
        error: String,
    },
}

/// A shard's part of a pool.
struct Local<C: Codec> {
    /// Idle connections, each with when it came back.
    idle: Vec<(Framed<C>, std::time::Instant)>,
    open: usize,
    waiting: VecDeque<Rc<Waiter>>,
    health: Health,
    /// The backoff after the last failure (doubles while failures go on).
    last_delay: Option<Duration>,
    /// Connects that succeeded: a connect that fails after one that began
    /// later succeeded says nothing of the upstream now.
    connected: u64,
}

/// A shard's part of a pool, shared by its callers and checkouts.
type Shard<C> = Rc<RefCell<Local<C>>>;

/// A caller waiting for a connection (or for the pool's health to change).
struct Waiter {
    waker: RefCell<Option<Waker>>,
    woken: std::cell::Cell<bool>,
}

thread_local! {
    static LOCALS: RefCell<HashMap<u64, Rc<dyn std::any::Any>>> = RefCell::new(HashMap::new());
}

impl<C: Codec> Pool<C> {
    /// A pool to `upstream` for a runtime of `shards` shards.
    pub fn new(upstream: Upstream, codec: C, config: PoolConfig, shards: usize) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        // The TLS record layer takes the keys after each handshake: the
        // configuration says so once here, not once per connect.
        let upstream = match upstream {
            Upstream::Tls {
                addr,
                server_name,
                config,
            } => Upstream::Tls {
                addr,
                server_name,
                config: crate::tls::with_secret_extraction(config),
            },
            other => other,
        };
        Pool {
            shared: Arc::new(Shared {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                upstream,
                codec,
                config,
                counters: (0..shards.max(1)).map(|_| Counters::default()).collect(),
                homes: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// Counters per shard.
    pub fn stats(&self) -> Vec<PoolShardStats> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.shared
            .counters
            .iter()
            .map(|c| PoolShardStats {
                connects: get(&c.connects),
                connect_failures: get(&c.connect_failures),
                reused: get(&c.reused),
                failed_fast: get(&c.failed_fast),
                saturated: get(&c.saturated),
                discarded: get(&c.discarded),
                open: get(&c.open),
                idle: get(&c.idle),
            })
            .collect()
    }

    fn counters(&self, shard: ShardId) -> &Counters {
        &self.shared.counters[shard.index() % self.shared.counters.len()]
    }

    fn local(&self) -> Result<(ShardId, Shard<C>), PoolError> {
        let shard = mailring::current_shard().ok_or(PoolError::OffShard)?;
        let id = self.shared.id;
        let local = LOCALS.with(|l| {
            l.borrow_mut()
                .entry(id)
                .or_insert_with(|| {
                    if let Some(handle) = mailring::Handle::try_current() {
                        self.shared
                            .homes
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((handle, shard));
                    }
                    Rc::new(RefCell::new(Local::<C> {
                        idle: Vec::new(),
                        open: 0,
                        waiting: VecDeque::new(),
                        health: Health::Up,
                        last_delay: None,
                        connected: 0,
                    })) as Rc<dyn std::any::Any>
                })
                .clone()
        });
        let local = local
            .downcast::<RefCell<Local<C>>>()
            .map_err(|_| PoolError::OffShard)?;
        Ok((shard, local))
    }

    /// A connection of this shard: an idle one, a new one if the shard has
    /// fewer than `max_connections`, or (all busy) the next one returned,
    /// within the checkout timeout. Returned to the pool when the
    /// [`Pooled`] drops, unless [`Pooled::discard`]ed.
    ///
    /// # Errors
    ///
    /// [`PoolError::Unhealthy`] at once while backing off after a failed
    /// connect; [`PoolError::Connect`] for the connect that fails (timeout
    /// included); [`PoolError::Saturated`]; [`PoolError::CheckoutTimeout`];
    /// [`PoolError::OffShard`].
    pub async fn get(&self) -> Result<Pooled<C>, PoolError> {
        let (shard, local) = self.local()?;
        // The runtime's clock; a timeout past any instant saturates.
        let deadline = mailring::time::deadline_in(self.shared.config.checkout_timeout);
        let counters = self.counters(shard);
        // Woken from the queue and back for another look: a caller that
        // got there first took what it was woken for.
        let mut woken_before = false;
        loop {
            let action = {
                let mut l = local.borrow_mut();
                // An idle connection first, whatever the health: it is
                // open, and the upstream answered on it last time.
                // Those idle past the idle timeout are closed, the oldest
                // (the bottom of the stack, in the order they came back)
                // too, not only those a caller would take.
                let now = mailring::time::now();
                let idle_timeout = self.shared.config.idle_timeout;
                let stale = |since: &std::time::Instant| {
                    now.saturating_duration_since(*since) > idle_timeout
                };
                let stale_ones = l.idle.partition_point(|(_, since)| stale(since));
                if stale_ones > 0 {
                    let gone: Vec<_> = l.idle.drain(..stale_ones).collect();
                    counters
                        .idle
                        .fetch_sub(gone.len() as u64, Ordering::Relaxed);
                    counters
                        .discarded
                        .fetch_add(gone.len() as u64, Ordering::Relaxed);
                    counters
                        .open
                        .fetch_sub(gone.len() as u64, Ordering::Relaxed);
                    l.open -= gone.len();
                    // Their places are free: those waiting take them (this
                    // caller may take one, and a spare wake only looks).
                    for _ in 0..gone.len() {
                        match l.waiting.pop_front() {
                            Some(w) => w.wake(),
                            None => break,
                        }
                    }
                }
                while let Some((framed, _)) = l.idle.pop() {
                    counters.idle.fetch_sub(1, Ordering::Relaxed);
                    if !framed.fit_for_reuse() {
                        counters.discarded.fetch_add(1, Ordering::Relaxed);
                        counters.open.fetch_sub(1, Ordering::Relaxed);
                        l.open -= 1;
                        continue;
                    }
                    counters.reused.fetch_add(1, Ordering::Relaxed);
                    return Ok(self.checked_out(&local, shard, framed));
                }
                let now = mailring::time::now();
                let trying_again = match &l.health {
                    Health::Up => false,
                    Health::Backoff { until, error } | Health::Trying { until, error }
                        if now < *until =>
                    {
                        counters.failed_fast.fetch_add(1, Ordering::Relaxed);
                        return Err(PoolError::Unhealthy {
                            upstream: format!("{:?}", self.shared.upstream),
                            last_error: error.clone(),
                            retry_in: *until - now,
                        });
                    }
                    // The backoff is over (or a try outlived its connect
                    // timeout without ending): this caller tries.
                    Health::Backoff { .. } | Health::Trying { .. } => true,
                };
                if l.open < self.shared.config.max_connections.max(1) {
                    l.open += 1;
                    counters.open.fetch_add(1, Ordering::Relaxed);
                    if trying_again {
                        let error = match std::mem::replace(&mut l.health, Health::Up) {
                            Health::Backoff { error, .. } | Health::Trying { error, .. } => error,
                            Health::Up => String::new(),
                        };
                        l.health = Health::Trying {
                            until: mailring::time::deadline_in(self.shared.config.connect_timeout),
                            error,
                        };
                    }
                    None
                } else {
                    let waiter = Rc::new(Waiter {
                        waker: RefCell::new(None),
                        woken: std::cell::Cell::new(false),
                    });
                    if woken_before {
                        // It keeps its turn: first in line again, and
                        // never refused for a queue that filled behind it.
                        l.waiting.push_front(waiter.clone());
                    } else {
                        if l.waiting.len() >= self.shared.config.max_waiting {
                            counters.saturated.fetch_add(1, Ordering::Relaxed);
                            return Err(PoolError::Saturated {
                                connections: l.open,
                                waiting: l.waiting.len(),
                            });
                        }
                        l.waiting.push_back(waiter.clone());
                    }
                    Some(waiter)
                }
            };
            match action {
                None => {
                    let place = Place {
                        connected_before: local.borrow().connected,
                        local: local.clone(),
                        counters,
                        armed: true,
                    };
                    return self.connect(shard, place).await;
                }
                Some(waiter) => {
                    // Dropped while queued: out of the queue; dropped once
                    // woken: the wake goes on to the next in line.
                    let mut in_queue = InQueue {
                        local: local.clone(),
                        waiter,
                        done: false,
                    };
                    let waiter = &in_queue.waiter;
                    let woken = std::future::poll_fn(|cx| {
                        if waiter.woken.get() {
                            Poll::Ready(())
                        } else {
                            *waiter.waker.borrow_mut() = Some(cx.waker().clone());
                            Poll::Pending
                        }
                    });
                    let waited = mailring::time::timeout_at(deadline, woken).await;
                    in_queue.done = true;
                    if waited.is_err() {
                        in_queue.leave();
                        return Err(PoolError::CheckoutTimeout);
                    }
                    woken_before = true;
                }
            }
        }
    }

    fn checked_out(&self, local: &Shard<C>, shard: ShardId, framed: Framed<C>) -> Pooled<C> {
        Pooled {
            pool: self.clone(),
            local: local.clone(),
            shard,
            at: framed.frames(),
            framed: Some(framed),
            discard: false,
        }
    }

    /// Makes a connection in `place` (already counted in `open`; given
    /// back if the connect fails or its caller drops it).
    async fn connect(
        &self,
        shard: ShardId,
        mut place: Place<'_, C>,
    ) -> Result<Pooled<C>, PoolError> {
        let counters = place.counters;
        counters.connects.fetch_add(1, Ordering::Relaxed);
        let codec = self.shared.codec.clone();
        let made = mailring::time::timeout(self.shared.config.connect_timeout, async {
            match &self.shared.upstream {
                Upstream::Tcp(addr) => Framed::connect_tcp(*addr, codec).await,
                Upstream::Unix(path) => Framed::connect_unix(path, codec).await,
                Upstream::Tls {
                    addr,
                    server_name,
                    config,
                } => Framed::connect_tls(*addr, server_name, config.clone(), codec).await,
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no connection within {:?}",
                    self.shared.config.connect_timeout
                ),
            ))
        });
        place.armed = false;
        let local = place.local.clone();
        let mut l = local.borrow_mut();
        match made {
            Ok(framed) => {
                l.health = Health::Up;
                l.last_delay = None;
                l.connected += 1;
                // A waiter woken while this try was under way may have
                // failed fast and left the place it was woken for: with
                // the upstream up, the next in line takes it (a spurious
                // wake only makes it look again).
                if l.open < self.shared.config.max_connections.max(1) {
                    if let Some(w) = l.waiting.pop_front() {
                        w.wake();
                    }
                }
                Ok(self.checked_out(&local, shard, framed))
            }
            Err(e) => {
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                counters.open.fetch_sub(1, Ordering::Relaxed);
                l.open -= 1;
                let now = mailring::time::now();
                // Connects that were under way together fail together: one
                // backoff for them all, not one doubling each.
                // One that began before a connect that has since succeeded
                // is stale news: the upstream answered after it began.
                let backing_off =
                    matches!(&l.health, Health::Backoff { until, .. } if now < *until);
                let stale = l.connected != place.connected_before;
                if !backing_off && !stale {
                    let config = &self.shared.config;
                    let delay = match l.last_delay {
                        None => config.initial_backoff,
                        Some(d) => d.saturating_mul(2),
                    }
                    .min(config.max_backoff);
                    l.last_delay = Some(delay);
                    l.health = Health::Backoff {
                        until: mailring::time::deadline_in(jittered(delay)),
                        error: e.to_string(),
                    };
                }
                // Those waiting learn of it now: each takes a connection
                // that came back idle, or fails fast.
                for w in l.waiting.drain(..) {
                    w.wake();
                }
                Err(PoolError::Connect {
                    upstream: format!("{:?}", self.shared.upstream),
                    source: e,
                })
            }
        }
    }

    /// Checks a connection out, sends `frame`, reads one reply, and puts
    /// the connection back (a connection that failed is dropped instead).
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); [`PoolError::Request`] or
    /// [`PoolError::Closed`] when the exchange fails.
    pub async fn request(&self, frame: C::Out) -> Result<C::In, PoolError> {
        let mut conn = self.get().await?;
        let after = self.shared.config.request_timeout;
        // Dropped before the reply (a caller's own timeout, or this one):
        // the connection may still get that reply, so it does not go back
        // (see `Pooled`'s drop).
        let exchange = async {
            conn.send(frame)
                .await
                .map_err(|e| PoolError::Request(FramedError::Io(e)))?;
            match conn.recv().await {
                Ok(Some(reply)) => Ok(reply),
                Ok(None) => Err(PoolError::Closed),
                Err(e) => Err(PoolError::Request(e)),
            }
        };
        let result = mailring::time::timeout(after, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(PoolError::RequestTimeout {
                    upstream: format!("{:?}", self.shared.upstream),
                    after,
                })
            });
        if result.is_err() {
            conn.discard();
        }
        result
    }
}

impl Waiter {
    fn wake(&self) {
        self.woken.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A place counted in a shard's `open` for a connect under way: given
/// back, with the next waiter woken to use it, unless the connect ended
/// (its caller dropped it, or it panicked).
struct Place<'a, C: Codec> {
    local: Shard<C>,
    counters: &'a Counters,
    armed: bool,
    /// The shard's count of successful connects when this one began.
    connected_before: u64,
}

impl<C: Codec> Drop for Place<'_, C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
        let Ok(mut l) = self.local.try_borrow_mut() else {
            return;
        };
        l.open -= 1;
        // A try of the upstream that ended without an answer: the next
        // caller tries.
        if let Health::Trying { error, .. } = &l.health {
            l.health = Health::Backoff {
                until: mailring::time::now(),
                error: error.clone(),
            };
        }
        if let Some(w) = l.waiting.pop_front() {
            w.wake();
        }
    }
}

/// A caller's place in a shard's queue of waiters, for as long as it
/// waits.
struct InQueue<C: Codec> {
    local: Shard<C>,
    waiter: Rc<Waiter>,
    /// The wait ended (woken, or timed out): nothing to undo on drop.
    done: bool,
}

impl<C: Codec> InQueue<C> {
    /// Leaves the queue.
    fn leave(&self) {
        if let Ok(mut l) = self.local.try_borrow_mut() {
            l.waiting.retain(|w| !Rc::ptr_eq(w, &self.waiter));
        }
    }
}

impl<C: Codec> Drop for InQueue<C> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.waiter.woken.get() {
            // Woken for a connection (or a place) it will not take: the
            // next in line gets the wake instead.
            if let Ok(mut l) = self.local.try_borrow_mut() {
                if let Some(w) = l.waiting.pop_front() {
                    w.wake();
                }
            }
        } else {
            self.leave();
        }
    }
}

/// `delay` give or take up to a quarter, from the clock's low bits (no
/// shared random state: shards back off at different moments).
fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let quarter = delay / 4;
    // A fraction in [0, 1) of half the delay, then centred.
    let spread = quarter.mul_f64(2.0 * f64::from(nanos % 1_000_000) / 1_000_000.0);
    (delay - quarter).saturating_add(spread)
}

/// A connection checked out of a [`Pool`], on this shard; back to the
/// pool when dropped (unless [`discard`](Self::discard)ed). Derefs to the
/// [`Framed`] connection.
///
/// It goes back only between exchanges: when every frame sent since the
/// checkout has had its reply (a frame received for each; more is fine, a
/// greeting) and no send or receive was cut off mid-way (its future
/// dropped: part of a frame may be on the wire, or bytes read lost), and
/// not dropped by a panic's unwinding (what the caller's code set up on
/// it is unknown). Otherwise it is closed, so the next caller never reads
/// a reply meant for another. A protocol whose requests do not each get one reply
/// frame should [`discard`](Self::discard) or keep its own connections.
pub struct Pooled<C: Codec> {
    pool: Pool<C>,
    local: Shard<C>,
    shard: ShardId,
    framed: Option<Framed<C>>,
    discard: bool,
    /// The connection's frames out and in when it was checked out.
    at: (u64, u64),
}

impl<C: Codec> fmt::Debug for Pooled<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pooled")
            .field("upstream", &self.pool.shared.upstream)
            .field("shard", &self.shard)
            .finish()
    }
}

impl<C: Codec> Pooled<C> {
    /// Drops the connection instead of returning it (after an error, or a
    /// protocol state the next user must not see).
    pub fn discard(&mut self) {
        self.discard = true;
    }
}

impl<C: Codec> std::ops::Deref for Pooled<C> {
    type Target = Framed<C>;

    fn deref(&self) -> &Framed<C> {
        self.framed.as_ref().expect("present until drop")
    }
}

impl<C: Codec> std::ops::DerefMut for Pooled<C> {
    fn deref_mut(&mut self) -> &mut Framed<C> {
        self.framed.as_mut().expect("present until drop")
    }
}

impl<C: Codec> Drop for Pooled<C> {
    fn drop(&mut self) {
        let Some(framed) = self.framed.take() else {
            return;
        };
        let counters = self.pool.counters(self.shard);
        let Ok(mut l) = self.local.try_borrow_mut() else {
            counters.open.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        // Dropped by a panic's unwinding: what the caller's code set up on
        // the connection (a transaction begun, a database selected) is
        // unknown, whatever the frame counts say.
        let unwinding = std::thread::panicking();
        if self.discard || unwinding || !framed.between_exchanges(self.at) || framed.is_closed() {
            counters.discarded.fetch_add(1, Ordering::Relaxed);
            counters.open.fetch_sub(1, Ordering::Relaxed);
            l.open -= 1;
        } else {
            // It served well: the next failure backs off from the first
            // step again.
            l.last_delay = None;
            counters.idle.fetch_add(1, Ordering::Relaxed);
            l.idle.push((framed, mailring::time::now()));
        }
        // The next waiter takes it (or the freed place).
        if let Some(w) = l.waiting.pop_front() {
            w.wake();
        }
    }
}
