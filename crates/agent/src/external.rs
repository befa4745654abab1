//! Policy objects from a source other than the store: the sink a source (the Kubernetes one,
//! [`crate::kube`]) feeds them into. The policy engine implements it and the root hands it to
//! the source, so that neither service names the other.

use tern_model::{Kind, Resource};

/// Why the sink refused or could not apply a change (the policy engine's error, boxed).
pub type ExternalError = Box<dyn std::error::Error + Send + Sync>;

/// Where a source's objects (namespaces, NetworkPolicies) go: held beside the store's and
/// applied over them at every resync.
pub trait ExternalObjects: Send + Sync {
    /// Replaces every held object of `kinds` by `objects` (a source's full list) in one
    /// transaction; with `flush` false only the desired state changes (before the first apply,
    /// so the table left by the previous agent keeps enforcing until then).
    fn replace(
        &self,
        kinds: &[Kind],
        objects: Vec<Resource>,
        flush: bool,
    ) -> Result<(), ExternalError>;

    /// Adds or replaces one object.
    fn apply(&self, r: Resource) -> Result<(), ExternalError>;

    /// Removes one object.
    fn remove(&self, kind: Kind, namespace: Option<&str>, name: &str) -> Result<(), ExternalError>;

    /// The objects held now (the Kubernetes source snapshots them to disk).
    fn objects(&self) -> Vec<Resource>;

    /// The objects held now as one JSON array (the snapshot's form), without copying them.
    fn objects_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&self.objects())
    }
}
