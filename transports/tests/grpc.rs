//! A tonic-generated gRPC service (`tests/grpc/greeter.rs`, from tonic-build)
//! served by hyper HTTP/2 on a mailring shard through the adapters, called
//! by the tonic-generated client over hyper on another shard; a request
//! with a `grpc-timeout` the handler outlives ends `DeadlineExceeded`, the
//! handler cut at the deadline.
//! tonic's own `transport` server spawns on Tokio, so it stays off. Built
//! with `--features tokio-io,futures-io,hyper` (`.ci/run` does).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use mailring_actors::ShardId;
use mailring_transports::compat::{CompatStream, ShardExecutor, ShardTimer};

mod common;

#[allow(unreachable_pub, missing_docs, missing_debug_implementations)]
#[allow(clippy::all)]
mod grpc {
    use std::marker::PhantomData;

    use bytes::{Buf, BufMut};
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    #[derive(Debug, Clone, PartialEq)]
    pub struct HelloRequest {
        pub name: String,
    }

    #[derive(Debug, Clone, PartialEq)]
    pub struct HelloReply {
        pub message: String,
    }

    /// Messages that are one UTF-8 string on the wire.
    pub trait Text: Sized + Send + 'static {
        fn text(&self) -> &str;
        fn from_text(text: String) -> Self;
    }

    impl Text for HelloRequest {
        fn text(&self) -> &str {
            &self.name
        }
        fn from_text(name: String) -> Self {
            HelloRequest { name }
        }
    }

    impl Text for HelloReply {
        fn text(&self) -> &str {
            &self.message
        }
        fn from_text(message: String) -> Self {
            HelloReply { message }
        }
    }

    /// The codec the generated code names (`codec_path`).
    pub struct TextCodec<E, D>(PhantomData<(E, D)>);

    impl<E, D> Default for TextCodec<E, D> {
        fn default() -> Self {
            TextCodec(PhantomData)
        }
    }

    pub struct TextEncoder<E>(PhantomData<E>);
    pub struct TextDecoder<D>(PhantomData<D>);

    impl<E: Text, D: Text> Codec for TextCodec<E, D> {
        type Encode = E;
        type Decode = D;
        type Encoder = TextEncoder<E>;
        type Decoder = TextDecoder<D>;

        fn encoder(&mut self) -> TextEncoder<E> {
            TextEncoder(PhantomData)
        }

        fn decoder(&mut self) -> TextDecoder<D> {
            TextDecoder(PhantomData)
        }
    }

    impl<E: Text> Encoder for TextEncoder<E> {
        type Item = E;
        type Error = Status;

        fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(item.text().as_bytes());
            Ok(())
        }
    }

    impl<D: Text> Decoder for TextDecoder<D> {
        type Item = D;
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
            let bytes = src.copy_to_bytes(src.remaining());
            String::from_utf8(bytes.to_vec())
                .map(|s| Some(D::from_text(s)))
                .map_err(|e| Status::invalid_argument(e.to_string()))
        }
    }

    include!("grpc/greeter.rs");
}

use grpc::greeter_client::GreeterClient;
use grpc::greeter_server::{Greeter, GreeterServer};
use grpc::{HelloReply, HelloRequest};

/// A `grpc-timeout` value (`50m`, `2S`, `100000u`...) as a duration.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok().filter(|_| digits.len() <= 8)?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Slow calls that ran to their end.
static SLOW_FINISHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Greets from its shard; `slow` takes a minute, within the caller's
/// `grpc-timeout` if it sent one.
struct ShardGreeter;

#[tonic::async_trait]
impl Greeter for ShardGreeter {
    async fn say_hello(
        &self,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout);
        let name = request.into_inner().name;
        let shard = mailring::current_shard().map_or(usize::MAX, |s| s.index());
        let work = async {
            if name == "slow" {
                // Far past any deadline a caller sets here: only the
                // deadline can end this call early.
                mailring::time::sleep(Duration::from_secs(60)).await;
                SLOW_FINISHED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            HelloReply {
                message: format!("hello {name} from shard {shard}"),
            }
        };
        match deadline {
            Some(d) => mailring::time::timeout(d, work)
                .await
                .map(tonic::Response::new)
                .map_err(|_| tonic::Status::deadline_exceeded(format!("past {d:?}"))),
            None => Ok(tonic::Response::new(work.await)),
        }
    }
}

/// The generated client's channel: hyper's HTTP/2 `SendRequest` as a
/// tower service.
#[derive(Clone)]
struct H2Channel(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for H2Channel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

#[test]
fn a_tonic_generated_service_runs_on_hyper_on_a_shard_with_grpc_timeouts() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available");
    let addr = common::accept_on(&rt, ShardId::new(0), |stream| async move {
        let service =
            hyper_util::service::TowerToHyperService::new(GreeterServer::new(ShardGreeter));
        let _ = hyper::server::conn::http2::Builder::new(ShardExecutor::current())
            .timer(ShardTimer)
            .serve_connection(CompatStream::tcp(stream), service)
            .await;
    });
    let (replies, late) = rt
        .block_on(
            rt.handle()
                .spawn_local_on(ShardId::new(1), move || async move {
                    let io = CompatStream::connect(addr).await.unwrap();
                    let (sender, conn) =
                        hyper::client::conn::http2::Builder::new(ShardExecutor::current())
                            .timer(ShardTimer)
                            .handshake(io)
                            .await
                            .unwrap();
                    drop(mailring::spawn_local(conn));
                    let uri: http::Uri = format!("http://{addr}").parse().unwrap();
                    let mut client = GreeterClient::with_origin(H2Channel(sender), uri);
                    let mut replies = Vec::new();
                    for name in ["ring", "shard"] {
                        let reply = client
                            .say_hello(HelloRequest { name: name.into() })
                            .await
                            .unwrap();
                        replies.push(reply.into_inner().message);
                    }
                    // A deadline of 50 ms on a call the handler takes a minute over.
                    let mut req = tonic::Request::new(HelloRequest {
                        name: "slow".into(),
                    });
                    req.set_timeout(Duration::from_millis(50));
                    let late = client.say_hello(req).await.unwrap_err();
                    (replies, late)
                }),
        )
        .unwrap();
    assert_eq!(
        replies,
        ["hello ring from shard 0", "hello shard from shard 0"]
    );
    assert_eq!(late.code(), tonic::Code::DeadlineExceeded, "{late:?}");
    assert_eq!(
        SLOW_FINISHED.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the handler was cut at the deadline"
    );
}

#[test]
fn grpc_timeout_values_parse_as_the_spec_writes_them() {
    assert_eq!(grpc_timeout("50m"), Some(Duration::from_millis(50)));
    assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
    assert_eq!(grpc_timeout("100000u"), Some(Duration::from_millis(100)));
    assert_eq!(grpc_timeout("123456789n"), None, "at most 8 digits");
    assert_eq!(grpc_timeout("5x"), None);
    assert_eq!(grpc_timeout(""), None);
}
