//! Every bound tern puts on input that enters from users, tenants or the store, in one place.
//!
//! Each limit exists so that no document, however hostile, can overflow a stack, take
//! quadratic time or hold unbounded memory in `ternctl` or in every node's `ternd`. The table
//! in `docs/limits.md` lists the same values with where each is enforced and the error it
//! gives; keep the two in step.

/// Longest selector text in bytes (`spec.selector`, `nodeSelector`, rule selectors), as for
/// other validated strings. Enforced by [`crate::Selector::parse`] itself, so text that
/// reaches the parser from anywhere (ternctl, or a document written straight into the store)
/// is refused before it is lexed.
pub const MAX_SELECTOR_BYTES: usize = 4096;

/// Deepest nesting of a selector: each `(` and each `!` is one level. Real selectors nest
/// two or three levels; the bound keeps the recursive-descent parser, evaluation, printing and
/// drop of the tree within a few kilobytes of stack. `&&`/`||` chains are flat lists and do not
/// count.
pub const MAX_SELECTOR_DEPTH: usize = 32;

/// Largest YAML/JSON stream (`ternctl apply -f`, one file or stdin) in bytes.
pub const MAX_STREAM_BYTES: usize = 8 * 1024 * 1024;

/// Most documents in one stream (`---`-separated documents plus the items of `kind: List`
/// documents and JSON arrays).
pub const MAX_STREAM_DOCUMENTS: usize = 1000;

/// Deepest nesting in a YAML/JSON document: flow collections (`[`, `{`) plus block
/// indentation levels (mappings and sequences). Checked by a linear pre-scan before the YAML
/// parser sees the text, so that parsing stays linear-time and within the stack.
pub const MAX_DOCUMENT_DEPTH: usize = 64;

/// Largest resource in bytes, as its stored JSON encoding (about what etcd accepts in one
/// request by default, and what Kubernetes objects stay under). Checked on write and again
/// when `ternd` decodes a value read from the store.
pub const MAX_RESOURCE_BYTES: usize = 1024 * 1024;

/// Most rules in one direction (`ingress` or `egress`) of a tern policy. Like every count
/// limit below, checked on write only (`put_resource`, `ternctl`): a daemon enforces a stored
/// policy over it rather than drop the policy's protection. Kubernetes NetworkPolicies have no
/// count limits, as in the API server; the resource size and
/// [`MAX_EXPANDED_RULES_PER_DIRECTION`] bound them.
pub const MAX_RULES_PER_DIRECTION: usize = 1000;

/// Most port entries in one tern rule (`destination.ports`), write-time only.
pub const MAX_PORTS_PER_RULE: usize = 1024;

/// Most CIDRs in one list of a tern rule (`nets`, `notNets`), write-time only.
pub const MAX_NETS_PER_RULE: usize = 4096;

/// Most normalised rules one direction of a Kubernetes NetworkPolicy expands to: a rule
/// allows every (peer, port) pair and the compiler copies each peer's `ipBlock.except` into
/// every pair, so it costs `peers x ports x (1 + except)`. The one policy bound that is also
/// enforced on read ([`crate::Resource::from_stored`]), since it is what keeps compiling
/// linear in the stored size; far above what real policies use.
pub const MAX_EXPANDED_RULES_PER_DIRECTION: usize = 100_000;

/// Longest label key prefix (the DNS subdomain before `/`), as Kubernetes validates it.
pub const MAX_LABEL_PREFIX_BYTES: usize = 253;

/// Longest label key name (after the optional prefix) and longest label value, as
/// Kubernetes validates them.
pub const MAX_LABEL_NAME_BYTES: usize = 63;

/// Longest label value (Kubernetes' limit).
pub const MAX_LABEL_VALUE_BYTES: usize = 63;

/// Total size of a resource's annotations (keys plus values), Kubernetes' limit.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
