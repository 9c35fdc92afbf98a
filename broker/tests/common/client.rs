//! A RESP client for tests (std TCP, loopback) that decodes replies
//! exactly, and a broker started on a given data directory.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mailring_broker::{Broker, BrokerConfig};

use super::encode;

/// A decoded reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum R {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<R>),
    Map(Vec<(R, R)>),
}

impl R {
    pub(crate) fn bulk(s: &str) -> R {
        R::Bulk(s.as_bytes().to_vec())
    }

    pub(crate) fn text(&self) -> String {
        match self {
            R::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            R::Status(s) | R::Error(s) => s.clone(),
            other => panic!("not text: {other:?}"),
        }
    }
}

pub(crate) struct Client {
    pub(crate) r: BufReader<TcpStream>,
    pub(crate) w: TcpStream,
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect to the broker");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    pub(crate) fn send_raw(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).unwrap();
    }

    pub(crate) fn cmd(&mut self, args: &[&str]) -> R {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd_bytes(&args)
    }

    /// How many entries group `group` of `stream` has pending (the first
    /// element of `XPENDING`'s summary).
    pub(crate) fn pending_count(&mut self, stream: &str, group: &str) -> R {
        let R::Array(summary) = self.cmd(&["XPENDING", stream, group]) else {
            panic!("XPENDING {stream} {group} answers an array")
        };
        summary.into_iter().next().expect("a summary's count")
    }

    pub(crate) fn cmd_bytes(&mut self, args: &[&[u8]]) -> R {
        let wire = encode(args);
        self.send_raw(&wire);
        self.read()
    }

    pub(crate) fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self.r.read_line(&mut line).expect("read a reply line");
        assert!(n > 0, "connection closed");
        assert!(line.ends_with("\r\n"), "line without CRLF: {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    pub(crate) fn read(&mut self) -> R {
        let line = self.line();
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" => R::Status(rest.to_owned()),
            "-" => R::Error(rest.to_owned()),
            ":" => R::Int(rest.parse().unwrap()),
            "_" => R::Nil,
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return R::Nil;
                }
                let mut buf = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut buf).unwrap();
                buf.truncate(n as usize);
                R::Bulk(buf)
            }
            // RESP3's verbatim string: its text after the format (`txt:`).
            "=" => {
                let n: usize = rest.parse().unwrap();
                let mut buf = vec![0u8; n + 2];
                self.r.read_exact(&mut buf).unwrap();
                buf.truncate(n);
                assert_eq!(buf.get(3), Some(&b':'), "a verbatim string's format");
                R::Bulk(buf.split_off(4))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return R::Nil;
                }
                R::Array((0..n).map(|_| self.read()).collect())
            }
            "%" => {
                let n: usize = rest.parse().unwrap();
                R::Map((0..n).map(|_| (self.read(), self.read())).collect())
            }
            other => panic!("unexpected reply type {other:?} in {line:?}"),
        }
    }

    /// Whether the server closed the connection (EOF within the timeout).
    pub(crate) fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0))
    }
}

/// A broker on `dir` with `shards` shards, listening on a loopback port.
pub(crate) fn start_in(dir: &std::path::Path, shards: usize, config: BrokerConfig) -> Broker {
    let mut config = BrokerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        shards,
        ..config
    };
    config.store.dir = dir.to_path_buf();
    Broker::start(config).expect("start the broker (needs io_uring)")
}
