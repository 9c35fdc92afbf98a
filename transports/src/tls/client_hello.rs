//! The server name a client asks for (SNI), read from its ClientHello.
//!
//! rustls's unbuffered server connection does not tell the name it read,
//! so the handshake driver reads it from the same bytes before rustls
//! takes them. rustls checks the whole message; this reader only finds the
//! name, with every length bounded by what is there, and gives `None` for
//! anything it cannot read (rustls then refuses the message, or it had no
//! name). The name is the one rustls keeps: a DNS name, in lower case.

use rustls::pki_types::ServerName;

#[cfg(test)]
const RECORD_HEADER_LEN: usize = 5;
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;
/// The most bytes of a ClientHello looked at (rustls takes up to 64 KiB
/// of handshake message too).
const MAX_HELLO: usize = 64 << 10;

/// What the bytes received so far say.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sni {
    /// The ClientHello has not all arrived.
    Incomplete,
    /// It has, and names this server (or none).
    Read(Option<String>),
}

/// Reads the server name of the ClientHello at the front of `received`
/// (the first records a client sent, a ClientHello split over several
/// handshake records included).
#[cfg(test)]
pub(super) fn server_name(received: &[u8]) -> Sni {
    let mut message = Vec::new();
    let mut rest = received;
    loop {
        let Some(header) = rest.get(..RECORD_HEADER_LEN) else {
            return Sni::Incomplete;
        };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if header[0] != CONTENT_TYPE_HANDSHAKE || len == 0 {
            return Sni::Read(None);
        }
        let Some(body) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
            return Sni::Incomplete;
        };
        message.extend_from_slice(body);
        rest = &rest[RECORD_HEADER_LEN + len..];
        if let Sni::Read(name) = server_name_in_message(&message) {
            return Sni::Read(name);
        }
    }
}

/// Reads the server name of the ClientHello that `message` starts (the
/// payloads of the client's first handshake records, joined): `Incomplete`
/// while it is shorter than the length it declares.
pub(super) fn server_name_in_message(message: &[u8]) -> Sni {
    let &[typ, a, b, c, ..] = message else {
        return Sni::Incomplete;
    };
    if typ != HANDSHAKE_CLIENT_HELLO {
        return Sni::Read(None);
    }
    let hello_len = u32::from_be_bytes([0, a, b, c]) as usize;
    if hello_len > MAX_HELLO {
        return Sni::Read(None);
    }
    match message.get(4..4 + hello_len) {
        Some(hello) => Sni::Read(name_in_hello(hello)),
        None => Sni::Incomplete,
    }
}

/// The most bytes of ClientHello records a server keeps while it looks
/// for the name.
pub(super) const MAX_HELLO_BYTES: usize = MAX_HELLO + 4;

/// Is this record header a handshake record's?
pub(super) fn is_handshake_record(header: &[u8]) -> bool {
    header.first() == Some(&CONTENT_TYPE_HANDSHAKE)
}

/// Takes `n` bytes off the front of `input`.
fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Some(head)
}

fn take_u8(input: &mut &[u8]) -> Option<u8> {
    take(input, 1).map(|b| b[0])
}

fn take_u16(input: &mut &[u8]) -> Option<u16> {
    take(input, 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// A vector with a one- or two-byte length in front.
fn take_vec<'a>(input: &mut &'a [u8], len_bytes: usize) -> Option<&'a [u8]> {
    let len = match len_bytes {
        1 => usize::from(take_u8(input)?),
        _ => usize::from(take_u16(input)?),
    };
    take(input, len)
}

fn name_in_hello(mut hello: &[u8]) -> Option<String> {
    let input = &mut hello;
    take(input, 2 + 32)?; // legacy_version, random
    take_vec(input, 1)?; // legacy_session_id
    take_vec(input, 2)?; // cipher_suites
    take_vec(input, 1)?; // legacy_compression_methods
    let mut extensions = take_vec(input, 2)?;
    while !extensions.is_empty() {
        let typ = take_u16(&mut extensions)?;
        let mut body = take_vec(&mut extensions, 2)?;
        if typ != EXTENSION_SERVER_NAME {
            continue;
        }
        let mut names = take_vec(&mut body, 2)?;
        while !names.is_empty() {
            let name_type = take_u8(&mut names)?;
            let name = take_vec(&mut names, 2)?;
            if name_type != NAME_TYPE_HOST_NAME {
                continue;
            }
            let name = std::str::from_utf8(name).ok()?;
            // An IP address is no server name (RFC 6066 §3), for rustls
            // neither.
            return match ServerName::try_from(name).ok()? {
                // One name, one form: lower case, without the root's dot
                // (`Tenant-7.Example.` is `tenant-7.example`).
                ServerName::DnsName(dns) => {
                    let name = dns.as_ref();
                    Some(name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase())
                }
                _ => None,
            };
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record with these extensions.
    fn hello(extensions: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // no session id
        body.extend([0, 2, 0x13, 0x01]); // one suite
        body.extend([1, 0]); // null compression
        body.extend((extensions.len() as u16).to_be_bytes());
        body.extend(extensions);
        let mut message = vec![HANDSHAKE_CLIENT_HELLO];
        message.extend(&(body.len() as u32).to_be_bytes()[1..]);
        message.extend(body);
        message
    }

    fn record(payload: &[u8]) -> Vec<u8> {
        let mut r = vec![CONTENT_TYPE_HANDSHAKE, 3, 1];
        r.extend((payload.len() as u16).to_be_bytes());
        r.extend(payload);
        r
    }

    fn sni_extension(name: &[u8]) -> Vec<u8> {
        let mut list = vec![NAME_TYPE_HOST_NAME];
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(name);
        let mut ext = vec![0, 0];
        ext.extend(((list.len() + 2) as u16).to_be_bytes());
        ext.extend((list.len() as u16).to_be_bytes());
        ext.extend(list);
        ext
    }

    #[test]
    fn the_name_is_read_in_lower_case_after_other_extensions() {
        let mut extensions = vec![0, 23, 0, 0]; // extended_master_secret, empty
        extensions.extend(sni_extension(b"Tenant-7.Example.COM"));
        let bytes = record(&hello(&extensions));
        assert_eq!(
            server_name(&bytes),
            Sni::Read(Some("tenant-7.example.com".into()))
        );
    }

    /// One name has one form: the root's trailing dot is dropped, so a
    /// client cannot make a second key of a tenant's name with it.
    #[test]
    fn a_name_with_the_roots_trailing_dot_is_the_name_without_it() {
        let bytes = record(&hello(&sni_extension(b"Tenant-7.Example.")));
        assert_eq!(
            server_name(&bytes),
            Sni::Read(Some("tenant-7.example".into()))
        );
    }

    #[test]
    fn a_hello_split_over_records_and_segments_is_read_once_all_arrived() {
        let message = hello(&sni_extension(b"a.example"));
        let (one, two) = message.split_at(20);
        let mut bytes = record(one);
        bytes.extend(record(two));
        for cut in 0..bytes.len() {
            assert_eq!(server_name(&bytes[..cut]), Sni::Incomplete, "cut at {cut}");
        }
        assert_eq!(server_name(&bytes), Sni::Read(Some("a.example".into())));
    }

    #[test]
    fn no_name_an_ip_address_and_malformed_bytes_give_none() {
        assert_eq!(server_name(&record(&hello(&[]))), Sni::Read(None));
        assert_eq!(
            server_name(&record(&hello(&sni_extension(b"127.0.0.1")))),
            Sni::Read(None)
        );
        assert_eq!(
            server_name(&record(&hello(&sni_extension(b"bad name!")))),
            Sni::Read(None)
        );
        // A name list that claims more than it holds.
        let mut ext = sni_extension(b"x.example");
        ext[5] = 200;
        assert_eq!(server_name(&record(&hello(&ext))), Sni::Read(None));
        // Not a handshake record, not a ClientHello, an empty record.
        assert_eq!(server_name(b"GET / HTTP/1.1\r\n"), Sni::Read(None));
        assert_eq!(server_name(&record(&[2, 0, 0, 0])), Sni::Read(None));
        assert_eq!(server_name(&record(&[])), Sni::Read(None));
        // A ClientHello that claims more than rustls would take.
        assert_eq!(
            server_name(&record(&[1, 0xff, 0xff, 0xff])),
            Sni::Read(None)
        );
    }

    /// ClientHellos with and without names, mutated, cut and random (a
    /// fixed seed): the reader never panics, a name it reads is a lower
    /// case DNS name, and a hello whose name it reads reads the same with
    /// more bytes after it.
    #[test]
    fn hostile_hellos_get_an_answer_never_a_panic() {
        let mut next = crate::fuzz::xorshift(0xd1b5_4a32_d192_ed03);
        let mut two_ext = vec![0, 23, 0, 0];
        two_ext.extend(sni_extension(b"Tenant.Example"));
        let seeds: Vec<Vec<u8>> = vec![
            record(&hello(&sni_extension(b"a.example"))),
            record(&hello(&two_ext)),
            record(&hello(&[])),
            {
                let message = hello(&sni_extension(b"split.example"));
                let (one, two) = message.split_at(20);
                let mut bytes = record(one);
                bytes.extend(record(two));
                bytes
            },
        ];
        for round in 0..100_000u32 {
            let mut bytes = seeds[(next() % seeds.len() as u64) as usize].clone();
            match round % 4 {
                0 => {
                    for _ in 0..(1 + next() % 3) {
                        let at = (next() % bytes.len() as u64) as usize;
                        bytes[at] = next() as u8;
                    }
                }
                1 => bytes.truncate((next() % bytes.len() as u64) as usize),
                2 => bytes.extend((0..next() % 64).map(|_| next() as u8)),
                _ => bytes = (0..next() % 300).map(|_| next() as u8).collect(),
            }
            match server_name(&bytes) {
                Sni::Read(Some(name)) => {
                    assert!(
                        ServerName::try_from(name.as_str()).is_ok()
                            && name.bytes().all(|b| !b.is_ascii_uppercase()),
                        "{name:?}"
                    );
                    // More bytes after it change nothing.
                    let mut more = bytes.clone();
                    more.extend_from_slice(&[22, 3, 1, 0, 1, 0]);
                    assert_eq!(server_name(&more), Sni::Read(Some(name)));
                }
                Sni::Read(None) | Sni::Incomplete => {}
            }
        }
    }
}
