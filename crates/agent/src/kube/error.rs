//! What can go wrong when an ADD asks Kubernetes about its pod ([`AddError`]), and why one GET
//! of the API server gave no answer ([`ApiError`]). Each names what failed; its CNI code is
//! decided in one place, [`AddError::code`], from `tern_cni::code`.

use std::time::Duration;

use tern_cni::code;

/// Why one request to the API server gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The source has not connected yet.
    #[error("no client for the API server yet")]
    NoClient,
    /// No answer in time.
    #[error("GET timed out after {0:?}")]
    Timeout(Duration),
    /// 401 or 403: the agent's ClusterRole lacks `verb` on `resource`.
    #[error(
        "RBAC: ternd may not {verb} {resource} (HTTP {status}): {message}; grant the agent's \
         ClusterRole what manifests/tern.yaml grants on {resource} (here at least {verb})"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        status: u16,
        message: String,
    },
    /// Any other failure: unreachable, a server error, a body that does not decode.
    #[error("{verb} {resource}: {message}")]
    Failed {
        verb: &'static str,
        resource: &'static str,
        message: String,
    },
}

impl ApiError {
    /// A client error of `verb` on `resource`; a 401/403 is [`ApiError::Forbidden`].
    pub fn from_client(verb: &'static str, resource: &'static str, e: &::kube::Error) -> ApiError {
        match e {
            ::kube::Error::Api(s) if s.code == 401 || s.code == 403 => {
                ApiError::forbidden(verb, resource, s)
            }
            other => ApiError::Failed {
                verb,
                resource,
                message: other.to_string(),
            },
        }
    }

    /// The permission problem an API status of 401/403 says.
    pub fn forbidden(
        verb: &'static str,
        resource: &'static str,
        s: &::kube::core::Status,
    ) -> ApiError {
        ApiError::Forbidden {
            verb,
            resource,
            status: s.code,
            message: s.message.clone(),
        }
    }
}

/// A pod or namespace IPAM annotation that cannot be used: the annotation (`key`), its value
/// where one value is at fault, and the message naming the pod and the annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AnnotationError {
    /// The annotation at fault (the first of two that conflict).
    pub key: String,
    /// Its value, or the entry of it, at fault (`None` when two annotations conflict).
    pub value: Option<String>,
    /// The whole message (names the pod and the annotation).
    pub message: String,
}

impl AnnotationError {
    /// An error about annotation `key` (value `value`), said by `message`.
    pub fn new(key: &str, value: Option<&str>, message: String) -> AnnotationError {
        AnnotationError {
            key: key.to_string(),
            value: value.map(str::to_string),
            message,
        }
    }
}

/// Why the Kubernetes part of an ADD failed; refused before anything is created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    /// The pod is not cached and the API server cannot answer.
    #[error(
        "pod {namespace}/{name} is not in ternd's cache and the Kubernetes API server cannot \
         answer ({cause}); retry when it is reachable"
    )]
    PodUnreadable {
        namespace: String,
        name: String,
        cause: ApiError,
    },
    /// The API server has no such pod.
    #[error("pod {namespace}/{name} does not exist in the Kubernetes API server")]
    PodNotFound { namespace: String, name: String },
    /// The API server knows another incarnation of the pod.
    #[error(
        "pod {namespace}/{name}: the runtime asked for uid {asked} but the API server has uid \
         {found} (the pod was re-created); retry"
    )]
    PodRecreated {
        namespace: String,
        name: String,
        asked: String,
        found: String,
    },
    /// The namespace is not cached and the API server cannot answer.
    #[error(
        "namespace {namespace} is not in ternd's cache and the Kubernetes API server cannot \
         answer ({cause}); retry when it is reachable"
    )]
    NamespaceUnreadable { namespace: String, cause: ApiError },
    /// A bad or refused IPAM annotation.
    #[error(transparent)]
    BadAnnotation(#[from] AnnotationError),
    /// The IP pools a pool annotation names could not be read: the store is unavailable (or
    /// could not tell the outcome).
    #[error("reading IP pools for the pool annotations: {0}")]
    PoolsUnavailable(String),
    /// The IP pools could not be read for another reason.
    #[error("reading IP pools for the pool annotations: {0}")]
    PoolsUnreadable(String),
}

impl AddError {
    /// The CNI error code the runtime gets.
    pub fn code(&self) -> u32 {
        match self {
            AddError::PodUnreadable { .. }
            | AddError::PodNotFound { .. }
            | AddError::PodRecreated { .. }
            | AddError::NamespaceUnreadable { .. }
            | AddError::PoolsUnavailable(_) => code::TRY_AGAIN_LATER,
            AddError::BadAnnotation(_) => code::INVALID_CONFIG,
            AddError::PoolsUnreadable(_) => code::AGENT,
        }
    }

    /// The pools could not be read: unavailable (try again) or otherwise.
    pub fn pools(e: &tern_model::ModelError) -> AddError {
        use tern_store::StoreError::{Ambiguous, Unavailable};
        match e {
            tern_model::ModelError::Store(Unavailable(_) | Ambiguous(_)) => {
                AddError::PoolsUnavailable(e.to_string())
            }
            _ => AddError::PoolsUnreadable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_cni_code() {
        let (ns, name) = ("prod".to_string(), "web".to_string());
        let cause = ApiError::Timeout(Duration::from_secs(5));
        let unreachable = AddError::PodUnreadable {
            namespace: ns.clone(),
            name: name.clone(),
            cause: cause.clone(),
        };
        assert_eq!(unreachable.code(), 11);
        assert_eq!(
            unreachable.to_string(),
            "pod prod/web is not in ternd's cache and the Kubernetes API server cannot answer \
             (GET timed out after 5s); retry when it is reachable"
        );
        let missing = AddError::PodNotFound {
            namespace: ns.clone(),
            name: name.clone(),
        };
        assert_eq!(missing.code(), 11);
        let ns_gone = AddError::NamespaceUnreadable {
            namespace: ns,
            cause,
        };
        assert_eq!(ns_gone.code(), 11);
        let bad = AddError::from(AnnotationError::new(
            "tern.dev/ipAddrs",
            Some("x"),
            "pod prod/web: annotation tern.dev/ipAddrs: \"x\" is not an IP address".into(),
        ));
        assert_eq!(bad.code(), 7);
        assert!(bad.to_string().starts_with("pod prod/web: annotation"));
        let down = tern_model::ModelError::Store(tern_store::StoreError::Unavailable(
            "connection refused".into(),
        ));
        assert_eq!(AddError::pools(&down).code(), 11);
    }

    #[test]
    fn forbidden_names_verb_resource_and_status() {
        let s = ::kube::core::Status {
            code: 403,
            message: "pods is forbidden".into(),
            ..Default::default()
        };
        let e = ApiError::from_client("get", "pods", &::kube::Error::Api(Box::new(s)));
        assert_eq!(
            e.to_string(),
            "RBAC: ternd may not get pods (HTTP 403): pods is forbidden; grant the agent's \
             ClusterRole what manifests/tern.yaml grants on pods (here at least get)"
        );
    }
}
