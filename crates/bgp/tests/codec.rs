//! Byte-exact codec fixtures, both ways, and decode errors with their exact NOTIFICATION.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};
use tern_bgp::codec::*;

/// Reads a fixture: hex octets, `#` starts a comment.
/// An AS_PATH of one AS_SEQUENCE segment.
fn as_sequence(asns: &[u32]) -> PathAttribute {
    PathAttribute::AsPath(vec![AsSegment {
        kind: SegmentType::AsSequence,
        asns: asns.to_vec(),
    }])
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}.hex", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let digits: String = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex"))
        .collect()
}

fn v4(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// Asserts decode(fixture) == msg and encode(msg) == fixture.
fn both_ways(name: &str, msg: Message, opts: CodecOptions) {
    let bytes = fixture(name);
    let decoded = decode_with(&bytes, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded, msg, "{name}: decode");
    assert_eq!(encode_with(&msg, opts), bytes, "{name}: encode");
}

fn four() -> CodecOptions {
    CodecOptions::default()
}

#[test]
fn keepalive_fixture() {
    both_ways("keepalive", Message::Keepalive, four());
}

#[test]
fn open_fixture_with_all_capabilities() {
    let open = Open {
        version: 4,
        my_as: AS_TRANS,
        hold_time: 90,
        bgp_id: ip4("198.18.0.1"),
        capabilities: vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::RouteRefresh,
            Capability::GracefulRestart(GracefulRestart {
                restart_state: true,
                other_flags: 0,
                restart_time: 120,
                families: vec![
                    GracefulRestartFamily {
                        family: Family::IPV4_UNICAST,
                        forwarding_preserved: true,
                        other_flags: 0,
                    },
                    GracefulRestartFamily {
                        family: Family::IPV6_UNICAST,
                        forwarding_preserved: false,
                        other_flags: 0,
                    },
                ],
            }),
            Capability::FourOctetAs(4_200_000_001),
            Capability::Unknown {
                code: 73,
                value: b"abc".to_vec(),
            },
        ],
    };
    assert_eq!(open.asn(), 4_200_000_001);
    assert_eq!(open.graceful_restart().map(|g| g.restart_time), Some(120));
    both_ways("open", Message::Open(open), four());
}

#[test]
fn open_new_uses_as_trans_for_large_as() {
    let o = Open::new(4_200_000_001, 90, ip4("198.18.0.1"), vec![]);
    assert_eq!(o.my_as, AS_TRANS);
    assert_eq!(o.capabilities, vec![Capability::FourOctetAs(4_200_000_001)]);
    let o = Open::new(64512, 90, ip4("198.18.0.1"), vec![]);
    assert_eq!(o.my_as, 64512);
}

#[test]
fn open_minimal_fixture() {
    let open = Open {
        version: 4,
        my_as: 64512,
        hold_time: 0,
        bgp_id: ip4("198.18.0.2"),
        capabilities: vec![],
    };
    both_ways("open_minimal", Message::Open(open), four());
}

#[test]
fn update_ipv4_fixture_with_every_attribute() {
    let u = Update {
        withdrawn: vec![v4("10.244.9.0/26"), v4("10.0.0.0/8")],
        attributes: vec![
            PathAttribute::Origin(Origin::Igp),
            PathAttribute::AsPath(vec![
                AsSegment {
                    kind: SegmentType::AsSequence,
                    asns: vec![64512, 4_200_000_001],
                },
                AsSegment {
                    kind: SegmentType::AsSet,
                    asns: vec![65001, 65002],
                },
            ]),
            PathAttribute::NextHop(ip4("198.18.0.10")),
            PathAttribute::MultiExitDisc(50),
            PathAttribute::LocalPref(200),
            PathAttribute::AtomicAggregate,
            PathAttribute::Aggregator {
                asn: 64512,
                address: ip4("198.18.0.10"),
            },
            PathAttribute::Communities(vec![0xfde8_0064, 0xffff_ff01]),
            PathAttribute::OriginatorId(ip4("198.18.0.20")),
            PathAttribute::ClusterList(vec![ip4("198.18.0.30"), ip4("198.18.0.31")]),
            PathAttribute::Unknown(UnknownAttribute {
                flags: FLAG_OPTIONAL | FLAG_TRANSITIVE | FLAG_PARTIAL,
                type_code: 99,
                value: vec![1, 2, 3],
            }),
        ],
        nlri: vec![
            v4("10.244.1.0/26"),
            v4("10.244.2.0/24"),
            v4("0.0.0.0/0"),
            v4("198.18.0.5/32"),
        ],
    };
    assert_eq!(u.end_of_rib_family(), None);
    both_ways("update_ipv4", Message::Update(u), four());
}

#[test]
fn update_ipv6_fixture_mp_reach() {
    let u = Update {
        withdrawn: vec![],
        attributes: vec![
            PathAttribute::Origin(Origin::Incomplete),
            PathAttribute::AsPath(vec![]),
            PathAttribute::LocalPref(100),
            PathAttribute::MpReach(MpReach {
                family: Family::IPV6_UNICAST,
                next_hops: vec![
                    IpAddr::V6("2001:db8::1".parse::<Ipv6Addr>().unwrap()),
                    IpAddr::V6("fe80::1".parse::<Ipv6Addr>().unwrap()),
                ],
                nlri: vec![
                    net("fd00:10:244:1::/64"),
                    net("fd00::/8"),
                    net("2001:db8:ffff::1/128"),
                ],
            }),
        ],
        nlri: vec![],
    };
    let announced = u.all_announced();
    assert_eq!(announced.len(), 3);
    assert_eq!(announced[0].1, Some("2001:db8::1".parse().unwrap()));
    both_ways("update_ipv6", Message::Update(u), four());
}

#[test]
fn update_mp_unreach_fixture() {
    let u = Update {
        withdrawn: vec![],
        attributes: vec![PathAttribute::MpUnreach(MpUnreach {
            family: Family::IPV6_UNICAST,
            withdrawn: vec![net("fd00:10:244:1::/64"), net("::/0")],
        })],
        nlri: vec![],
    };
    assert_eq!(u.all_withdrawn().len(), 2);
    both_ways("update_mp_unreach", Message::Update(u), four());
}

#[test]
fn update_mp_reach_ipv4_fixture() {
    let u = Update {
        withdrawn: vec![],
        attributes: vec![
            PathAttribute::Origin(Origin::Igp),
            as_sequence(&[64513]),
            PathAttribute::MpReach(MpReach {
                family: Family::IPV4_UNICAST,
                next_hops: vec![IpAddr::V4(ip4("198.18.0.10"))],
                nlri: vec![net("10.244.3.0/26")],
            }),
        ],
        nlri: vec![],
    };
    both_ways("update_mp_reach_ipv4", Message::Update(u), four());
}

#[test]
fn end_of_rib_fixtures() {
    let eor4 = Update::end_of_rib(Family::IPV4_UNICAST);
    assert_eq!(eor4.end_of_rib_family(), Some(Family::IPV4_UNICAST));
    both_ways("eor_ipv4", Message::Update(eor4), four());
    let eor6 = Update::end_of_rib(Family::IPV6_UNICAST);
    assert_eq!(eor6.end_of_rib_family(), Some(Family::IPV6_UNICAST));
    both_ways("eor_ipv6", Message::Update(eor6), four());
}

#[test]
fn extended_length_fixture() {
    let bytes = fixture("update_extended_length");
    // The COMMUNITIES attribute header: flags 0xd0 (optional, transitive, extended), type 8,
    // length 280.
    let needle = [0xd0, 0x08, 0x01, 0x18];
    assert!(bytes.windows(4).any(|w| w == needle));
    let u = Update {
        withdrawn: vec![],
        attributes: vec![
            PathAttribute::Origin(Origin::Igp),
            as_sequence(&[65010]),
            PathAttribute::NextHop(ip4("198.18.1.1")),
            PathAttribute::Communities((0..70).map(|i| 0xfde8_0000 + i).collect()),
        ],
        nlri: vec![v4("10.96.0.0/12")],
    };
    both_ways("update_extended_length", Message::Update(u), four());
}

#[test]
fn two_octet_as_fixture() {
    let u = Update {
        withdrawn: vec![],
        attributes: vec![
            PathAttribute::Origin(Origin::Egp),
            as_sequence(&[65001, u32::from(AS_TRANS)]),
            PathAttribute::NextHop(ip4("198.18.0.9")),
            PathAttribute::Aggregator {
                asn: 65001,
                address: ip4("198.18.0.9"),
            },
        ],
        nlri: vec![v4("10.1.0.0/16")],
    };
    both_ways(
        "update_two_octet",
        Message::Update(u),
        CodecOptions {
            four_octet_as: false,
        },
    );
}

#[test]
fn notification_fixtures() {
    both_ways(
        "notification_hold",
        Message::Notification(Notification::bare(ErrorCode::HoldTimerExpired)),
        four(),
    );
    both_ways(
        "notification_bad_length",
        Message::Notification(Notification::new(
            ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
            vec![0x10, 0x01],
        )),
        four(),
    );
    both_ways(
        "notification_cease",
        Message::Notification(Notification::new(
            ErrorCode::Cease(CeaseSubcode::AdministrativeShutdown),
            b"\x04bye!".to_vec(),
        )),
        four(),
    );
}

#[test]
fn route_refresh_fixture() {
    both_ways(
        "route_refresh",
        Message::RouteRefresh(RouteRefresh {
            family: Family::IPV6_UNICAST,
            subtype: 0,
        }),
        four(),
    );
}

#[test]
fn every_error_code_round_trips_through_the_wire_octets() {
    for code in 0..=8u8 {
        for sub in 0..=12u8 {
            let e = ErrorCode::from_wire(code, sub);
            assert_eq!((e.code(), e.subcode()), (code, sub));
        }
    }
    assert_eq!(
        ErrorCode::from_wire(2, 6),
        ErrorCode::Open(OpenSubcode::UnacceptableHoldTime)
    );
    assert_eq!(
        ErrorCode::from_wire(3, 11),
        ErrorCode::Update(UpdateSubcode::MalformedAsPath)
    );
    assert_eq!(
        ErrorCode::from_wire(4, 1),
        ErrorCode::Unknown {
            code: 4,
            subcode: 1
        }
    );
}

// ---------------------------------------------------------------- decode errors

fn header(len: u16, typ: u8) -> Vec<u8> {
    let mut v = vec![0xff; 16];
    v.extend_from_slice(&len.to_be_bytes());
    v.push(typ);
    v
}

fn update_msg(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let len = 19 + 4 + withdrawn.len() + attrs.len() + nlri.len();
    let mut v = header(len as u16, 2);
    v.extend_from_slice(&(withdrawn.len() as u16).to_be_bytes());
    v.extend_from_slice(withdrawn);
    v.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    v.extend_from_slice(attrs);
    v.extend_from_slice(nlri);
    v
}

const ORIGIN_IGP: [u8; 4] = [0x40, 1, 1, 0];
const AS_PATH_EMPTY: [u8; 3] = [0x40, 2, 0];
const NEXT_HOP: [u8; 7] = [0x40, 3, 4, 198, 18, 0, 1];
const NLRI: [u8; 4] = [24, 10, 1, 2];

fn mandatory() -> Vec<u8> {
    [&ORIGIN_IGP[..], &AS_PATH_EMPTY, &NEXT_HOP].concat()
}

fn err(bytes: &[u8]) -> DecodeError {
    match decode(bytes) {
        Ok(m) => panic!("expected an error, decoded {m:?}"),
        Err(e) => e,
    }
}

fn assert_reset(bytes: &[u8], error: ErrorCode, data: &[u8]) {
    let e = err(bytes);
    assert_eq!(e.action, ErrorAction::SessionReset, "{e}");
    assert_eq!(e.notification.error, error, "{e}");
    assert_eq!(e.notification.data, data, "{e}");
}

fn assert_withdraw(bytes: &[u8], error: ErrorCode, data: &[u8], prefixes: &[&str]) {
    let e = err(bytes);
    let want: Vec<IpNet> = prefixes.iter().map(|p| net(p)).collect();
    assert_eq!(e.action, ErrorAction::TreatAsWithdraw(want), "{e}");
    assert_eq!(e.notification.error, error, "{e}");
    assert_eq!(e.notification.data, data, "{e}");
}

#[test]
fn header_errors() {
    let mut bad_marker = fixture("keepalive");
    bad_marker[3] = 0;
    assert_reset(
        &bad_marker,
        ErrorCode::MessageHeader(HeaderSubcode::ConnectionNotSynchronized),
        &[],
    );
    // KEEPALIVE must be exactly 19 octets.
    let mut ka = header(20, 4);
    ka.push(0);
    assert_reset(
        &ka,
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
        &[0, 20],
    );
    assert_reset(
        &header(18, 4),
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
        &[0, 18],
    );
    assert_reset(
        &header(19, 9),
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageType),
        &[9],
    );
    // OPEN shorter than 29 octets.
    let mut open = header(28, 1);
    open.extend_from_slice(&[0; 9]);
    assert_reset(
        &open,
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
        &[0, 28],
    );
    // Length field disagrees with the octets given.
    let mut ka2 = fixture("keepalive");
    ka2.push(0);
    assert_reset(
        &ka2,
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
        &[0, 19],
    );
    assert_reset(
        &[0xff; 5],
        ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
        &[0, 5],
    );
}

#[test]
fn open_errors() {
    let mut bytes = fixture("open_minimal");
    bytes[19] = 3;
    assert_reset(
        &bytes,
        ErrorCode::Open(OpenSubcode::UnsupportedVersionNumber),
        &[0, 4],
    );
    // Optional parameter type 1 (deprecated authentication).
    let mut o = header(19 + 10 + 3, 1);
    o.extend_from_slice(&[4, 0xfc, 0, 0, 90, 198, 18, 0, 1, 3, 1, 1, 0]);
    let len = o.len() as u16;
    o[16..18].copy_from_slice(&len.to_be_bytes());
    assert_reset(
        &o,
        ErrorCode::Open(OpenSubcode::UnsupportedOptionalParameter),
        &[],
    );
    // Optional parameters length runs past the message.
    let mut o = fixture("open_minimal");
    o[28] = 5;
    assert_reset(&o, ErrorCode::Open(OpenSubcode::Unspecific), &[]);
}

#[test]
fn update_session_reset_errors() {
    // Withdrawn length larger than the message.
    let mut u = update_msg(&[], &[], &[]);
    u[19..21].copy_from_slice(&[0, 9]);
    assert_reset(
        &u,
        ErrorCode::Update(UpdateSubcode::MalformedAttributeList),
        &[],
    );
    // NLRI prefix length 33.
    assert_reset(
        &update_msg(&[], &mandatory(), &[33, 10, 0, 0, 0, 0]),
        ErrorCode::Update(UpdateSubcode::InvalidNetworkField),
        &[],
    );
    // Truncated withdrawn prefix.
    assert_reset(
        &update_msg(&[24, 10], &[], &[]),
        ErrorCode::Update(UpdateSubcode::InvalidNetworkField),
        &[],
    );
    // Unrecognised well-known attribute (optional bit clear), data = the attribute.
    let unk = [0x40, 77, 1, 9];
    let attrs = [&mandatory()[..], &unk].concat();
    assert_reset(
        &update_msg(&[], &attrs, &NLRI),
        ErrorCode::Update(UpdateSubcode::UnrecognizedWellKnownAttribute),
        &unk,
    );
    // MP_REACH_NLRI for an unsupported family.
    let mp = [0x80, 14, 5, 0, 1, 128, 0, 0];
    assert_reset(
        &update_msg(&[], &mp, &[]),
        ErrorCode::Update(UpdateSubcode::OptionalAttributeError),
        &mp,
    );
    // MP_UNREACH_NLRI twice.
    let unr = [0x80, 15, 3, 0, 2, 1];
    assert_reset(
        &update_msg(&[], &[unr, unr].concat(), &[]),
        ErrorCode::Update(UpdateSubcode::MalformedAttributeList),
        &[],
    );
}

#[test]
fn update_treat_as_withdraw_errors() {
    let with = |attr: &[u8], mandatory_without: u8| {
        let mut attrs = Vec::new();
        for (t, a) in [(1u8, &ORIGIN_IGP[..]), (2, &AS_PATH_EMPTY), (3, &NEXT_HOP)] {
            if t != mandatory_without {
                attrs.extend_from_slice(a);
            }
        }
        attrs.extend_from_slice(attr);
        update_msg(&[16, 10, 9], &attrs, &NLRI)
    };
    let prefixes = ["10.9.0.0/16", "10.1.2.0/24"];
    use UpdateSubcode as U;
    // (the bad attribute, the mandatory attribute left out (0: none), the error, its data when
    // it is not the bad attribute itself).
    type Case<'a> = (&'a [u8], u8, UpdateSubcode, Option<&'a [u8]>);
    let cases: [Case; 8] = [
        (&[0x40, 1, 1, 7], 1, U::InvalidOriginAttribute, None),
        (&[0x40, 1, 2, 0, 0], 1, U::AttributeLengthError, None),
        (
            &[0x40, 2, 6, 2, 2, 0, 0, 0xfd, 0xe8],
            2,
            U::MalformedAsPath,
            None,
        ),
        (
            &[0x40, 3, 4, 224, 0, 0, 1],
            3,
            U::InvalidNextHopAttribute,
            None,
        ),
        // MED sent as well-known: flags error.
        (&[0x40, 4, 4, 0, 0, 0, 1], 0, U::AttributeFlagsError, None),
        (&[0xc0, 8, 3, 1, 2, 3], 0, U::AttributeLengthError, None),
        // NEXT_HOP missing: its type code is the data.
        (&[], 3, U::MissingWellKnownAttribute, Some(&[3])),
        // Last attribute overruns the attribute section: no data.
        (&[0x40, 5, 4, 0], 0, U::MalformedAttributeList, Some(&[])),
    ];
    for (attr, without, sub, data) in cases {
        let data = data.unwrap_or(attr);
        assert_withdraw(
            &with(attr, without),
            ErrorCode::Update(sub),
            data,
            &prefixes,
        );
    }
}

#[test]
fn attribute_discard_and_duplicates() {
    // Malformed AGGREGATOR and ATOMIC_AGGREGATE are dropped; a duplicate LOCAL_PREF is
    // ignored after the first.
    let attrs = [
        &mandatory()[..],
        &[0xc0, 7, 3, 1, 2, 3],
        &[0x40, 6, 1, 0],
        &[0x40, 5, 4, 0, 0, 0, 7],
        &[0x40, 5, 4, 0, 0, 0, 9],
    ]
    .concat();
    let Message::Update(u) = decode(&update_msg(&[], &attrs, &NLRI)).unwrap() else {
        panic!("not an update");
    };
    assert_eq!(u.attributes.len(), 4);
    assert_eq!(u.attributes[3], PathAttribute::LocalPref(7));
}

#[test]
fn framer_splits_stream_and_detects_errors() {
    let mut stream = fixture("keepalive");
    stream.extend(fixture("update_ipv4"));
    stream.extend(fixture("route_refresh"));
    let mut f = Framer::new();
    let mut frames = Vec::new();
    // Feed one octet at a time: frames appear only when complete.
    for b in &stream {
        f.push(&[*b]);
        while let Some(frame) = f.next_frame().unwrap() {
            frames.push(frame);
        }
    }
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[1], fixture("update_ipv4"));
    assert_eq!(f.buffered(), 0);
    assert_eq!(decode(&frames[2]).unwrap().type_code(), 5);

    let mut f = Framer::new();
    let mut bad = header(5000, 2);
    bad.extend_from_slice(&[0; 4]);
    f.push(&bad);
    let e = f.next_frame().unwrap_err();
    assert_eq!(
        e.notification,
        Notification::new(
            ErrorCode::MessageHeader(HeaderSubcode::BadMessageLength),
            5000u16.to_be_bytes().to_vec()
        )
    );
    // Stays failed.
    f.push(&fixture("keepalive"));
    assert!(f.next_frame().is_err());

    let mut f = Framer::new();
    let mut garbage = vec![0u8; 19];
    garbage[0] = 0xff;
    f.push(&garbage);
    assert_eq!(
        f.next_frame().unwrap_err().notification.error,
        ErrorCode::MessageHeader(HeaderSubcode::ConnectionNotSynchronized)
    );
}
