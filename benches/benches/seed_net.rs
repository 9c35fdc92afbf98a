//! The eight session-shaped "seed" network workloads of spargio 0.5.13
//! (`benches/net_api.rs` of the published crate: constants and harness shape
//! copied with their line numbers), for mailring, Tokio, spargio 0.5.13 and
//! compio 0.19.2, written at the same level.
//!
//! Run: `cargo bench -p mailring-bench --bench seed_net` (latest results in
//! `benches/results/seed-net-*.txt`).
//!
//! Shape of every workload: one std-thread echo server per contender (one blocking thread per
//! connection, 127.0.0.1 only), 8 persistent client connections owned by the
//! runtime under test, a long-lived driver in that runtime that takes a command
//! from the bench thread, runs the workload over the 8 streams and replies on a
//! std channel. What is timed is that whole command round trip, as in the seed.
//!
//! | contender | driver | per-stream work |
//! | --- | --- | --- |
//! | mailring | task pinned on shard 1 (spawn_local_on) | `spawn_on(stream's shard)` (= spargio `spawn_on_session`), or `mailring::spawn` (Stealable) where spargio uses `spawn_stealable` |
//! | tokio | block_on loop on its own thread, 2 workers | `JoinSet::spawn` per stream |
//! | spargio | `StealablePreferred(1)` task, 2 shards | as the seed: `spawn_on_session` or `spawn_stealable` |
//! | compio | block_on loop on its own thread (1 ring) | `join_all` of per-stream futures |
//! | mailring-poll | as mailring, with shards that never block (`IdlePolicy::Poll`), as spargio's | as mailring |
//! | mailring-actors | task on shard 1 asking keyed actors | each stream a keyed actor owning a `Framed` connection (`seed_net/actors.rs`: mailring as a user writes it, not at the seed's level) |
//!
//! Each runtime is built once per group, outside the timed region, and torn
//! down before the next contender starts (spargio's shards busy-poll when idle;
//! they must not overlap another contender's measurement). `[cpu]` lines as in
//! io_peers.rs; note the process CPU includes the echo server's 8 threads.
//!
//! Needs (Cargo.toml, all already in benches/Cargo.toml): tokio (rt-multi-thread,
//! sync, net, io-util), spargio =0.5.13 (uring-native), compio =0.19.2 (net,
//! runtime, io-uring), futures, libc; dev: criterion 0.5. Register as
//! `[[bench]] name = "seed_net" harness = false`.
//!
//! Deviations from the seed, on purpose (each marked `DEVIATION` below):
//! - compio clients set TCP_NODELAY (the seed's compio client does not; Tokio's
//!   does, spargio's does by default).
//! - compio's keyed workload sends its dispatches through channels to two owner
//!   futures like Tokio's (the seed's compio variant only adds to local counters).
//! - one harness alive at a time (the seed keeps the idle Tokio harness alive
//!   during the spargio and compio runs of a group).
//! - contender ids are `mailring`/`tokio`/`spargio`/`compio` (the seed's ids are
//!   e.g. `tokio_tcp_8streams_hotcold`); group names are the seed's.
//!
//! Knobs: SEED_MAILRING_PINNED=1 runs mailring's stealable workloads (imbalanced,
//! burst flip) with session-pinned tasks instead; PEER_SPARGIO_IDLE_SLEEP_US=N as
//! in io_peers.rs; SEED_SKIP_ACTORS=1 leaves out mailring-actors; SEED_SKIP_POLL=1
//! leaves out mailring-poll.

#![allow(clippy::too_many_arguments)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use futures::channel::mpsc;
use futures::executor::block_on;
use futures::future::{join, join_all, select, Either};
use futures::StreamExt;
use mailring::net::TcpStream as MrTcp;
use mailring::{hot, ShardId};
use mailring_bench::Meter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "seed_net/actors.rs"]
mod actors;

// ------------------------------------------------------------ constants
// Copied from spargio-0.5.13/benches/net_api.rs (line numbers there).

/// L39. Client connections of every harness.
const STREAMS: usize = 8;

// L39-50: net_stream_imbalanced_4k_hot1_light7
const IMBALANCED_HEAVY_FRAMES: usize = 2048;
const IMBALANCED_LIGHT_FRAMES: usize = 128;
const IMBALANCED_FRAME_BYTES: usize = 4096;
const IMBALANCED_WINDOW: usize = 32;
const IMBALANCED_TOTAL_FRAMES: usize =
    IMBALANCED_HEAVY_FRAMES + ((STREAMS - 1) * IMBALANCED_LIGHT_FRAMES);

// L52-63: net_stream_hotspot_rotation_4k
const HOTSPOT_ROTATION_STEPS: usize = 64;
const HOTSPOT_ROTATION_HEAVY_FRAMES: usize = 32;
const HOTSPOT_ROTATION_LIGHT_FRAMES: usize = 2;
const HOTSPOT_ROTATION_FRAME_BYTES: usize = 4096;
const HOTSPOT_ROTATION_WINDOW: usize = 32;
const HOTSPOT_ROTATION_TOTAL_FRAMES: usize = HOTSPOT_ROTATION_STEPS
    * (HOTSPOT_ROTATION_HEAVY_FRAMES + ((STREAMS - 1) * HOTSPOT_ROTATION_LIGHT_FRAMES));

// L65-79: net_pipeline_hotspot_rotation_4k_window32
const PIPELINE_FRAMES_PER_STREAM: usize = 1024;
const PIPELINE_FRAME_BYTES: usize = 4096;
const PIPELINE_WINDOW: usize = 32;
const PIPELINE_ROTATE_EVERY: usize = 64;
const PIPELINE_HEAVY_CPU_ITERS: usize = 4000;
const PIPELINE_LIGHT_CPU_ITERS: usize = 150;
const PIPELINE_TOTAL_FRAMES: usize = STREAMS * PIPELINE_FRAMES_PER_STREAM;

// L81-100: net_keyed_hotspot_rotation_4k (the I/O of the hotspot rotation)
const KEYED_HOTSPOT_OWNER_SHARDS: usize = 2;
const KEYED_DISPATCHES_PER_FRAME: usize = 16;
/// Coalesced hot tag of the dispatches (spargio: hot + coalesced msg tag;
/// mailring: `Builder::coalesced_hot_tag`).
const KEYED_DISPATCH_TAG: u16 = 0x4B44;
/// One per stream per owner at the end (spargio: hot msg tag; mailring: a
/// plain tiny-message tag).
const KEYED_STOP_TAG: u16 = 0x4B45;

// L122-128: ingress_dispatch_to_workers_rr_256b_ack
const INGRESS_RR_STEPS: usize = 16_384;
const INGRESS_RR_PAYLOAD_BYTES: usize = 256;
const INGRESS_RR_WINDOW: usize = 1;

// L130-136: fs_net_microservice_4k_read_then_256b_reply_qd1
const FS_NET_MICRO_ROUNDS: usize = 1_024;
const FS_NET_MICRO_READ_BYTES: usize = 4096;
const FS_NET_MICRO_REPLY_BYTES: usize = 256;
const FS_NET_MICRO_FILE_BLOCKS: usize = 128;

// L362-374: session_owner_with_spillover_4k
const SESSION_OWNER_SPILLOVER_STEPS: usize = 128;
const SESSION_OWNER_SPILLOVER_HEAVY_FRAMES: usize = 96;
const SESSION_OWNER_SPILLOVER_LIGHT_FRAMES: usize = 2;
const SESSION_OWNER_SPILLOVER_FRAME_BYTES: usize = 4096;
const SESSION_OWNER_SPILLOVER_WINDOW: usize = 32;
const SESSION_OWNER_SPILLOVER_TOTAL_FRAMES: usize = SESSION_OWNER_SPILLOVER_STEPS
    * (SESSION_OWNER_SPILLOVER_HEAVY_FRAMES
        + ((STREAMS - 1) * SESSION_OWNER_SPILLOVER_LIGHT_FRAMES));

// L376-389: net_burst_flip_imbalance_4k
const BURST_FLIP_PHASES: usize = 160;
const BURST_FLIP_FLIP_EVERY_PHASES: usize = 10;
const BURST_FLIP_HOT_FRAMES: usize = 96;
const BURST_FLIP_COLD_FRAMES: usize = 2;
const BURST_FLIP_FRAME_BYTES: usize = 4096;
const BURST_FLIP_WINDOW: usize = 32;
const BURST_FLIP_TOTAL_FRAMES: usize =
    BURST_FLIP_PHASES * (BURST_FLIP_HOT_FRAMES + ((STREAMS - 1) * BURST_FLIP_COLD_FRAMES));

/// Criterion samples per contender (the seed's log runs `--sample-size 12`
/// and `--sample-size 20`; criterion's default is 100). UNSURE: burst flip
/// (~90 ms an iteration) then overruns the default 5 s measurement time and
/// criterion warns; raise `measurement_time` if that matters.
const SAMPLES: usize = 20;

// ------------------------------------------------------------ helpers (seed L486-614)

/// The sum of the first byte of each `frame`-byte frame that starts in
/// `chunk`, which begins at byte `at` of a run of frames (a checksum that
/// reads every frame without copying it out).
fn frame_heads_sum(chunk: &[u8], at: usize, frame: usize) -> u64 {
    let first = (frame - at % frame) % frame;
    chunk
        .iter()
        .skip(first)
        .step_by(frame)
        .map(|&b| u64::from(b))
        .sum()
}

/// The hot stream at `tick` when the hot spot moves to the next of
/// `streams` streams every `period` ticks (the seed's rotation rule).
fn hot_stream(tick: usize, period: usize, streams: usize) -> usize {
    (tick / period.max(1)) % streams.max(1)
}

/// Stream 0 is the static hot one.
fn imbalanced_frames_for_stream(idx: usize, heavy_frames: usize, light_frames: usize) -> usize {
    [light_frames, heavy_frames][usize::from(idx == 0)]
}

/// Frames of stream `stream_idx` at rotation step `step_idx` (the hot spot
/// moves every step).
fn hotspot_rotation_frames_for_step(
    stream_idx: usize,
    step_idx: usize,
    stream_count: usize,
    heavy_frames: usize,
    light_frames: usize,
) -> usize {
    let hot = hot_stream(step_idx, 1, stream_count) == stream_idx;
    [light_frames, heavy_frames][usize::from(hot)]
}

/// Frames of stream `stream_idx` in burst phase `phase_idx` (the hot spot
/// moves every `flip_every_phases` phases).
fn burst_flip_frames_for_phase(
    stream_idx: usize,
    phase_idx: usize,
    stream_count: usize,
    flip_every_phases: usize,
    hot_frames: usize,
    cold_frames: usize,
) -> usize {
    let hot = hot_stream(phase_idx, flip_every_phases, stream_count) == stream_idx;
    [cold_frames, hot_frames][usize::from(hot)]
}

/// CPU iterations for frame `frame_idx` of stream `stream_idx` in the
/// pipeline workload (the hot spot moves every `rotate_every` frames).
fn hotspot_iters_for_frame(
    stream_idx: usize,
    frame_idx: usize,
    stream_count: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
) -> usize {
    let hot = hot_stream(frame_idx, rotate_every, stream_count) == stream_idx;
    [light_iters, heavy_iters][usize::from(hot)]
}

/// The pipeline workload's CPU stage: `iters` rounds of a dependent
/// multiply-xorshift mix over the frame's identity (a chain the compiler
/// cannot shorten; a few ns per round, as in the seed's stage).
fn pipeline_cpu_stage(seed: u8, stream_idx: usize, frame_idx: usize, iters: usize) -> u64 {
    let mut state = u64::from(seed)
        .wrapping_mul(0xA076_1D64_78BD_642F)
        .wrapping_add(((stream_idx as u64) << 32) | frame_idx as u64);
    for round in 0..iters as u64 {
        state = (state ^ (state >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        state = state.rotate_left(17) ^ round;
    }
    std::hint::black_box(state)
}

/// Dispatch messages each keyed owner receives in one run: the sum over the
/// streams and the steps it owns (`step % owners`) of `frames * 16`.
fn keyed_expected_per_owner(steps: usize, heavy: usize, light: usize, owners: usize) -> Vec<u64> {
    let mut out = vec![0u64; owners.max(1)];
    for step in 0..steps {
        for s in 0..STREAMS {
            let frames = hotspot_rotation_frames_for_step(s, step, STREAMS, heavy, light);
            out[step % owners.max(1)] += (frames * KEYED_DISPATCHES_PER_FRAME) as u64;
        }
    }
    out
}

/// Seed L644-728: the fs_net file (block `i`'s first byte is `i`), read with
/// synchronous positional reads on the bench thread.
struct FsBenchFixture {
    path: std::path::PathBuf,
    file: std::fs::File,
    block_size: usize,
    blocks: usize,
}

impl FsBenchFixture {
    fn new(block_size: usize, blocks: usize) -> Self {
        let path =
            std::env::temp_dir().join(format!("mailring-bench-seed-fs-{}.dat", std::process::id()));
        mailring_bench::write_block_fixture(&path, block_size, blocks);
        let file = std::fs::File::open(&path).expect("open fs fixture");
        Self {
            path,
            file,
            block_size,
            blocks,
        }
    }

    fn read_qd1(&self, rounds: usize) -> u64 {
        let mut buf = vec![0u8; self.block_size];
        let mut checksum = 0u64;
        for i in 0..rounds {
            let offset = ((i % self.blocks) * self.block_size) as u64;
            let n = self
                .file
                .read_at(&mut buf, offset)
                .expect("fs fixture read_at");
            assert_eq!(n, self.block_size, "short fs fixture read");
            checksum = checksum.wrapping_add(u64::from(buf[0]));
        }
        checksum
    }
}

impl Drop for FsBenchFixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Seed L731-793: a std listener on 127.0.0.1; accepts exactly `clients`
/// connections, one blocking echo thread each (64 KiB reads, echoes what it
/// read), which ends at EOF. The join handle returns when all have ended.
fn spawn_echo_server_with_clients(
    name: &str,
    clients: usize,
) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
    let addr = listener.local_addr().expect("listener addr");
    let thread_name = name.to_owned();
    let join = thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            let mut handlers = Vec::with_capacity(clients);
            for idx in 0..clients {
                let (mut server, _) = listener.accept().expect("accept");
                server.set_nodelay(true).expect("nodelay server");
                handlers.push(
                    thread::Builder::new()
                        .name(format!("{thread_name}-conn-{idx}"))
                        .spawn(move || {
                            let mut buf = [0u8; 64 * 1024];
                            loop {
                                match server.read(&mut buf) {
                                    Ok(0) => break,
                                    Ok(n) => {
                                        if server.write_all(&buf[..n]).is_err() {
                                            break;
                                        }
                                    }
                                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                    Err(_) => break,
                                }
                            }
                        })
                        .expect("spawn echo conn thread"),
                );
            }
            for h in handlers {
                let _ = h.join();
            }
        })
        .expect("spawn echo thread");
    (addr, join)
}

// ------------------------------------------------------------ workloads

/// One command of a driver: the seed's `Echo*` commands that these eight
/// workloads use.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Stream 0 `heavy` frames, the others `light`; one task per stream.
    Imbalanced {
        heavy: usize,
        light: usize,
        payload: usize,
        window: usize,
    },
    /// `steps` steps per stream, unsynchronised; stream `step % 8` does `heavy`
    /// frames in that step, the others `light` (0: skip the step).
    Rotation {
        steps: usize,
        heavy: usize,
        light: usize,
        payload: usize,
        window: usize,
    },
    /// Per stream `frames` frames, written one by one per window, then each
    /// echo read and followed by a CPU stage (heavy on the rotating hot stream).
    Pipeline {
        frames: usize,
        payload: usize,
        window: usize,
        rotate_every: usize,
        heavy_iters: usize,
        light_iters: usize,
    },
    /// `Rotation`, then after each step `frames * 16` messages to owner `step % owners`.
    Keyed {
        steps: usize,
        heavy: usize,
        light: usize,
        payload: usize,
        window: usize,
        owners: usize,
    },
    /// `phases` barriers: every phase one task per stream, joined; hot stream
    /// `(phase / flip_every) % 8`.
    BurstFlip {
        phases: usize,
        flip_every: usize,
        hot: usize,
        cold: usize,
        payload: usize,
        window: usize,
    },
    /// qd1 round trips on stream 0, in the driver itself.
    Rtt { rounds: usize, payload: usize },
}

type Cmd = (Shape, std_mpsc::Sender<u64>);

/// A contender's harness: runs one command and returns its checksum.
trait NetHarness {
    fn run(&mut self, shape: Shape) -> u64;
}

struct Workload {
    group: &'static str,
    /// Bytes one way per iteration (the seed's `Throughput::Bytes`).
    bytes: u64,
    /// Frames (requests) per iteration, for the `[cpu]` per-op figures.
    ops: u64,
    warm: Shape,
    shape: Shape,
    /// fs_net: `read_qd1(warm_rounds / rounds)` on the bench thread first.
    fs_reads: Option<(usize, usize)>,
    /// spargio: `new_distributed()` (connect_many_round_robin) or `new()`.
    spargio_distributed: bool,
    /// The seed's spargio uses `spawn_stealable` (else `spawn_on_session`).
    stealable: bool,
}

const WORKLOADS: [Workload; 8] = [
    // bench fn L3872-3941; warm-up L3878-3879.
    Workload {
        group: "net_stream_imbalanced_4k_hot1_light7",
        bytes: (IMBALANCED_TOTAL_FRAMES * IMBALANCED_FRAME_BYTES) as u64,
        ops: IMBALANCED_TOTAL_FRAMES as u64,
        warm: Shape::Imbalanced {
            heavy: IMBALANCED_HEAVY_FRAMES / 8,
            light: IMBALANCED_LIGHT_FRAMES / 4,
            payload: IMBALANCED_FRAME_BYTES,
            window: IMBALANCED_WINDOW,
        },
        shape: Shape::Imbalanced {
            heavy: IMBALANCED_HEAVY_FRAMES,
            light: IMBALANCED_LIGHT_FRAMES,
            payload: IMBALANCED_FRAME_BYTES,
            window: IMBALANCED_WINDOW,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: true,
    },
    // L3943-4019.
    Workload {
        group: "net_stream_hotspot_rotation_4k",
        bytes: (HOTSPOT_ROTATION_TOTAL_FRAMES * HOTSPOT_ROTATION_FRAME_BYTES) as u64,
        ops: HOTSPOT_ROTATION_TOTAL_FRAMES as u64,
        warm: Shape::Rotation {
            steps: HOTSPOT_ROTATION_STEPS / 8,
            heavy: HOTSPOT_ROTATION_HEAVY_FRAMES / 4,
            light: HOTSPOT_ROTATION_LIGHT_FRAMES,
            payload: HOTSPOT_ROTATION_FRAME_BYTES,
            window: HOTSPOT_ROTATION_WINDOW,
        },
        shape: Shape::Rotation {
            steps: HOTSPOT_ROTATION_STEPS,
            heavy: HOTSPOT_ROTATION_HEAVY_FRAMES,
            light: HOTSPOT_ROTATION_LIGHT_FRAMES,
            payload: HOTSPOT_ROTATION_FRAME_BYTES,
            window: HOTSPOT_ROTATION_WINDOW,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: false,
    },
    // L4021-4103.
    Workload {
        group: "net_pipeline_hotspot_rotation_4k_window32",
        bytes: (PIPELINE_TOTAL_FRAMES * PIPELINE_FRAME_BYTES) as u64,
        ops: PIPELINE_TOTAL_FRAMES as u64,
        warm: Shape::Pipeline {
            frames: PIPELINE_FRAMES_PER_STREAM / 8,
            payload: PIPELINE_FRAME_BYTES,
            window: PIPELINE_WINDOW,
            rotate_every: PIPELINE_ROTATE_EVERY,
            heavy_iters: PIPELINE_HEAVY_CPU_ITERS / 4,
            light_iters: PIPELINE_LIGHT_CPU_ITERS / 2,
        },
        shape: Shape::Pipeline {
            frames: PIPELINE_FRAMES_PER_STREAM,
            payload: PIPELINE_FRAME_BYTES,
            window: PIPELINE_WINDOW,
            rotate_every: PIPELINE_ROTATE_EVERY,
            heavy_iters: PIPELINE_HEAVY_CPU_ITERS,
            light_iters: PIPELINE_LIGHT_CPU_ITERS,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: false,
    },
    // L4105-4186 (constants alias the hotspot rotation ones, L81-89).
    Workload {
        group: "net_keyed_hotspot_rotation_4k",
        bytes: (HOTSPOT_ROTATION_TOTAL_FRAMES * HOTSPOT_ROTATION_FRAME_BYTES) as u64,
        ops: HOTSPOT_ROTATION_TOTAL_FRAMES as u64,
        warm: Shape::Keyed {
            steps: HOTSPOT_ROTATION_STEPS / 8,
            heavy: HOTSPOT_ROTATION_HEAVY_FRAMES / 4,
            light: HOTSPOT_ROTATION_LIGHT_FRAMES,
            payload: HOTSPOT_ROTATION_FRAME_BYTES,
            window: HOTSPOT_ROTATION_WINDOW,
            owners: KEYED_HOTSPOT_OWNER_SHARDS,
        },
        shape: Shape::Keyed {
            steps: HOTSPOT_ROTATION_STEPS,
            heavy: HOTSPOT_ROTATION_HEAVY_FRAMES,
            light: HOTSPOT_ROTATION_LIGHT_FRAMES,
            payload: HOTSPOT_ROTATION_FRAME_BYTES,
            window: HOTSPOT_ROTATION_WINDOW,
            owners: KEYED_HOTSPOT_OWNER_SHARDS,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: false,
    },
    // L6003-6079: the hotspot rotation command with bigger numbers.
    Workload {
        group: "session_owner_with_spillover_4k",
        bytes: (SESSION_OWNER_SPILLOVER_TOTAL_FRAMES * SESSION_OWNER_SPILLOVER_FRAME_BYTES) as u64,
        ops: SESSION_OWNER_SPILLOVER_TOTAL_FRAMES as u64,
        warm: Shape::Rotation {
            steps: SESSION_OWNER_SPILLOVER_STEPS / 8,
            heavy: SESSION_OWNER_SPILLOVER_HEAVY_FRAMES / 4,
            light: SESSION_OWNER_SPILLOVER_LIGHT_FRAMES,
            payload: SESSION_OWNER_SPILLOVER_FRAME_BYTES,
            window: SESSION_OWNER_SPILLOVER_WINDOW,
        },
        shape: Shape::Rotation {
            steps: SESSION_OWNER_SPILLOVER_STEPS,
            heavy: SESSION_OWNER_SPILLOVER_HEAVY_FRAMES,
            light: SESSION_OWNER_SPILLOVER_LIGHT_FRAMES,
            payload: SESSION_OWNER_SPILLOVER_FRAME_BYTES,
            window: SESSION_OWNER_SPILLOVER_WINDOW,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: false,
    },
    // L4312-4386: rotation with heavy 1, light 0: 8 concurrent streams of
    // 2048 qd1 256 B round trips each.
    Workload {
        group: "ingress_dispatch_to_workers_rr_256b_ack",
        bytes: (INGRESS_RR_STEPS * INGRESS_RR_PAYLOAD_BYTES) as u64,
        ops: INGRESS_RR_STEPS as u64,
        warm: Shape::Rotation {
            steps: INGRESS_RR_STEPS / 8,
            heavy: 1,
            light: 0,
            payload: INGRESS_RR_PAYLOAD_BYTES,
            window: INGRESS_RR_WINDOW,
        },
        shape: Shape::Rotation {
            steps: INGRESS_RR_STEPS,
            heavy: 1,
            light: 0,
            payload: INGRESS_RR_PAYLOAD_BYTES,
            window: INGRESS_RR_WINDOW,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: false,
    },
    // L4388-4451: std preads on the bench thread, then qd1 RTTs on stream 0
    // (phased as in the seed, not interleaved). spargio: `new()`.
    Workload {
        group: "fs_net_microservice_4k_read_then_256b_reply_qd1",
        bytes: (FS_NET_MICRO_ROUNDS * (FS_NET_MICRO_READ_BYTES + FS_NET_MICRO_REPLY_BYTES)) as u64,
        ops: FS_NET_MICRO_ROUNDS as u64,
        warm: Shape::Rtt {
            rounds: FS_NET_MICRO_ROUNDS / 8,
            payload: FS_NET_MICRO_REPLY_BYTES,
        },
        shape: Shape::Rtt {
            rounds: FS_NET_MICRO_ROUNDS,
            payload: FS_NET_MICRO_REPLY_BYTES,
        },
        fs_reads: Some((FS_NET_MICRO_ROUNDS / 8, FS_NET_MICRO_ROUNDS)),
        spargio_distributed: false,
        stealable: false,
    },
    // L6081-6162.
    Workload {
        group: "net_burst_flip_imbalance_4k",
        bytes: (BURST_FLIP_TOTAL_FRAMES * BURST_FLIP_FRAME_BYTES) as u64,
        ops: BURST_FLIP_TOTAL_FRAMES as u64,
        warm: Shape::BurstFlip {
            phases: BURST_FLIP_PHASES / 8,
            flip_every: BURST_FLIP_FLIP_EVERY_PHASES,
            hot: BURST_FLIP_HOT_FRAMES / 4,
            cold: BURST_FLIP_COLD_FRAMES,
            payload: BURST_FLIP_FRAME_BYTES,
            window: BURST_FLIP_WINDOW,
        },
        shape: Shape::BurstFlip {
            phases: BURST_FLIP_PHASES,
            flip_every: BURST_FLIP_FLIP_EVERY_PHASES,
            hot: BURST_FLIP_HOT_FRAMES,
            cold: BURST_FLIP_COLD_FRAMES,
            payload: BURST_FLIP_FRAME_BYTES,
            window: BURST_FLIP_WINDOW,
        },
        fs_reads: None,
        spargio_distributed: true,
        stealable: true,
    },
];

// ============================================================ mailring

/// A client connection and the shard whose ring it belongs to (spargio's
/// "session shard").
struct MStream {
    shard: ShardId,
    stream: MrTcp,
}

struct MailringHarness {
    rt: Option<mailring::Runtime>,
    /// The keyed-actor version's system (stopped before the runtime).
    system: Option<mailring_actors::ActorSystem>,
    cmd_tx: Option<mpsc::UnboundedSender<Cmd>>,
    worker: Option<mailring::JoinHandle<()>>,
    echo: Option<thread::JoinHandle<()>>,
}

impl MailringHarness {
    /// `stealable`: run the per-stream tasks of `Imbalanced` / `BurstFlip` as
    /// `Placement::Stealable` (as spargio's `spawn_stealable`), unless
    /// SEED_MAILRING_PINNED is set.
    fn new(stealable: bool, idle: mailring::IdlePolicy) -> Self {
        let rt = mailring::Runtime::builder()
            .shards(2)
            .coalesced_hot_tag(KEYED_DISPATCH_TAG)
            .idle_policy(idle)
            .build()
            .expect("mailring runtime (needs io_uring)");
        let stealable = stealable && std::env::var_os("SEED_MAILRING_PINNED").is_none();
        let (addr, echo) = spawn_echo_server_with_clients("bench-net-echo-mailring", STREAMS);
        let (cmd_tx, mut cmd_rx) = mpsc::unbounded::<Cmd>();
        // The driver: pinned to shard 1 (UNSURE: spargio's is
        // StealablePreferred(1), which an idle shard 0 may steal before it
        // starts; pinning keeps stream 0 on the driver's shard for Rtt).
        let worker = rt
            .handle()
            .spawn_local_on(ShardId::new(1), move || async move {
                let here = mailring::current_shard().expect("driver runs on a shard");
                // Distributed connect: stream i on shard (here + i) % 2, each
                // connected from its own shard (spargio: connect_many_round_robin).
                let mut streams = Vec::with_capacity(STREAMS);
                for i in 0..STREAMS {
                    let shard = ShardId::new((here.index() + i) % 2);
                    let stream = mailring::spawn_on(shard, async move {
                        let s = MrTcp::connect(addr).await.expect("mailring connect");
                        s.set_nodelay(true).expect("mailring nodelay");
                        s
                    })
                    .await
                    .expect("mailring connect task");
                    streams.push(MStream { shard, stream });
                }
                while let Some((shape, reply)) = cmd_rx.next().await {
                    let value = mailring_run(&mut streams, shape, stealable).await;
                    let _ = reply.send(value);
                }
                // Streams drop here (closing them ends the echo threads).
            });
        Self {
            rt: Some(rt),
            system: None,
            cmd_tx: Some(cmd_tx),
            worker: Some(worker),
            echo: Some(echo),
        }
    }
}

impl NetHarness for MailringHarness {
    fn run(&mut self, shape: Shape) -> u64 {
        let (tx, rx) = std_mpsc::channel();
        self.cmd_tx
            .as_ref()
            .expect("harness running")
            .unbounded_send((shape, tx))
            .expect("mailring driver gone");
        rx.recv().expect("mailring driver reply")
    }
}

impl Drop for MailringHarness {
    fn drop(&mut self) {
        drop(self.cmd_tx.take());
        if let Some(w) = self.worker.take() {
            let _ = block_on(w);
        }
        // Stopping the actors closes the connections they own.
        if let Some(system) = self.system.take() {
            let _ = system.shutdown();
        }
        if let Some(rt) = self.rt.take() {
            let _ = rt.shutdown();
        }
        if let Some(e) = self.echo.take() {
            let _ = e.join();
        }
    }
}

/// Reads one echoed frame of `buf.len()` bytes; returns its first byte.
/// mailring's `recv` fills a buffer from its start up to its capacity (a
/// `Box<[u8]>`'s length), so a short read's rest goes into a buffer of exactly
/// the missing size and nothing of the next frame is taken.
async fn mailring_read_frame(s: &MrTcp, buf: Box<[u8]>) -> (u8, Box<[u8]>) {
    let want = buf.len();
    let (r, buf) = s.recv(buf).await;
    let mut got = r.expect("mailring recv");
    assert!(got > 0, "echo server closed");
    let first = buf[0];
    while got < want {
        let rest = vec![0u8; want - got].into_boxed_slice();
        let (r, _rest) = s.recv(rest).await;
        let n = r.expect("mailring recv");
        assert!(n > 0, "echo server closed");
        got += n;
    }
    (first, buf)
}

async fn mailring_echo_rtt(s: &MrTcp, rounds: usize, payload_len: usize) -> u64 {
    let mut out = vec![0u8; payload_len.max(1)];
    let mut inb = vec![0u8; payload_len.max(1)].into_boxed_slice();
    let mut checksum = 0u64;
    for i in 0..rounds {
        out[0] = i as u8;
        let (r, back) = s.send_all(out).await;
        r.expect("mailring send_all");
        out = back;
        let (b0, back) = mailring_read_frame(s, inb).await;
        inb = back;
        checksum = checksum.wrapping_add(u64::from(b0));
    }
    checksum
}

/// The window's frames in one owned buffer and one `send_all` (as spargio
/// batches them with `send_all_batch`; on a completion ring one send per
/// frame would cost a round trip through the ring each, where a readiness
/// runtime's `write` returns at once), then one exact read per frame.
async fn mailring_echo_windowed(
    s: &MrTcp,
    frames: usize,
    payload_len: usize,
    window: usize,
) -> u64 {
    let payload_len = payload_len.max(1);
    let window = window.max(1);
    let mut out = Vec::with_capacity(payload_len * window);
    let mut inb: Vec<u8> = Vec::with_capacity(payload_len * window);
    let mut checksum = 0u64;
    let mut next = 0usize;
    while next < frames {
        let batch = (frames - next).min(window);
        out.clear();
        for idx in 0..batch {
            let at = out.len();
            out.resize(at + payload_len, 0);
            out[at] = (next + idx) as u8;
        }
        let (r, back) = s.send_all(out).await;
        r.expect("mailring send_all");
        out = back;
        // The echoes back in as few receives as they arrive in.
        let want = batch * payload_len;
        let mut got = 0;
        while got < want {
            inb.clear();
            let (r, back) = s.recv(inb).await;
            let n = r.expect("mailring recv");
            assert!(n > 0, "echo server closed");
            checksum = checksum.wrapping_add(frame_heads_sum(&back[..n], got, payload_len));
            got += n;
            inb = back;
        }
        next += batch;
    }
    checksum
}

async fn mailring_echo_rotation_stream(
    s: &MrTcp,
    idx: usize,
    count: usize,
    steps: usize,
    heavy: usize,
    light: usize,
    payload: usize,
    window: usize,
) -> u64 {
    let mut checksum = 0u64;
    for step in 0..steps {
        let frames = hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
        if frames == 0 {
            continue;
        }
        checksum = checksum.wrapping_add(mailring_echo_windowed(s, frames, payload, window).await);
    }
    checksum
}

async fn mailring_echo_pipeline_stream(
    s: &MrTcp,
    idx: usize,
    count: usize,
    frames: usize,
    payload_len: usize,
    window: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
) -> u64 {
    let payload_len = payload_len.max(1);
    let window = window.max(1);
    let mut out = vec![0u8; payload_len];
    let mut inb = vec![0u8; payload_len].into_boxed_slice();
    let mut checksum = 0u64;
    let mut next = 0usize;
    while next < frames {
        let batch = (frames - next).min(window);
        for i in 0..batch {
            out[0] = (next + i) as u8;
            let (r, back) = s.send_all(out).await;
            r.expect("mailring send_all");
            out = back;
        }
        for i in 0..batch {
            let (b0, back) = mailring_read_frame(s, inb).await;
            inb = back;
            let frame_idx = next + i;
            let iters = hotspot_iters_for_frame(
                idx,
                frame_idx,
                count,
                rotate_every,
                heavy_iters,
                light_iters,
            );
            checksum = checksum.wrapping_add(pipeline_cpu_stage(b0, idx, frame_idx, iters));
        }
        next += batch;
    }
    checksum
}

/// Runs `work` once per stream, one task each, and joins them in order:
/// pinned to the stream's shard (spargio's `spawn_on_session`), or
/// `Placement::Stealable` (spargio's `spawn_stealable`): the stream travels as
/// a std stream and is adopted by whichever shard starts the task, which
/// becomes its shard from then on. (UNSURE: spargio's stealable tasks keep
/// issuing their I/O on the stream's session shard; mailring's task does its
/// I/O on its own shard's ring, which is mailring's model.)
async fn mailring_fan<W, Fut>(streams: &mut Vec<MStream>, stealable: bool, work: W) -> u64
where
    W: Fn(usize, MrTcp) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (MrTcp, u64)> + Send + 'static,
{
    let moved = std::mem::take(streams);
    let count = moved.len();
    let mut joins = Vec::with_capacity(count);
    for (idx, ms) in moved.into_iter().enumerate() {
        let work = work.clone();
        if stealable {
            let std_stream = ms
                .stream
                .into_std()
                .unwrap_or_else(|_| panic!("stream {idx} still has an abandoned op"));
            joins.push(mailring::spawn(async move {
                let s = MrTcp::from_std(std_stream).expect("adopt the stream");
                let (s, v) = work(idx, s).await;
                (mailring::current_shard().expect("on a shard"), s, v)
            }));
        } else {
            let shard = ms.shard;
            joins.push(mailring::spawn_on(shard, async move {
                let (s, v) = work(idx, ms.stream).await;
                (shard, s, v)
            }));
        }
    }
    let mut checksum = 0u64;
    for j in joins {
        let (shard, stream, v) = j.await.expect("mailring stream task");
        streams.push(MStream { shard, stream });
        checksum = checksum.wrapping_add(v);
    }
    checksum
}

async fn mailring_run(streams: &mut Vec<MStream>, shape: Shape, stealable: bool) -> u64 {
    let count = streams.len();
    match shape {
        Shape::Imbalanced {
            heavy,
            light,
            payload,
            window,
        } => {
            mailring_fan(streams, stealable, move |idx, s| async move {
                let frames = imbalanced_frames_for_stream(idx, heavy, light);
                let v = mailring_echo_windowed(&s, frames, payload, window).await;
                (s, v)
            })
            .await
        }
        Shape::Rotation {
            steps,
            heavy,
            light,
            payload,
            window,
        } => {
            mailring_fan(streams, false, move |idx, s| async move {
                let v = mailring_echo_rotation_stream(
                    &s, idx, count, steps, heavy, light, payload, window,
                )
                .await;
                (s, v)
            })
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
            mailring_fan(streams, false, move |idx, s| async move {
                let v = mailring_echo_pipeline_stream(
                    &s,
                    idx,
                    count,
                    frames,
                    payload,
                    window,
                    rotate_every,
                    heavy_iters,
                    light_iters,
                )
                .await;
                (s, v)
            })
            .await
        }
        Shape::Keyed {
            steps,
            heavy,
            light,
            payload,
            window,
            owners,
        } => {
            // Owners pinned on shards 0 and 1 (spargio: spawn_pinned(0/1)),
            // summing the coalesced dispatch counter until every stream has
            // sent its stop AND the expected total has arrived (mailring posts
            // hot sums and tiny messages at tick end; waiting for the total
            // keeps a late sum out of the next iteration. UNSURE whether the
            // stop can overtake the sums; spargio does not guard this).
            let owners = owners.clamp(1, 2);
            let expected = keyed_expected_per_owner(steps, heavy, light, owners);
            let owner_joins: Vec<_> = (0..owners)
                .map(|o| {
                    let expect = expected[o];
                    mailring::spawn_on(ShardId::new(o), async move {
                        let mut sum = 0u64;
                        let mut stops = 0usize;
                        while stops < count || sum < expect {
                            match select(
                                Box::pin(hot::next_hot_count(KEYED_DISPATCH_TAG)),
                                Box::pin(hot::next_tiny(KEYED_STOP_TAG)),
                            )
                            .await
                            {
                                Either::Left((n, _)) => sum = sum.wrapping_add(n),
                                Either::Right((_, _)) => stops += 1,
                            }
                        }
                        sum
                    })
                })
                .collect();
            let mut checksum = mailring_fan(streams, false, move |idx, s| async move {
                let mut sum = 0u64;
                for step in 0..steps {
                    let frames = hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                    if frames == 0 {
                        continue;
                    }
                    sum =
                        sum.wrapping_add(mailring_echo_windowed(&s, frames, payload, window).await);
                    let owner = ShardId::new(step % owners);
                    // One tiny message per dispatch, as Tokio's one channel
                    // send and spargio's one raw message per dispatch.
                    for _ in 0..frames * KEYED_DISPATCHES_PER_FRAME {
                        hot::send_tiny(owner, KEYED_DISPATCH_TAG, 1);
                    }
                }
                for o in 0..owners {
                    hot::send_tiny(ShardId::new(o), KEYED_STOP_TAG, 1);
                }
                (s, sum)
            })
            .await;
            for j in owner_joins {
                checksum = checksum.wrapping_add(j.await.expect("mailring keyed owner"));
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
                checksum = checksum.wrapping_add(
                    mailring_fan(streams, stealable, move |idx, s| async move {
                        let frames =
                            burst_flip_frames_for_phase(idx, phase, count, flip_every, hot, cold);
                        let v = mailring_echo_windowed(&s, frames, payload, window).await;
                        (s, v)
                    })
                    .await,
                );
            }
            checksum
        }
        Shape::Rtt { rounds, payload } => {
            // Inline in the driver when stream 0 is on its shard (it is, by
            // construction, unless a stealable run moved it).
            if mailring::current_shard() == Some(streams[0].shard) {
                mailring_echo_rtt(&streams[0].stream, rounds, payload).await
            } else {
                let ms = streams.remove(0);
                let shard = ms.shard;
                let (s, v) = mailring::spawn_on(shard, async move {
                    let v = mailring_echo_rtt(&ms.stream, rounds, payload).await;
                    (ms.stream, v)
                })
                .await
                .expect("mailring rtt task");
                streams.insert(0, MStream { shard, stream: s });
                v
            }
        }
    }
}

// ============================================================ tokio (seed L786-1249, L1251-1608)

struct TokioHarness {
    cmd_tx: Option<tokio::sync::mpsc::UnboundedSender<Cmd>>,
    thread: Option<thread::JoinHandle<()>>,
    echo: Option<thread::JoinHandle<()>>,
}

impl TokioHarness {
    fn new() -> Self {
        let (addr, echo) = spawn_echo_server_with_clients("bench-net-echo-tokio", STREAMS);
        let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
        let thread = thread::Builder::new()
            .name("bench-net-tokio".to_owned())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(async move {
                    let mut streams = Vec::with_capacity(STREAMS);
                    for _ in 0..STREAMS {
                        let s = tokio::net::TcpStream::connect(addr)
                            .await
                            .expect("tokio connect");
                        s.set_nodelay(true).expect("tokio nodelay");
                        streams.push(s);
                    }
                    while let Some((shape, reply)) = cmd_rx.recv().await {
                        let _ = reply.send(tokio_run(&mut streams, shape).await);
                    }
                });
            })
            .expect("spawn tokio bench thread");
        Self {
            cmd_tx: Some(cmd_tx),
            thread: Some(thread),
            echo: Some(echo),
        }
    }
}

impl NetHarness for TokioHarness {
    fn run(&mut self, shape: Shape) -> u64 {
        let (tx, rx) = std_mpsc::channel();
        self.cmd_tx
            .as_ref()
            .expect("harness running")
            .send((shape, tx))
            .expect("tokio driver gone");
        rx.recv().expect("tokio driver reply")
    }
}

impl Drop for TokioHarness {
    fn drop(&mut self) {
        drop(self.cmd_tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(e) = self.echo.take() {
            let _ = e.join();
        }
    }
}

async fn tokio_echo_rtt(
    stream: &mut tokio::net::TcpStream,
    rounds: usize,
    payload_len: usize,
) -> u64 {
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    for i in 0..rounds {
        payload[0] = i as u8;
        stream.write_all(&payload).await.expect("tokio write_all");
        stream
            .read_exact(&mut recv)
            .await
            .expect("tokio read_exact");
        checksum = checksum.wrapping_add(u64::from(recv[0]));
    }
    checksum
}

async fn tokio_echo_windowed(
    stream: &mut tokio::net::TcpStream,
    frames: usize,
    payload_len: usize,
    window: usize,
) -> u64 {
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    let mut next = 0usize;
    let window = window.max(1);
    while next < frames {
        let batch = (frames - next).min(window);
        for idx in 0..batch {
            payload[0] = (next + idx) as u8;
            stream.write_all(&payload).await.expect("tokio write_all");
        }
        for _ in 0..batch {
            stream
                .read_exact(&mut recv)
                .await
                .expect("tokio read_exact");
            checksum = checksum.wrapping_add(u64::from(recv[0]));
        }
        next += batch;
    }
    checksum
}

async fn tokio_echo_pipeline_stream(
    stream: &mut tokio::net::TcpStream,
    stream_idx: usize,
    stream_count: usize,
    frames: usize,
    payload_len: usize,
    window: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
) -> u64 {
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    let mut next = 0usize;
    let window = window.max(1);
    while next < frames {
        let batch = (frames - next).min(window);
        for idx in 0..batch {
            payload[0] = (next + idx) as u8;
            stream.write_all(&payload).await.expect("tokio write_all");
        }
        for idx in 0..batch {
            stream
                .read_exact(&mut recv)
                .await
                .expect("tokio read_exact");
            let frame_idx = next + idx;
            let iters = hotspot_iters_for_frame(
                stream_idx,
                frame_idx,
                stream_count,
                rotate_every,
                heavy_iters,
                light_iters,
            );
            checksum =
                checksum.wrapping_add(pipeline_cpu_stage(recv[0], stream_idx, frame_idx, iters));
        }
        next += batch;
    }
    checksum
}

/// One JoinSet task per stream (streams moved in and restored, in completion
/// order as in the seed), each running `work`.
async fn tokio_fan<W, Fut>(streams: &mut Vec<tokio::net::TcpStream>, work: W) -> u64
where
    W: Fn(usize, tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = (tokio::net::TcpStream, u64)> + Send + 'static,
{
    let mut joins = tokio::task::JoinSet::new();
    let moved = std::mem::take(streams);
    let count = moved.len();
    for (idx, stream) in moved.into_iter().enumerate() {
        joins.spawn(work(idx, stream));
    }
    let mut checksum = 0u64;
    let mut restored = Vec::with_capacity(count);
    while let Some(outcome) = joins.join_next().await {
        let (stream, value) = outcome.expect("tokio stream join");
        restored.push(stream);
        checksum = checksum.wrapping_add(value);
    }
    *streams = restored;
    checksum
}

async fn tokio_run(streams: &mut Vec<tokio::net::TcpStream>, shape: Shape) -> u64 {
    let count = streams.len();
    match shape {
        // L1305-1333
        Shape::Imbalanced {
            heavy,
            light,
            payload,
            window,
        } => {
            tokio_fan(streams, |idx, mut s| async move {
                let frames = imbalanced_frames_for_stream(idx, heavy, light);
                let v = tokio_echo_windowed(&mut s, frames, payload, window).await;
                (s, v)
            })
            .await
        }
        // L1335-1402
        Shape::Rotation {
            steps,
            heavy,
            light,
            payload,
            window,
        } => {
            tokio_fan(streams, |idx, mut s| async move {
                let mut v = 0u64;
                for step in 0..steps {
                    let frames = hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                    if frames == 0 {
                        continue;
                    }
                    v = v.wrapping_add(tokio_echo_windowed(&mut s, frames, payload, window).await);
                }
                (s, v)
            })
            .await
        }
        // L1404-1492
        Shape::Pipeline {
            frames,
            payload,
            window,
            rotate_every,
            heavy_iters,
            light_iters,
        } => {
            tokio_fan(streams, |idx, mut s| async move {
                let v = tokio_echo_pipeline_stream(
                    &mut s,
                    idx,
                    count,
                    frames,
                    payload,
                    window,
                    rotate_every,
                    heavy_iters,
                    light_iters,
                )
                .await;
                (s, v)
            })
            .await
        }
        // L1494-1567
        Shape::Keyed {
            steps,
            heavy,
            light,
            payload,
            window,
            owners,
        } => {
            let owner_count = owners.max(1);
            let mut owner_txs = Vec::with_capacity(owner_count);
            let mut owner_joins = tokio::task::JoinSet::new();
            for _ in 0..owner_count {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
                owner_txs.push(tx);
                owner_joins.spawn(async move {
                    let mut sum = 0u64;
                    while let Some(v) = rx.recv().await {
                        sum = sum.wrapping_add(v as u64);
                    }
                    sum
                });
            }
            let owner_txs = std::sync::Arc::new(owner_txs);
            let txs = owner_txs.clone();
            let mut checksum = tokio_fan(streams, move |idx, mut s| {
                let txs = txs.clone();
                async move {
                    let mut sum = 0u64;
                    for step in 0..steps {
                        let frames =
                            hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                        if frames == 0 {
                            continue;
                        }
                        sum = sum.wrapping_add(
                            tokio_echo_windowed(&mut s, frames, payload, window).await,
                        );
                        let tx = &txs[step % txs.len().max(1)];
                        for _ in 0..frames * KEYED_DISPATCHES_PER_FRAME {
                            tx.send(1).expect("tokio keyed owner channel closed");
                        }
                    }
                    (s, sum)
                }
            })
            .await;
            // All stream tasks are done; their Arc clones are gone with them.
            drop(owner_txs);
            while let Some(outcome) = owner_joins.join_next().await {
                checksum = checksum.wrapping_add(outcome.expect("tokio keyed owner join"));
            }
            checksum
        }
        // L1569-1608
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
                checksum = checksum.wrapping_add(
                    tokio_fan(streams, |idx, mut s| async move {
                        let frames =
                            burst_flip_frames_for_phase(idx, phase, count, flip_every, hot, cold);
                        let v = tokio_echo_windowed(&mut s, frames, payload, window).await;
                        (s, v)
                    })
                    .await,
                );
            }
            checksum
        }
        // L1251-1271: in the block_on future itself (the harness thread).
        Shape::Rtt { rounds, payload } => tokio_echo_rtt(&mut streams[0], rounds, payload).await,
    }
}

// ============================================================ spargio (seed L1674-2878)

struct SpargioHarness {
    rt: Option<spargio::Runtime>,
    cmd_tx: Option<mpsc::UnboundedSender<Cmd>>,
    worker: Option<spargio::JoinHandle<()>>,
    echo: Option<thread::JoinHandle<()>>,
}

impl SpargioHarness {
    /// Seed L1867-2098 (`new()` = SingleContext when `!distributed`,
    /// `new_distributed()` otherwise; driver `StealablePreferred(1)`).
    /// `None` when io_uring cannot start.
    fn new(distributed: bool) -> Option<Self> {
        let mut base = spargio::Runtime::builder()
            .backend(spargio::BackendKind::IoUring)
            .shards(2)
            .hot_msg_tags([KEYED_DISPATCH_TAG, KEYED_STOP_TAG])
            .coalesced_hot_msg_tag(KEYED_DISPATCH_TAG);
        // io_peers.rs knob (not in the seed; the seed has SPARGIO_BENCH_* steal knobs).
        if let Some(us) = std::env::var("PEER_SPARGIO_IDLE_SLEEP_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            base = base.idle_strategy(spargio::IdleStrategy::Sleep(Duration::from_micros(us)));
        }
        let rt = match base.clone().io_uring_throughput_mode(None).build() {
            Ok(rt) => rt,
            Err(spargio::RuntimeError::IoUringInit(_)) => match base.build() {
                Ok(rt) => rt,
                Err(spargio::RuntimeError::IoUringInit(_)) => return None,
                Err(err) => panic!("unexpected spargio init error: {err:?}"),
            },
            Err(err) => panic!("unexpected spargio init error: {err:?}"),
        };
        let (addr, echo) = spawn_echo_server_with_clients("bench-net-echo-spargio", STREAMS);
        let (cmd_tx, mut cmd_rx) = mpsc::unbounded::<Cmd>();
        let handle = rt.handle();
        let wh = handle.clone();
        let worker_fut = async move {
            let streams: Vec<spargio::net::TcpStream> = if distributed {
                spargio::net::TcpStream::connect_many_round_robin(wh.clone(), addr, STREAMS)
                    .await
                    .expect("spargio distributed connect")
            } else {
                let mut v = Vec::with_capacity(STREAMS);
                for _ in 0..STREAMS {
                    v.push(
                        spargio::net::TcpStream::connect(wh.clone(), addr)
                            .await
                            .expect("spargio connect"),
                    );
                }
                v
            };
            while let Some((shape, reply)) = cmd_rx.next().await {
                let _ = reply.send(spargio_run(wh.clone(), &streams, shape).await);
            }
        };
        let worker = handle
            .spawn_with_placement(spargio::TaskPlacement::StealablePreferred(1), worker_fut)
            .ok()?;
        Some(Self {
            rt: Some(rt),
            cmd_tx: Some(cmd_tx),
            worker: Some(worker),
            echo: Some(echo),
        })
    }
}

impl NetHarness for SpargioHarness {
    fn run(&mut self, shape: Shape) -> u64 {
        let (tx, rx) = std_mpsc::channel();
        self.cmd_tx
            .as_ref()
            .expect("harness running")
            .unbounded_send((shape, tx))
            .expect("spargio driver gone");
        rx.recv().expect("spargio driver reply")
    }
}

impl Drop for SpargioHarness {
    fn drop(&mut self) {
        drop(self.cmd_tx.take());
        if let Some(w) = self.worker.take() {
            let _ = block_on(w);
        }
        if let Some(mut rt) = self.rt.take() {
            block_on(rt.shutdown());
        }
        if let Some(e) = self.echo.take() {
            let _ = e.join();
        }
    }
}

/// Seed L2297-2320.
async fn spargio_echo_rtt(
    stream: &spargio::net::TcpStream,
    rounds: usize,
    payload_len: usize,
) -> u64 {
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    for i in 0..rounds {
        payload[0] = i as u8;
        payload = stream
            .write_all_owned(payload)
            .await
            .expect("write_all_owned");
        recv = stream
            .read_exact_owned(recv)
            .await
            .expect("read_exact_owned");
        checksum = checksum.wrapping_add(u64::from(recv[0]));
    }
    checksum
}

/// `frames` frames of `payload_len` bytes, `window` at a time: one batched
/// send of the window (spargio's `send_all_batch`, its buffers kept for the
/// next window), then each echo read back whole. Every contender reads
/// frame by frame (no multishot receive), so they run at the same level.
async fn spargio_echo_windowed(
    stream: &spargio::net::TcpStream,
    frames: usize,
    payload_len: usize,
    window: usize,
) -> u64 {
    let size = payload_len.max(1);
    let window = window.max(1);
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut inbound = vec![0u8; size];
    let mut sum = 0u64;
    let mut sent = 0usize;
    let mut multishot = true;
    while sent < frames {
        let n = window.min(frames - sent);
        let outbound: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let mut frame = spare.pop().unwrap_or_else(|| vec![0u8; size]);
                frame[0] = (sent + k) as u8;
                frame
            })
            .collect();
        let (_, back) = stream
            .send_all_batch(outbound, n)
            .await
            .expect("spargio send_all_batch");
        spare.extend(back);
        let want = n * size;
        let mut got = 0usize;
        if multishot {
            let buffers = (2 * n).clamp(4, usize::from(u16::MAX)) as u16;
            match stream.recv_multishot_segments(size, buffers, want).await {
                Ok(received) => {
                    for seg in &received.segments {
                        let end = (seg.offset + seg.len).min(received.buffer.len());
                        let chunk = &received.buffer[seg.offset.min(end)..end];
                        sum = sum.wrapping_add(frame_heads_sum(chunk, got, size));
                        got += chunk.len();
                    }
                }
                // Kernels without it: frame by frame from now on.
                Err(_) => multishot = false,
            }
        }
        while got < want {
            inbound = stream
                .read_exact_owned(inbound)
                .await
                .expect("spargio read_exact_owned");
            sum = sum.wrapping_add(frame_heads_sum(&inbound, got, size));
            got += size;
        }
        sent += n;
    }
    sum
}

/// Seed L2511-2561.
async fn spargio_echo_pipeline_stream(
    stream: &spargio::net::TcpStream,
    stream_idx: usize,
    stream_count: usize,
    frames: usize,
    payload_len: usize,
    window: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
) -> u64 {
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    let mut next = 0usize;
    let window = window.max(1);
    while next < frames {
        let batch = (frames - next).min(window);
        for idx in 0..batch {
            payload[0] = (next + idx) as u8;
            payload = stream
                .write_all_owned(payload)
                .await
                .expect("write_all_owned");
        }
        for idx in 0..batch {
            recv = stream
                .read_exact_owned(recv)
                .await
                .expect("read_exact_owned");
            let frame_idx = next + idx;
            let iters = hotspot_iters_for_frame(
                stream_idx,
                frame_idx,
                stream_count,
                rotate_every,
                heavy_iters,
                light_iters,
            );
            checksum =
                checksum.wrapping_add(pipeline_cpu_stage(recv[0], stream_idx, frame_idx, iters));
        }
        next += batch;
    }
    checksum
}

/// Sends `count` keyed dispatches (tiny messages on the coalesced tag) to
/// `remote` in chunks of `batch_size`; a chunk refused for backpressure is
/// retried as one awaited send.
async fn spargio_send_keyed_dispatch_messages(
    remote: &spargio::RemoteShard,
    count: usize,
    batch_size: usize,
) {
    let mut left = count;
    while left > 0 {
        let chunk = left.min(batch_size.max(1));
        let sent = match remote
            .send_many_raw_nowait(std::iter::repeat_n((KEYED_DISPATCH_TAG, 1u32), chunk))
        {
            Ok(()) => chunk,
            Err(spargio::SendError::Backpressure) => {
                remote
                    .send_raw(KEYED_DISPATCH_TAG, 1)
                    .expect("spargio send_raw")
                    .await
                    .expect("spargio send_raw completion");
                1
            }
            Err(spargio::SendError::Closed) => panic!("spargio keyed dispatch: shard closed"),
        };
        left -= sent;
    }
}

/// One task per stream: `spawn_on_session` (pinned to the session shard) or
/// `spawn_stealable`, joined in order (seed L2400-2435, L2469-2509).
async fn spargio_fan<W, Fut>(
    handle: spargio::RuntimeHandle,
    streams: &[spargio::net::TcpStream],
    stealable: bool,
    work: W,
) -> u64
where
    W: Fn(usize, spargio::net::TcpStream) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let mut joins = Vec::with_capacity(streams.len());
    for (idx, stream) in streams.iter().cloned().enumerate() {
        let for_spawn = stream.clone();
        let fut = work(idx, stream);
        let join = if stealable {
            handle.spawn_stealable(fut)
        } else {
            for_spawn.spawn_on_session(&handle, fut)
        }
        .expect("spawn spargio stream task");
        joins.push(join);
    }
    let mut checksum = 0u64;
    for join in joins {
        checksum = checksum.wrapping_add(join.await.expect("spargio stream join"));
    }
    checksum
}

/// `handle` by value, as the seed (only temporary borrows across awaits).
async fn spargio_run(
    handle: spargio::RuntimeHandle,
    streams: &[spargio::net::TcpStream],
    shape: Shape,
) -> u64 {
    let count = streams.len();
    match shape {
        // L2400-2435: spawn_stealable, Multishot.
        Shape::Imbalanced {
            heavy,
            light,
            payload,
            window,
        } => {
            spargio_fan(handle.clone(), streams, true, |idx, s| async move {
                let frames = imbalanced_frames_for_stream(idx, heavy, light);
                spargio_echo_windowed(&s, frames, payload, window).await
            })
            .await
        }
        // L2437-2509: spawn_on_session, ReadExact.
        Shape::Rotation {
            steps,
            heavy,
            light,
            payload,
            window,
        } => {
            spargio_fan(handle.clone(), streams, false, |idx, s| async move {
                let mut v = 0u64;
                for step in 0..steps {
                    let frames = hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                    if frames == 0 {
                        continue;
                    }
                    v = v.wrapping_add(spargio_echo_windowed(&s, frames, payload, window).await);
                }
                v
            })
            .await
        }
        // L2563-2604: spawn_on_session.
        Shape::Pipeline {
            frames,
            payload,
            window,
            rotate_every,
            heavy_iters,
            light_iters,
        } => {
            spargio_fan(handle.clone(), streams, false, |idx, s| async move {
                spargio_echo_pipeline_stream(
                    &s,
                    idx,
                    count,
                    frames,
                    payload,
                    window,
                    rotate_every,
                    heavy_iters,
                    light_iters,
                )
                .await
            })
            .await
        }
        // The seed's keyed workload (its L2637-2759): owners pinned to the
        // shards count coalesced dispatches until every stream said stop.
        Shape::Keyed {
            steps,
            heavy,
            light,
            payload,
            window,
            owners,
        } => {
            let owner_count = owners.max(1).min(handle.shard_count().max(1));
            let owner_joins: Vec<_> = (0..owner_count)
                .map(|owner| {
                    handle
                        .spawn_pinned(owner as spargio::ShardId, async move {
                            let here = || spargio::ShardCtx::current().expect("on a spargio shard");
                            let (mut total, mut stops) = (0u64, 0usize);
                            while stops < count {
                                let counted = Box::pin(here().next_hot_count(KEYED_DISPATCH_TAG));
                                let event = Box::pin(here().next_hot_event());
                                match select(counted, event).await {
                                    Either::Left((n, _)) => total = total.wrapping_add(n),
                                    Either::Right((
                                        spargio::Event::RingMsg { tag, val, .. },
                                        _,
                                    )) => match tag {
                                        KEYED_STOP_TAG => stops += 1,
                                        KEYED_DISPATCH_TAG => {
                                            total = total.wrapping_add(u64::from(val))
                                        }
                                        _ => {}
                                    },
                                }
                            }
                            while let Some(n) = here().try_take_hot_count(KEYED_DISPATCH_TAG) {
                                total = total.wrapping_add(n);
                            }
                            total
                        })
                        .expect("spawn a spargio keyed owner")
                })
                .collect();
            let remotes: Vec<spargio::RemoteShard> = (0..owner_count)
                .map(|o| {
                    handle
                        .remote(o as spargio::ShardId)
                        .expect("spargio keyed owner remote")
                })
                .collect();
            let mut checksum = spargio_fan(handle.clone(), streams, false, |idx, s| {
                let remotes = remotes.clone(); // RemoteShard: Clone (src/lib.rs L6023); the seed calls handle.remote() per stream
                async move {
                    let mut sum = 0u64;
                    for step in 0..steps {
                        let frames =
                            hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                        if frames == 0 {
                            continue;
                        }
                        sum = sum
                            .wrapping_add(spargio_echo_windowed(&s, frames, payload, window).await);
                        spargio_send_keyed_dispatch_messages(
                            &remotes[step % remotes.len().max(1)],
                            frames.saturating_mul(KEYED_DISPATCHES_PER_FRAME),
                            window.saturating_mul(2),
                        )
                        .await;
                    }
                    for remote in &remotes {
                        let ticket = remote
                            .send_raw(KEYED_STOP_TAG, 1)
                            .expect("send spargio keyed owner stop");
                        ticket.await.expect("await spargio keyed owner stop");
                    }
                    sum
                }
            })
            .await;
            for join in owner_joins {
                checksum = checksum.wrapping_add(join.await.expect("spargio keyed owner join"));
            }
            checksum
        }
        // L2761-2807: spawn_stealable per stream per phase, Multishot.
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
                checksum = checksum.wrapping_add(
                    spargio_fan(handle.clone(), streams, true, |idx, s| async move {
                        let frames =
                            burst_flip_frames_for_phase(idx, phase, count, flip_every, hot, cold);
                        spargio_echo_windowed(&s, frames, payload, window).await
                    })
                    .await,
                );
            }
            checksum
        }
        // Inline in the driver (seed L1926-1934 + L2297-2320).
        Shape::Rtt { rounds, payload } => spargio_echo_rtt(&streams[0], rounds, payload).await,
    }
}

// ============================================================ compio (seed L2882-3790)

struct CompioHarness {
    cmd_tx: Option<std_mpsc::Sender<Cmd>>,
    thread: Option<thread::JoinHandle<()>>,
    echo: Option<thread::JoinHandle<()>>,
}

impl CompioHarness {
    /// Seed L2962-3159: one thread, one compio runtime (one ring); the driver
    /// blocks on a std channel between commands (nothing else runs then).
    fn new() -> Self {
        let (addr, echo) = spawn_echo_server_with_clients("bench-net-echo-compio", STREAMS);
        let (cmd_tx, cmd_rx) = std_mpsc::channel::<Cmd>();
        let thread = thread::Builder::new()
            .name("bench-net-compio".to_owned())
            .spawn(move || {
                // io_peers.rs's compio_rt(): asserts the io_uring driver.
                let rt = compio::runtime::Runtime::new().expect("compio runtime");
                assert!(
                    matches!(rt.driver_type(), compio::driver::DriverType::IoUring),
                    "compio is not on io_uring"
                );
                rt.block_on(async move {
                    let mut streams = Vec::with_capacity(STREAMS);
                    for _ in 0..STREAMS {
                        let s = compio::net::TcpStream::connect(addr)
                            .await
                            .expect("compio connect");
                        // DEVIATION: the seed's compio client leaves Nagle on.
                        s.set_nodelay(true).expect("compio nodelay");
                        streams.push(s);
                    }
                    while let Ok((shape, reply)) = cmd_rx.recv() {
                        let _ = reply.send(compio_run(&mut streams, shape).await);
                    }
                });
            })
            .expect("spawn compio bench thread");
        Self {
            cmd_tx: Some(cmd_tx),
            thread: Some(thread),
            echo: Some(echo),
        }
    }
}

impl NetHarness for CompioHarness {
    fn run(&mut self, shape: Shape) -> u64 {
        let (tx, rx) = std_mpsc::channel();
        self.cmd_tx
            .as_ref()
            .expect("harness running")
            .send((shape, tx))
            .expect("compio driver gone");
        rx.recv().expect("compio driver reply")
    }
}

impl Drop for CompioHarness {
    fn drop(&mut self) {
        drop(self.cmd_tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(e) = self.echo.take() {
            let _ = e.join();
        }
    }
}

/// Seed L3354-3377.
async fn compio_echo_rtt(
    stream: &mut compio::net::TcpStream,
    rounds: usize,
    payload_len: usize,
) -> u64 {
    use compio::io::{AsyncReadExt, AsyncWriteExt};
    let mut payload = vec![0u8; payload_len.max(1)];
    let mut recv = vec![0u8; payload_len.max(1)];
    let mut checksum = 0u64;
    for i in 0..rounds {
        payload[0] = i as u8;
        let ((), back) = stream.write_all(payload).await.expect("compio write_all");
        payload = back;
        let ((), back) = stream.read_exact(recv).await.expect("compio read_exact");
        recv = back;
        checksum = checksum.wrapping_add(u64::from(recv[0]));
    }
    checksum
}

/// Seed L3380-3415 (read_exact fills the Vec's capacity = its length here).
async fn compio_echo_windowed(
    stream: &mut compio::net::TcpStream,
    frames: usize,
    payload_len: usize,
    window: usize,
) -> u64 {
    use compio::io::{AsyncReadExt, AsyncWriteExt};
    let window = window.max(1);
    let payload_len = payload_len.max(1);
    let mut recv = vec![0u8; payload_len];
    let mut tx_pool: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; payload_len]).collect();
    let mut checksum = 0u64;
    let mut next = 0usize;
    while next < frames {
        let batch = (frames - next).min(window);
        for idx in 0..batch {
            let mut payload = tx_pool.pop().unwrap_or_else(|| vec![0u8; payload_len]);
            payload[0] = (next + idx) as u8;
            let ((), back) = stream.write_all(payload).await.expect("compio write_all");
            tx_pool.push(back);
        }
        for _ in 0..batch {
            let ((), back) = stream.read_exact(recv).await.expect("compio read_exact");
            recv = back;
            checksum = checksum.wrapping_add(u64::from(recv[0]));
        }
        next += batch;
    }
    checksum
}

/// Seed L3514-3567.
async fn compio_echo_pipeline_stream(
    stream: &mut compio::net::TcpStream,
    stream_idx: usize,
    stream_count: usize,
    frames: usize,
    payload_len: usize,
    window: usize,
    rotate_every: usize,
    heavy_iters: usize,
    light_iters: usize,
) -> u64 {
    use compio::io::{AsyncReadExt, AsyncWriteExt};
    let window = window.max(1);
    let payload_len = payload_len.max(1);
    let mut recv = vec![0u8; payload_len];
    let mut tx_pool: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; payload_len]).collect();
    let mut checksum = 0u64;
    let mut next = 0usize;
    while next < frames {
        let batch = (frames - next).min(window);
        for idx in 0..batch {
            let mut payload = tx_pool.pop().unwrap_or_else(|| vec![0u8; payload_len]);
            payload[0] = (next + idx) as u8;
            let ((), back) = stream.write_all(payload).await.expect("compio write_all");
            tx_pool.push(back);
        }
        for idx in 0..batch {
            let ((), back) = stream.read_exact(recv).await.expect("compio read_exact");
            recv = back;
            let frame_idx = next + idx;
            let iters = hotspot_iters_for_frame(
                stream_idx,
                frame_idx,
                stream_count,
                rotate_every,
                heavy_iters,
                light_iters,
            );
            checksum =
                checksum.wrapping_add(pipeline_cpu_stage(recv[0], stream_idx, frame_idx, iters));
        }
        next += batch;
    }
    checksum
}

/// All streams' futures with `join_all` on the one compio thread (no spawn),
/// as the seed; streams restored in order.
async fn compio_fan<W, Fut>(streams: &mut Vec<compio::net::TcpStream>, work: W) -> u64
where
    W: Fn(usize, compio::net::TcpStream) -> Fut,
    Fut: Future<Output = (compio::net::TcpStream, u64)>,
{
    let moved = std::mem::take(streams);
    let work_futs: Vec<_> = moved
        .into_iter()
        .enumerate()
        .map(|(idx, s)| work(idx, s))
        .collect();
    let mut checksum = 0u64;
    for (s, v) in join_all(work_futs).await {
        streams.push(s);
        checksum = checksum.wrapping_add(v);
    }
    checksum
}

async fn compio_run(streams: &mut Vec<compio::net::TcpStream>, shape: Shape) -> u64 {
    let count = streams.len();
    match shape {
        // L3417-3444
        Shape::Imbalanced {
            heavy,
            light,
            payload,
            window,
        } => {
            compio_fan(streams, |idx, mut s| async move {
                let frames = imbalanced_frames_for_stream(idx, heavy, light);
                let v = compio_echo_windowed(&mut s, frames, payload, window).await;
                (s, v)
            })
            .await
        }
        // L3446-3512
        Shape::Rotation {
            steps,
            heavy,
            light,
            payload,
            window,
        } => {
            compio_fan(streams, |idx, mut s| async move {
                let mut v = 0u64;
                for step in 0..steps {
                    let frames = hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                    if frames == 0 {
                        continue;
                    }
                    v = v.wrapping_add(compio_echo_windowed(&mut s, frames, payload, window).await);
                }
                (s, v)
            })
            .await
        }
        // L3569-3608
        Shape::Pipeline {
            frames,
            payload,
            window,
            rotate_every,
            heavy_iters,
            light_iters,
        } => {
            compio_fan(streams, |idx, mut s| async move {
                let v = compio_echo_pipeline_stream(
                    &mut s,
                    idx,
                    count,
                    frames,
                    payload,
                    window,
                    rotate_every,
                    heavy_iters,
                    light_iters,
                )
                .await;
                (s, v)
            })
            .await
        }
        // DEVIATION from L3610-3665 (which only adds to local counters): two
        // owner futures on the same thread, fed one channel message per
        // dispatch, as Tokio's owners.
        Shape::Keyed {
            steps,
            heavy,
            light,
            payload,
            window,
            owners,
        } => {
            let owner_count = owners.max(1);
            let mut txs = Vec::with_capacity(owner_count);
            let mut owner_futs = Vec::with_capacity(owner_count);
            for _ in 0..owner_count {
                let (tx, mut rx) = mpsc::unbounded::<u32>();
                txs.push(tx);
                owner_futs.push(async move {
                    let mut sum = 0u64;
                    while let Some(v) = rx.next().await {
                        sum = sum.wrapping_add(v as u64);
                    }
                    sum
                });
            }
            let txs = std::rc::Rc::new(txs);
            let streams_fut = {
                let txs = txs.clone();
                compio_fan(streams, move |idx, mut s| {
                    let txs = txs.clone();
                    async move {
                        let mut sum = 0u64;
                        for step in 0..steps {
                            let frames =
                                hotspot_rotation_frames_for_step(idx, step, count, heavy, light);
                            if frames == 0 {
                                continue;
                            }
                            sum = sum.wrapping_add(
                                compio_echo_windowed(&mut s, frames, payload, window).await,
                            );
                            let tx = &txs[step % txs.len()];
                            for _ in 0..frames * KEYED_DISPATCHES_PER_FRAME {
                                tx.unbounded_send(1).expect("compio keyed owner gone");
                            }
                        }
                        (s, sum)
                    }
                })
            };
            drop(txs);
            // The owners end when the last sender (held by the stream
            // futures' closure, dropped when compio_fan returns) is gone.
            // UNSURE: the closure `work` lives until compio_fan returns, so
            // the senders drop only then; join() keeps polling the owners.
            let (checksum, owner_sums) = join(streams_fut, join_all(owner_futs)).await;
            owner_sums
                .into_iter()
                .fold(checksum, |acc, v| acc.wrapping_add(v))
        }
        // L3667-3705
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
                checksum = checksum.wrapping_add(
                    compio_fan(streams, |idx, mut s| async move {
                        let frames =
                            burst_flip_frames_for_phase(idx, phase, count, flip_every, hot, cold);
                        let v = compio_echo_windowed(&mut s, frames, payload, window).await;
                        (s, v)
                    })
                    .await,
                );
            }
            checksum
        }
        Shape::Rtt { rounds, payload } => compio_echo_rtt(&mut streams[0], rounds, payload).await,
    }
}

// ============================================================ criterion

/// One command; for fs_net, the seed's synchronous preads on the bench thread
/// first (seed L4403-4407: `read_qd1` then `echo_rtt`, phased).
fn one_iteration<H: NetHarness>(
    h: &mut H,
    shape: Shape,
    fs: Option<&FsBenchFixture>,
    fs_rounds: usize,
) -> u64 {
    let fs_sum = match fs {
        Some(f) => f.read_qd1(fs_rounds),
        None => 0,
    };
    fs_sum.wrapping_add(h.run(shape))
}

fn bench_contender<H: NetHarness>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    w: &Workload,
    id: &str,
    mut h: H,
    fs: Option<&FsBenchFixture>,
) {
    let (warm_reads, reads) = w.fs_reads.unwrap_or((0, 0));
    let mut warmed = false;
    let mut m = Meter::default();
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            // The seed's warm-up call, once, untimed (lazily, so a group the
            // filter skips costs only its harness start-up).
            if !warmed {
                black_box(one_iteration(&mut h, w.warm, fs, warm_reads));
                warmed = true;
            }
            m.measure(iters * w.ops, || {
                for _ in 0..iters {
                    black_box(one_iteration(&mut h, w.shape, fs, reads));
                }
            })
        })
    });
    m.report(&format!("{}/{id}", w.group));
    drop(h); // tears the runtime down before the next contender starts
}

fn seed_net(c: &mut Criterion) {
    for w in &WORKLOADS {
        let fixture = w
            .fs_reads
            .map(|_| FsBenchFixture::new(FS_NET_MICRO_READ_BYTES, FS_NET_MICRO_FILE_BLOCKS));
        let fs = fixture.as_ref();
        let mut g = c.benchmark_group(w.group);
        g.throughput(Throughput::Bytes(w.bytes));
        g.sample_size(SAMPLES);
        bench_contender(
            &mut g,
            w,
            "mailring",
            MailringHarness::new(w.stealable, mailring::IdlePolicy::default()),
            fs,
        );
        bench_contender(&mut g, w, "tokio", TokioHarness::new(), fs);
        match SpargioHarness::new(w.spargio_distributed) {
            Some(h) => bench_contender(&mut g, w, "spargio", h, fs),
            None => eprintln!("{}: spargio skipped (io_uring unavailable)", w.group),
        }
        bench_contender(&mut g, w, "compio", CompioHarness::new(), fs);
        // mailring with shards that never block, as spargio's (a `yield_now`
        // loop): on a VM an idle vCPU takes ~10 µs to run any thread woken
        // onto it (the echo server's among them), and polling shards keep
        // both awake. SEED_SKIP_POLL=1 leaves it out.
        if std::env::var_os("SEED_SKIP_POLL").is_none() {
            bench_contender(
                &mut g,
                w,
                "mailring-poll",
                MailringHarness::new(w.stealable, mailring::IdlePolicy::Poll),
                fs,
            );
        }
        // SEED_SKIP_ACTORS=1 leaves out the keyed-actor version.
        if std::env::var_os("SEED_SKIP_ACTORS").is_none() {
            bench_contender(&mut g, w, "mailring-actors", actors::harness(), fs);
        }
        g.finish();
    }
}

criterion_group!(benches, seed_net);
criterion_main!(benches);
