//! Collision-free identities of an attachment: the IPAM handle (and the journal file name
//! derived from it).
//!
//! An attachment is the tuple (network, container ID, interface). Calico's handle
//! `<network>.<containerID>` (tern appended `.<ifname>` for interfaces other than `eth0`) is
//! not injective: the CNI spec allows dots in both the network name and the container ID, and
//! Linux allows them in interface names, so `("a.b", "c", "eth0")` and `("a", "b.c", "eth0")`,
//! or `("n", "x.net1", "eth0")` and `("n", "x", "net1")`, shared a handle and one DEL released
//! both.
//!
//! The handle is now `esc(network) ":" escdot(ifname) "." esc(containerID)`, where `esc`
//! percent-encodes `%`, `:`, `/`, whitespace and control characters (and nothing else) and
//! `escdot` also `.`. It is injective: neither escape emits `:`, so the first `:` ends the
//! network part; `escdot` emits no `.`, so the first `.` after it ends the interface part; the
//! rest is the container ID part; and each part decodes to exactly one string
//! ([`decode_handle`] is the inverse; the tests check `decode(encode(t)) == t` over random
//! tuples full of dots, separators and escapes).
//!
//! Why this order: spec-valid names (network and container ID `[A-Za-z0-9][A-Za-z0-9_.-]*`)
//! and ordinary interface names are never escaped, so handles stay readable
//! (`k8s-pod-network:eth0.3f2a…`), and the container ID stays the part after the handle's last
//! `.` (as in Calico's form) whenever it has no dot itself: the compact block format stores
//! such a container ID as "the handle's suffix" instead of a second string, and readers of
//! every version decode that the same way. No handle contains `/`, so it is one store key
//! segment.
//!
//! An empty interface name means `eth0` (as everywhere in tern: the runtime always names the
//! interface for ADD/DEL/CHECK; only older callers left it empty).
//!
//! Handles written before this change are recognised by [`legacy_handle`]; the agent looks
//! them up next to the new form (accepting a legacy handle only when its allocations carry the
//! attachment's container ID and interface) so a pod added before the upgrade is still released
//! by its DEL.

/// Separator after the network part of a handle; never produced by [`escape`].
pub const HANDLE_SEP: char = ':';

/// Separator after the interface part; never produced when escaping an interface name.
const IFNAME_SEP: char = '.';

/// The interface an empty `ifname` stands for.
fn normalize_ifname(ifname: &str) -> &str {
    if ifname.is_empty() { "eth0" } else { ifname }
}

fn needs_escape(c: char, dot: bool) -> bool {
    matches!(c, '%' | ':' | '/') || (dot && c == '.') || c.is_whitespace() || c.is_control()
}

fn escape_with(s: &str, dot: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if needs_escape(c, dot) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Percent-encodes (UTF-8 bytes, upper-case hex) the characters that would make a handle
/// ambiguous or unsafe as a key segment or file name; every other character is kept.
pub fn escape(s: &str) -> String {
    escape_with(s, false)
}

fn unescape_with(s: &str, dot: bool) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let raw = s.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
            {
                return None;
            }
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    let out = String::from_utf8(bytes).ok()?;
    // Only the canonical encoding decodes: a kept character written as %XX (or a character
    // that must be escaped written as itself) would give two spellings of one string.
    (escape_with(&out, dot) == s).then_some(out)
}

/// Inverse of [`escape`]; None for text [`escape`] cannot have produced.
pub fn unescape(s: &str) -> Option<String> {
    unescape_with(s, false)
}

/// The IPAM handle of (network, container ID, interface); see the module documentation.
pub fn encode_handle(network: &str, container_id: &str, ifname: &str) -> String {
    format!(
        "{}{HANDLE_SEP}{}{IFNAME_SEP}{}",
        escape(network),
        escape_with(normalize_ifname(ifname), true),
        escape(container_id)
    )
}

/// The (network, container ID, interface) a handle of [`encode_handle`] was made from; None
/// for any other string (legacy handles, gateway handles, manual ones).
pub fn decode_handle(handle: &str) -> Option<(String, String, String)> {
    let (n, rest) = handle.split_once(HANDLE_SEP)?;
    let (i, c) = rest.split_once(IFNAME_SEP)?;
    Some((unescape(n)?, unescape(c)?, unescape_with(i, true)?))
}

/// Every handle of `network` starts with this (and no handle of another network does, since
/// an escaped network name contains no separator).
pub fn handle_prefix(network: &str) -> String {
    format!("{}{HANDLE_SEP}", escape(network))
}

/// The handle tern wrote before handles were made unambiguous: `<network>.<containerID>`, with
/// `.<ifname>` appended for interfaces other than `eth0`. Only for looking up allocations made
/// before the upgrade; never written.
pub fn legacy_handle(network: &str, container_id: &str, ifname: &str) -> String {
    let ifname = normalize_ifname(ifname);
    if ifname == "eth0" {
        format!("{network}.{container_id}")
    } else {
        format!("{network}.{container_id}.{ifname}")
    }
}

/// True when `a` and `b` name the same interface (an empty name is `eth0`).
pub fn same_ifname(a: &str, b: &str) -> bool {
    normalize_ifname(a) == normalize_ifname(b)
}

/// A journal file name for the attachment: its escaped handle (unique per attachment) with
/// `.json`, or, when that would exceed a file name's length or start with a dot (which marks
/// temporary files), `h-<128-bit FNV-1a digest>.json`. Both are free of `/`.
pub fn journal_file_name(network: &str, container_id: &str, ifname: &str) -> String {
    let handle = encode_handle(network, container_id, ifname);
    if handle.len() <= 200 && !handle.starts_with('.') {
        return format!("{handle}.json");
    }
    format!("h-{:032x}.json", digest128(handle.as_bytes()))
}

/// FNV-1a over 128 bits: a stable digest (same across builds and versions, unlike std's
/// hasher) for over-long journal names, where only an accidental collision matters.
fn digest128(data: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    data.iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spec_valid_names_are_not_escaped() {
        assert_eq!(
            encode_handle("k8s-pod-network", "abc.1_x-y", "eth0"),
            "k8s-pod-network:eth0.abc.1_x-y"
        );
        assert_eq!(encode_handle("n", "c", ""), "n:eth0.c");
        assert_eq!(encode_handle("n", "c", "net1.5"), "n:net1%2E5.c");
        assert_eq!(handle_prefix("a.b"), "a.b:");
    }

    #[test]
    fn the_observed_collisions_are_gone() {
        type Attachment = (&'static str, &'static str, &'static str);
        let encode = |(n, c, i): Attachment| encode_handle(n, c, i);
        let legacy = |(n, c, i): Attachment| legacy_handle(n, c, i);
        // Pod x.net1's eth0 and pod x's net1; dotted network vs dotted container ID: one
        // legacy handle each, two handles now.
        for (a, b) in [
            (("n", "x.net1", "eth0"), ("n", "x", "net1")),
            (("a.b", "c", "eth0"), ("a", "b.c", "eth0")),
        ] {
            assert_eq!(legacy(a), legacy(b), "{a:?} {b:?}");
            assert_ne!(encode(a), encode(b), "{a:?} {b:?}");
        }
        // Separators and escapes inside parts cannot forge another tuple.
        for (a, b) in [
            (("a:b", "c", "d"), ("a", "b:c", "d")),
            (("a%3Ab", "c", "d"), ("a:b", "c", "d")),
        ] {
            assert_ne!(encode(a), encode(b), "{a:?} {b:?}");
        }
        assert!(!encode_handle("a/b", "c/d", "e/f").contains('/'));
    }

    #[test]
    fn legacy_form_is_the_old_one() {
        assert_eq!(
            legacy_handle("k8s-pod-network", "abc", "eth0"),
            "k8s-pod-network.abc"
        );
        assert_eq!(
            legacy_handle("k8s-pod-network", "abc", ""),
            "k8s-pod-network.abc"
        );
        assert_eq!(legacy_handle("n", "abc", "net1"), "n.abc.net1");
        assert_eq!(decode_handle("k8s-pod-network.abc"), None);
    }

    #[test]
    fn non_canonical_escapes_do_not_decode() {
        assert_eq!(unescape("%61"), None, "'a' is never escaped");
        assert_eq!(unescape("%3a"), None, "lower-case hex is not canonical");
        assert_eq!(unescape("%3"), None);
        assert_eq!(unescape("%3A"), Some(":".into()));
        assert_eq!(decode_handle("a:b"), None);
        assert_eq!(decode_handle("a:b.c:d"), None);
        assert_eq!(
            decode_handle("a:b.c"),
            Some(("a".into(), "c".into(), "b".into()))
        );
    }

    #[test]
    fn journal_names_are_distinct_and_safe() {
        let a = journal_file_name("n", "x.net1", "eth0");
        let b = journal_file_name("n", "x", "net1");
        assert_ne!(a, b);
        let long = journal_file_name(&"n".repeat(300), "c", "eth0");
        assert!(long.starts_with("h-") && long.len() < 64, "{long}");
        assert!(!journal_file_name(".hidden", "c", "eth0").starts_with('.'));
        assert!(!journal_file_name("a/../b", "c", "eth0").contains('/'));
    }

    /// Parts drawn to hit the dangerous characters often: dots, separators, escapes.
    fn part() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just('.'),
                Just(':'),
                Just('%'),
                Just('/'),
                Just('a'),
                Just('0'),
                Just('-'),
                Just(' '),
                any::<char>(),
            ],
            0..12,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// decode ∘ encode is the identity, so encode is injective.
        #[test]
        fn handle_round_trips(n in part(), c in part(), i in part()) {
            let h = encode_handle(&n, &c, &i);
            let want_if = if i.is_empty() { "eth0".to_string() } else { i.clone() };
            prop_assert_eq!(decode_handle(&h), Some((n.clone(), c.clone(), want_if)));
            prop_assert!(h.starts_with(&handle_prefix(&n)));
            prop_assert!(!h.contains('/'));
            // The compact block format's rule: a dot-free, unescaped container ID is the part
            // after the handle's last '.'.
            if !c.contains('.') && escape(&c) == c {
                prop_assert_eq!(h.rsplit_once('.').map(|(_, x)| x), Some(c.as_str()));
            }
        }

        /// Distinct tuples never share a handle, nor a journal file.
        #[test]
        fn distinct_tuples_distinct_handles(
            a in (part(), part(), part()),
            b in (part(), part(), part()),
        ) {
            let norm = |t: &(String, String, String)| {
                (t.0.clone(), t.1.clone(), normalize_ifname(&t.2).to_string())
            };
            if norm(&a) != norm(&b) {
                prop_assert_ne!(encode_handle(&a.0, &a.1, &a.2), encode_handle(&b.0, &b.1, &b.2));
                prop_assert_ne!(
                    journal_file_name(&a.0, &a.1, &a.2),
                    journal_file_name(&b.0, &b.1, &b.2)
                );
            }
        }

        /// A handle of one network never carries another network's prefix.
        #[test]
        fn prefixes_separate_networks(n in part(), m in part(), c in part(), i in part()) {
            if n != m {
                prop_assert!(!encode_handle(&n, &c, &i).starts_with(&handle_prefix(&m)));
            }
        }
    }
}
