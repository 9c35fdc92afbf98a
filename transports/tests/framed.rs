//! `Framed` connections whose sends or receives are given up mid-way.

use std::time::Duration;

use bytes::Bytes;
use mailring::net::UnixStream;
use mailring_actors::mailring;
use mailring_transports::codec::LengthDelimited;
use mailring_transports::Framed;

fn runtime() -> mailring::Runtime {
    mailring::Runtime::builder()
        .shards(1)
        .build()
        .expect("io_uring available")
}

/// A send given up mid-way (the peer reads nothing, the frame does not
/// fit its socket) may have put part of its frame on the wire: the
/// connection's next send or receive fails rather than go on out of step
/// (the peer would read the next frame as the rest of the broken one).
#[test]
fn a_send_given_up_mid_way_breaks_the_connection_for_good() {
    let rt = runtime();
    let failed = rt.block_on_local(|| async {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut framed = Framed::unix(ours, LengthDelimited::new());
        let big = Bytes::from(vec![7u8; 8 << 20]);
        let cut = mailring::time::timeout(Duration::from_millis(100), framed.send(big)).await;
        assert!(cut.is_err(), "the peer reads nothing: the send waits");
        let again = mailring::time::timeout(
            Duration::from_millis(100),
            framed.send(Bytes::from_static(b"next")),
        )
        .await;
        let received = mailring::time::timeout(Duration::from_millis(100), framed.recv()).await;
        (matches!(again, Ok(Err(_))), matches!(received, Ok(Err(_))))
    });
    assert_eq!(failed, (true, true), "(send, recv) after a send cut off");
}

/// A receive given up before anything came (an idle timeout around
/// `recv`) takes nothing: the connection goes on, and the next frame is
/// read whole.
#[test]
fn a_receive_given_up_before_anything_came_leaves_the_connection_whole() {
    let rt = runtime();
    let got = rt.block_on_local(|| async {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut framed = Framed::unix(ours, LengthDelimited::new());
        let mut peer = Framed::unix(theirs, LengthDelimited::new());
        for _ in 0..3 {
            let idle = mailring::time::timeout(Duration::from_millis(20), framed.recv()).await;
            assert!(idle.is_err(), "nothing sent yet");
        }
        peer.send(Bytes::from_static(b"hello")).await.unwrap();
        framed.send(Bytes::from_static(b"back")).await.unwrap();
        let got = framed.recv().await.unwrap().unwrap();
        let back = peer.recv().await.unwrap().unwrap();
        (got, back)
    });
    assert_eq!((&got.0[..], &got.1[..]), (&b"hello"[..], &b"back"[..]));
}

/// A receive given up after the kernel had filled its buffer lost those
/// bytes: a later receive says so once, and the connection is out of step
/// for good, also when a send came in between.
#[test]
fn a_receive_that_lost_bytes_breaks_the_connection_even_after_a_send() {
    use std::future::Future;
    let rt = runtime();
    let (lost, after) = rt.block_on_local(|| async {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut framed = Framed::unix(ours, LengthDelimited::new());
        let mut peer = Framed::unix(theirs, LengthDelimited::new());
        {
            let mut cut = std::pin::pin!(framed.recv());
            std::future::poll_fn(|cx| {
                assert!(cut.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
            peer.send(Bytes::from_static(b"taken, then lost")).await.unwrap();
            mailring::time::sleep(Duration::from_millis(20)).await;
        }
        framed.send(Bytes::from_static(b"a send between")).await.unwrap();
        let lost = framed.recv().await;
        peer.send(Bytes::from_static(b"whole")).await.unwrap();
        let after = mailring::time::timeout(Duration::from_millis(200), framed.recv()).await;
        (
            matches!(&lost, Err(mailring_transports::FramedError::Io(e)) if mailring::net::LostBytes::is(e)),
            matches!(after, Ok(Err(_))),
        )
    });
    assert_eq!(
        (lost, after),
        (true, true),
        "(the loss said, then out of step)"
    );
}
