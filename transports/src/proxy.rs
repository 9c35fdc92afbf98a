//! The PROXY protocol (versions 1 and 2, as HAProxy defines them): the
//! header a load balancer writes before a connection's own bytes to say
//! who the client is. [`ProxyHeader`] is what it said; [`parse`] reads one
//! from the front of a buffer; the server reads it before anything else
//! when [`ServerConfig::proxy_protocol`](crate::ServerConfig::proxy_protocol)
//! is on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature, the first 12 bytes of every v2 header.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v1 header's longest line, `\r\n` included (the specification's 107).
const V1_MAX: usize = 107;
/// The longest v2 header taken: 16 bytes, then addresses and TLVs. The
/// format allows 64 KiB of TLVs; proxies send a few hundred bytes at most.
pub const V2_MAX: usize = 16 + 2048;

/// What a PROXY header said.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyHeader {
    /// 1 or 2.
    pub version: u8,
    /// The client's address, as the proxy saw it. `None` for a v1
    /// `UNKNOWN`, a v2 `LOCAL` command (the proxy's own health check), or
    /// an address family with no socket address (Unix): the connection's
    /// own peer then stands.
    pub source: Option<SocketAddr>,
    /// The address the client connected to, on the proxy.
    pub destination: Option<SocketAddr>,
}

/// Why a PROXY header was refused; the connection closes with
/// [`CloseReason::ProxyHeader`](crate::CloseReason::ProxyHeader).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The connection does not start with `PROXY ` nor the v2 signature.
    #[error("no PROXY protocol header")]
    NoHeader,
    /// A v1 line that breaks the format.
    #[error("PROXY v1 header: {0}")]
    V1(String),
    /// A v2 header that breaks the format.
    #[error("PROXY v2 header: {0}")]
    V2(String),
    /// A header longer than the limit (v1: 107 bytes; v2: [`V2_MAX`]).
    #[error("PROXY header longer than {0} bytes")]
    TooLong(usize),
    /// The peer closed before its header ended.
    #[error("connection closed within its PROXY header ({0} bytes)")]
    Truncated(usize),
    /// The header did not arrive within the server's
    /// [`proxy_header_timeout`](crate::ServerConfig::proxy_header_timeout).
    #[error("no PROXY header within the timeout")]
    Timeout,
}

/// What [`parse`] found at the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A whole header, and its length in bytes (what follows it is the
    /// connection's own data).
    Complete(ProxyHeader, usize),
    /// A valid beginning: more bytes are needed.
    Incomplete,
}

/// Reads a PROXY header (v1 or v2) from the front of `buf`.
///
/// ```
/// use mailring_transports::proxy::{parse, Parsed};
///
/// let buf = b"PROXY TCP4 192.0.2.1 198.51.100.2 51234 443\r\nhello";
/// let Parsed::Complete(header, len) = parse(buf)? else { unreachable!() };
/// assert_eq!(header.source, Some("192.0.2.1:51234".parse()?));
/// assert_eq!(&buf[len..], b"hello");
/// assert_eq!(parse(b"PROXY TC")?, Parsed::Incomplete);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// A [`ProxyError`] for bytes that are not (the beginning of) a header.
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyError> {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() {
            Ok(Parsed::Incomplete)
        } else {
            parse_v2(buf)
        };
    }
    let n = buf.len().min(6);
    if buf[..n] == b"PROXY "[..n] {
        return if n < 6 {
            Ok(Parsed::Incomplete)
        } else {
            parse_v1(buf)
        };
    }
    Err(ProxyError::NoHeader)
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX {
            return Err(ProxyError::TooLong(V1_MAX));
        }
        // A byte that can never be in a v1 line fails now, not at 107: a
        // `\r` only as the last byte so far (its `\n` to come).
        let last = buf.len() - 1;
        if let Some((_, b)) = buf
            .iter()
            .enumerate()
            .find(|&(i, b)| !(b.is_ascii_graphic() || *b == b' ' || (*b == b'\r' && i == last)))
        {
            return Err(ProxyError::V1(format!("byte {b:#04x} in the line")));
        }
        // So does a protocol that can never be one.
        let proto = buf[6..]
            .split(|&b| b == b' ' || b == b'\r')
            .next()
            .unwrap_or(&[]);
        let complete = buf.len() > 6 + proto.len();
        let known = [&b"TCP4"[..], b"TCP6", b"UNKNOWN"];
        if !known.iter().any(|k| {
            if complete {
                *k == proto
            } else {
                k.starts_with(proto)
            }
        }) {
            return Err(ProxyError::V1(format!(
                "protocol {:?}",
                String::from_utf8_lossy(proto)
            )));
        }
        return Ok(Parsed::Incomplete);
    };
    if let Some(b) = buf[..end]
        .iter()
        .find(|b| !(b.is_ascii_graphic() || **b == b' '))
    {
        return Err(ProxyError::V1(format!("byte {b:#04x} in the line")));
    }
    let line = std::str::from_utf8(&buf[..end]).map_err(|_| ProxyError::V1("not ASCII".into()))?;
    let bad = |what: &str| ProxyError::V1(format!("{what}: {line:?}"));
    let mut fields = line.split(' ');
    fields.next(); // "PROXY"
    let proto = fields.next().ok_or_else(|| bad("no protocol"))?;
    let header = match proto {
        "UNKNOWN" => ProxyHeader {
            version: 1,
            source: None,
            destination: None,
        },
        "TCP4" | "TCP6" => {
            let f: Vec<&str> = fields.collect();
            let [src, dst, sport, dport] = f[..] else {
                return Err(bad("expected 4 fields after the protocol"));
            };
            let ip = |s: &str| -> Result<IpAddr, ProxyError> {
                if proto == "TCP4" {
                    s.parse::<Ipv4Addr>().map(IpAddr::V4)
                } else {
                    s.parse::<Ipv6Addr>().map(IpAddr::V6)
                }
                .map_err(|_| bad("bad address"))
            };
            let port = |s: &str| -> Result<u16, ProxyError> {
                let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                // No leading zeros ("0" itself is a port).
                let canonical = s == "0" || !s.starts_with('0');
                match (digits && canonical).then(|| s.parse::<u16>()) {
                    Some(Ok(p)) => Ok(p),
                    _ => Err(bad("bad port")),
                }
            };
            ProxyHeader {
                version: 1,
                source: Some(SocketAddr::new(ip(src)?, port(sport)?)),
                destination: Some(SocketAddr::new(ip(dst)?, port(dport)?)),
            }
        }
        _ => return Err(bad("unknown protocol")),
    };
    Ok(Parsed::Complete(header, end + 2))
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyError> {
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete);
    }
    let version = buf[12] >> 4;
    let command = buf[12] & 0x0f;
    if version != 2 {
        return Err(ProxyError::V2(format!("version {version}")));
    }
    // Refused from the fixed part, before waiting for the body.
    if command > 1 {
        return Err(ProxyError::V2(format!("command {command}")));
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = 16 + len;
    if total > V2_MAX {
        return Err(ProxyError::TooLong(V2_MAX));
    }
    if buf.len() < total {
        return Ok(Parsed::Incomplete);
    }
    let body = &buf[16..total];
    let (source, destination) = match command {
        // LOCAL: the proxy speaking for itself; the address block is
        // ignored whatever it holds.
        0 => (None, None),
        1 => match buf[13] >> 4 {
            // UNSPEC: nothing to say about the peer.
            0 if buf[13] == 0 => (None, None),
            // Family UNSPEC with a transport: a value the spec says
            // receivers must refuse.
            0 => {
                return Err(ProxyError::V2(format!(
                    "family and transport {:#04x}",
                    buf[13]
                )))
            }
            family => {
                // A stream listener takes stream connections only.
                let transport = buf[13] & 0x0f;
                if transport != 1 {
                    return Err(ProxyError::V2(format!(
                        "transport {transport} (a stream is 1)"
                    )));
                }
                let addresses = v2_addresses(family, body, len)?;
                v2_tlvs(&body[v2_address_len(family)..])?;
                addresses
            }
        },
        c => return Err(ProxyError::V2(format!("command {c}"))),
    };
    Ok(Parsed::Complete(
        ProxyHeader {
            version: 2,
            source,
            destination,
        },
        total,
    ))
}

/// The bytes of a v2 address block of `family` (IPv4, IPv6, Unix).
fn v2_address_len(family: u8) -> usize {
    match family {
        1 => 12,
        2 => 36,
        _ => 216,
    }
}

/// Checks that the TLVs after a v2 address block fill it exactly (each a
/// type byte, a big-endian length, that many bytes); their contents are
/// not read.
fn v2_tlvs(mut rest: &[u8]) -> Result<(), ProxyError> {
    while !rest.is_empty() {
        let [kind, hi, lo, ..] = *rest else {
            return Err(ProxyError::V2(format!(
                "a TLV cut in its header ({} bytes)",
                rest.len()
            )));
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        rest = rest.get(3 + len..).ok_or_else(|| {
            ProxyError::V2(format!(
                "TLV {kind:#04x} of {len} bytes past the header's end"
            ))
        })?;
    }
    Ok(())
}

/// The source and destination in a v2 `PROXY` header's address block.
fn v2_addresses(
    family: u8,
    body: &[u8],
    len: usize,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>), ProxyError> {
    Ok(match family {
        1 => {
            let a = body
                .get(..12)
                .ok_or_else(|| ProxyError::V2(format!("{len} bytes for IPv4 addresses")))?;
            let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]));
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            (
                Some(SocketAddr::new(ip(0), port(8))),
                Some(SocketAddr::new(ip(4), port(10))),
            )
        }
        2 => {
            let a = body
                .get(..36)
                .ok_or_else(|| ProxyError::V2(format!("{len} bytes for IPv6 addresses")))?;
            let ip = |i: usize| {
                let octets: [u8; 16] = a[i..i + 16].try_into().expect("16 bytes");
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            (
                Some(SocketAddr::new(ip(0), port(32))),
                Some(SocketAddr::new(ip(16), port(34))),
            )
        }
        // Unix sockets: two paths of 108 bytes, no socket address to
        // give.
        3 => {
            if body.len() < 216 {
                return Err(ProxyError::V2(format!("{len} bytes for Unix addresses")));
            }
            (None, None)
        }
        f => return Err(ProxyError::V2(format!("address family {f}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut v = V2_SIGNATURE.to_vec();
        v.push(0x20 | command);
        v.push(family);
        v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let h = b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n";
        assert_eq!(
            parse(h),
            Ok(Parsed::Complete(
                ProxyHeader {
                    version: 1,
                    source: Some("[2001:db8::1]:65535".parse().unwrap()),
                    destination: Some("[::1]:0".parse().unwrap()),
                },
                h.len()
            ))
        );
        let u = b"PROXY UNKNOWN whatever follows\r\nrest";
        assert!(matches!(
            parse(u),
            Ok(Parsed::Complete(ProxyHeader { source: None, .. }, 32))
        ));
    }

    #[test]
    fn every_prefix_of_a_valid_header_is_incomplete_not_an_error() {
        let v1 = b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n".to_vec();
        let mut body = vec![10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2];
        body.extend_from_slice(&[0x04, 0x00, 0x01, 0xaa]); // a TLV (NOOP), skipped
        let v2 = v2(1, 0x11, &body);
        for h in [v1, v2] {
            for cut in 0..h.len() {
                assert_eq!(parse(&h[..cut]), Ok(Parsed::Incomplete), "{cut} of {h:?}");
            }
            assert!(matches!(parse(&h), Ok(Parsed::Complete(_, n)) if n == h.len()));
        }
    }

    /// Family and transport bytes the spec says a receiver must refuse
    /// (`0x01`..=`0x0f`: no family, a transport) are refused, and a bad
    /// command is refused from the fixed part, without waiting for a body
    /// that may never come.
    /// A v1 line that can never be valid is refused as the byte that
    /// makes it so arrives, not when its end (or byte 107, or the
    /// timeout) comes.
    #[test]
    fn v1_refuses_a_stray_cr_or_an_unknown_protocol_early() {
        for early in [
            &b"PROXY \rX"[..],
            b"PROXY FOO",
            b"PROXY TCP5",
            b"PROXY TCP4X",
            b"PROXY UNKNOWNS",
            b"PROXY TCP4 1.2.3.4\r ",
        ] {
            assert!(
                matches!(parse(early), Err(ProxyError::V1(_))),
                "{:?}",
                String::from_utf8_lossy(early)
            );
        }
        for fine in [
            &b"PROXY T"[..],
            b"PROXY TCP",
            b"PROXY TCP4",
            b"PROXY TCP4 1.2",
            b"PROXY UNKNOWN whatever",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r",
        ] {
            assert_eq!(
                parse(fine),
                Ok(Parsed::Incomplete),
                "{:?}",
                String::from_utf8_lossy(fine)
            );
        }
    }

    #[test]
    fn v2_refuses_an_unspecified_family_with_a_transport_and_a_bad_command_early() {
        for byte in 0x01..=0x0f {
            assert!(
                matches!(parse(&v2(1, byte, &[])), Err(ProxyError::V2(_))),
                "{byte:#04x}"
            );
        }
        assert!(matches!(
            parse(&v2(1, 0x00, &[])),
            Ok(Parsed::Complete(ProxyHeader { source: None, .. }, 16))
        ));
        let mut fixed = v2(2, 0x11, &[0u8; 100]);
        fixed.truncate(16);
        assert!(matches!(parse(&fixed), Err(ProxyError::V2(_))));
    }

    #[test]
    fn v2_proxy_local_and_unix() {
        let mut six = vec![0u8; 36];
        six[15] = 1; // ::1
        six[31] = 2; // ::2
        six[32..34].copy_from_slice(&443u16.to_be_bytes());
        six[34..36].copy_from_slice(&80u16.to_be_bytes());
        let Ok(Parsed::Complete(h, _)) = parse(&v2(1, 0x21, &six)) else {
            panic!()
        };
        assert_eq!(h.source, Some("[::1]:443".parse().unwrap()));
        assert_eq!(h.destination, Some("[::2]:80".parse().unwrap()));
        // LOCAL (health checks) ignores whatever address block it has.
        let Ok(Parsed::Complete(h, n)) = parse(&v2(0, 0x11, &[1, 2, 3])) else {
            panic!()
        };
        assert_eq!((h.source, n), (None, 19));
        let Ok(Parsed::Complete(h, _)) = parse(&v2(1, 0x31, &[0u8; 216])) else {
            panic!()
        };
        assert_eq!(h.source, None);
    }

    #[test]
    fn hostile_headers_are_typed_errors() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyError::NoHeader));
        assert_eq!(parse(b"\x16\x03\x01"), Err(ProxyError::NoHeader));
        let cases: &[&[u8]] = &[
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 65536\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 080 1\r\n",
            b"PROXY TCP4 ::1 5.6.7.8 1 1\r\n",
            b"PROXY TCP6 1.2.3.4 ::1 1 1\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 1\r\n",
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 1 extra\r\n",
            b"PROXY TCP4 1.2.3.4\x00",
        ];
        for c in cases {
            assert!(matches!(parse(c), Err(ProxyError::V1(_))), "{c:?}");
        }
        let long = [b"PROXY ".as_slice(), &[b'9'; 200]].concat();
        assert_eq!(parse(&long), Err(ProxyError::TooLong(V1_MAX)));
        // v2: version 1, command 7, family 9, short IPv4 block, oversize.
        let mut bad_version = v2(1, 0x11, &[0; 12]);
        bad_version[12] = 0x11;
        assert!(matches!(parse(&bad_version), Err(ProxyError::V2(_))));
        assert!(matches!(
            parse(&v2(7, 0x11, &[0; 12])),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x91, &[0; 12])),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x11, &[0; 8])),
            Err(ProxyError::V2(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x21, &[0; 12])),
            Err(ProxyError::V2(_))
        ));
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(parse(&huge), Err(ProxyError::TooLong(V2_MAX)));
    }

    #[test]
    fn v2_headers_that_do_not_hold_together_are_refused() {
        // A transport other than a stream, on a stream listener.
        for family in [0x10, 0x12, 0x1f, 0x22, 0x30] {
            let body = [0u8; 216];
            assert!(
                matches!(parse(&v2(1, family, &body)), Err(ProxyError::V2(_))),
                "{family:#04x}"
            );
        }
        // A Unix address block shorter than two 108-byte paths.
        for len in [0, 10, 215] {
            assert!(matches!(
                parse(&v2(1, 0x31, &vec![0u8; len])),
                Err(ProxyError::V2(_))
            ));
        }
        // TLVs after the addresses must fill the rest exactly.
        let addr = [10u8, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2];
        for tlvs in [&[0x04u8, 0x00, 0x05, 1, 2][..], &[0x04, 0x00], &[0x04]] {
            let body = [&addr[..], tlvs].concat();
            assert!(
                matches!(parse(&v2(1, 0x11, &body)), Err(ProxyError::V2(_))),
                "{tlvs:?}"
            );
        }
        let two = [&addr[..], &[0x04, 0x00, 0x01, 7, 0x05, 0x00, 0x00]].concat();
        assert!(matches!(
            parse(&v2(1, 0x11, &two)),
            Ok(Parsed::Complete(_, n)) if n == 16 + two.len()
        ));
    }

    #[test]
    fn v1_unknown_takes_only_printable_ascii_after_it() {
        for line in [
            &b"PROXY UNKNOWN \x01\r\n"[..],
            "PROXY UNKNOWN é\r\n".as_bytes(),
        ] {
            assert!(matches!(parse(line), Err(ProxyError::V1(_))), "{line:?}");
        }
        assert!(matches!(
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"),
            Ok(Parsed::Complete(ProxyHeader { source: None, .. }, _))
        ));
    }

    /// Headers of every shape, mutated, cut and padded at random (a
    /// fixed seed): the parser never panics, never claims more bytes than
    /// it was given or than a header may hold, and a header it reads
    /// whole is only ever "incomplete" before its end, never refused.
    #[test]
    fn hostile_headers_get_an_answer_never_a_panic() {
        let mut next = crate::fuzz::xorshift(0x9e37_79b9_7f4a_7c15);
        let addr4 = [10u8, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2];
        let addr6: Vec<u8> = (0..36).collect();
        let unix: Vec<u8> = (0..216).map(|i| (i % 250) as u8 + 1).collect();
        let seeds: Vec<Vec<u8>> = vec![
            b"PROXY TCP4 192.0.2.1 198.51.100.2 51234 443\r\n".to_vec(),
            b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n".to_vec(),
            b"PROXY UNKNOWN\r\n".to_vec(),
            v2(1, 0x11, &addr4),
            v2(1, 0x21, &addr6),
            v2(1, 0x31, &unix),
            v2(0, 0x00, &[]),
            v2(1, 0x11, &[&addr4[..], &[0x04, 0x00, 0x01, 7]].concat()),
        ];
        for round in 0..200_000u32 {
            let mut buf = seeds[(next() % seeds.len() as u64) as usize].clone();
            let whole = buf.clone();
            match round % 4 {
                // A byte changed.
                0 => {
                    let at = (next() % buf.len() as u64) as usize;
                    buf[at] = next() as u8;
                }
                // Cut short.
                1 => buf.truncate((next() % buf.len() as u64) as usize),
                // Random bytes after it, or a length field changed.
                2 => {
                    let extra = (next() % 64) as usize;
                    buf.extend((0..extra).map(|_| next() as u8));
                    if buf.starts_with(V2_SIGNATURE) && buf.len() > 15 {
                        buf[14] = next() as u8;
                        buf[15] = next() as u8;
                    }
                }
                // Nothing but noise.
                _ => {
                    let n = (next() % 300) as usize;
                    buf = (0..n).map(|_| next() as u8).collect();
                }
            }
            match parse(&buf) {
                Ok(Parsed::Complete(_, len)) => {
                    assert!(len <= buf.len(), "{buf:?}");
                    assert!(len <= V2_MAX.max(V1_MAX), "{buf:?}");
                    for cut in [0, len / 2, len.saturating_sub(1)] {
                        if cut < len {
                            assert_eq!(
                                parse(&buf[..cut]),
                                Ok(Parsed::Incomplete),
                                "{buf:?} at {cut}"
                            );
                        }
                    }
                }
                Ok(Parsed::Incomplete) => assert!(buf.len() <= V2_MAX, "{buf:?}"),
                Err(_) => {}
            }
            // The untouched header still reads whole, whatever follows it.
            let mut padded = whole.clone();
            padded.extend_from_slice(&buf);
            assert!(
                matches!(parse(&padded), Ok(Parsed::Complete(_, n)) if n == whole.len()),
                "{whole:?}"
            );
        }
    }
}
