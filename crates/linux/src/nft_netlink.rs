//! nftables over NETLINK_NETFILTER, without spawning `nft`: the whole table (tables, base and
//! regular chains, rules, sets and maps, elements) as typed [`TableChange`]s (`tern-nft`),
//! applied as one nfnetlink batch, one transaction: all changes or none.
//!
//! `nft -f` loads the whole table into its cache before it commits anything, which costs tens
//! of milliseconds of CPU with thousands of chains and elements; a batch costs what its changes
//! cost. Every change is encoded as the messages `nft` itself sends for the change's text
//! ([`tern_nft::render_changes`]), so the kernel holds the same table either way; the
//! `nft_ir` test applies the same tables both ways in two private namespaces and compares what
//! the kernels report.
//!
//! - `batch`: one message per change (`NEWTABLE`/`DELTABLE`, `NEWCHAIN` with hook,
//!   priority, policy and type for a base chain, `DELRULE` without a handle to flush a chain,
//!   `DELCHAIN`, `NEWSET`/`DELSET`, `DELSETELEM` without elements to flush a set), a run of
//!   element changes of one set per `NEWSETELEM`/`DELSETELEM` (split at 256 entries);
//! - `expr`: rules as expressions, with nft's lowering (the family check an `ip` match
//!   implies, single-element anonymous sets as comparisons, others as constant anonymous sets
//!   created just before the rule, concatenations in consecutive registers);
//! - `elems`: set declarations (key type and length, concatenation field lengths, flags, nft's
//!   user data) and elements as kernel entries (interval start/end entries, merged ranges of
//!   auto-merge and anonymous sets, interval concatenations with an end key).
//!
//! Semantics are idempotent: adding an element that exists, deleting one that does not and
//! creating a chain or set that exists are not errors. A missing table or set of an element
//! change is [`LinuxError::NotFound`]; any other refusal fails the whole transaction and names
//! the change (as nft text).
//!
//! Like the rtnetlink [`crate::netlink::Handle`], an [`NftSocket`] talks to the network
//! namespace of the thread that created it.

use std::os::fd::OwnedFd;

use tern_nft::TableChange;

use crate::error::{LinuxError, Result};
use crate::netlink::framing::{
    Answer, MsgBuilder, NLM_F_ACK, NLMSG_ERROR, open_bound, parse_datagram, recv_retrying,
    send_all, set_int_option, set_recv_timeout,
};

mod batch;
mod elems;
mod expr;

/// `NFPROTO_INET`: the family of `inet` tables.
pub const NFPROTO_INET: u8 = 1;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWCHAIN: u8 = 3;
const NFT_MSG_DELCHAIN: u8 = 5;
const NFT_MSG_NEWRULE: u8 = 6;
const NFT_MSG_DELRULE: u8 = 8;
const NFT_MSG_NEWSET: u8 = 9;
const NFT_MSG_GETSET: u8 = 10;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_DELSETELEM: u8 = 14;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// Interface name keys are `IFNAMSIZ` bytes.
const IFNAMSIZ: usize = 16;
/// How long to wait for the kernel's answer to a batch.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// nfnetlink messages are built on the framing core's builder; a batch is several messages in
/// one buffer, sent as one datagram.
type Batch = MsgBuilder;

/// Starts an nfnetlink message: the netlink header, then `struct nfgenmsg` (family, version 0,
/// res_id big-endian).
fn begin(b: &mut Batch, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
    let [r0, r1] = res_id.to_be_bytes();
    b.begin(msg_type, flags, seq).raw(&[family, 0, r0, r1]); // 0: NFNETLINK_V0
}

/// A blocking NETLINK_NETFILTER socket in the network namespace of the creating thread.
pub struct NftSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl NftSocket {
    /// Opens and binds the socket (needs CAP_NET_ADMIN to change anything).
    pub fn new() -> Result<NftSocket> {
        let fd = open_bound(libc::NETLINK_NETFILTER, "nfnetlink")?;
        // A lost answer must not hang the agent: time out and let the caller fall back.
        set_recv_timeout(&fd, REPLY_TIMEOUT)
            .map_err(|e| LinuxError::io("set nfnetlink receive timeout", e))?;
        Ok(NftSocket {
            fd,
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&self, bytes: &[u8], context: &str) -> Result<()> {
        // A batch is one datagram: big ones need a send buffer to match. SO_SNDBUFFORCE
        // (CAP_NET_ADMIN, which changing nftables needs anyway) goes past wmem_max; without it,
        // best effort.
        if bytes.len() > 128 * 1024 {
            let size = libc::c_int::try_from(bytes.len() * 2).unwrap_or(libc::c_int::MAX);
            for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
                if set_int_option(&self.fd, libc::SOL_SOCKET, opt, size).is_ok() {
                    break;
                }
            }
        }
        send_all(&self.fd, bytes)
            .map_err(|err| LinuxError::io(format!("{context}: send nfnetlink batch"), err))
    }

    /// Receives datagrams, handing every NLMSG_ERROR (ack or error) to `each` by sequence
    /// number, until `each` says the exchange is complete. Other messages go to `other`.
    fn receive(
        &mut self,
        context: &str,
        each: &mut dyn FnMut(u32, Answer) -> bool,
        other: &mut dyn FnMut(u32, u16),
    ) -> Result<()> {
        loop {
            let n = recv_retrying(&self.fd, &mut self.buf).map_err(|err| {
                LinuxError::io(format!("{context}: receive nfnetlink answer"), err)
            })?;
            for m in parse_datagram(&self.buf[..n], &|| context.to_string())? {
                if m.msg_type != NLMSG_ERROR {
                    other(m.seq, m.msg_type);
                    continue;
                }
                if each(m.seq, Answer::decode(&m, &|| context.to_string())?) {
                    return Ok(());
                }
            }
        }
    }

    /// True when set `set` of table `inet table` exists.
    pub fn set_exists(&mut self, table: &str, set: &str) -> Result<bool> {
        let context = format!("look up set inet {table} {set}");
        let seq = self.next_seq();
        let mut b = Batch::batch();
        begin(
            &mut b,
            (NFNL_SUBSYS_NFTABLES << 8) | u16::from(NFT_MSG_GETSET),
            NLM_F_ACK,
            seq,
            NFPROTO_INET,
            0,
        );
        b.attr_str(NFTA_SET_TABLE, table);
        b.attr_str(NFTA_SET_NAME, set);
        self.send(b.finish()?, &context)?;
        let mut found = false;
        let mut answer = None;
        self.receive(
            &context,
            &mut |s, a| {
                if s == seq {
                    answer = Some(a);
                    true
                } else {
                    false
                }
            },
            &mut |s, t| {
                if s == seq && t == (NFNL_SUBSYS_NFTABLES << 8) | u16::from(NFT_MSG_NEWSET) {
                    found = true;
                }
            },
        )?;
        match answer {
            Some(Answer { errno: 0, .. }) => Ok(found),
            Some(Answer { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Some(a) => Err(a.into_error(context)),
            None => Err(LinuxError::Malformed(format!("{context}: no answer"))),
        }
    }
}

thread_local! {
    /// This thread's socket and the network namespace (device, inode) it was opened in.
    static CACHED: std::cell::RefCell<Option<((u64, u64), NftSocket)>> =
        const { std::cell::RefCell::new(None) };
}

/// The (device, inode) of the calling thread's network namespace.
fn current_netns() -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| LinuxError::io("stat /proc/thread-self/ns/net", e))?;
    Ok((m.dev(), m.ino()))
}

/// [`NftSocket::apply`] on a socket kept per thread and reused while the thread stays in the
/// same network namespace. Closing a socket that committed a transaction costs the kernel
/// several milliseconds, more than the change itself, so a caller that applies changes one by
/// one should use this rather than a socket per change. After an error the socket is
/// dropped, so no stale answer can confuse the next exchange.
pub fn apply_cached(table: &str, changes: &[TableChange]) -> Result<()> {
    with_cached(|sock| sock.apply(table, changes))
}

fn with_cached(f: impl FnOnce(&mut NftSocket) -> Result<()>) -> Result<()> {
    let ns = current_netns()?;
    CACHED.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(n, _)| *n != ns) {
            *slot = Some((ns, NftSocket::new()?));
        }
        let (_, sock) = slot.as_mut().expect("socket just cached");
        let r = f(sock);
        if r.is_err() {
            *slot = None;
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::batch::{Encoder, units};
    use super::*;
    use crate::netlink::framing::{NLM_F_CREATE, NLM_F_REQUEST, NLMSG_HDRLEN};
    use tern_nft::{Element, ElementChange, Family, Key, SetType, Verdict};

    fn attrs(buf: &[u8]) -> Vec<(u16, Vec<u8>)> {
        crate::netlink::framing::attrs(buf)
            .map(|(k, v)| (k, v.to_vec()))
            .collect()
    }

    /// The messages (each as its bytes) `changes` encode to, numbered from 9.
    fn messages(changes: &[TableChange]) -> Vec<Vec<u8>> {
        let mut b = Batch::batch();
        let mut enc = Encoder::new(&mut b, 8);
        for u in units(changes) {
            enc.unit("tern", &u).unwrap();
        }
        let bytes = b.finish().unwrap().to_vec();
        let mut out = Vec::new();
        let mut rest = &bytes[..];
        while rest.len() >= 4 {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
            out.push(rest[..len].to_vec());
            rest = &rest[len..];
        }
        out
    }

    fn change(
        set: &str,
        set_type: SetType,
        add: bool,
        key: Key,
        v: Option<Verdict>,
    ) -> TableChange {
        TableChange::Element(ElementChange {
            set: set.into(),
            set_type,
            add,
            element: Element { key, verdict: v },
        })
    }

    /// The message of one element change.
    fn one_message(set: &str, set_type: SetType, add: bool, key: Key) -> Vec<u8> {
        let mut m = messages(&[change(set, set_type, add, key, None)]);
        assert_eq!(m.len(), 1);
        m.remove(0)
    }

    /// The NFTA_LIST_ELEM entries of a NEWSETELEM/DELSETELEM message.
    fn list_elems(msg: &[u8]) -> Vec<Vec<(u16, Vec<u8>)>> {
        let len = u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, msg.len());
        let top = attrs(&msg[NLMSG_HDRLEN + 4..]);
        assert_eq!(top[0], (NFTA_SET_ELEM_LIST_TABLE, b"tern\0".to_vec()));
        let list = top
            .iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS)
            .unwrap();
        attrs(&list.1)
            .into_iter()
            .map(|(k, v)| {
                assert_eq!(k, NFTA_LIST_ELEM);
                attrs(&v)
            })
            .collect()
    }

    fn key_of(elem: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let k = &elem
            .iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_KEY)
            .unwrap()
            .1;
        attrs(k)[0].1.clone()
    }

    fn flags_of(elem: &[(u16, Vec<u8>)]) -> Option<Vec<u8>> {
        elem.iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_FLAGS)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn header_and_nfgenmsg_of_an_add() {
        let m = one_message(
            "sel-1-v4",
            SetType::addr(Family::V4),
            true,
            Key::Addr("10.0.0.1".parse().unwrap()),
        );
        let ty = u16::from_ne_bytes(m[4..6].try_into().unwrap());
        assert_eq!(ty, (10 << 8) | 12);
        let flags = u16::from_ne_bytes(m[6..8].try_into().unwrap());
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_CREATE);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(&m[16..20], &[NFPROTO_INET, 0, 0, 0]);
        let elems = list_elems(&m);
        assert_eq!(elems.len(), 1);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 1]);
    }

    #[test]
    fn single_address_of_an_interval_set_is_start_and_end_plus_one() {
        let m = one_message(
            "pools",
            SetType::addr(Family::V4).interval(),
            false,
            Key::Net("10.0.0.255/32".parse().unwrap()),
        );
        assert_eq!(
            u16::from_ne_bytes(m[4..6].try_into().unwrap()),
            (10 << 8) | 14
        );
        let elems = list_elems(&m);
        assert_eq!(elems.len(), 2);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 255]);
        assert_eq!(flags_of(&elems[0]), None);
        assert_eq!(key_of(&elems[1]), vec![10, 0, 1, 0]);
        assert_eq!(
            flags_of(&elems[1]),
            Some(NFT_SET_ELEM_INTERVAL_END.to_be_bytes().to_vec())
        );
    }

    #[test]
    fn interval_ends_and_open_ended_prefixes() {
        let end = |net: &str| {
            let m = one_message(
                "pools",
                SetType::addr(Family::of_net(&net.parse().unwrap())).interval(),
                true,
                Key::Net(net.parse().unwrap()),
            );
            let elems = list_elems(&m);
            (elems.len() == 2).then(|| key_of(&elems[1]))
        };
        assert_eq!(end("10.1.0.0/16"), Some(vec![10, 2, 0, 0]));
        assert_eq!(end("255.255.255.255/32"), None);
        assert_eq!(end("0.0.0.0/0"), None);
        let mut fd01 = vec![0xfd, 0, 0, 0, 0, 0, 0, 1];
        fd01.resize(16, 0);
        assert_eq!(end("fd00::/64"), Some(fd01));
        assert_eq!(end("::/0"), None);
    }

    #[test]
    fn concatenation_pads_fields_and_port_is_big_endian() {
        let np = SetType::of(&[
            tern_nft::DataType::Ipv4Addr,
            tern_nft::DataType::InetService,
        ]);
        let m = one_message(
            "np-1-v4",
            np,
            true,
            Key::AddrPort("10.0.0.1".parse().unwrap(), 8080),
        );
        let elems = list_elems(&m);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 1, 0x1f, 0x90, 0, 0]);
    }

    #[test]
    fn ifname_key_with_jump_verdict() {
        let entry = |add: bool| {
            let m = messages(&[change(
                "ep-in",
                SetType::ifname_vmap(),
                add,
                Key::Ifname("veth1".into()),
                Some(Verdict::Jump("ep-in-veth1".into())),
            )]);
            list_elems(&m[0]).remove(0)
        };
        let e = entry(true);
        let mut want = b"veth1".to_vec();
        want.resize(16, 0);
        assert_eq!(key_of(&e), want);
        let data = &e.iter().find(|(t, _)| *t == NFTA_SET_ELEM_DATA).unwrap().1;
        let verdict = attrs(data);
        assert_eq!(verdict[0].0, NFTA_DATA_VERDICT);
        let v = attrs(&verdict[0].1);
        assert_eq!(v[0], (NFTA_VERDICT_CODE, NFT_JUMP.to_be_bytes().to_vec()));
        assert_eq!(v[1], (NFTA_VERDICT_CHAIN, b"ep-in-veth1\0".to_vec()));
        // Deletes carry only the key.
        assert!(!entry(false).iter().any(|(t, _)| *t == NFTA_SET_ELEM_DATA));
    }

    #[test]
    fn runs_of_one_set_and_direction_share_messages_of_at_most_256_entries() {
        let four = SetType::addr(Family::V4);
        let c = |set: &str, add, i: u32| {
            change(
                set,
                four,
                add,
                Key::Addr(std::net::IpAddr::V4(i.into())),
                None,
            )
        };
        let changes = vec![
            c("a", true, 1),
            c("a", true, 2),
            c("a", false, 3),
            c("b", false, 4),
        ];
        let m = messages(&changes);
        assert_eq!(
            m.iter().map(|m| list_elems(m).len()).collect::<Vec<_>>(),
            vec![2, 1, 1]
        );
        let changes: Vec<TableChange> = (0..600).map(|i| c("a", true, i)).collect();
        let m = messages(&changes);
        assert_eq!(
            m.iter().map(|m| list_elems(m).len()).collect::<Vec<_>>(),
            vec![256, 256, 88]
        );
    }

    #[test]
    fn the_first_elements_of_a_new_interval_set_start_with_an_end_at_zero() {
        let iv = SetType::addr(Family::V4).interval();
        let add = change(
            "iv",
            iv,
            true,
            Key::Net("10.0.0.0/8".parse().unwrap()),
            None,
        );
        let created = messages(&[
            TableChange::AddSet {
                name: "iv".into(),
                set_type: iv,
            },
            add.clone(),
        ]);
        let e = list_elems(&created[1]);
        assert_eq!(e.len(), 3);
        assert_eq!(key_of(&e[0]), vec![0, 0, 0, 0]);
        assert!(flags_of(&e[0]).is_some());
        // Added to a set of the kernel (not created or flushed here): as they are.
        assert_eq!(list_elems(&messages(&[add])[0]).len(), 2);
    }
}
