//! How the allocator reads and writes store records: the JSON codec, a resource's
//! revision.

use serde::{Deserialize, Serialize};
use tern_model::Resource;
use tern_store::KeyValue;

use crate::error::{IpamError, Result};

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(kv: &KeyValue) -> Result<T> {
    serde_json::from_slice(&kv.value).map_err(|e| IpamError::Corrupt {
        key: kv.key.clone(),
        message: e.to_string(),
    })
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain data; serialisation cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// The `mod_revision` a model resource was read at.
pub(crate) fn resource_rev(r: &Resource) -> i64 {
    r.metadata()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether `needle` occurs in `haystack`.
pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
