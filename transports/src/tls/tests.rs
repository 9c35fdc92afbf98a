//! The handshake driver and the record layer, run in memory: two
//! connection states pass their records to each other, or one of ours
//! talks to rustls's own buffered connection (an independent record
//! layer), for every suite of both versions, key updates, tickets and
//! hostile records.

use std::cell::Cell;
use std::io::{Read as _, Write as _};
use std::sync::Arc;

use bytes::BytesMut;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

use super::record::Read;
use super::{
    next_receive_room, Handshake, Phase, Step, TlsState, CIPHER_CHUNK, CIPHER_CHUNK_MAX,
    CIPHER_SMALL, MAX_HANDSHAKE_HELD, SMALL_RECEIVES_TO_SHRINK,
};

/// When the connections of a test hand their records from rustls to the
/// record layer, in records of data: at the handshake's end, after the
/// first, after a few (in the middle of an exchange), never.
const HAND_OVERS: [u32; 4] = [0, 1, 3, u32::MAX];

thread_local! {
    /// The hand-over of the connections `our_server` and `our_client` make
    /// (0 unless a test runs [`for_each_hand_over`]).
    static HAND_OVER: Cell<u32> = const { Cell::new(0) };
}

/// Runs `test` once for each of [`HAND_OVERS`].
fn for_each_hand_over(mut test: impl FnMut(u32)) {
    for hand_over in HAND_OVERS {
        HAND_OVER.set(hand_over);
        test(hand_over);
    }
    HAND_OVER.set(0);
}

struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

fn identity() -> Identity {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    Identity {
        cert: cert.der().clone(),
        key: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    }
}

fn provider(suite: SupportedCipherSuite) -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![suite],
        ..rustls::crypto::ring::default_provider()
    })
}

fn version_of(suite: SupportedCipherSuite) -> &'static SupportedProtocolVersion {
    match suite {
        SupportedCipherSuite::Tls13(_) => &rustls::version::TLS13,
        SupportedCipherSuite::Tls12(_) => &rustls::version::TLS12,
    }
}

fn server_config(id: &Identity, suite: SupportedCipherSuite) -> Arc<rustls::ServerConfig> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[version_of(suite)])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![id.cert.clone()], id.key.clone_key())
        .unwrap();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn client_config(id: &Identity, suite: SupportedCipherSuite) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(id.cert.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[version_of(suite)])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").unwrap()
}

fn our_server(config: Arc<rustls::ServerConfig>) -> TlsState {
    let conn = rustls::server::UnbufferedServerConnection::new(config).unwrap();
    let mut state = TlsState::new(Handshake::Server(conn), BytesMut::new());
    state.hand_over_after = HAND_OVER.get();
    state
}

fn our_client(config: Arc<rustls::ClientConfig>) -> TlsState {
    let conn = rustls::client::UnbufferedClientConnection::new(config, localhost()).unwrap();
    let mut state = TlsState::new(Handshake::Client(conn), BytesMut::new());
    state.hand_over_after = HAND_OVER.get();
    state
}

/// Moves every record `from` has queued to `to`'s receive buffer.
fn transfer(from: &mut TlsState, to: &mut TlsState) {
    while from.wants_write() {
        let records = from.take_outgoing();
        to.cipher_in.extend_from_slice(&records);
    }
}

/// The handshake is done: rustls or the record layer protects records.
fn past_handshake(state: &TlsState) -> bool {
    matches!(state.phase, Phase::Opening(_) | Phase::Traffic(_))
}

fn in_traffic(state: &TlsState) -> bool {
    matches!(state.phase, Phase::Traffic(_))
}

/// One step of `me`'s handshake; what it sends goes to `peer`.
fn step(me: &mut TlsState, peer: &mut TlsState) {
    match me.handshake_step() {
        Step::Send => transfer(me, peer),
        Step::Receive | Step::Done => {}
        Step::Failed(e) => panic!("handshake failed: {e}"),
    }
}

/// Runs both handshakes to their end.
fn handshake(client: &mut TlsState, server: &mut TlsState) {
    for _ in 0..50 {
        step(client, server);
        step(server, client);
        if past_handshake(client)
            && past_handshake(server)
            && !client.wants_write()
            && !server.wants_write()
        {
            return;
        }
    }
    panic!("the handshake did not end");
}

fn pair(suite: SupportedCipherSuite) -> (TlsState, TlsState) {
    let hand_over = HAND_OVER.get();
    pair_with(suite, hand_over, hand_over)
}

/// A client and a server that hand over at their own points.
fn pair_with(
    suite: SupportedCipherSuite,
    client_hand_over: u32,
    server_hand_over: u32,
) -> (TlsState, TlsState) {
    let id = identity();
    let mut client = our_client(client_config(&id, suite));
    client.hand_over_after = client_hand_over;
    let mut server = our_server(server_config(&id, suite));
    server.hand_over_after = server_hand_over;
    handshake(&mut client, &mut server);
    (client, server)
}

/// Everything `state` can decrypt now, and whether the peer ended.
fn read_all(state: &mut TlsState) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    loop {
        let mut buf = BytesMut::with_capacity(3000);
        match state.read(&mut buf).unwrap() {
            Read::Plaintext(n) => {
                assert_eq!(n, buf.len());
                got.extend_from_slice(&buf);
            }
            Read::End => return (got, true),
            Read::NeedMore => return (got, false),
        }
    }
}

/// How many whole records `bytes` holds.
fn records_in(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    let mut count = 0;
    while rest.len() >= 5 {
        let len = 5 + usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        assert!(rest.len() >= len, "a record cut short");
        rest = &rest[len..];
        count += 1;
    }
    assert!(rest.is_empty());
    count
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn all_suites() -> Vec<SupportedCipherSuite> {
    rustls::crypto::ring::ALL_CIPHER_SUITES.to_vec()
}

#[test]
fn every_suite_of_both_versions_carries_data_both_ways_across_record_boundaries() {
    let suites = all_suites();
    assert_eq!(suites.len(), 9, "three TLS 1.3 suites, six TLS 1.2 ones");
    for_each_hand_over(|hand_over| {
        for suite in &suites {
            let suite = *suite;
            let SupportedCipherSuite::Tls12(s) = suite else {
                // TLS 1.3: one certificate type serves every suite.
                check_both_ways(suite, hand_over);
                continue;
            };
            // The RSA-signed TLS 1.2 suites need an RSA certificate;
            // rcgen's default key is ECDSA, so only the ECDSA ones run
            // here.
            if format!("{:?}", s.common.suite).contains("ECDSA") {
                check_both_ways(suite, hand_over);
            }
        }
    });
}

fn check_both_ways(suite: SupportedCipherSuite, hand_over: u32) {
    let (mut client, mut server) = pair(suite);
    for state in [&client, &server] {
        match &state.phase {
            Phase::Traffic(layer) => {
                assert_eq!(hand_over, 0);
                assert!(layer.seals_in_place(), "{suite:?} is sealed in place");
            }
            Phase::Opening(_) => assert_ne!(hand_over, 0),
            _ => unreachable!(),
        }
    }
    exchange(suite, &mut client, &mut server);
    // Both took the keys past their point, or kept to rustls.
    for state in [&client, &server] {
        assert_eq!(in_traffic(state), hand_over != u32::MAX, "{suite:?}");
    }
}

fn exchange(suite: SupportedCipherSuite, client: &mut TlsState, server: &mut TlsState) {
    for (i, len) in [1, 16384, 16385, 100_000].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        client.encrypt(&data).unwrap();
        transfer(client, server);
        assert_eq!(read_all(server), (data.clone(), false), "{suite:?} {len}");
        server.encrypt(&data).unwrap();
        transfer(server, client);
        assert_eq!(read_all(client), (data, false), "{suite:?} {len}");
    }
    client.queue_close_notify().unwrap();
    transfer(client, server);
    assert_eq!(read_all(server), (Vec::new(), true), "{suite:?}");
    // The end stays the end.
    assert_eq!(read_all(server), (Vec::new(), true), "{suite:?}");
    assert!(
        client.encrypt(b"late").is_err(),
        "nothing is sent after close_notify"
    );
}

/// Drives a rustls buffered connection's output into our state.
fn from_rustls(peer: &mut rustls::Connection, us: &mut TlsState) {
    while peer.wants_write() {
        let mut records = Vec::new();
        peer.write_tls(&mut records).unwrap();
        us.cipher_in.extend_from_slice(&records);
    }
}

/// Hands our records to a rustls buffered connection, and returns the
/// plaintext it read (or its error).
fn to_rustls(us: &mut TlsState, peer: &mut rustls::Connection) -> Result<Vec<u8>, rustls::Error> {
    while us.wants_write() {
        let records = us.take_outgoing();
        let mut rd: &[u8] = &records;
        while !rd.is_empty() {
            peer.read_tls(&mut rd).unwrap();
            peer.process_new_packets()?;
        }
    }
    let mut got = Vec::new();
    match peer.reader().read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(e) => panic!("{e}"),
    }
    Ok(got)
}

/// Our server and a rustls buffered client, handshake done.
fn our_server_and_rustls_client(
    suite: SupportedCipherSuite,
) -> (TlsState, rustls::Connection, Arc<rustls::ClientConfig>) {
    let id = identity();
    let mut server = our_server(server_config(&id, suite));
    let config = client_config(&id, suite);
    let mut client = rustls::Connection::Client(
        rustls::ClientConnection::new(config.clone(), localhost()).unwrap(),
    );
    for _ in 0..50 {
        from_rustls(&mut client, &mut server);
        match server.handshake_step() {
            Step::Send => {
                to_rustls(&mut server, &mut client).unwrap();
            }
            Step::Receive | Step::Done => {}
            Step::Failed(e) => panic!("{e}"),
        }
        if past_handshake(&server) && !client.is_handshaking() && !client.wants_write() {
            // The session tickets, if the server sent them last.
            to_rustls(&mut server, &mut client).unwrap();
            return (server, client, config);
        }
    }
    panic!("the handshake did not end");
}

#[test]
fn a_rustls_peer_s_key_updates_are_followed_and_answered_when_it_asks() {
    for_each_hand_over(|_| key_updates_followed_and_answered());
}

fn key_updates_followed_and_answered() {
    let (mut server, mut client, _) =
        our_server_and_rustls_client(rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384);
    // More updates than the bound on updates in a row: data between them
    // resets it.
    for round in 0..40u8 {
        let request = pattern(300, round);
        client.writer().write_all(&request).unwrap();
        // rustls asks for an update of ours too.
        client.refresh_traffic_keys().unwrap();
        client.writer().write_all(&request).unwrap();
        from_rustls(&mut client, &mut server);
        let (got, ended) = read_all(&mut server);
        assert_eq!(got, [request.clone(), request.clone()].concat());
        assert!(!ended);
        // Our answering KeyUpdate goes first, then the reply under the
        // new key; rustls reads both. The record layer queues the answer
        // at once, rustls with the next data.
        if in_traffic(&server) {
            assert!(server.wants_write(), "the requested key update is queued");
        }
        server.encrypt(&request).unwrap();
        assert_eq!(records_in(&server.records_out), 2, "the answer, the reply");
        assert_eq!(to_rustls(&mut server, &mut client).unwrap(), request);
    }
}

#[test]
fn requests_for_key_updates_while_our_records_wait_get_one_answer() {
    for_each_hand_over(|_| one_answer_for_waiting_requests());
}

fn one_answer_for_waiting_requests() {
    // A peer that never reads (our records wait, not taken to be sent)
    // asks again and again for an update of ours, data between each batch
    // of asks: one answer is queued, not one per request, and the peer
    // reads it and the data after it.
    let (mut server, mut client, _) =
        our_server_and_rustls_client(rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384);
    for round in 0..200u8 {
        client.refresh_traffic_keys().unwrap();
        client.writer().write_all(&[round]).unwrap();
        from_rustls(&mut client, &mut server);
        let (got, _) = read_all(&mut server);
        assert_eq!(got, [round]);
    }
    let queued = server.records_out.len();
    assert!(
        queued < 100,
        "{queued} bytes of answers queued for 200 requests"
    );
    server.encrypt(b"after").unwrap();
    assert_eq!(to_rustls(&mut server, &mut client).unwrap(), b"after");
    // Once taken to be sent, a new request gets its own answer.
    client.refresh_traffic_keys().unwrap();
    client.writer().write_all(b"x").unwrap();
    from_rustls(&mut client, &mut server);
    assert_eq!(read_all(&mut server).0, b"x");
    if in_traffic(&server) {
        assert!(
            server.wants_write(),
            "a new answer after the last was taken"
        );
    }
    server.encrypt(b"again").unwrap();
    assert_eq!(records_in(&server.records_out), 2, "the answer, the data");
    assert_eq!(to_rustls(&mut server, &mut client).unwrap(), b"again");
}

#[test]
fn our_key_update_at_the_confidentiality_limit_keeps_a_rustls_peer_reading() {
    let (mut server, mut client, _) =
        our_server_and_rustls_client(rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256);
    let Phase::Traffic(layer) = &mut server.phase else {
        unreachable!()
    };
    layer.set_tx_limit(3);
    let mut expected = Vec::new();
    for i in 0..20u8 {
        let data = pattern(100 + usize::from(i), i);
        server.encrypt(&data).unwrap();
        expected.extend_from_slice(&data);
    }
    assert_eq!(to_rustls(&mut server, &mut client).unwrap(), expected);
    // And the peer's records still open on our side.
    client.writer().write_all(b"after").unwrap();
    from_rustls(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"after".to_vec(), false));
}

/// A write that would cross TLS 1.2's record limit part way is refused
/// whole (as rustls checks every fragment before it writes any): the peer
/// gets nothing of it, then the clean end, not its first records and then
/// an end that reads as clean.
#[test]
fn tls12_near_its_limit_refuses_a_write_whole_not_part_of_it() {
    let (mut client, mut server) =
        pair(rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    let Phase::Traffic(layer) = &mut client.phase else {
        unreachable!()
    };
    // Finished was record 0, "one" is record 1; a write of two records
    // (2 and 3) would reach the limit of 4 at its second.
    layer.set_tx_limit(4);
    client.encrypt(b"one").unwrap();
    let two_records = pattern(16 * 1024 + 1, 9);
    let e = client.encrypt(&two_records).unwrap_err();
    assert!(e.to_string().contains("confidentiality limit"), "{e}");
    transfer(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"one".to_vec(), true));
}

#[test]
fn tls12_refuses_to_send_past_the_confidentiality_limit() {
    let (mut client, mut server) =
        pair(rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    let Phase::Traffic(layer) = &mut client.phase else {
        unreachable!()
    };
    // The client's Finished was its record 0 under these keys; "one" is
    // record 1, and the limit is 3 records.
    layer.set_tx_limit(3);
    client.encrypt(b"one").unwrap();
    let e = client.encrypt(b"two").unwrap_err();
    assert!(e.to_string().contains("confidentiality limit"), "{e}");
    assert!(client.check().is_err(), "the connection is failed");
    // The peer gets what was sent, then a clean end (close_notify, the
    // last record the keys allow).
    transfer(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"one".to_vec(), true));
}

#[test]
fn our_client_stores_the_server_s_tickets_and_resumes_with_them() {
    for_each_hand_over(|_| tickets_stored_and_used());
}

fn tickets_stored_and_used() {
    let id = identity();
    let suite = rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256;
    let client_config = client_config(&id, suite);
    let server_config = server_config(&id, suite);
    let mut client = our_client(client_config.clone());
    let mut server = our_server(server_config.clone());
    handshake(&mut client, &mut server);
    assert!(!client.info.resumed);
    // The tickets came after the client's handshake ended: rustls takes
    // them, or the record layer hands them to rustls.
    assert_eq!(read_all(&mut client), (Vec::new(), false));

    let mut client = our_client(client_config);
    let mut server = our_server(server_config);
    handshake(&mut client, &mut server);
    assert!(client.info.resumed, "the second handshake resumed");
    assert!(server.info.resumed);
    client.encrypt(b"resumed").unwrap();
    transfer(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"resumed".to_vec(), false));
}

#[test]
fn a_tampered_record_fails_with_bad_record_mac_and_the_peer_is_told() {
    for_each_hand_over(|_| tampered_record_fails());
}

fn tampered_record_fails() {
    for suite in [
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ] {
        let (mut server, mut client, _) = our_server_and_rustls_client(suite);
        client.writer().write_all(b"first").unwrap();
        from_rustls(&mut client, &mut server);
        assert_eq!(read_all(&mut server), (b"first".to_vec(), false));
        client.writer().write_all(b"second").unwrap();
        from_rustls(&mut client, &mut server);
        let last = server.cipher_in.len() - 1;
        server.cipher_in[last] ^= 1;
        let mut buf = BytesMut::with_capacity(100);
        let e = server.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{suite:?}");
        assert!(server.check().is_err());
        let told = to_rustls(&mut server, &mut client).unwrap_err();
        assert!(
            format!("{told:?}").contains("BadRecordMac"),
            "{suite:?}: {told:?}"
        );
    }
}

#[test]
fn oversized_unprotected_and_unexpected_records_are_refused() {
    for_each_hand_over(bad_records_refused);
}

fn bad_records_refused(hand_over: u32) {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let cases: [(&[u8], &str); 3] = [
        // A length past any record's.
        (&[23, 3, 3, 0xff, 0xff], "over the limit"),
        // A handshake record in clear after a TLS 1.3 handshake.
        (&[22, 3, 3, 0, 1, 0], "unprotected"),
        // An alert in clear.
        (&[21, 3, 3, 0, 2, 2, 40], "unprotected"),
    ];
    for (bytes, expected) in cases {
        let (_client, mut server) = pair(suite);
        server.cipher_in.extend_from_slice(bytes);
        let mut buf = BytesMut::with_capacity(100);
        let e = server.read(&mut buf).unwrap_err();
        // rustls, protecting the first records, words it its own way.
        if hand_over == 0 {
            assert!(e.to_string().contains(expected), "{e}");
        }
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        // The alert that says why is queued for the peer.
        assert!(server.wants_write());
    }
    // Past TLS 1.3's bound (2^14 + 256), though within TLS 1.2's: refused
    // from the header, with `record_overflow`, by our record layer.
    if hand_over == 0 {
        let (_client, mut server) = pair(suite);
        let len = (16 * 1024 + 257) as u16;
        server.cipher_in.extend_from_slice(&[23, 3, 3]);
        server.cipher_in.extend_from_slice(&len.to_be_bytes());
        let e = server.read(&mut BytesMut::with_capacity(100)).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        assert!(server.wants_write(), "the alert is queued");
    }
    // A fatal alert from the peer fails the connection with its name.
    let (mut server, mut client, _) = our_server_and_rustls_client(suite);
    client.send_close_notify();
    let (mut ours, mut theirs) = pair_with(suite, 0, hand_over);
    let Phase::Traffic(layer) = &mut ours.phase else {
        unreachable!()
    };
    let mut out = BytesMut::new();
    let failure = layer.encrypt_fatal_alert_for_test(&mut out);
    ours.records_out = out;
    transfer(&mut ours, &mut theirs);
    let e = theirs.read(&mut BytesMut::with_capacity(10)).unwrap_err();
    assert!(e.to_string().contains(&failure), "{e}");
    // And a clean end from rustls is the end.
    from_rustls(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (Vec::new(), true));
}

#[test]
fn a_record_cut_anywhere_waits_for_the_rest() {
    for_each_hand_over(|_| cut_record_waits());
}

fn cut_record_waits() {
    let (mut client, mut server) =
        pair(rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256);
    let data = pattern(5000, 9);
    client.encrypt(&data).unwrap();
    let records = client.take_outgoing();
    let mut got = Vec::new();
    for byte in records.iter() {
        server.cipher_in.extend_from_slice(&[*byte]);
        let (part, ended) = read_all(&mut server);
        assert!(!ended);
        got.extend(part);
    }
    assert_eq!(got, data);
}

#[test]
fn a_suite_of_another_provider_is_sealed_by_its_own_encrypter() {
    // A suite not sealed here (a provider's own, here ring's AES-GCM
    // under another suite's number): records go through the provider's
    // encrypter, and the peer reads them all the same.
    let SupportedCipherSuite::Tls13(ring_suite) =
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
    else {
        unreachable!()
    };
    let other: &'static rustls::Tls13CipherSuite = Box::leak(Box::new(rustls::Tls13CipherSuite {
        common: rustls::crypto::CipherSuiteCommon {
            suite: rustls::CipherSuite::TLS13_AES_128_CCM_SHA256,
            hash_provider: ring_suite.common.hash_provider,
            confidentiality_limit: ring_suite.common.confidentiality_limit,
        },
        hkdf_provider: ring_suite.hkdf_provider,
        aead_alg: ring_suite.aead_alg,
        quic: ring_suite.quic,
    }));
    let suite = SupportedCipherSuite::Tls13(other);
    for_each_hand_over(|hand_over| {
        let (mut client, mut server) = pair(suite);
        if let Phase::Traffic(layer) = &client.phase {
            assert!(!layer.seals_in_place());
        } else {
            assert_ne!(hand_over, 0);
        }
        exchange(suite, &mut client, &mut server);
        if let Phase::Traffic(layer) = &client.phase {
            assert!(!layer.seals_in_place());
        }
    });
}

/// A small deterministic generator (xorshift), so the hostile-input test
/// needs no dependency and fails the same way every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn hostile_record_streams_never_panic_and_never_yield_forged_plaintext() {
    let suites = [
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let data = pattern(40_000, 3);
    for suite in suites {
        for round in 0..200 {
            // Each kind of corruption meets each hand-over.
            HAND_OVER.set(HAND_OVERS[(round / 4) % HAND_OVERS.len()]);
            // A valid stream of a few records and the end, under this
            // pair's keys, to corrupt.
            let (mut client, mut server) = pair(suite);
            client.encrypt(&data).unwrap();
            client.queue_close_notify().unwrap();
            let mut bytes = client.take_outgoing().to_vec();
            match round % 4 {
                // Flip a few bits anywhere (headers included).
                0 => {
                    for _ in 0..1 + rng.below(3) {
                        let at = rng.below(bytes.len());
                        bytes[at] ^= 1 << rng.below(8);
                    }
                }
                // Cut it short.
                1 => bytes.truncate(rng.below(bytes.len())),
                // Garbage after a valid prefix.
                2 => {
                    bytes.truncate(rng.below(bytes.len()));
                    bytes.extend((0..rng.below(300)).map(|_| rng.next() as u8));
                }
                // Garbage only.
                _ => bytes = (0..rng.below(20_000)).map(|_| rng.next() as u8).collect(),
            }
            // Fed in random slices, as the network would.
            let mut got = Vec::new();
            let mut failed = false;
            let mut rest = &bytes[..];
            while !rest.is_empty() && !failed {
                let n = 1 + rng.below(rest.len().min(5000));
                server.cipher_in.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
                loop {
                    let mut buf = BytesMut::with_capacity(1 + rng.below(9000));
                    match server.read(&mut buf) {
                        Ok(Read::Plaintext(n)) => got.extend_from_slice(&buf[..n]),
                        Ok(Read::End | Read::NeedMore) => break,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            // Whatever came out is authentic: a prefix of what was sent.
            assert!(
                data.starts_with(&got),
                "{suite:?} round {round}: {} bytes that were never sent",
                got.len()
            );
            if round % 4 == 1 {
                assert!(!failed, "a stream cut short only waits for more");
            }
        }
    }
    HAND_OVER.set(0);
}

#[test]
fn what_follows_the_client_s_finished_in_one_read_is_read_after_the_handshake() {
    for_each_hand_over(|_| what_follows_finished_is_read());
}

fn what_follows_finished_is_read() {
    // rustls's client sends its Finished, data, a KeyUpdate asking for
    // ours, more data and close_notify, all in one read of the server's.
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let id = identity();
    let mut server = our_server(server_config(&id, suite));
    let mut client = rustls::Connection::Client(
        rustls::ClientConnection::new(client_config(&id, suite), localhost()).unwrap(),
    );
    from_rustls(&mut client, &mut server);
    for _ in 0..10 {
        match server.handshake_step() {
            Step::Send => {
                to_rustls(&mut server, &mut client).unwrap();
            }
            Step::Receive => {}
            Step::Done | Step::Failed(_) => panic!("the handshake ended early"),
        }
        if !client.is_handshaking() {
            break;
        }
    }
    assert!(!client.is_handshaking());
    client.writer().write_all(b"first ").unwrap();
    client.refresh_traffic_keys().unwrap();
    client.writer().write_all(b"second").unwrap();
    client.send_close_notify();
    from_rustls(&mut client, &mut server);
    let mut steps = 0;
    loop {
        match server.handshake_step() {
            Step::Done => break,
            Step::Send => {
                to_rustls(&mut server, &mut client).unwrap();
            }
            Step::Receive => panic!("everything needed is at hand"),
            Step::Failed(e) => panic!("{e}"),
        }
        steps += 1;
        assert!(steps < 10);
    }
    assert_eq!(read_all(&mut server), (b"first second".to_vec(), true));
    // Our answering KeyUpdate is queued (by rustls, with the next data);
    // what follows it is under the new key, and rustls reads both.
    if in_traffic(&server) {
        assert!(server.wants_write());
    }
    server.encrypt(b"reply").unwrap();
    assert_eq!(records_in(&server.records_out), 2, "the answer, the reply");
    assert_eq!(to_rustls(&mut server, &mut client).unwrap(), b"reply");
}

#[test]
fn the_server_name_of_a_client_hello_in_many_small_records_is_read() {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let id = identity();
    let mut config = (*client_config(&id, suite)).clone();
    // Records of at most 64 bytes: the ClientHello spans several, which
    // rustls joins in place as they come.
    config.max_fragment_size = Some(64);
    let mut client = our_client(Arc::new(config));
    let mut server = our_server(server_config(&id, suite));
    handshake(&mut client, &mut server);
    assert_eq!(server.info.server_name.as_deref(), Some("localhost"));
}

#[test]
fn a_tls12_renegotiation_is_refused_once_with_a_warning_then_fails() {
    for_each_hand_over(renegotiation_refused);
}

fn renegotiation_refused(hand_over: u32) {
    let suite = rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;
    // The client sends what no client of ours would: its record layer
    // has to have the keys.
    let (mut client, mut server) = pair_with(suite, 0, hand_over);
    // A whole ClientHello, as a client that renegotiates sends it.
    let id = identity();
    let mut hello_from =
        rustls::ClientConnection::new(client_config(&id, suite), localhost()).unwrap();
    let mut hello_record = Vec::new();
    hello_from.write_tls(&mut hello_record).unwrap();
    let client_hello = &hello_record[5..];
    assert_eq!(client_hello[0], 1, "a ClientHello");
    for attempt in 0..2 {
        if hand_over == 1 {
            // The first attempt was read under rustls, and "still here"
            // handed the keys over: the record layer knows of the refusal.
            assert_eq!(in_traffic(&server), attempt == 1);
        }
        let Phase::Traffic(layer) = &mut client.phase else {
            unreachable!()
        };
        let mut out = BytesMut::new();
        layer.encrypt_handshake_for_test(client_hello, &mut out);
        server.cipher_in.extend_from_slice(&out);
        // Whether the record layer has the keys (a TLS 1.2 connection
        // hands over on a read too, past its point).
        let ours = in_traffic(&server);
        let read = server.read(&mut BytesMut::with_capacity(100));
        if attempt == 0 {
            assert_eq!(read.unwrap(), Read::NeedMore);
            // The warning reaches the client, which passes over it.
            transfer(&mut server, &mut client);
            assert_eq!(read_all(&mut client), (Vec::new(), false));
            client.encrypt(b"still here").unwrap();
            transfer(&mut client, &mut server);
            assert_eq!(read_all(&mut server), (b"still here".to_vec(), false));
        } else {
            let e = read.unwrap_err();
            // rustls, protecting the first records, words it its own way.
            let expected = if ours {
                "handshake message 1"
            } else {
                "TooManyRenegotiationRequests"
            };
            assert!(e.to_string().contains(expected), "{e}");
        }
    }
}

#[test]
fn a_short_connection_keeps_to_rustls_and_a_long_one_hands_over_after_its_first_records() {
    use super::opening::HAND_OVER_AFTER_RECORDS;
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384;
    let id = identity();
    let fresh = rustls::server::UnbufferedServerConnection::new(server_config(&id, suite)).unwrap();
    let fresh = TlsState::new(Handshake::Server(fresh), BytesMut::new());
    assert_eq!(fresh.hand_over_after, HAND_OVER_AFTER_RECORDS);
    HAND_OVER.set(HAND_OVER_AFTER_RECORDS);

    // A request, its answer, the end: the keys are never derived again.
    let (mut client, mut server) = pair(suite);
    client.encrypt(b"GET /").unwrap();
    transfer(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"GET /".to_vec(), false));
    server.encrypt(b"200 OK").unwrap();
    server.queue_close_notify().unwrap();
    transfer(&mut server, &mut client);
    assert_eq!(read_all(&mut client), (b"200 OK".to_vec(), true));
    assert!(!in_traffic(&client) && !in_traffic(&server));

    // Requests and answers one record each: each side hands over with the
    // write that carries its record past the point.
    let (mut client, mut server) = pair(suite);
    for round in 0..20u32 {
        let request = pattern(100, round as u8);
        client.encrypt(&request).unwrap();
        transfer(&mut client, &mut server);
        assert_eq!(read_all(&mut server), (request.clone(), false));
        server.encrypt(&request).unwrap();
        transfer(&mut server, &mut client);
        assert_eq!(read_all(&mut client), (request, false));
        // Records carried after this round's write: the client's 2r + 1,
        // the server's 2r + 2.
        assert_eq!(
            in_traffic(&client),
            2 * round + 1 >= HAND_OVER_AFTER_RECORDS,
            "{round}"
        );
        assert_eq!(
            in_traffic(&server),
            2 * round + 2 >= HAND_OVER_AFTER_RECORDS,
            "{round}"
        );
    }
    HAND_OVER.set(0);
}

#[test]
fn no_hand_over_while_rustls_holds_a_ticket_split_over_records() {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let id = identity();
    let client_config = client_config(&id, suite);
    let mut server_config = (*server_config(&id, suite)).clone();
    // Records of at most 64 bytes: each session ticket spans several.
    server_config.max_fragment_size = Some(64);
    let server_config = Arc::new(server_config);
    let mut client = our_client(client_config.clone());
    client.hand_over_after = 1;
    let mut server = our_server(server_config.clone());
    handshake(&mut client, &mut server);
    // The tickets wait, unread, in the client's buffer.
    let tickets = client.cipher_in.split();
    let records = records_in(&tickets);
    assert!(records >= 3, "{records} records of tickets");
    let first_len = u16::from_be_bytes([tickets[3], tickets[4]]);
    let header_at = 5 + usize::from(first_len);
    // The first ticket's first record comes; the client writes, past its
    // point, while rustls holds it: no hand-over yet.
    client.cipher_in.extend_from_slice(&tickets[..header_at]);
    assert_eq!(read_all(&mut client), (Vec::new(), false));
    client.encrypt(b"first").unwrap();
    assert!(!in_traffic(&client), "rustls holds part of a ticket");
    // The rest comes; the next write hands over.
    client.cipher_in.extend_from_slice(&tickets[header_at..]);
    assert_eq!(read_all(&mut client), (Vec::new(), false));
    client.encrypt(b" second").unwrap();
    assert!(in_traffic(&client));
    transfer(&mut client, &mut server);
    assert_eq!(read_all(&mut server), (b"first second".to_vec(), false));
    // The tickets were whole: the next client resumes with one.
    let mut client = our_client(client_config);
    let mut server = our_server(server_config);
    handshake(&mut client, &mut server);
    assert!(client.info.resumed);
}

#[test]
fn a_bad_record_costs_none_of_the_data_before_it_and_fails_no_write() {
    for_each_hand_over(|hand_over| {
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let (mut server, mut client, _) = our_server_and_rustls_client(suite);
        // Data, then a record that does not authenticate, in one read.
        client.writer().write_all(b"good").unwrap();
        from_rustls(&mut client, &mut server);
        client.writer().write_all(b"forged").unwrap();
        let at = server.cipher_in.len();
        from_rustls(&mut client, &mut server);
        let last = server.cipher_in.len() - 1;
        assert!(last > at);
        server.cipher_in[last] ^= 1;
        // A write reads nothing, so it does not fail for the peer's record.
        server.encrypt(b"reply").unwrap();
        let mut buf = BytesMut::with_capacity(100);
        assert_eq!(
            server.read(&mut buf).unwrap(),
            Read::Plaintext(4),
            "{hand_over}"
        );
        assert_eq!(&buf[..], b"good");
        let e = server.read(&mut buf).unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::InvalidData,
            "{hand_over}: {e}"
        );
        // The reply, then the alert that says why.
        let told = to_rustls(&mut server, &mut client).unwrap_err();
        assert!(format!("{told:?}").contains("BadRecordMac"), "{told:?}");
    });
}

#[test]
fn an_empty_handshake_record_from_the_peer_never_unsettles_the_hand_over() {
    // RFC 8446 §5.1 forbids it, but rustls and the record layer both take
    // it; rustls keeps its bytes until a handshake message ends there, and
    // must not be taken from meanwhile. Data flows the same whatever the
    // point of the hand-over.
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    for hand_over in HAND_OVERS {
        let (mut client, mut server) = pair_with(suite, 0, hand_over);
        let Phase::Traffic(layer) = &mut client.phase else {
            unreachable!()
        };
        let mut out = BytesMut::new();
        layer.encrypt_handshake_for_test(&[], &mut out);
        server.cipher_in.extend_from_slice(&out);
        for round in 0..20u8 {
            let data = pattern(50, round);
            client.encrypt(&data).unwrap();
            transfer(&mut client, &mut server);
            assert_eq!(
                read_all(&mut server),
                (data.clone(), false),
                "{hand_over} {round}"
            );
            server.encrypt(&data).unwrap();
            transfer(&mut server, &mut client);
            assert_eq!(read_all(&mut client), (data, false), "{hand_over} {round}");
        }
    }
}

#[test]
fn a_tls12_connection_that_said_close_notify_keeps_to_rustls_and_writes_nothing_more() {
    // Our side ends what it sends, then reads on past its point: the
    // record layer does not take over a connection that has ended its
    // side (it would let data, or a second close_notify, follow).
    let suite = rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;
    let (mut client, mut server) = pair_with(suite, 1, 1);
    server.queue_close_notify().unwrap();
    transfer(&mut server, &mut client);
    assert_eq!(read_all(&mut client), (Vec::new(), true));
    for round in 0..4u8 {
        let data = pattern(30, round);
        client.encrypt(&data).unwrap();
        transfer(&mut client, &mut server);
        assert_eq!(read_all(&mut server), (data, false));
    }
    assert!(!in_traffic(&server));
    assert!(server.encrypt(b"late").is_err());
    assert!(!server.wants_write(), "nothing follows our close_notify");
}

/// A connection whose receives are small asks for a small buffer after a
/// few of them (a fresh one at once), so an idle connection holds 2 KiB of
/// ciphertext room, not 16; one that fills it asks for a whole chunk
/// again; records of a few KiB one at a time never shrink it (each would
/// otherwise fill the small buffer and need a second receive).
#[test]
fn the_ciphertext_receive_is_small_only_while_receives_are_small() {
    // Fresh: small at once.
    let (mut asked, mut small) = (CIPHER_SMALL, SMALL_RECEIVES_TO_SHRINK);
    (asked, small) = next_receive_room(asked, asked, 300, small);
    assert_eq!(asked, CIPHER_SMALL);
    // A small receive filled: a whole chunk next, and small again only
    // after four small receives in a row.
    (asked, small) = next_receive_room(asked, asked, CIPHER_SMALL, small);
    assert_eq!((asked, small), (CIPHER_CHUNK, 0));
    for i in 1..SMALL_RECEIVES_TO_SHRINK {
        (asked, small) = next_receive_room(asked, asked, 100, small);
        assert_eq!(asked, CIPHER_CHUNK, "after {i} small receives");
    }
    (asked, small) = next_receive_room(asked, asked, 100, small);
    assert_eq!(asked, CIPHER_SMALL);
    // Records of 4 KiB one at a time: whole chunks, all along.
    (asked, small) = next_receive_room(asked, asked, CIPHER_SMALL, small);
    for _ in 0..20 {
        (asked, small) = next_receive_room(asked, asked, 4 << 10, small);
        assert_eq!(asked, CIPHER_CHUNK);
    }
    // A busy spell: full receives double the room up to the most.
    for _ in 0..10 {
        (asked, small) = next_receive_room(asked, asked, asked, small);
    }
    assert_eq!(asked, CIPHER_CHUNK_MAX);
    // A room bigger than asked (a reused buffer) does not raise the ask.
    let (next, _) = next_receive_room(CIPHER_CHUNK, 2 * CIPHER_CHUNK, 12 << 10, 0);
    assert_eq!(next, CIPHER_CHUNK);
}

#[test]
fn a_handshake_message_sent_a_byte_a_record_cannot_make_a_connection_hold_more_than_one_message() {
    // rustls joins a handshake message's fragments in place and lets no
    // byte go until the message is whole: a peer that sends a message
    // declared 64 KiB long one byte per record (each record 6 bytes here,
    // up to 16 KiB once encrypted and padded) would make the connection
    // hold all of its records. Past what one whole message can take, the
    // handshake fails.
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let mut server = our_server(server_config(&identity(), suite));
    // A ClientHello's header: type 1, declared length 0xffff.
    let message = [1u8, 0x00, 0xff, 0xff];
    let record = |byte: u8| [22u8, 3, 1, 0, 1, byte];
    let mut failed = None;
    for (i, byte) in message
        .iter()
        .copied()
        .chain(std::iter::repeat(0))
        .enumerate()
        .take(0xffff + 4)
    {
        server.cipher_in.extend_from_slice(&record(byte));
        if i % 64 == 63 {
            if let Step::Failed(e) = server.handshake_step() {
                failed = Some((i, e));
                break;
            }
            assert!(
                server.cipher_in.len() <= MAX_HANDSHAKE_HELD + 6 * 64,
                "{} bytes held after {i} records",
                server.cipher_in.len()
            );
        }
    }
    let (at, failure) = failed.expect("the handshake fails");
    assert!(
        at * 6 < MAX_HANDSHAKE_HELD + 6 * 64,
        "failed after {at} records"
    );
    assert!(
        failure.to_string().contains("handshake message"),
        "{failure}"
    );
}

#[test]
fn a_receive_that_queues_a_key_update_answer_does_not_wait_for_room_to_send_it() {
    for_each_hand_over(|_| key_update_answer_without_room());
}

/// Our end's send buffer is full (the peer reads nothing) and no send of
/// ours is under way; the peer sends data, a request for a key update,
/// more data. The receive queues the answer and hands out the data: the
/// answer goes when the socket has room (before our next data), not
/// before the receive returns, which would wait for a peer that may be
/// waiting for us to read.
fn key_update_answer_without_room() {
    use mailring_actors::mailring;
    let (server, mut client, _) =
        our_server_and_rustls_client(rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384);
    let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    // Fill our send buffer through a second descriptor of our end.
    let filler = ours.try_clone().unwrap();
    filler.set_nonblocking(true).unwrap();
    loop {
        match (&filler).write(&[0u8; 4096]) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    client.writer().write_all(b"hello").unwrap();
    client.refresh_traffic_keys().unwrap();
    client.writer().write_all(b"world").unwrap();
    let mut records = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut records).unwrap();
    }
    theirs.write_all(&records).unwrap();
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let got = rt.block_on_local(move || async move {
        let conn = super::TlsConn::from_state(
            crate::conn::Conn::Unix(mailring::net::UnixStream::from_std(ours).unwrap()),
            server,
        );
        let mut got = Vec::new();
        let read = mailring::time::timeout(std::time::Duration::from_secs(2), async {
            while got.len() < 10 {
                let (n, buf) = conn.recv(BytesMut::with_capacity(64)).await;
                let n = n.unwrap();
                assert!(n > 0, "the end");
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        drop(filler);
        read.map(|()| got)
    });
    assert_eq!(
        got.expect("the receive waited to send the answer"),
        b"helloworld"
    );
}

/// A writer polled again and again while another send holds the write
/// side (a task woken by something else, a select over a timer) waits
/// once: the list of waiters does not grow with each poll.
#[test]
fn a_writer_polled_again_while_it_waits_for_its_turn_waits_once() {
    use mailring_actors::mailring;
    use std::future::Future;
    let (server, _client, _) =
        our_server_and_rustls_client(rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384);
    let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let rt = mailring::Runtime::builder().shards(1).build().unwrap();
    let waiting = rt.block_on_local(move || async move {
        let conn = super::TlsConn::from_state(
            crate::conn::Conn::Unix(mailring::net::UnixStream::from_std(ours).unwrap()),
            server,
        );
        // Another send holds the write side.
        conn.writing
            .store(true, std::sync::atomic::Ordering::Release);
        let mut turn = std::pin::pin!(conn.write_turn());
        for _ in 0..1000 {
            std::future::poll_fn(|cx| {
                assert!(turn.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
        }
        let waiting = conn.write_waiters.lock().unwrap().len();
        conn.writing
            .store(false, std::sync::atomic::Ordering::Release);
        waiting
    });
    assert_eq!(waiting, 1);
}
