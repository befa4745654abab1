//! The cluster identity on a real etcd (issue 10, "etcd flavour"): the ID is created once even
//! when several agents race, and a non-empty etcd without it is told apart from an empty one
//! (the agent refuses the first while it has pods, see `tern_agent::identity`).

use std::sync::Arc;
use tern_store::etcd::harness::EtcdServer;
use tern_store::{Store, keys};

#[test]
fn cluster_id_on_etcd_is_created_once_and_its_loss_is_visible() {
    let etcd = EtcdServer::start().expect("start etcd (Debian package etcd-server)");
    let store: Arc<dyn Store> = Arc::new(etcd.store().unwrap().with_namespace("/cid"));
    assert!(tern_store::is_empty(&*store).unwrap());
    assert_eq!(tern_store::read_cluster_id(&*store).unwrap(), None);
    // Four agents starting at once on an empty etcd agree on one ID.
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let s = store.clone();
            std::thread::spawn(move || tern_store::create_cluster_id(&*s).unwrap())
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(
        tern_store::read_cluster_id(&*store).unwrap(),
        Some(ids[0].clone())
    );
    // Data without the ID (a partial wipe, a restore from before it): not empty, no ID.
    store.put("/tern/v1/resources/ippool/p", b"{}").unwrap();
    store.delete(keys::CLUSTER_ID).unwrap();
    assert!(!tern_store::is_empty(&*store).unwrap());
    assert_eq!(tern_store::read_cluster_id(&*store).unwrap(), None);
}
