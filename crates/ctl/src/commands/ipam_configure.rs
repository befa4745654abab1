//! `ternctl ipam configure --strictaffinity=BOOL --max-blocks-per-host N` and
//! `ipam show --show-configuration`: the cluster's `IPAMConfig` resource named `default`.

use anyhow::Context;
use tern_model::{Document, IpamConfigSpec, Kind, Resource};
use tern_store::Store;

use crate::table::{Align, BoxTable};

/// The current configuration (defaults when none is stored).
pub fn current(store: &dyn Store) -> anyhow::Result<IpamConfigSpec> {
    Ok(
        match tern_model::get_resource(store, Kind::IpamConfig, None, "default")
            .context("reading the IPAM configuration")?
        {
            Some(Resource::IpamConfig(c)) => c.spec,
            _ => IpamConfigSpec::default(),
        },
    )
}

/// Changes the given fields, keeping the others; returns the new configuration.
pub fn configure(
    store: &dyn Store,
    strict_affinity: Option<bool>,
    max_blocks_per_host: Option<u32>,
) -> anyhow::Result<IpamConfigSpec> {
    if strict_affinity.is_none() && max_blocks_per_host.is_none() {
        anyhow::bail!(
            "nothing to change: pass --strictaffinity=BOOL and/or --max-blocks-per-host N"
        );
    }
    let existing = tern_model::get_resource(store, Kind::IpamConfig, None, "default")
        .context("reading the IPAM configuration")?;
    let mut doc = match existing {
        Some(Resource::IpamConfig(c)) => c,
        _ => Document::new("default", IpamConfigSpec::default()),
    };
    if let Some(v) = strict_affinity {
        doc.spec.strict_affinity = v;
    }
    if let Some(n) = max_blocks_per_host {
        doc.spec.max_blocks_per_host = n;
    }
    let spec = doc.spec.clone();
    tern_model::put_resource(store, &Resource::IpamConfig(doc))
        .context("writing the IPAM configuration")?;
    Ok(spec)
}

/// The configuration table calicoctl prints.
pub fn render(spec: &IpamConfigSpec) -> String {
    let mut t = BoxTable::new(&[("PROPERTY", Align::Left), ("VALUE", Align::Right)]);
    t.row(vec![
        "StrictAffinity".into(),
        spec.strict_affinity.to_string(),
    ]);
    t.row(vec![
        "MaxBlocksPerHost".into(),
        spec.max_blocks_per_host.to_string(),
    ]);
    // Only while set (`ternctl datastore lock`, a migration's source).
    if let Some(why) = &spec.migration_lock {
        t.row(vec!["MigrationLock".into(), why.clone()]);
    }
    t.render()
}

/// `ipam show --show-configuration`.
pub fn show(store: &dyn Store) -> anyhow::Result<String> {
    Ok(render(&current(store)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_table() {
        let out = render(&IpamConfigSpec {
            strict_affinity: true,
            max_blocks_per_host: 4,
            ..Default::default()
        });
        assert_eq!(
            out,
            "\
+------------------+-------+
|     PROPERTY     | VALUE |
+------------------+-------+
| StrictAffinity   |  true |
| MaxBlocksPerHost |     4 |
+------------------+-------+
"
        );
    }

    #[test]
    fn configure_changes_only_what_is_given() {
        let s = tern_store::mem::MemStore::new();
        let d = current(&s).unwrap();
        let c = configure(&s, Some(true), None).unwrap();
        assert!(c.strict_affinity);
        assert_eq!(c.max_blocks_per_host, d.max_blocks_per_host);
        let c = configure(&s, None, Some(7)).unwrap();
        assert!(c.strict_affinity);
        assert_eq!(c.max_blocks_per_host, 7);
        assert_eq!(current(&s).unwrap(), c);
        assert!(configure(&s, None, None).is_err());
    }
}
