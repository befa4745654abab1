//! Host-side veth names: which name an attachment's veth has on the node. Here rather than in
//! `tern-linux` because more than the kernel side needs it: the Kubernetes datastore derives
//! a pod's WorkloadEndpoint (its `interfaceName`) from the Pod alone.

use sha1::{Digest, Sha1};

/// Default host veth name prefix.
pub const DEFAULT_VETH_PREFIX: &str = "tern";

/// Linux interface name limit (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// Whether `s` is a Kubernetes namespace name (an RFC 1123 DNS label): 1-63 of `[a-z0-9-]`,
/// starting and ending alphanumeric. Such a name contains no `.`, which is what makes
/// Calico's `"<namespace>.<pod>"` unambiguous.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Appends `field` length-prefixed (`<decimal length>:<bytes>`), so a sequence of fields
/// parses back in exactly one way whatever bytes the fields hold.
fn push_field(out: &mut Vec<u8>, field: &str) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field.as_bytes());
}

/// The byte string whose SHA-1 names an attachment's host veth. Injective over
/// (pod or container ID, interface), with an empty interface meaning `eth0`:
///
/// - a pod's `eth0` when the namespace is a DNS label: `"<namespace>.<pod>"`, Calico's
///   preimage (unchanged, so existing pods keep their veth name). The namespace holds no
///   `.`, so the first `.` splits it off unambiguously; the string starts with `[a-z0-9]`.
/// - everything else: `"/"` then a tag (`p` pod, `c` container ID) then length-prefixed fields
///   (`p`: namespace, pod, ifname; `c`: container ID, ifname). It starts with `/`, which the
///   first form never does, and the tag and length prefixes make it parse one way only.
///
/// So distinct attachments never share a preimage; the name then carries 44 bits of the
/// digest (as Calico's does), which is what a collision would take.
pub fn veth_name_preimage(pod: Option<(&str, &str)>, container_id: &str, ifname: &str) -> Vec<u8> {
    let ifname = if ifname.is_empty() { "eth0" } else { ifname };
    let mut out = Vec::new();
    match pod {
        Some((ns, name)) if ifname == "eth0" && is_dns_label(ns) => {
            out.extend_from_slice(ns.as_bytes());
            out.push(b'.');
            out.extend_from_slice(name.as_bytes());
        }
        Some((ns, name)) => {
            out.extend_from_slice(b"/p");
            push_field(&mut out, ns);
            push_field(&mut out, name);
            push_field(&mut out, ifname);
        }
        None => {
            out.extend_from_slice(b"/c");
            push_field(&mut out, container_id);
            push_field(&mut out, ifname);
        }
    }
    out
}

/// Host-side veth name of one attachment: `prefix` + the first 11 hex digits of the SHA-1 of
/// [`veth_name_preimage`], truncated to 15 bytes. A pod's `eth0` keeps Calico's
/// `sha1("<namespace>.<pod>")`; a pod's other interfaces and container-ID-only attachments are
/// hashed over a length-prefixed encoding, so no two attachments share a preimage (a pod named
/// `x.net1` and pod `x`'s `net1` used to share one).
pub fn attachment_veth_name(
    prefix: &str,
    pod: Option<(&str, &str)>,
    container_id: &str,
    ifname: &str,
) -> String {
    name_from_digest(prefix, &veth_name_preimage(pod, container_id, ifname))
}

/// Host-side veth name of an attachment's `eth0` ([`attachment_veth_name`] with `eth0`).
pub fn host_veth_name(prefix: &str, pod: Option<(&str, &str)>, container_id: &str) -> String {
    attachment_veth_name(prefix, pod, container_id, "eth0")
}

fn name_from_digest(prefix: &str, preimage: &[u8]) -> String {
    let digest = hex::encode(Sha1::digest(preimage));
    let mut name = String::with_capacity(MAX_IFNAME_LEN);
    name.push_str(prefix);
    name.push_str(&digest[..11]);
    let mut cut = MAX_IFNAME_LEN.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    name
}

/// Hex digits of the digest a pod veth name carries after the prefix.
pub const NAME_DIGITS: usize = 11;
