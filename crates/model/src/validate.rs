//! Validation helpers every kind shares: DNS-1123 names, label keys and values, CIDRs, MAC
//! addresses, port names and list bounds. A leaf (it imports only [`crate::limits`]): the kind
//! modules call it, it calls none of them.
//!
//! Kind checks report a [`FieldError`], `(field path, reason)`; [`crate::Resource::validate`]
//! wraps it into [`crate::ModelError::Invalid`] with the kind and name.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::limits::{MAX_LABEL_NAME_BYTES, MAX_LABEL_PREFIX_BYTES, MAX_LABEL_VALUE_BYTES};

/// A failed check: the field path (`spec.cidr`) and the reason.
pub type FieldError = (String, String);

/// A [`FieldError`] for `field`.
pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    (field.into(), reason.into())
}

/// Checks that no item of the list at `field` is listed twice (`[Ingress, Ingress]`).
pub(crate) fn listed_once<T: PartialEq + std::fmt::Debug>(
    items: &[T],
    field: &str,
) -> Result<(), FieldError> {
    for (i, t) in items.iter().enumerate() {
        if items[..i].contains(t) {
            return Err(invalid(field, format!("{t:?} is listed twice")));
        }
    }
    Ok(())
}

/// Checks that `name` is a DNS-1123 subdomain: at most 253 characters of lowercase
/// alphanumerics, `-` and `.`, starting and ending with an alphanumeric.
pub fn validate_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let first = name.chars().next().unwrap_or('-');
    let last = name.chars().last().unwrap_or('-');
    if !name.chars().all(ok_char) || !alnum(first) || !alnum(last) {
        return Err(format!(
            "{name:?} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Checks a label key as Kubernetes does: an optional prefix (a DNS-1123 subdomain of at most
/// [`MAX_LABEL_PREFIX_BYTES`]) and `/`, then a name of at most [`MAX_LABEL_NAME_BYTES`]
/// alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric. Annotation keys
/// follow the same rule.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.len() > MAX_LABEL_PREFIX_BYTES {
            return Err(format!(
                "key prefix is {} bytes, the limit is {MAX_LABEL_PREFIX_BYTES}",
                p.len()
            ));
        }
        validate_dns1123_subdomain(p).map_err(|e| format!("key prefix {e}"))?;
    }
    if name.is_empty() {
        return Err(format!("key {key:?} has an empty name"));
    }
    if name.len() > MAX_LABEL_NAME_BYTES {
        return Err(format!(
            "key name is {} bytes, the limit is {MAX_LABEL_NAME_BYTES}",
            name.len()
        ));
    }
    if !qualified_name_chars(name) {
        return Err(format!(
            "key {key:?} is not a valid label key (alphanumerics, '-', '_' and '.', starting \
             and ending with an alphanumeric, after an optional DNS prefix and '/')"
        ));
    }
    Ok(())
}

/// Checks a label value as Kubernetes does: empty, or at most [`MAX_LABEL_VALUE_BYTES`]
/// alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_LABEL_VALUE_BYTES {
        return Err(format!(
            "value is {} bytes, the limit is {MAX_LABEL_VALUE_BYTES}",
            value.len()
        ));
    }
    if !value.is_empty() && !qualified_name_chars(value) {
        return Err(format!(
            "value {value:?} is not a valid label value (alphanumerics, '-', '_' and '.', \
             starting and ending with an alphanumeric)"
        ));
    }
    Ok(())
}

fn qualified_name_chars(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    s.chars().all(ok)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Checks an IANA service name as Kubernetes does for named ports: 1-15 characters of
/// lowercase letters, digits and `-`, at least one letter, no leading, trailing or double `-`
/// (the rule the plugin applies to `args.cni.ports`, so both are one function).
pub fn validate_port_name(name: &str) -> Result<(), String> {
    if tern_cni::conf::is_iana_svc_name(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid port name (1-15 lowercase letters, digits and '-', with at \
             least one letter)"
        ))
    }
}

/// Quotes at most the first few dozen characters of a user string in an error.
pub(crate) fn short(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        format!("{:?}...", s.chars().take(MAX).collect::<String>())
    }
}

/// Fails when `items` has more than `limit` entries, naming the field and the limit.
pub(crate) fn at_most<T>(
    items: &[T],
    limit: usize,
    field: &str,
    what: &str,
) -> Result<(), FieldError> {
    if items.len() > limit {
        return Err((
            field.to_string(),
            format!("{} {what}, the limit is {limit}", items.len()),
        ));
    }
    Ok(())
}

/// The link-local range of `net`'s family.
pub(crate) fn link_local(net: &IpNet) -> IpNet {
    match net {
        IpNet::V4(_) => "169.254.0.0/16".parse().expect("valid literal"),
        IpNet::V6(_) => "fe80::/10".parse().expect("valid literal"),
    }
}

/// Whether two networks share an address.
pub(crate) fn nets_overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Parses a CIDR that must be a network address (no host bits), as pools and reservations
/// require.
pub(crate) fn parse_network_cidr(cidr: &str) -> Result<IpNet, String> {
    let net: IpNet = cidr
        .parse()
        .map_err(|_| format!("{cidr:?} is not a CIDR (expected e.g. 10.244.0.0/16)"))?;
    if net.trunc() != net {
        return Err(format!(
            "{cidr} is not a network address; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

/// A CIDR of a policy rule; host bits are allowed (Kubernetes accepts `10.0.0.1/24` and means
/// its network).
pub(crate) fn parse_rule_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("{s:?} is not a CIDR (expected e.g. 10.0.0.0/16)"))
}

/// Whether `s` is an IP address or a CIDR.
pub(crate) fn ip_or_cidr(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok() || s.parse::<IpNet>().is_ok()
}

/// Whether `m` is a MAC address written as six `:`-separated hex pairs.
pub(crate) fn valid_mac(m: &str) -> bool {
    let parts: Vec<_> = m.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}
