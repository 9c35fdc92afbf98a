//! hyper's graceful shutdown following the signal future, with a real
//! SIGTERM, in a binary of its own (`harness = false`: a signal handler is
//! process-wide): a request in flight when SIGTERM arrives is answered,
//! the connection takes nothing after it, and the process lives on.
//! Built with `--features tokio-io,futures-io,hyper` (`.ci/run` does).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use mailring::signal::{signal, SignalKind};
use mailring_actors::mailring::net::TcpListener;
use mailring_actors::ShardId;
use mailring_transports::compat::{serve_until, CompatStream, Drain, ShardTimer};

/// Requests the server has begun to serve.
static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn slow(_req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    mailring::time::sleep(Duration::from_millis(300)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"answered"))))
}

fn main() {
    let rt = mailring::Runtime::builder()
        .shards(2)
        .build()
        .expect("io_uring available");
    let drain = Drain::new();
    // SIGTERM starts the drain (installed before anything can send it).
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM listener");
    let trigger = drain.clone();
    drop(rt.handle().spawn(async move {
        terminate.recv().await;
        trigger.trigger();
    }));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = drain.clone();
    drop(
        rt.handle()
            .spawn_local_on(ShardId::new(0), move || async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(ShardTimer)
                    .serve_connection(CompatStream::tcp(stream), hyper::service::service_fn(slow));
                serve_until(conn, served.signaled()).await.unwrap();
            }),
    );
    let body = rt
        .block_on(
            rt.handle()
                .spawn_local_on(ShardId::new(1), move || async move {
                    let io = CompatStream::connect(addr).await.unwrap();
                    let (mut sender, conn) =
                        hyper::client::conn::http1::handshake(io).await.unwrap();
                    let conn = mailring::spawn_local(conn);
                    let req = || {
                        Request::get("/")
                            .header("host", "localhost")
                            .body(Full::new(Bytes::new()))
                            .unwrap()
                    };
                    let in_flight = sender.send_request(req());
                    let kill = mailring::spawn_local(async {
                        // Once the request is being served (not on a timer).
                        while STARTED.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                            mailring::time::sleep(Duration::from_millis(1)).await;
                        }
                        let status = std::process::Command::new("kill")
                            .args(["-TERM", &std::process::id().to_string()])
                            .status()
                            .expect("run kill");
                        assert!(status.success());
                    });
                    let res = in_flight.await.unwrap();
                    kill.await.unwrap();
                    let body = res.into_body().collect().await.unwrap().to_bytes();
                    // The connection ends after the answer; a new request fails.
                    conn.await.unwrap().unwrap();
                    assert!(sender.send_request(req()).await.is_err());
                    body
                }),
        )
        .unwrap();
    assert_eq!(&body[..], b"answered");
    assert!(drain.is_triggered(), "SIGTERM triggered the drain");
    println!("drain_on_sigterm: 1 test passed");
}
