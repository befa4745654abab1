//! Decodes tens of thousands of random and mutated byte strings: the decoder and framer must
//! return (never panic), and whatever decodes must re-encode to something that decodes equal.

use tern_bgp::codec::{CodecOptions, Framer, decode_with, encode_with};
use tern_testkit::rng::Rng;

fn seeds() -> Vec<Vec<u8>> {
    let dir = format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let digits: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect();
        out.push(
            (0..digits.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
                .collect(),
        );
    }
    out
}

fn check(bytes: &[u8], opts: CodecOptions) -> bool {
    match decode_with(bytes, opts) {
        Ok(m) => {
            let again = encode_with(&m, opts);
            assert_eq!(decode_with(&again, opts).as_ref(), Ok(&m), "{bytes:02x?}");
            true
        }
        Err(_) => false,
    }
}

#[test]
fn random_and_mutated_inputs_never_panic() {
    let seeds = seeds();
    assert!(seeds.len() >= 10);
    let mut rng = Rng(0x7e2d_b6a1_0c55_e3f1);
    let mut decoded = 0;
    for i in 0..60_000 {
        let opts = CodecOptions {
            four_octet_as: i % 3 != 0,
        };
        let mut m = seeds[rng.below(seeds.len())].clone();
        match i % 4 {
            // Pure noise behind a valid marker, with a consistent length field half the time.
            0 => {
                let n = 19 + rng.below(200);
                m = (0..n).map(|_| rng.next_u64() as u8).collect();
                m[..16].fill(0xff);
                if rng.below(2) == 0 {
                    m[16..18].copy_from_slice(&(n as u16).to_be_bytes());
                }
            }
            // Flip a few octets past the marker.
            1 | 2 => {
                for _ in 0..1 + rng.below(4) {
                    let at = 16 + rng.below(m.len() - 16);
                    m[at] = rng.next_u64() as u8;
                }
            }
            // Truncate or extend, then fix the length field so the body is parsed.
            _ => {
                let n = 19 + rng.below(m.len() + 8);
                m.resize(n, rng.next_u64() as u8);
                m[16..18].copy_from_slice(&(n as u16).to_be_bytes());
            }
        }
        if check(&m, opts) {
            decoded += 1;
        }
        let mut f = Framer::new();
        f.push(&m);
        while let Ok(Some(frame)) = f.next_frame() {
            let _ = decode_with(&frame, opts);
        }
    }
    // The mutations must reach past the header checks often enough to mean something.
    assert!(decoded > 5_000, "only {decoded} inputs decoded");
}

// ---------------------------------------------------------------------------------------------
// proptest campaign: structured valid messages, their mutations, and the framer. The case count
// is bounded (PROPTEST_CASES overrides it) so that CI time stays fixed.

mod campaign {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use ipnet::{IpNet, Ipv4Net, Ipv6Net};
    use proptest::collection::vec;
    use proptest::prelude::*;
    use tern_bgp::codec::*;

    /// Cases per property unless PROPTEST_CASES says otherwise.
    const CASES: u32 = 2_000;

    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CASES);
        ProptestConfig {
            cases,
            max_shrink_iters: 2_000,
            // Failures are turned into regression tests by hand (see `regressions` below).
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    fn v4net() -> impl Strategy<Value = Ipv4Net> {
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, l)| Ipv4Net::new(Ipv4Addr::from(a), l).unwrap().trunc())
    }

    fn v6net() -> impl Strategy<Value = IpNet> {
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, l)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), l).unwrap().trunc()))
    }

    fn unicast_v4() -> impl Strategy<Value = Ipv4Addr> {
        (1u32..0xe000_0000).prop_map(|a| Ipv4Addr::from(a.max(0x0100_0000)))
    }

    fn segment(four: bool) -> impl Strategy<Value = AsSegment> {
        let asn = if four {
            any::<u32>().boxed()
        } else {
            any::<u16>().prop_map(u32::from).boxed()
        };
        (
            prop_oneof![Just(SegmentType::AsSet), Just(SegmentType::AsSequence)],
            vec(asn, 1..6),
        )
            .prop_map(|(kind, asns)| AsSegment { kind, asns })
    }

    /// Optional attributes, at most one of each type (the decoder drops repeats).
    fn optional(four: bool) -> impl Strategy<Value = Vec<PathAttribute>> {
        let agg_as = if four {
            any::<u32>().boxed()
        } else {
            any::<u16>().prop_map(u32::from).boxed()
        };
        (
            proptest::option::of(any::<u32>().prop_map(PathAttribute::MultiExitDisc)),
            proptest::option::of(any::<u32>().prop_map(PathAttribute::LocalPref)),
            any::<bool>(),
            proptest::option::of((agg_as, any::<u32>()).prop_map(|(asn, a)| {
                PathAttribute::Aggregator {
                    asn,
                    address: a.into(),
                }
            })),
            proptest::option::of(vec(any::<u32>(), 1..8).prop_map(PathAttribute::Communities)),
            proptest::option::of(any::<u32>().prop_map(|a| PathAttribute::OriginatorId(a.into()))),
            proptest::option::of(
                vec(any::<u32>().prop_map(Ipv4Addr::from), 1..5)
                    .prop_map(PathAttribute::ClusterList),
            ),
            proptest::option::of(
                (
                    vec(v6net(), 0..6),
                    any::<u128>(),
                    proptest::option::of(any::<u128>()),
                )
                    .prop_map(|(nlri, nh, ll)| {
                        let mut next_hops = vec![IpAddr::V6(nh.into())];
                        next_hops.extend(ll.map(|l| IpAddr::V6(l.into())));
                        PathAttribute::MpReach(MpReach {
                            family: Family::IPV6_UNICAST,
                            next_hops,
                            nlri,
                        })
                    }),
            ),
            proptest::option::of(vec(v6net(), 0..6).prop_map(|withdrawn| {
                PathAttribute::MpUnreach(MpUnreach {
                    family: Family::IPV6_UNICAST,
                    withdrawn,
                })
            })),
            proptest::option::of(
                (16u8..=255, vec(any::<u8>(), 0..300), any::<bool>()).prop_map(
                    |(t, value, partial)| {
                        PathAttribute::Unknown(UnknownAttribute {
                            flags: FLAG_OPTIONAL
                                | FLAG_TRANSITIVE
                                | if partial { FLAG_PARTIAL } else { 0 },
                            type_code: t,
                            value,
                        })
                    },
                ),
            ),
        )
            .prop_map(
                |(med, lp, atomic, agg, comm, orig, cl, reach, unreach, unknown)| {
                    let mut v: Vec<PathAttribute> =
                        [med, lp, agg, comm, orig, cl, reach, unreach, unknown]
                            .into_iter()
                            .flatten()
                            .collect();
                    if atomic {
                        v.push(PathAttribute::AtomicAggregate);
                    }
                    v
                },
            )
    }

    /// A valid UPDATE: the mandatory attributes whenever something is announced.
    fn update(four: bool) -> impl Strategy<Value = Update> {
        (
            vec(v4net(), 0..12),
            vec(v4net(), 0..12),
            prop_oneof![
                Just(Origin::Igp),
                Just(Origin::Egp),
                Just(Origin::Incomplete)
            ],
            vec(segment(four), 0..4),
            unicast_v4(),
            optional(four),
            any::<bool>(),
        )
            .prop_map(|(withdrawn, nlri, origin, path, nh, mut opt, shuffle)| {
                let announces =
                    !nlri.is_empty() || opt.iter().any(|a| matches!(a, PathAttribute::MpReach(_)));
                let mut attributes = Vec::new();
                if announces || !opt.is_empty() {
                    attributes.push(PathAttribute::Origin(origin));
                    attributes.push(PathAttribute::AsPath(path));
                    attributes.push(PathAttribute::NextHop(nh));
                }
                if shuffle {
                    opt.reverse();
                }
                attributes.extend(opt);
                Update {
                    withdrawn,
                    attributes,
                    nlri,
                }
            })
    }

    fn family() -> impl Strategy<Value = Family> {
        prop_oneof![
            Just(Family::IPV4_UNICAST),
            Just(Family::IPV6_UNICAST),
            (any::<u16>(), any::<u8>()).prop_map(|(afi, safi)| Family { afi, safi }),
        ]
    }

    fn capability() -> impl Strategy<Value = Capability> {
        prop_oneof![
            family().prop_map(Capability::Multiprotocol),
            Just(Capability::RouteRefresh),
            (
                any::<bool>(),
                0u8..8,
                0u16..4096,
                vec((family(), any::<bool>(), 0u8..0x80), 0..4)
            )
                .prop_map(|(restart_state, other_flags, restart_time, fs)| {
                    Capability::GracefulRestart(GracefulRestart {
                        restart_state,
                        other_flags,
                        restart_time,
                        families: fs
                            .into_iter()
                            .map(|(family, forwarding_preserved, other_flags)| {
                                GracefulRestartFamily {
                                    family,
                                    forwarding_preserved,
                                    other_flags,
                                }
                            })
                            .collect(),
                    })
                }),
            (any::<u8>(), vec(any::<u8>(), 0..20))
                .prop_filter("a code the decoder knows", |(c, _)| ![1, 2, 64, 65]
                    .contains(c))
                .prop_map(|(code, value)| Capability::Unknown { code, value }),
        ]
    }

    fn open() -> impl Strategy<Value = Open> {
        (
            any::<u32>(),
            prop_oneof![Just(0u16), 3u16..=u16::MAX],
            1u32..,
            vec(capability(), 0..6),
        )
            .prop_map(|(asn, hold, id, caps)| Open::new(asn, hold, Ipv4Addr::from(id), caps))
    }

    fn message(four: bool) -> impl Strategy<Value = Message> {
        prop_oneof![
            4 => update(four).prop_map(Message::Update),
            2 => open().prop_map(Message::Open),
            1 => Just(Message::Keepalive),
            1 => (1u8..=6, any::<u8>(), vec(any::<u8>(), 0..64)).prop_map(|(c, s, data)| {
                Message::Notification(Notification::new(ErrorCode::from_wire(c, s), data))
            }),
            1 => (family(), any::<u8>())
                .prop_map(|(family, subtype)| Message::RouteRefresh(RouteRefresh { family, subtype })),
        ]
    }

    /// One edit of an encoded message.
    #[derive(Debug, Clone)]
    enum Mutation {
        /// Overwrite the octet at (index modulo length) past the marker.
        Set(usize, u8),
        /// Insert octets there.
        Insert(usize, Vec<u8>),
        /// Remove up to n octets there.
        Remove(usize, usize),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
            1 => (any::<usize>(), vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
            1 => (any::<usize>(), 1usize..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
        ]
    }

    fn mutate(bytes: &mut Vec<u8>, m: &Mutation, fix_length: bool) {
        let body = bytes.len().saturating_sub(16).max(1);
        match m {
            Mutation::Set(i, b) => {
                let at = 16 + i % body;
                if at < bytes.len() {
                    bytes[at] = *b;
                }
            }
            Mutation::Insert(i, b) => {
                let at = (16 + i % body).min(bytes.len());
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Remove(i, n) => {
                let at = (16 + i % body).min(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
        }
        if fix_length && bytes.len() >= 18 {
            let n = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
            bytes[16..18].copy_from_slice(&n.to_be_bytes());
        }
    }

    /// Whatever decodes re-encodes to bytes that decode to the same message (and the codec
    /// never panics: a panic fails the property).
    fn assert_stable(bytes: &[u8], opts: CodecOptions) -> Result<bool, TestCaseError> {
        match decode_with(bytes, opts) {
            Ok(m) => {
                let again = encode_with(&m, opts);
                prop_assert!(
                    again.len() <= MAX_MESSAGE_LEN,
                    "re-encoded beyond 4096: {m:?}"
                );
                prop_assert_eq!(decode_with(&again, opts), Ok(m));
                Ok(true)
            }
            Err(e) => {
                // Every error carries a NOTIFICATION that itself encodes and decodes.
                let n = Message::Notification(e.notification.clone());
                let wire = encode(&n);
                prop_assert!(
                    decode(&wire).is_ok(),
                    "notification of {e:?} does not decode"
                );
                Ok(false)
            }
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// decode ∘ encode is the identity on valid messages (both AS widths).
        #[test]
        fn valid_messages_round_trip(
            (four, m) in any::<bool>().prop_flat_map(|f| (Just(f), message(f))),
        ) {
            let opts = CodecOptions { four_octet_as: four };
            let wire = encode_with(&m, opts);
            prop_assume!(wire.len() <= MAX_MESSAGE_LEN);
            prop_assert_eq!(decode_with(&wire, opts), Ok(m), "wire {:02x?}", wire);
        }

        /// Mutated valid messages (length field fixed up or not) never panic, and what still
        /// decodes is stable.
        #[test]
        fn mutated_messages_never_panic(
            four in any::<bool>(),
            m in message(true),
            muts in vec(mutation(), 1..6),
            fix in any::<bool>(),
        ) {
            let opts = CodecOptions { four_octet_as: four };
            let mut wire = encode_with(&m, opts);
            for mu in &muts {
                mutate(&mut wire, mu, fix);
            }
            assert_stable(&wire, opts)?;
        }

        /// Random bodies behind a valid header never panic.
        #[test]
        fn random_bodies_never_panic(typ in 0u8..8, body in vec(any::<u8>(), 0..4200), four in any::<bool>()) {
            let mut wire = vec![0xff; 16];
            let n = u16::try_from(body.len() + 19).unwrap_or(u16::MAX);
            wire.extend_from_slice(&n.to_be_bytes());
            wire.push(typ);
            wire.extend_from_slice(&body);
            assert_stable(&wire, CodecOptions { four_octet_as: four })?;
        }

        /// The framer yields exactly the messages of a stream however it is cut, and stops
        /// at the first bad header instead of buffering without bound.
        #[test]
        fn framer_reassembles_any_chunking(
            msgs in vec(message(true), 1..6),
            cuts in vec(1usize..300, 1..40),
            garbage in vec(any::<u8>(), 0..64),
        ) {
            let frames: Vec<Vec<u8>> = msgs
                .iter()
                .map(encode)
                .filter(|w| w.len() <= MAX_MESSAGE_LEN)
                .collect();
            let mut stream: Vec<u8> = frames.concat();
            stream.extend_from_slice(&garbage);
            let mut f = Framer::new();
            let mut got = Vec::new();
            let mut at = 0;
            let mut cut = cuts.iter().cycle();
            let mut failed = false;
            while at < stream.len() && !failed {
                let n = (*cut.next().unwrap()).min(stream.len() - at);
                f.push(&stream[at..at + n]);
                at += n;
                loop {
                    match f.next_frame() {
                        Ok(Some(frame)) => got.push(frame),
                        Ok(None) => break,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            prop_assert!(got.len() >= frames.len(), "{} of {} frames", got.len(), frames.len());
            prop_assert_eq!(&got[..frames.len()], &frames[..]);
            for extra in &got[frames.len()..] {
                assert_stable(extra, CodecOptions::default())?;
            }
        }
    }
}
