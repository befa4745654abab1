//! `ternctl policy promote NAME [-n NS] [--kind KIND]`: a staged policy becomes its enforced
//! kind. `stagedAction: Set` writes the enforced policy of the same name (StagedNetworkPolicy
//! -> NetworkPolicy, StagedGlobalNetworkPolicy -> GlobalNetworkPolicy,
//! StagedKubernetesNetworkPolicy -> KubernetesNetworkPolicy) with the staged spec, labels and
//! annotations; `Delete` deletes the enforced one. Then the staged policy is deleted.
//!
//! On the Kubernetes datastore a Kubernetes NetworkPolicy is the cluster's own
//! `networking.k8s.io/v1` object: promote writes (server-side apply) or deletes it through the
//! API server, which every agent's Kubernetes source enforces; a Delete also removes a record
//! of that name `ternctl apply` may have written into tern's store.
//!
//! Two writes, in this order, each idempotent: a crash between them leaves the staged policy
//! beside its effect, and running promote again writes the same enforced policy (or finds the
//! deleted one gone, which is success) and finishes by deleting the staged one. The other order
//! could lose the staged policy before its effect.

use anyhow::{Context, bail};
use tern_model::{
    Document, Kind, ObjectMeta, Resource, StagedAction, StagedGlobalNetworkPolicy,
    StagedKubernetesNetworkPolicy, StagedNetworkPolicy,
};
use tern_store::Store;
use tern_store::kube::KubeStore;

use crate::commands::delete::DEFAULT_NAMESPACE;

/// The staged kinds, in the order a lookup without `--kind` tries them.
pub const STAGED_KINDS: [Kind; 3] = [
    Kind::StagedNetworkPolicy,
    Kind::StagedGlobalNetworkPolicy,
    Kind::StagedKubernetesNetworkPolicy,
];

/// What promoting one staged policy does.
#[derive(Debug, Clone, PartialEq)]
pub enum Promotion {
    /// Write this enforced policy.
    Set(Box<Resource>),
    /// Delete the enforced policy of this kind, namespace and name.
    Delete {
        kind: Kind,
        namespace: Option<String>,
        name: String,
    },
}

/// The enforced policy's metadata: the staged one's name, namespace, labels and annotations
/// (not its resource version, UID or creation time, which are the staged object's).
fn enforced_meta(m: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        ..ObjectMeta::default()
    }
}

fn document<S>(kind: Kind, meta: &ObjectMeta, spec: S) -> Document<S> {
    Document {
        api_version: kind.api_version().to_string(),
        kind: kind.document_kind().to_string(),
        metadata: enforced_meta(meta),
        spec,
    }
}

/// What promoting `r` does; an error for a resource that is not a staged policy.
pub fn promotion(r: &Resource) -> anyhow::Result<Promotion> {
    let Some(kind) = r.kind().enforced_of_staged() else {
        bail!(
            "{} {:?} is not a staged policy (StagedNetworkPolicy, StagedGlobalNetworkPolicy, \
             StagedKubernetesNetworkPolicy)",
            r.kind(),
            r.name()
        );
    };
    let action = match r {
        Resource::StagedNetworkPolicy(StagedNetworkPolicy { spec, .. }) => spec.staged_action,
        Resource::StagedGlobalNetworkPolicy(StagedGlobalNetworkPolicy { spec, .. }) => {
            spec.0.staged_action
        }
        Resource::StagedKubernetesNetworkPolicy(StagedKubernetesNetworkPolicy { spec, .. }) => {
            spec.staged_action
        }
        _ => unreachable!("a staged kind"),
    };
    if action == StagedAction::Delete {
        return Ok(Promotion::Delete {
            kind,
            namespace: kind
                .namespaced()
                .then(|| r.namespace().unwrap_or_default().to_string()),
            name: r.name().to_string(),
        });
    }
    let meta = r.metadata();
    Ok(Promotion::Set(Box::new(match r {
        Resource::StagedNetworkPolicy(p) => document(kind, meta, p.spec.enforced()).into(),
        Resource::StagedGlobalNetworkPolicy(p) => document(
            kind,
            meta,
            tern_model::GlobalNetworkPolicySpec(p.spec.0.enforced()),
        )
        .into(),
        Resource::StagedKubernetesNetworkPolicy(p) => {
            document(kind, meta, p.spec.enforced()).into()
        }
        _ => unreachable!("a staged kind"),
    })))
}

/// Finds the staged policy `name`: of `kind` when given, else of whichever staged kind has
/// one of that name (namespaced kinds in `namespace`, default `default`); several is an
/// error asking for `--kind`.
pub fn find(
    store: &dyn Store,
    kind: Option<Kind>,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Resource> {
    if let Some(k) = kind
        && !k.is_staged()
    {
        bail!(
            "--kind {k}: not a staged kind (StagedNetworkPolicy, StagedGlobalNetworkPolicy, \
             StagedKubernetesNetworkPolicy)"
        );
    }
    let ns = namespace.unwrap_or(DEFAULT_NAMESPACE);
    let mut found = Vec::new();
    for k in STAGED_KINDS
        .into_iter()
        .filter(|k| kind.is_none_or(|w| w == *k))
    {
        let at = k.namespaced().then_some(ns);
        if let Some(r) = tern_model::get_resource(store, k, at, name)
            .with_context(|| format!("cannot read {k} {name:?}"))?
        {
            found.push(r);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => match kind {
            Some(k) if !k.namespaced() => bail!("{k} {name:?} not found"),
            Some(k) => bail!("{k} {name:?} not found in namespace {ns:?}"),
            None => bail!("no staged policy {name:?} (namespace {ns:?} for the namespaced kinds)"),
        },
        _ => bail!(
            "{name:?} names a staged policy of several kinds ({}); pass --kind",
            found
                .iter()
                .map(|r| r.kind().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Promotes the staged policy `r`: its effect first, then its deletion (see the module
/// documentation). Returns what was done, for the user. `kube`: the API server, when the
/// datastore is the Kubernetes one (a Kubernetes NetworkPolicy is then written there as a
/// `networking.k8s.io` object).
pub fn promote(
    store: &dyn Store,
    kube: Option<&KubeStore>,
    r: &Resource,
) -> anyhow::Result<String> {
    let what = match promotion(r)? {
        Promotion::Set(enforced) => {
            let id = describe(enforced.kind(), enforced.namespace(), enforced.name());
            match (kube, &*enforced) {
                (Some(k), Resource::K8sNetworkPolicy(p)) => {
                    let mut p = p.clone();
                    tern_model::Spec::fill_defaults(&mut p.spec);
                    Resource::K8sNetworkPolicy(p.clone()).validate()?;
                    let doc = serde_json::to_value(&p).context("encoding the policy")?;
                    k.apply_network_policy(
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        &p.metadata.name,
                        &doc,
                    )
                    .with_context(|| format!("writing {id} through the API server"))?;
                }
                _ => {
                    tern_model::put_resource(store, &enforced)
                        .with_context(|| format!("writing {id}"))?;
                }
            }
            format!("{id} written")
        }
        Promotion::Delete {
            kind,
            namespace,
            name,
        } => {
            let id = describe(kind, namespace.as_deref(), &name);
            // Already gone (a promote that stopped after this step) is success.
            let mut gone = tern_model::delete_resource(store, kind, namespace.as_deref(), &name)
                .with_context(|| format!("deleting {id}"))?;
            if let (Some(k), Kind::K8sNetworkPolicy) = (kube, kind) {
                gone |= k
                    .delete_network_policy(namespace.as_deref().unwrap_or_default(), &name)
                    .with_context(|| format!("deleting {id} through the API server"))?;
            }
            if gone {
                format!("{id} deleted")
            } else {
                format!("{id} was already absent")
            }
        }
    };
    let staged = describe(r.kind(), r.namespace(), r.name());
    tern_model::delete_resource(store, r.kind(), r.namespace(), r.name())
        .with_context(|| format!("{what}, but deleting {staged} failed; run promote again"))?;
    Ok(format!("{staged} promoted: {what}"))
}

fn describe(kind: Kind, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(yaml: &str) -> Resource {
        tern_model::parse_documents(yaml, "s.yaml")
            .unwrap()
            .remove(0)
    }

    /// Each staged kind promotes to its enforced kind with its spec and labels, not its
    /// resource version; a Delete names the enforced policy.
    #[test]
    fn each_staged_kind_promotes_to_its_enforced_kind() {
        let r = one(
            "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: deny, namespace: shop, labels: {a: b}, resourceVersion: '7'}\nspec:\n  podSelector: {}\n",
        );
        let Promotion::Set(set) = promotion(&r).unwrap() else {
            panic!("not a Set")
        };
        let Resource::K8sNetworkPolicy(p) = *set else {
            panic!("not a Kubernetes NetworkPolicy")
        };
        assert_eq!(p.api_version, "networking.k8s.io/v1");
        assert_eq!(p.kind, "NetworkPolicy");
        assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(p.metadata.labels["a"], "b");
        assert_eq!(p.metadata.resource_version, None);
        assert_eq!(p.spec.policy_types, [tern_model::PolicyType::Ingress]);
        let r = one(
            "apiVersion: tern.dev/v1\nkind: StagedGlobalNetworkPolicy\nmetadata: {name: g}\nspec:\n  order: 3\n  selector: all()\n  ingress: [{action: Deny}]\n",
        );
        let Promotion::Set(set) = promotion(&r).unwrap() else {
            panic!("not a Set")
        };
        let Resource::GlobalNetworkPolicy(g) = *set else {
            panic!("not a GlobalNetworkPolicy")
        };
        assert_eq!(g.spec.0.order, Some(3.0));
        Resource::GlobalNetworkPolicy(g).validate().unwrap();
        let r = one(
            "apiVersion: tern.dev/v1\nkind: StagedNetworkPolicy\nmetadata: {name: old, namespace: shop}\nspec: {stagedAction: Delete}\n",
        );
        assert_eq!(
            promotion(&r).unwrap(),
            Promotion::Delete {
                kind: Kind::NetworkPolicy,
                namespace: Some("shop".into()),
                name: "old".into()
            }
        );
        let r = one("apiVersion: tern.dev/v1\nkind: Namespace\nmetadata: {name: x}\n");
        assert!(
            promotion(&r)
                .unwrap_err()
                .to_string()
                .contains("not a staged policy")
        );
    }
}
