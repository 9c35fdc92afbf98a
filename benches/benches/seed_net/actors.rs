//! The seed workloads written as a mailring user writes them: each client
//! connection is owned by a keyed actor (`StreamOwner`, key = stream index,
//! placed on shard `index % shards`), which talks through
//! `mailring_transports::Framed` with the length-delimited codec; the
//! driver asks the owners for work and joins the replies; the keyed
//! workload's dispatches are `tell`s to two keyed `Owner` actors.
//!
//! Not written at the seed's level on purpose: a Framed user pipelines a
//! window by feeding its frames and flushing once (the seed's pipeline
//! workload sends each frame on its own), and frames carry a 4-byte length
//! header inside the seed's frame size, so the bytes on the wire are the
//! same. Placement is static (the seed's stealable workloads move tasks; a
//! keyed actor stays on its key's shard).

use bytes::{BufMut, Bytes, BytesMut};
use mailring_actors::{Actor, ActorSystem, Addr, Ctx, Handler, Message, ShardId, SystemConfig};
use mailring_transports::codec::LengthDelimited;
use mailring_transports::Framed;

use super::{
    burst_flip_frames_for_phase, hotspot_iters_for_frame, hotspot_rotation_frames_for_step,
    imbalanced_frames_for_stream, join_all, keyed_expected_per_owner, mpsc, pipeline_cpu_stage,
    spawn_echo_server_with_clients, Cmd, MailringHarness, Shape, SocketAddr, StreamExt,
    KEYED_DISPATCHES_PER_FRAME, STREAMS,
};

/// The length header inside each seed frame.
const HEADER: usize = 4;

/// One client connection, on shard `key % shards`.
#[derive(Actor)]
#[actor(
    key = usize,
    activate = StreamOwner::new,
    placement = StreamOwner::place,
    handles(Connect, Windowed, Pipelined, Rtt, KeyedSteps)
)]
pub(crate) struct StreamOwner {
    idx: usize,
    conn: Option<Framed<LengthDelimited>>,
    /// Frames of the current size, one per first byte (a clone is a
    /// reference count, not a copy).
    frames: Vec<Bytes>,
}

impl StreamOwner {
    fn new(key: &usize) -> Self {
        StreamOwner {
            idx: *key,
            conn: None,
            frames: Vec::new(),
        }
    }

    fn place(key: &usize, shards: usize) -> ShardId {
        ShardId::new(key % shards.max(1))
    }

    /// The frame whose first body byte is `seq as u8`, `wire` bytes on the
    /// wire with its header.
    fn frame(&mut self, wire: usize, seq: usize) -> Bytes {
        let body = wire.max(HEADER + 1) - HEADER;
        if self.frames.first().map(Bytes::len) != Some(body) {
            self.frames = (0..=255u8)
                .map(|b| {
                    let mut f = BytesMut::with_capacity(body);
                    f.put_u8(b);
                    f.put_bytes(0, body - 1);
                    f.freeze()
                })
                .collect();
        }
        self.frames[seq % 256].clone()
    }

    fn conn(&mut self) -> &mut Framed<LengthDelimited> {
        self.conn.as_mut().expect("connected first")
    }

    /// Round trips of `frames` frames, `window` written at a time.
    async fn windowed(&mut self, frames: usize, wire: usize, window: usize) -> u64 {
        let window = window.max(1);
        let mut checksum = 0u64;
        let mut next = 0;
        while next < frames {
            let batch = (frames - next).min(window);
            for i in 0..batch {
                let f = self.frame(wire, next + i);
                self.conn().feed(f).expect("frame fits");
            }
            self.conn().flush().await.expect("send");
            for _ in 0..batch {
                let back = self.conn().recv().await.expect("recv").expect("echo open");
                checksum = checksum.wrapping_add(u64::from(back[0]));
            }
            next += batch;
        }
        checksum
    }
}

#[derive(Message)]
#[message(reply = ())]
pub(crate) struct Connect(SocketAddr);

impl Handler<Connect> for StreamOwner {
    async fn handle(&mut self, m: Connect, _cx: &mut Ctx<Self>) {
        let framed = Framed::connect_tcp(m.0, LengthDelimited::new())
            .await
            .expect("connect to the echo server");
        self.conn = Some(framed);
    }
}

#[derive(Message)]
#[message(reply = u64)]
pub(crate) struct Windowed {
    frames: usize,
    wire: usize,
    window: usize,
}

impl Handler<Windowed> for StreamOwner {
    async fn handle(&mut self, m: Windowed, _cx: &mut Ctx<Self>) -> u64 {
        self.windowed(m.frames, m.wire, m.window).await
    }
}

#[derive(Message)]
#[message(reply = u64)]
pub(crate) struct Pipelined {
    frames: usize,
    wire: usize,
    window: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
}

impl Handler<Pipelined> for StreamOwner {
    async fn handle(&mut self, m: Pipelined, _cx: &mut Ctx<Self>) -> u64 {
        let window = m.window.max(1);
        let mut checksum = 0u64;
        let mut next = 0;
        while next < m.frames {
            let batch = (m.frames - next).min(window);
            for i in 0..batch {
                let f = self.frame(m.wire, next + i);
                self.conn().feed(f).expect("frame fits");
            }
            self.conn().flush().await.expect("send");
            for i in 0..batch {
                let back = self.conn().recv().await.expect("recv").expect("echo open");
                let frame_idx = next + i;
                let iters = hotspot_iters_for_frame(
                    self.idx,
                    frame_idx,
                    STREAMS,
                    m.rotate_every,
                    m.heavy_iters,
                    m.light_iters,
                );
                checksum =
                    checksum.wrapping_add(pipeline_cpu_stage(back[0], self.idx, frame_idx, iters));
            }
            next += batch;
        }
        checksum
    }
}

#[derive(Message)]
#[message(reply = u64)]
pub(crate) struct Rtt {
    rounds: usize,
    wire: usize,
}

impl Handler<Rtt> for StreamOwner {
    async fn handle(&mut self, m: Rtt, _cx: &mut Ctx<Self>) -> u64 {
        self.windowed(m.rounds, m.wire, 1).await
    }
}

/// The rotation's steps, each followed by `frames * 16` dispatches told to
/// owner `step % owners` (`owners == 0`: no dispatches).
#[derive(Clone, Copy, Message)]
#[message(reply = u64)]
pub(crate) struct KeyedSteps {
    steps: usize,
    heavy: usize,
    light: usize,
    wire: usize,
    window: usize,
    owners: usize,
}

impl Handler<KeyedSteps> for StreamOwner {
    async fn handle(&mut self, m: KeyedSteps, cx: &mut Ctx<Self>) -> u64 {
        let owners: Vec<Addr<Owner>> = (0..m.owners)
            .map(|o| cx.system().keyed::<Owner>(o))
            .collect();
        let mut sum = 0u64;
        for step in 0..m.steps {
            let frames =
                hotspot_rotation_frames_for_step(self.idx, step, STREAMS, m.heavy, m.light);
            if frames == 0 {
                continue;
            }
            sum = sum.wrapping_add(self.windowed(frames, m.wire, m.window).await);
            if let Some(owner) = owners.get(step % m.owners.max(1)) {
                for _ in 0..frames * KEYED_DISPATCHES_PER_FRAME {
                    owner.tell(Dispatch).expect("owner lives");
                }
            }
        }
        sum
    }
}

/// A keyed dispatch target: counts what it is told.
#[derive(Actor)]
#[actor(
    key = usize,
    activate = Owner::new,
    placement = Owner::place,
    handles(Dispatch, TakeCount)
)]
pub(crate) struct Owner {
    count: u64,
}

impl Owner {
    fn new(_key: &usize) -> Self {
        Owner { count: 0 }
    }

    fn place(key: &usize, shards: usize) -> ShardId {
        ShardId::new(key % shards.max(1))
    }
}

#[derive(Message)]
pub(crate) struct Dispatch;

impl Handler<Dispatch> for Owner {
    async fn handle(&mut self, _m: Dispatch, _cx: &mut Ctx<Self>) {
        self.count += 1;
    }
}

/// The count so far, reset to zero.
#[derive(Message)]
#[message(reply = u64)]
pub(crate) struct TakeCount;

impl Handler<TakeCount> for Owner {
    async fn handle(&mut self, _m: TakeCount, _cx: &mut Ctx<Self>) -> u64 {
        std::mem::take(&mut self.count)
    }
}

/// The harness (the hand-placed version's, with an actor system): a
/// driver task on shard 1 asking the stream owners.
pub(crate) fn harness() -> MailringHarness {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("mailring runtime (needs io_uring)");
    let system = ActorSystem::start_on(rt.handle(), SystemConfig::default()).expect("actor system");
    let sys = system.handle();
    let (addr, echo) = spawn_echo_server_with_clients("bench-net-echo-actors", STREAMS);
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded::<Cmd>();
    let worker = rt
        .handle()
        .spawn_local_on(ShardId::new(1), move || async move {
            let streams: Vec<Addr<StreamOwner>> =
                (0..STREAMS).map(|i| sys.keyed::<StreamOwner>(i)).collect();
            for s in &streams {
                s.ask(Connect(addr)).await.expect("connect");
            }
            while let Some((shape, reply)) = cmd_rx.next().await {
                let value = run(&sys, &streams, shape).await;
                let _ = reply.send(value);
            }
        });
    MailringHarness {
        rt: Some(rt),
        system: Some(system),
        cmd_tx: Some(cmd_tx),
        worker: Some(worker),
        echo: Some(echo),
    }
}

/// Every stream runs `steps`; the sum of their checksums.
async fn keyed_steps(streams: &[Addr<StreamOwner>], steps: KeyedSteps) -> u64 {
    sum_of(streams.iter().map(|s| s.ask(steps)).collect()).await
}

async fn sum_of(asks: Vec<mailring_actors::Reply<u64>>) -> u64 {
    join_all(asks)
        .await
        .into_iter()
        .map(|r| r.expect("stream owner"))
        .fold(0u64, u64::wrapping_add)
}

async fn run(
    sys: &mailring_actors::SystemHandle,
    streams: &[Addr<StreamOwner>],
    shape: Shape,
) -> u64 {
    match shape {
        Shape::Imbalanced {
            heavy,
            light,
            payload,
            window,
        } => {
            let asks = (0..STREAMS)
                .map(|idx| {
                    streams[idx].ask(Windowed {
                        frames: imbalanced_frames_for_stream(idx, heavy, light),
                        wire: payload,
                        window,
                    })
                })
                .collect();
            sum_of(asks).await
        }
        Shape::Rotation {
            steps,
            heavy,
            light,
            payload,
            window,
        } => {
            keyed_steps(
                streams,
                KeyedSteps {
                    steps,
                    heavy,
                    light,
                    wire: payload,
                    window,
                    owners: 0,
                },
            )
            .await
        }
        Shape::Pipeline {
            frames,
            payload,
            window,
            rotate_every,
            heavy_iters,
            light_iters,
        } => {
            let asks = streams
                .iter()
                .map(|s| {
                    s.ask(Pipelined {
                        frames,
                        wire: payload,
                        window,
                        rotate_every,
                        heavy_iters,
                        light_iters,
                    })
                })
                .collect();
            sum_of(asks).await
        }
        Shape::Keyed {
            steps,
            heavy,
            light,
            payload,
            window,
            owners,
        } => {
            let owners = owners.clamp(1, 2);
            let mut checksum = keyed_steps(
                streams,
                KeyedSteps {
                    steps,
                    heavy,
                    light,
                    wire: payload,
                    window,
                    owners,
                },
            )
            .await;
            // Tells from the stream owners' shards may still be on their
            // way: take counts until each owner has seen all of its own.
            let expected = keyed_expected_per_owner(steps, heavy, light, owners);
            for (o, want) in expected.into_iter().enumerate() {
                let owner = sys.keyed::<Owner>(o);
                let mut got = 0u64;
                while got < want {
                    got += owner.ask(TakeCount).await.expect("owner");
                    if got < want {
                        mailring::yield_now().await;
                    }
                }
                checksum = checksum.wrapping_add(got);
            }
            checksum
        }
        Shape::BurstFlip {
            phases,
            flip_every,
            hot,
            cold,
            payload,
            window,
        } => {
            let mut checksum = 0u64;
            for phase in 0..phases {
                let asks = (0..STREAMS)
                    .map(|idx| {
                        streams[idx].ask(Windowed {
                            frames: burst_flip_frames_for_phase(
                                idx, phase, STREAMS, flip_every, hot, cold,
                            ),
                            wire: payload,
                            window,
                        })
                    })
                    .collect();
                checksum = checksum.wrapping_add(sum_of(asks).await);
            }
            checksum
        }
        Shape::Rtt { rounds, payload } => streams[0]
            .ask(Rtt {
                rounds,
                wire: payload,
            })
            .await
            .expect("stream owner"),
    }
}
