//! Calico's IPAM annotations on pods and namespaces, and tern's own equivalents.
//!
//! | annotation (`cni.projectcalico.org/…` or `tern.dev/…`) | on            | effect                          |
//! |--------------------------------------------------------|---------------|---------------------------------|
//! | `ipv4pools`, `ipv6pools`: JSON list of pool names/CIDRs | pod, namespace | allocate only from those pools |
//! | `ipAddrs`: JSON list of addresses                      | pod           | exactly those addresses, by IPAM |
//! | `ipAddrsNoIpam`: JSON list of addresses                | pod           | those addresses, IPAM bypassed  |
//!
//! Semantics follow Calico's CNI plugin (`cni-plugin/pkg/k8s/k8s.go`):
//! - A pod's pool annotation overrides its namespace's, family by family; an empty value is
//!   no annotation.
//! - `ipAddrs` and `ipAddrsNoIpam` hold at most one IPv4 and one IPv6 address, may not be an
//!   empty list, and may not be used together.
//! - `ipAddrsNoIpam` works only when the network configuration enables
//!   `feature_control.ip_addrs_no_ipam`, and both need tern's own IPAM (not a delegated plugin).
//!
//! tern is stricter where Calico silently ignores: `ipAddrs`/`ipAddrsNoIpam` together with a
//! pool annotation on the pod is refused (the pools could not apply), and when the Calico and
//! the `tern.dev/` spelling of one annotation are both set they must agree. Every refusal is
//! CNI code 7 with a message naming the pod and the annotation.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::error::{AddError, AnnotationError};

/// Prefix of Calico's annotations.
pub const CALICO_PREFIX: &str = "cni.projectcalico.org/";
/// Prefix of tern's equivalents.
pub const TERN_PREFIX: &str = "tern.dev/";
/// Pools for IPv4 allocation.
pub const IPV4_POOLS: &str = "ipv4pools";
/// Pools for IPv6 allocation.
pub const IPV6_POOLS: &str = "ipv6pools";
/// Addresses taken from IPAM.
pub const IP_ADDRS: &str = "ipAddrs";
/// Addresses used without IPAM.
pub const IP_ADDRS_NO_IPAM: &str = "ipAddrsNoIpam";

const SUFFIXES: [&str; 4] = [IPV4_POOLS, IPV6_POOLS, IP_ADDRS, IP_ADDRS_NO_IPAM];

/// Largest annotation value read (a list of two addresses or a few pools is tiny; this bounds
/// what one object can make the agent keep).
const MAX_VALUE: usize = 4096;

/// The annotations of `all` this module reads, so the caches keep nothing else (values longer
/// than [`MAX_VALUE`] are kept truncated to a marker, so they still fail as malformed).
pub fn relevant(all: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let Some(all) = all else {
        return BTreeMap::new();
    };
    all.iter()
        .filter(|(k, _)| {
            let s = k
                .strip_prefix(CALICO_PREFIX)
                .or_else(|| k.strip_prefix(TERN_PREFIX));
            s.is_some_and(|s| SUFFIXES.contains(&s))
        })
        .map(|(k, v)| {
            let v = if v.len() > MAX_VALUE {
                format!("<{} bytes, more than {MAX_VALUE}>", v.len())
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// A value with the annotation it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotated<T> {
    /// The annotation's key (the Calico spelling when both spellings agree).
    pub key: String,
    /// True when the namespace's annotation, not the pod's, supplied it.
    pub from_namespace: bool,
    pub value: T,
}

/// What a pod's (and its namespace's) annotations ask of IPAM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIpam {
    pub v4_pools: Option<Annotated<Vec<String>>>,
    pub v6_pools: Option<Annotated<Vec<String>>>,
    pub ip_addrs: Option<Annotated<Vec<IpAddr>>>,
    pub ip_addrs_no_ipam: Option<Annotated<Vec<IpAddr>>>,
}

impl PodIpam {
    /// True when nothing is asked.
    pub fn is_empty(&self) -> bool {
        *self == PodIpam::default()
    }
}

/// Who an error is about: `pod <ns>/<name>`.
fn whose(ns: &str, pod: &str, key: &str, from_namespace: bool) -> String {
    if from_namespace {
        format!("pod {ns}/{pod}: annotation {key} of namespace {ns}")
    } else {
        format!("pod {ns}/{pod}: annotation {key}")
    }
}

/// The value of one annotation in its two spellings: `(key, value)`; an error when both are
/// set and say different things.
fn lookup(
    ann: &BTreeMap<String, String>,
    suffix: &str,
    who: &dyn Fn(&str) -> String,
) -> Result<Option<(String, String)>, AnnotationError> {
    let calico_key = format!("{CALICO_PREFIX}{suffix}");
    let tern_key = format!("{TERN_PREFIX}{suffix}");
    let get = |k: &str| ann.get(k).filter(|v| !v.trim().is_empty()).cloned();
    match (get(&calico_key), get(&tern_key)) {
        (None, None) => Ok(None),
        (Some(v), None) => Ok(Some((calico_key, v))),
        (None, Some(v)) => Ok(Some((tern_key, v))),
        (Some(c), Some(t)) => {
            // Compared as JSON, so spacing differences are no conflict.
            let same = match (
                serde_json::from_str::<serde_json::Value>(&c),
                serde_json::from_str::<serde_json::Value>(&t),
            ) {
                (Ok(a), Ok(b)) => a == b,
                _ => c == t,
            };
            if same {
                Ok(Some((calico_key, c)))
            } else {
                Err(AnnotationError::new(
                    &calico_key,
                    Some(&c),
                    format!(
                        "{} is {c:?} but {tern_key} is {t:?}: set one of them, or both to the same value",
                        who(&calico_key)
                    ),
                ))
            }
        }
    }
}

fn string_list(key_who: &str, v: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = serde_json::from_str(v).map_err(|e| {
        format!("{key_who}: {v:?} is not a JSON list of strings (e.g. [\"pool-a\"]): {e}")
    })?;
    if let Some(i) = list.iter().position(|s| s.trim().is_empty()) {
        return Err(format!("{key_who}: entry {i} is empty"));
    }
    Ok(list)
}

fn pools(
    ns: &str,
    pod: &str,
    pod_ann: &BTreeMap<String, String>,
    ns_ann: &BTreeMap<String, String>,
    suffix: &str,
) -> Result<Option<Annotated<Vec<String>>>, AnnotationError> {
    let on_pod = lookup(pod_ann, suffix, &|k| whose(ns, pod, k, false))?;
    let (found, from_namespace) = match on_pod {
        Some(f) => (Some(f), false),
        None => (lookup(ns_ann, suffix, &|k| whose(ns, pod, k, true))?, true),
    };
    let Some((key, v)) = found else {
        return Ok(None);
    };
    let list = string_list(&whose(ns, pod, &key, from_namespace), &v)
        .map_err(|m| AnnotationError::new(&key, Some(&v), m))?;
    if list.is_empty() {
        return Ok(None);
    }
    Ok(Some(Annotated {
        key,
        from_namespace,
        value: list,
    }))
}

fn addresses(
    ns: &str,
    pod: &str,
    pod_ann: &BTreeMap<String, String>,
    suffix: &str,
) -> Result<Option<Annotated<Vec<IpAddr>>>, AnnotationError> {
    let Some((key, v)) = lookup(pod_ann, suffix, &|k| whose(ns, pod, k, false))? else {
        return Ok(None);
    };
    let who = whose(ns, pod, &key, false);
    let bad = |value: &str, m: String| AnnotationError::new(&key, Some(value), m);
    let list: Vec<String> = serde_json::from_str(&v).map_err(|e| {
        bad(
            &v,
            format!("{who}: {v:?} is not a JSON list of addresses (e.g. [\"10.244.0.10\"]): {e}"),
        )
    })?;
    if list.is_empty() {
        return Err(bad(&v, format!("{who}: the list is empty")));
    }
    let mut out: Vec<IpAddr> = Vec::with_capacity(list.len());
    for s in &list {
        let ip: IpAddr = s.trim().parse().map_err(|_| {
            bad(
                s,
                format!("{who}: {s:?} is not an IP address (write it without a prefix length)"),
            )
        })?;
        if out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            return Err(bad(
                &v,
                format!(
                    "{who}: more than one IPv{} address (at most one IPv4 and one IPv6)",
                    if ip.is_ipv4() { 4 } else { 6 }
                ),
            ));
        }
        out.push(ip);
    }
    Ok(Some(Annotated {
        key,
        from_namespace: false,
        value: out,
    }))
}

/// Reads the IPAM annotations of pod `ns/pod` (`pod_ann`) and of its namespace (`ns_ann`).
/// The error names the pod and the annotation.
pub fn parse(
    ns: &str,
    pod: &str,
    pod_ann: &BTreeMap<String, String>,
    ns_ann: &BTreeMap<String, String>,
) -> Result<PodIpam, AnnotationError> {
    let p = PodIpam {
        v4_pools: pools(ns, pod, pod_ann, ns_ann, IPV4_POOLS)?,
        v6_pools: pools(ns, pod, pod_ann, ns_ann, IPV6_POOLS)?,
        ip_addrs: addresses(ns, pod, pod_ann, IP_ADDRS)?,
        ip_addrs_no_ipam: addresses(ns, pod, pod_ann, IP_ADDRS_NO_IPAM)?,
    };
    if let (Some(a), Some(b)) = (&p.ip_addrs, &p.ip_addrs_no_ipam) {
        return Err(AnnotationError::new(
            &a.key,
            None,
            format!(
                "pod {ns}/{pod}: annotations {} and {} cannot be used together",
                a.key, b.key
            ),
        ));
    }
    let fixed = p.ip_addrs.as_ref().or(p.ip_addrs_no_ipam.as_ref());
    let pod_pools = [&p.v4_pools, &p.v6_pools]
        .into_iter()
        .flatten()
        .find(|x| !x.from_namespace);
    if let (Some(f), Some(pl)) = (fixed, pod_pools) {
        return Err(AnnotationError::new(
            &f.key,
            None,
            format!(
                "pod {ns}/{pod}: annotations {} and {} cannot be used together (the addresses \
                 are fixed, so no pool is chosen)",
                f.key, pl.key
            ),
        ));
    }
    Ok(p)
}

/// An IP pool as an annotation may name it (by name or CIDR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRef {
    pub name: String,
    pub cidr: String,
    pub net: ipnet::IpNet,
}

/// The addresses of `requested` (runtimeConfig.ips, args.cni.ips, CNI_ARGS IP=), prefix
/// lengths dropped; unparsable entries are left to the allocator's own error.
fn requested_set(requested: &[String]) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = requested
        .iter()
        .filter_map(|s| s.split('/').next()?.trim().parse().ok())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Applies the annotations `p` of pod `ns/pod` to the IPAM part of an ADD (`delegated` when
/// another IPAM plugin already chose the addresses): pools and requested addresses go into
/// `req`; `Ok(Some(addresses))` for `ipAddrsNoIpam` (the caller uses them without IPAM).
/// `pools` lists the IP pools, read only when a pool annotation needs checking. A refused
/// annotation is [`AddError::BadAnnotation`] (CNI code 7), naming the pod and the annotation.
pub fn apply(
    ns: &str,
    pod: &str,
    p: &PodIpam,
    req: &mut tern_api::IpamRequest,
    delegated: bool,
    pools: &dyn Fn() -> Result<Vec<PoolRef>, AddError>,
) -> Result<Option<Vec<IpAddr>>, AddError> {
    let bad = |key: &str, value: String, m: String| {
        AddError::BadAnnotation(AnnotationError::new(key, Some(&value), m))
    };
    let fixed = p.ip_addrs.as_ref().or(p.ip_addrs_no_ipam.as_ref());
    if let Some(f) = fixed {
        if delegated {
            return Err(bad(
                &f.key,
                format!("{:?}", f.value),
                format!(
                    "{}: needs tern's IPAM (ipam type tern-ipam or calico-ipam); this network \
                 delegates IPAM to another plugin",
                    whose(ns, pod, &f.key, false)
                ),
            ));
        }
        let asked = requested_set(&req.requested);
        let mut want = f.value.clone();
        want.sort();
        if !asked.is_empty() && asked != want {
            return Err(bad(
                &f.key,
                format!("{:?}", f.value),
                format!(
                    "{}: asks for {:?} but the runtime requested {:?} (runtimeConfig.ips, \
                 args.cni.ips or CNI_ARGS IP=); use one of them",
                    whose(ns, pod, &f.key, false),
                    f.value,
                    req.requested
                ),
            ));
        }
    }
    if let Some(a) = &p.ip_addrs {
        req.requested = a.value.iter().map(|ip| ip.to_string()).collect();
        return Ok(None);
    }
    if let Some(a) = &p.ip_addrs_no_ipam {
        if !req.ip_addrs_no_ipam {
            return Err(bad(
                &a.key,
                format!("{:?}", a.value),
                format!(
                    "{}: requested feature is not enabled: ip_addrs_no_ipam (set \
                 \"feature_control\": {{\"ip_addrs_no_ipam\": true}} in the network \
                 configuration to allow addresses without IPAM)",
                    whose(ns, pod, &a.key, false)
                ),
            ));
        }
        return Ok(Some(a.value.clone()));
    }
    if p.v4_pools.is_none() && p.v6_pools.is_none() {
        return Ok(None);
    }
    if delegated {
        // As Calico: pool annotations only concern its own IPAM.
        log::debug!("pod {ns}/{pod}: pool annotations ignored, IPAM is delegated");
        return Ok(None);
    }
    let all = pools()?;
    for (family, a, slot) in [
        (4u8, &p.v4_pools, &mut req.ipv4_pools),
        (6u8, &p.v6_pools, &mut req.ipv6_pools),
    ] {
        let Some(a) = a else { continue };
        let of_family: Vec<&PoolRef> = all
            .iter()
            .filter(|x| x.net.addr().is_ipv4() == (family == 4))
            .collect();
        for w in &a.value {
            let w = w.trim();
            if !of_family
                .iter()
                .any(|x| x.name == w || x.cidr == w || x.net.to_string() == w)
            {
                let known: Vec<String> = of_family
                    .iter()
                    .map(|x| format!("{} ({})", x.name, x.net))
                    .collect();
                return Err(bad(
                    &a.key,
                    w.to_string(),
                    format!(
                        "{}: IPv{family} pool {w:?} does not exist (IPv{family} pools: {})",
                        whose(ns, pod, &a.key, a.from_namespace),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
        }
        // The annotation replaces the network configuration's pools, as in Calico.
        *slot = a.value.iter().map(|w| w.trim().to_string()).collect();
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Pod prod/web's annotations `kv` read, in a namespace without any.
    fn parse_pod(kv: &[(&str, &str)]) -> Result<PodIpam, AnnotationError> {
        parse("prod", "web", &m(kv), &m(&[]))
    }

    fn parse_pod_map(pod: &BTreeMap<String, String>) -> Result<PodIpam, String> {
        parse("prod", "web", pod, &m(&[])).map_err(|e| e.to_string())
    }

    #[test]
    fn pod_pools_override_the_namespace_per_family() {
        let ns = m(&[
            ("cni.projectcalico.org/ipv4pools", r#"["ns-v4"]"#),
            ("cni.projectcalico.org/ipv6pools", r#"["ns-v6"]"#),
        ]);
        let pod = m(&[("tern.dev/ipv4pools", r#"["pod-v4", "10.9.0.0/16"]"#)]);
        let p = parse("prod", "web", &pod, &ns).unwrap();
        let v4 = p.v4_pools.unwrap();
        assert_eq!(v4.value, vec!["pod-v4", "10.9.0.0/16"]);
        assert_eq!(v4.key, "tern.dev/ipv4pools");
        assert!(!v4.from_namespace);
        let v6 = p.v6_pools.unwrap();
        assert_eq!(v6.value, vec!["ns-v6"]);
        assert!(v6.from_namespace);
        // Empty values are no annotation (Calico's len() == 0).
        let p = parse(
            "prod",
            "web",
            &m(&[("cni.projectcalico.org/ipv4pools", "")]),
            &ns,
        )
        .unwrap();
        assert_eq!(p.v4_pools.unwrap().value, vec!["ns-v4"]);
        assert!(parse_pod(&[]).unwrap().is_empty());
    }

    #[test]
    fn addresses_parse_and_bad_ones_name_pod_and_annotation() {
        let p = parse_pod(&[(
            "cni.projectcalico.org/ipAddrs",
            r#"["10.244.1.7", "fd00::7"]"#,
        )])
        .unwrap();
        assert_eq!(
            p.ip_addrs.unwrap().value,
            vec![
                "10.244.1.7".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        for (ann, want) in [
            (
                ("cni.projectcalico.org/ipAddrs", "10.0.0.1"),
                "is not a JSON list",
            ),
            (("cni.projectcalico.org/ipAddrs", "[]"), "the list is empty"),
            (
                ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1/32"]"#),
                "is not an IP address",
            ),
            (
                ("tern.dev/ipAddrs", r#"["10.0.0.1", "10.0.0.2"]"#),
                "more than one IPv4",
            ),
            (
                ("cni.projectcalico.org/ipAddrsNoIpam", r#"["x"]"#),
                "is not an IP address",
            ),
            (("cni.projectcalico.org/ipv4pools", r#"[""]"#), "is empty"),
            (("cni.projectcalico.org/ipv6pools", "{}"), "JSON list"),
        ] {
            let e = parse_pod(&[ann]).unwrap_err();
            assert_eq!(e.key, ann.0, "{e}");
            assert!(e.value.is_some(), "{e}");
            let e = e.to_string();
            assert!(e.starts_with("pod prod/web: annotation "), "{e}");
            assert!(e.contains(ann.0), "{e} does not name {}", ann.0);
            assert!(e.contains(want), "{e} does not say {want}");
        }
        let e = parse(
            "prod",
            "web",
            &m(&[]),
            &m(&[("cni.projectcalico.org/ipv4pools", "[1]")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("of namespace prod"), "{e}");
    }

    #[test]
    fn conflicting_annotations_are_refused() {
        let both = m(&[
            ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#),
            ("cni.projectcalico.org/ipAddrsNoIpam", r#"["10.0.0.1"]"#),
        ]);
        let e = parse_pod_map(&both).unwrap_err();
        assert!(e.contains("cannot be used together"), "{e}");
        let with_pools = m(&[
            ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#),
            ("cni.projectcalico.org/ipv4pools", r#"["a"]"#),
        ]);
        let e = parse_pod_map(&with_pools).unwrap_err();
        assert!(
            e.contains("ipAddrs and cni.projectcalico.org/ipv4pools"),
            "{e}"
        );
        // A namespace default of pools does not block a pod's fixed address.
        let p = parse(
            "prod",
            "web",
            &m(&[("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#)]),
            &m(&[("cni.projectcalico.org/ipv4pools", r#"["a"]"#)]),
        )
        .unwrap();
        assert!(p.ip_addrs.is_some());
        // Both spellings: equal is fine, different is refused.
        let same = m(&[
            ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#),
            ("tern.dev/ipAddrs", r#"[ "10.0.0.1" ]"#),
        ]);
        assert!(parse_pod_map(&same).is_ok());
        let differ = m(&[
            ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#),
            ("tern.dev/ipAddrs", r#"["10.0.0.2"]"#),
        ]);
        let e = parse_pod_map(&differ).unwrap_err();
        assert!(e.contains("tern.dev/ipAddrs"), "{e}");
        assert!(e.starts_with("pod prod/web"), "{e}");
    }

    fn add_req() -> tern_api::IpamRequest {
        tern_api::IpamRequest {
            ipv4_pools: vec!["cfg".into()],
            ..Default::default()
        }
    }

    fn pool_list() -> Result<Vec<PoolRef>, AddError> {
        Ok(vec![
            PoolRef {
                name: "blue".into(),
                cidr: "10.1.0.0/16".into(),
                net: "10.1.0.0/16".parse().unwrap(),
            },
            PoolRef {
                name: "v6".into(),
                cidr: "fd00::/48".into(),
                net: "fd00::/48".parse().unwrap(),
            },
        ])
    }

    #[test]
    fn apply_sets_pools_and_addresses() {
        let mut req = add_req();
        let p = parse(
            "prod",
            "web",
            &m(&[]),
            &m(&[(
                "cni.projectcalico.org/ipv4pools",
                r#"["blue", "10.1.0.0/16"]"#,
            )]),
        )
        .unwrap();
        assert_eq!(
            apply("prod", "web", &p, &mut req, false, &pool_list),
            Ok(None)
        );
        assert_eq!(req.ipv4_pools, vec!["blue", "10.1.0.0/16"]);

        // An unknown pool, or one of the other family, is code 7 naming pod and annotation.
        for v in [r#"["nope"]"#, r#"["v6"]"#] {
            let p = parse_pod(&[("tern.dev/ipv4pools", v)]).unwrap();
            let e = apply("prod", "web", &p, &mut add_req(), false, &pool_list).unwrap_err();
            let (code, msg) = (e.code(), e.to_string());
            assert_eq!(code, 7);
            assert!(
                msg.starts_with("pod prod/web: annotation tern.dev/ipv4pools: IPv4 pool"),
                "{msg}"
            );
            assert!(
                msg.contains("does not exist (IPv4 pools: blue (10.1.0.0/16))"),
                "{msg}"
            );
        }

        let mut req = add_req();
        let p = parse_pod(&[("cni.projectcalico.org/ipAddrs", r#"["10.1.0.9"]"#)]).unwrap();
        let no_pools = || -> Result<Vec<PoolRef>, AddError> { panic!("pools read") };
        assert_eq!(
            apply("prod", "web", &p, &mut req, false, &no_pools),
            Ok(None)
        );
        assert_eq!(req.requested, vec!["10.1.0.9"]);
        // The runtime asking for another address is a conflict; the same one is not.
        let mut req = add_req();
        req.requested = vec!["10.1.0.9/32".into()];
        assert!(apply("prod", "web", &p, &mut req, false, &no_pools).is_ok());
        req.requested = vec!["10.1.0.8".into()];
        assert_eq!(
            apply("prod", "web", &p, &mut req, false, &no_pools)
                .unwrap_err()
                .code(),
            7
        );
        // Delegated IPAM cannot honour fixed addresses.
        let mut req = add_req();
        let e = apply("prod", "web", &p, &mut req, true, &no_pools).unwrap_err();
        let (code, msg) = (e.code(), e.to_string());
        assert_eq!(code, 7);
        assert!(msg.contains("delegates IPAM"), "{msg}");
    }

    #[test]
    fn no_ipam_is_gated() {
        let p = parse_pod(&[("cni.projectcalico.org/ipAddrsNoIpam", r#"["192.0.2.5"]"#)]).unwrap();
        let mut req = add_req();
        let e = apply("prod", "web", &p, &mut req, false, &pool_list).unwrap_err();
        let (code, msg) = (e.code(), e.to_string());
        assert_eq!(code, 7);
        assert!(
            msg.contains("annotation cni.projectcalico.org/ipAddrsNoIpam")
                && msg.contains("requested feature is not enabled: ip_addrs_no_ipam"),
            "{msg}"
        );
        req.ip_addrs_no_ipam = true;
        assert_eq!(
            apply("prod", "web", &p, &mut req, false, &pool_list),
            Ok(Some(vec!["192.0.2.5".parse().unwrap()]))
        );
    }

    #[test]
    fn only_relevant_annotations_are_kept() {
        let all = m(&[
            ("cni.projectcalico.org/ipAddrs", r#"["10.0.0.1"]"#),
            ("tern.dev/ipv4pools", r#"["a"]"#),
            ("tern.dev/other", "x"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{...}"),
        ]);
        let r = relevant(Some(&all));
        assert_eq!(r.len(), 2);
        let long = m(&[("cni.projectcalico.org/ipAddrs", &"x".repeat(5000))]);
        let r = relevant(Some(&long));
        assert!(r["cni.projectcalico.org/ipAddrs"].len() < 100);
    }
}
