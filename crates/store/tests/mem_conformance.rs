//! The conformance suite against the in-memory backend.

use std::sync::Arc;

use tern_store::mem::MemStore;
use tern_store::{Store, conformance};

#[test]
fn mem_store_passes_conformance() {
    conformance::run_all(&|| Arc::new(MemStore::new()) as Arc<dyn Store>);
}

#[test]
fn mem_store_compacts_history() {
    conformance::watch_compacted(&MemStore::with_history(16), 16);
}

#[test]
fn mem_store_clones_share_data() {
    let a = MemStore::new();
    let b = a.clone();
    a.put("/k", b"v").unwrap();
    assert_eq!(b.get("/k").unwrap().unwrap().value, b"v");
}
