//! Misuse from the wrong shard or thread gives errors (or a panic that names
//! the call and its remedy), never another shard's memory or a hang.

use std::time::Duration;

use mailring::buf::BufRing;
use mailring::net::UnixStream;
use mailring::ShardId;

/// A `BufRing` registered on shard 1, used by a stream on shard 0 (which has
/// no buffer group of its own): an error, not an endless re-arm on
/// `ENOBUFS`.
#[test]
fn a_buf_ring_of_another_shard_is_refused_by_recv_multishot() {
    let rt = super::rt2();
    let h = rt.handle().clone();
    let res = rt.block_on(async move {
        let ring = h
            .spawn_on(ShardId::new(1), async { BufRing::new(8, 256) })
            .await
            .unwrap()
            .unwrap();
        h.spawn_on(ShardId::new(0), async move {
            let (a, b) = UnixStream::pair().unwrap();
            a.send_all(b"hello".to_vec()).await.0.unwrap();
            let mut incoming = b.recv_multishot(&ring);
            mailring::time::timeout(Duration::from_secs(5), incoming.next()).await
        })
        .await
        .unwrap()
    });
    let err = res
        .expect("an answer, not an endless re-arm")
        .expect("an item")
        .expect_err("a foreign ring is an error");
    assert!(err.to_string().contains("another shard"), "{err}");
}

/// Group ids repeat across shards: with a ring of its own in the same group,
/// shard 0 must still refuse shard 1's ring instead of reading its own
/// ring's buffers through it.
#[test]
fn a_buf_ring_of_another_shard_never_reads_this_shards_buffers() {
    let rt = super::rt2();
    let h = rt.handle().clone();
    let res = rt.block_on(async move {
        let foreign = h
            .spawn_on(ShardId::new(1), async { BufRing::new(8, 256) })
            .await
            .unwrap()
            .unwrap();
        h.spawn_on(ShardId::new(0), async move {
            let own = BufRing::new(8, 256).unwrap();
            assert_eq!(
                own.group(),
                foreign.group(),
                "group ids repeat across shards"
            );
            let (a, b) = UnixStream::pair().unwrap();
            a.send_all(b"hello".to_vec()).await.0.unwrap();
            let mut incoming = b.recv_multishot(&foreign);
            let got = mailring::time::timeout(Duration::from_secs(5), incoming.next()).await;
            drop(incoming);
            // The data is still there for a receive with the right ring.
            let mut right = b.recv_multishot(&own);
            let data = mailring::time::timeout(Duration::from_secs(5), right.next())
                .await
                .map(|d| d.unwrap().unwrap().to_vec());
            (got.map(|g| g.map(|r| r.map(|b| b.to_vec()))), data)
        })
        .await
        .unwrap()
    });
    let (got, data) = res;
    let got = got.expect("answered").expect("an item");
    assert!(got.is_err(), "read through a foreign ring: {got:?}");
    assert_eq!(data.expect("the data is still in the socket"), b"hello");
}

/// `block_on` of another runtime from a shard would block that shard (and
/// deadlock if the future waits on a task there): it panics with a message
/// that says what to do instead, as Tokio does.
#[test]
fn block_on_of_another_runtime_from_a_shard_panics_with_the_remedy() {
    let rt = super::rt2();
    let other = std::sync::Arc::new(super::rt2());
    let inner = other.clone();
    let message = rt.block_on(async move {
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.block_on(async { 1 })));
        let payload = caught.expect_err("block_on from a shard must panic");
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    });
    assert!(
        message.contains("another mailring runtime") && message.contains("spawn"),
        "{message}"
    );
    // Both runtimes still work.
    assert_eq!(other.block_on(async { 2 }), 2);
    assert_eq!(rt.block_on(async { 3 }), 3);
}
