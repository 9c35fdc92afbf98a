//! Steering a `SO_REUSEPORT` group by source port: a classic BPF program
//! (`SO_ATTACH_REUSEPORT_CBPF`) that picks socket [`steered_index`]`(source
//! port, n)`, a multiplicative hash of the port, so a client that knows
//! which socket (shard) it wants picks its source port to match
//! ([`super::TcpStream::connect_from`]), and ordinary clients spread.
//! (Not `port % n`: Linux gives `connect()` even ephemeral ports, so `% 2`
//! sent every ordinary client to socket 0.)

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h; the `libc` crate
/// exports it only for Android).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The program: for IPv4 the TCP/UDP source port sits after the IP header
/// (its length from the header's IHL), for IPv6 40 bytes in (no extension
/// headers); `SKF_NET_OFF` makes loads relative to the network header (a
/// reuseport program's data otherwise starts at the payload, empty in a
/// SYN). [`steered_index`] of the port is the socket's index: the order the
/// group's sockets called `listen` (TCP) or `bind` (UDP).
fn program(group: u32) -> [libc::sock_filter; 11] {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD,
        BPF_LDX, BPF_MOD, BPF_MSH, BPF_MUL, BPF_RET, BPF_RSH,
    };
    let net = libc::SKF_NET_OFF as u32;
    [
        // A = IP version (high nibble of the first byte)
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, net),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4),
        // IPv6: jump to 6
        op(BPF_JMP | BPF_JEQ | BPF_K, 3, 0, 6),
        // IPv4: X = header length, A = u16 at X (the source port)
        op(BPF_LDX | BPF_B | BPF_MSH, 0, 0, net),
        op(BPF_LD | BPF_H | BPF_IND, 0, 0, net),
        op(BPF_JMP | BPF_JA, 0, 0, 1),
        // IPv6: A = u16 at 40
        op(BPF_LD | BPF_H | BPF_ABS, 0, 0, net.wrapping_add(40)),
        // A = ((A * K) mod 2^32 >> 16) % group: steered_index
        op(BPF_ALU | BPF_MUL | BPF_K, 0, 0, STEER_MULTIPLIER),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 16),
        op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, group),
        op(BPF_RET | BPF_A, 0, 0, 0),
    ]
}

/// The multiplier of the steering hash (2^32 / φ, odd).
const STEER_MULTIPLIER: u32 = 0x9E37_79B1;

/// The socket of a steered group of `group` sockets that a connection
/// from source `port` goes to: the high half of `port × 0x9E3779B1`
/// (32-bit, wrapping), modulo `group`. The program computes the same in
/// the kernel; a client picks a port for which this is the shard it wants.
///
/// ```
/// use mailring::net::steered_index;
///
/// // Consecutive even ports (what Linux gives connect()) spread.
/// let hits = (0..64u16).filter(|i| steered_index(40_000 + 2 * i, 2) == 1).count();
/// assert!((24..=40).contains(&hits));
/// ```
///
/// # Panics
///
/// For a `group` of 0.
pub fn steered_index(port: u16, group: usize) -> usize {
    assert!(group > 0, "a steered group of 0 sockets");
    ((u32::from(port).wrapping_mul(STEER_MULTIPLIER) >> 16) as usize) % group
}

/// Attaches source-port steering to the reuseport group of `socket` (any
/// member; the program applies to the whole group): a connection from
/// source port `p` goes to the group's socket [`steered_index`]`(p,
/// group)`, counting in the
/// order they started listening. Attach it once every member listens; a
/// member that closes reorders the group (the last takes its place), so
/// attach again after a change. Connections whose index is past the group
/// fall back to the kernel's hash.
///
/// # Errors
///
/// `InvalidInput` for a group of 0 or over 65,536; the OS error of
/// `setsockopt` (e.g. on kernels before 4.5).
pub fn steer_by_source_port(socket: BorrowedFd<'_>, group: usize) -> io::Result<()> {
    let group = u32::try_from(group)
        .ok()
        .filter(|g| (1..=65_536).contains(g))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a reuseport group of {group} sockets"),
            )
        })?;
    let mut filter = program(group);
    let prog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filter`, both alive for the call; the
    // kernel copies the program before returning.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
