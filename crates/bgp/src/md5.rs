//! TCP MD5 signatures (RFC 2385) through the Linux `TCP_MD5SIG` socket option.
//!
//! The key is bound to the peer's address: on a listening socket one key per peer (accepted
//! connections inherit them), on an outbound socket the key for the address it connects to.
//! The option must be set before the handshake, since the SYN is already signed.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

/// Longest key the kernel accepts (`TCP_MD5SIG_MAXKEYLEN`).
pub const MAX_KEY_LEN: usize = 80;

/// TCP MD5 errors.
#[derive(Debug, thiserror::Error)]
pub enum Md5Error {
    /// The kernel has no `CONFIG_TCP_MD5SIG`.
    #[error("TCP MD5 not supported by this kernel (setting the key for peer {peer}: {source})")]
    Unsupported {
        /// The peer the key was for.
        peer: IpAddr,
        /// The kernel's answer (ENOPROTOOPT or EINVAL).
        source: io::Error,
    },
    /// The password is longer than the kernel allows.
    #[error("TCP MD5 password for peer {peer} is {len} bytes; at most {MAX_KEY_LEN} are allowed")]
    KeyTooLong {
        /// The peer.
        peer: IpAddr,
        /// Its length.
        len: usize,
    },
    /// Any other failure.
    #[error("setting the TCP MD5 key for peer {peer}: {source}")]
    Io {
        /// The peer.
        peer: IpAddr,
        /// The error.
        source: io::Error,
    },
}

/// `struct tcp_md5sig` from `<linux/tcp.h>` (libc does not define it).
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: libc::c_int,
    key: [u8; MAX_KEY_LEN],
}

/// Sets (with `Some`) or removes (with `None`) the MD5 key for `peer` on socket `fd`.
pub fn set_key(fd: RawFd, peer: IpAddr, key: Option<&[u8]>) -> Result<(), Md5Error> {
    let key = key.unwrap_or(&[]);
    if key.len() > MAX_KEY_LEN {
        return Err(Md5Error::KeyTooLong {
            peer,
            len: key.len(),
        });
    }
    // SAFETY: all-zero bytes are a valid value for this plain C struct.
    let mut sig: TcpMd5Sig = unsafe { std::mem::zeroed() };
    let sa = socket2::SockAddr::from(SocketAddr::new(peer, 0));
    // SAFETY: SockAddr holds at most a sockaddr_storage; copying its length of bytes into
    // the zeroed storage stays in bounds.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sa.as_ptr() as *const u8,
            &mut sig.addr as *mut libc::sockaddr_storage as *mut u8,
            sa.len() as usize,
        );
    }
    sig.keylen = key.len() as u16;
    sig.key[..key.len()].copy_from_slice(key);
    // SAFETY: fd is a socket owned by the caller; the pointer and length describe `sig`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            &sig as *const TcpMd5Sig as *const libc::c_void,
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // Deleting a key that was never set is not an error worth reporting.
        Some(libc::ENOENT) if key.is_empty() => Ok(()),
        Some(libc::ENOPROTOOPT) | Some(libc::EINVAL) => {
            Err(Md5Error::Unsupported { peer, source: err })
        }
        _ => Err(Md5Error::Io { peer, source: err }),
    }
}

/// Whether this kernel supports TCP MD5, probed on a throwaway socket.
pub fn supported() -> bool {
    let Ok(sock) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None) else {
        return false;
    };
    use std::os::fd::AsRawFd;
    set_key(
        sock.as_raw_fd(),
        IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 255, 254)),
        Some(b"probe"),
    )
    .is_ok()
}
