//! The API server client: making it, one GET on the source's runtime ([`Inner::get`]) and
//! what its errors say (a missing permission names the verb and resource).

use super::*;

impl Inner {
    /// Runs one GET on the source's runtime and waits for it (at most [`GET_TIMEOUT`]): the
    /// API's answer, or why there is none (no client yet, timed out).
    pub(super) fn get<T, F, Fut>(&self, request: F) -> Result<Result<T, ::kube::Error>, ApiError>
    where
        F: FnOnce(::kube::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ::kube::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let (Some(h), Some(c)) = (self.handle.get(), self.client.get()) else {
            return Err(ApiError::NoClient);
        };
        let fut = request(c.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        h.spawn(async move {
            let r = tokio::time::timeout(GET_TIMEOUT, fut).await;
            let _ = tx.send(r);
        });
        match rx.recv_timeout(GET_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) | Err(_) => Err(ApiError::Timeout(GET_TIMEOUT)),
        }
    }

    pub(super) fn get_pod(&self, ns: &str, name: &str) -> Result<Option<PodInfo>, ApiError> {
        let (ns, name) = (ns.to_string(), name.to_string());
        let got = self
            .get(move |c| async move { Api::<SlimPod>::namespaced(c, &ns).get_opt(&name).await })?;
        match got {
            Ok(p) => Ok(p.map(|p| PodInfo::from_pod(&p))),
            Err(e) => Err(ApiError::from_client("get", PODS, &e)),
        }
    }

    /// One GET of a namespace's metadata; a namespace that does not exist has no annotations.
    pub(super) fn get_namespace_annotations(
        &self,
        ns: &str,
    ) -> Result<BTreeMap<String, String>, ApiError> {
        let name = ns.to_string();
        let got = self
            .get(move |c| async move { Api::<Namespace>::all(c).get_metadata_opt(&name).await })?;
        match got {
            Ok(m) => Ok(m
                .map(|m| annotations::relevant(m.metadata.annotations.as_ref()))
                .unwrap_or_default()),
            Err(e) => Err(ApiError::from_client("get", NAMESPACES, &e)),
        }
    }
}

/// A client error as one line; a 401/403 names the verb and resource the agent lacks.
pub(super) fn describe_client_error(
    verb: &'static str,
    resource: &'static str,
    e: &::kube::Error,
) -> String {
    ApiError::from_client(verb, resource, e).to_string()
}

pub(super) fn rbac_message(
    verb: &'static str,
    resource: &'static str,
    s: &::kube::core::Status,
) -> String {
    ApiError::forbidden(verb, resource, s).to_string()
}

/// Classifies a watcher error: `Some(message)` when it is a permission problem.
pub(super) fn rbac_problem(resource: &'static str, e: &watcher::Error) -> Option<String> {
    let (verb, status) = match e {
        watcher::Error::InitialListFailed(::kube::Error::Api(s)) => ("list", s),
        watcher::Error::WatchStartFailed(::kube::Error::Api(s))
        | watcher::Error::WatchFailed(::kube::Error::Api(s)) => ("watch", s),
        watcher::Error::WatchError(s) => ("watch", s),
        _ => return None,
    };
    (status.code == 401 || status.code == 403).then(|| rbac_message(verb, resource, status))
}

/// A client of the API server of `kubeconfig` (`None`: kube-rs's inference order).
pub(crate) async fn make_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<::kube::Client, String> {
    let mut cfg = match kubeconfig {
        Some(p) => {
            let kc = ::kube::config::Kubeconfig::read_from(p).map_err(|e| e.to_string())?;
            ::kube::Config::from_custom_kubeconfig(
                kc,
                &::kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?
        }
        None => ::kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    cfg.connect_timeout = Some(Duration::from_secs(5));
    ::kube::Client::try_from(cfg).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_verb_and_resource() {
        let s = ::kube::core::Status {
            code: 403,
            message: "pods is forbidden: User \"tern\" cannot list resource \"pods\"".into(),
            ..Default::default()
        };
        let e = watcher::Error::InitialListFailed(::kube::Error::Api(Box::new(s)));
        let m = rbac_problem(PODS, &e).expect("a permission problem");
        assert!(m.contains("may not list pods"), "{m}");
        assert!(m.contains("HTTP 403"), "{m}");
        let gone = ::kube::core::Status {
            code: 410,
            ..Default::default()
        };
        assert!(rbac_problem(PODS, &watcher::Error::WatchError(Box::new(gone))).is_none());
    }
}
