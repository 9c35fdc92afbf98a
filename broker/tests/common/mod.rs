//! What the broker's test binaries share: RESP request encoding and
//! temporary data directories.

#![allow(dead_code)]

use std::path::PathBuf;

pub(crate) mod client;

/// `XREADGROUP GROUP g c BLOCK 0 STREAMS <stream> >`, encoded: a group
/// read that blocks until served.
#[allow(dead_code)]
pub(crate) fn blocking_group_read(stream: &[u8]) -> Vec<u8> {
    encode(&[
        b"XREADGROUP",
        b"GROUP",
        b"g",
        b"c",
        b"BLOCK",
        b"0",
        b"STREAMS",
        stream,
        b">",
    ])
}

/// A command as a RESP multibulk request.
pub(crate) fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A data directory removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    /// A fresh, not yet existing directory under the system's temp dir.
    pub(crate) fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mailring-broker-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every segment file under a data directory (`gen-*/log-*/*.seg`), in
/// path order.
pub(crate) fn segment_files(dir: &std::path::Path) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "seg") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// Copies what a power loss now would leave of `dir` into `to`: each
/// segment cut to its flushed length, segments never flushed left out.
pub(crate) fn power_loss_image(
    dir: &std::path::Path,
    to: &std::path::Path,
    durable: &std::collections::HashMap<std::path::PathBuf, u64>,
) {
    for gen in std::fs::read_dir(dir).unwrap().flatten() {
        let gen_to = to.join(gen.file_name());
        std::fs::create_dir_all(&gen_to).unwrap();
        for entry in std::fs::read_dir(gen.path()).unwrap().flatten() {
            if entry.path().is_file() {
                std::fs::copy(entry.path(), gen_to.join(entry.file_name())).unwrap();
                continue;
            }
            let log_to = gen_to.join(entry.file_name());
            std::fs::create_dir_all(&log_to).unwrap();
            for seg in std::fs::read_dir(entry.path()).unwrap().flatten() {
                let Some(&len) = durable.get(&seg.path()) else {
                    continue;
                };
                let mut bytes = std::fs::read(seg.path()).unwrap();
                bytes.truncate(len as usize);
                std::fs::write(log_to.join(seg.file_name()), bytes).unwrap();
            }
        }
    }
}
