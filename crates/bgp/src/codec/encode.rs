//! Encoding. Infallible: callers keep messages within [`super::MAX_MESSAGE_LEN`] (the RIB's
//! export splits large updates).

use std::net::IpAddr;

use ipnet::IpNet;

use super::{
    AS_TRANS, AsSegment, Capability, CodecOptions, FLAG_EXTENDED, Message, Open, Origin,
    PathAttribute, SegmentType, Update,
};

/// Encodes a message with default options (4-octet AS).
pub fn encode(msg: &Message) -> Vec<u8> {
    encode_with(msg, CodecOptions::default())
}

/// Encodes a message, header included.
pub fn encode_with(msg: &Message, opts: CodecOptions) -> Vec<u8> {
    let mut out = vec![0xff; 16];
    out.extend_from_slice(&[0, 0, msg.type_code()]);
    match msg {
        Message::Open(o) => encode_open(o, &mut out),
        Message::Update(u) => encode_update(u, opts, &mut out),
        Message::Notification(n) => {
            out.push(n.error.code());
            out.push(n.error.subcode());
            out.extend_from_slice(&n.data);
        }
        Message::Keepalive => {}
        Message::RouteRefresh(rr) => {
            out.extend_from_slice(&rr.family.afi.to_be_bytes());
            out.push(rr.subtype);
            out.push(rr.family.safi);
        }
    }
    let len = u16::try_from(out.len()).unwrap_or(u16::MAX);
    out[16..18].copy_from_slice(&len.to_be_bytes());
    out
}

fn push_len8(out: &mut Vec<u8>, len: usize) {
    out.push(u8::try_from(len).unwrap_or(u8::MAX));
}

fn encode_open(o: &Open, out: &mut Vec<u8>) {
    out.push(o.version);
    out.extend_from_slice(&o.my_as.to_be_bytes());
    out.extend_from_slice(&o.hold_time.to_be_bytes());
    out.extend_from_slice(&o.bgp_id.octets());
    let mut caps = Vec::new();
    for c in &o.capabilities {
        encode_capability(c, &mut caps);
    }
    if caps.is_empty() {
        out.push(0);
    } else {
        push_len8(out, caps.len() + 2);
        out.push(2);
        push_len8(out, caps.len());
        out.extend_from_slice(&caps);
    }
}

fn encode_capability(c: &Capability, out: &mut Vec<u8>) {
    match c {
        Capability::Multiprotocol(f) => {
            out.extend_from_slice(&[1, 4]);
            out.extend_from_slice(&f.afi.to_be_bytes());
            out.push(0);
            out.push(f.safi);
        }
        Capability::RouteRefresh => out.extend_from_slice(&[2, 0]),
        Capability::GracefulRestart(gr) => {
            out.push(64);
            push_len8(out, 2 + 4 * gr.families.len());
            let flags = u16::from((gr.other_flags & 0x7) | if gr.restart_state { 0x8 } else { 0 });
            let word = (flags << 12) | (gr.restart_time & 0x0fff);
            out.extend_from_slice(&word.to_be_bytes());
            for f in &gr.families {
                out.extend_from_slice(&f.family.afi.to_be_bytes());
                out.push(f.family.safi);
                out.push((f.other_flags & 0x7f) | if f.forwarding_preserved { 0x80 } else { 0 });
            }
        }
        Capability::FourOctetAs(asn) => {
            out.extend_from_slice(&[65, 4]);
            out.extend_from_slice(&asn.to_be_bytes());
        }
        Capability::Unknown { code, value } => {
            out.push(*code);
            push_len8(out, value.len());
            out.extend_from_slice(value);
        }
    }
}

/// Appends one NLRI entry (length, significant octets).
pub(crate) fn encode_prefix(p: &IpNet, out: &mut Vec<u8>) {
    let len = p.prefix_len();
    let n = usize::from(len).div_ceil(8);
    out.push(len);
    match p {
        IpNet::V4(p) => out.extend(p.network().octets().iter().take(n)),
        IpNet::V6(p) => out.extend(p.network().octets().iter().take(n)),
    }
}

fn encode_update(u: &Update, opts: CodecOptions, out: &mut Vec<u8>) {
    let mut w = Vec::new();
    for p in &u.withdrawn {
        encode_prefix(&IpNet::V4(*p), &mut w);
    }
    let mut a = Vec::new();
    for attr in &u.attributes {
        encode_attribute_into(attr, opts, &mut a);
    }
    out.extend_from_slice(&u16::try_from(w.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&w);
    out.extend_from_slice(&u16::try_from(a.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&a);
    for p in &u.nlri {
        encode_prefix(&IpNet::V4(*p), out);
    }
}

/// Appends one path attribute (flags, type, length, value).
pub fn encode_attribute_into(attr: &PathAttribute, opts: CodecOptions, out: &mut Vec<u8>) {
    let mut v = Vec::new();
    match attr {
        PathAttribute::Origin(o) => v.push(match o {
            Origin::Igp => 0,
            Origin::Egp => 1,
            Origin::Incomplete => 2,
        }),
        PathAttribute::AsPath(segs) => encode_as_path(segs, opts.four_octet_as, &mut v),
        PathAttribute::NextHop(nh) => v.extend_from_slice(&nh.octets()),
        PathAttribute::MultiExitDisc(x) | PathAttribute::LocalPref(x) => {
            v.extend_from_slice(&x.to_be_bytes())
        }
        PathAttribute::AtomicAggregate => {}
        PathAttribute::Aggregator { asn, address } => {
            if opts.four_octet_as {
                v.extend_from_slice(&asn.to_be_bytes());
            } else {
                v.extend_from_slice(&u16::try_from(*asn).unwrap_or(AS_TRANS).to_be_bytes());
            }
            v.extend_from_slice(&address.octets());
        }
        PathAttribute::Communities(cs) => {
            for c in cs {
                v.extend_from_slice(&c.to_be_bytes());
            }
        }
        PathAttribute::OriginatorId(id) => v.extend_from_slice(&id.octets()),
        PathAttribute::ClusterList(ids) => {
            for id in ids {
                v.extend_from_slice(&id.octets());
            }
        }
        PathAttribute::MpReach(r) => {
            v.extend_from_slice(&r.family.afi.to_be_bytes());
            v.push(r.family.safi);
            let mut nh = Vec::new();
            for a in &r.next_hops {
                match a {
                    IpAddr::V4(a) => nh.extend_from_slice(&a.octets()),
                    IpAddr::V6(a) => nh.extend_from_slice(&a.octets()),
                }
            }
            push_len8(&mut v, nh.len());
            v.extend_from_slice(&nh);
            v.push(0);
            for p in &r.nlri {
                encode_prefix(p, &mut v);
            }
        }
        PathAttribute::MpUnreach(u) => {
            v.extend_from_slice(&u.family.afi.to_be_bytes());
            v.push(u.family.safi);
            for p in &u.withdrawn {
                encode_prefix(p, &mut v);
            }
        }
        PathAttribute::Unknown(u) => v.extend_from_slice(&u.value),
    }
    let mut flags = attr.flags();
    if v.len() > 255 {
        flags |= FLAG_EXTENDED;
        out.push(flags);
        out.push(attr.type_code());
        out.extend_from_slice(&u16::try_from(v.len()).unwrap_or(u16::MAX).to_be_bytes());
    } else {
        out.push(flags);
        out.push(attr.type_code());
        push_len8(out, v.len());
    }
    out.extend_from_slice(&v);
}

fn encode_as_path(segs: &[AsSegment], four_octet: bool, v: &mut Vec<u8>) {
    for seg in segs {
        // A segment holds at most 255 AS numbers; longer runs are split.
        for chunk in seg.asns.chunks(255) {
            v.push(match seg.kind {
                SegmentType::AsSet => 1,
                SegmentType::AsSequence => 2,
            });
            push_len8(v, chunk.len());
            for asn in chunk {
                if four_octet {
                    v.extend_from_slice(&asn.to_be_bytes());
                } else {
                    v.extend_from_slice(&u16::try_from(*asn).unwrap_or(AS_TRANS).to_be_bytes());
                }
            }
        }
    }
}
