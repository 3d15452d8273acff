//! [`Bucket`] over the object_store crate: `s3://`, `gs://`, `az://`, `file://`, `memory://`.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::client::SpawnedReqwestConnector;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutOptions, PutPayload, RetryConfig,
};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Credentials and endpoints, as object_store configuration keys (`aws_endpoint`,
/// `google_service_account`, `azure_storage_account_name`, ...) with their values.
pub type StoreOptions = Vec<(String, String)>;

#[derive(Debug)]
pub struct ObjectStoreBucket {
    store: Arc<dyn ObjectStore>,
}

impl ObjectStoreBucket {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }
}

/// Opens an object-store bucket: `s3://`, `gs://`, `az://`, `memory://`.
pub fn open_object_store(url: &str, options: &StoreOptions) -> Result<ObjectStoreBucket, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        format!(
            "bucket URL `{url}` has no scheme (expected s3://, gs://, az://, file:// or memory://)"
        )
    })?;
    // object_store's own retries are kept short: RetryingBucket above this adds the budget the
    // engine wants, uniformly for every backend.
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
    };
    // RetryingBucket times each attempt by its size; the client's own timeout is only a backstop
    // for requests made without it.
    let client = ClientOptions::new().with_timeout(Duration::from_secs(600));
    let (bucket_name, prefix) = match rest.split_once('/') {
        Some((b, p)) => (b, p.trim_matches('/')),
        None => (rest, ""),
    };
    let bad_key = |k: &str, e: object_store::Error| format!("storage option `{k}`: {e}");
    // Requests run on the runtime the bucket is opened on (the engine's), whichever runtime
    // asks: the HTTP client keeps pooled connections as tasks of the runtime that opened them,
    // and a 9P connection's own runtime, which ends with the connection, would take them along.
    let home = tokio::runtime::Handle::try_current().ok();
    let store: Arc<dyn ObjectStore> = match scheme {
        "memory" => Arc::new(object_store::memory::InMemory::new()),
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::new()
                // Client options first: with_client_options replaces them wholesale, which would
                // undo `*_allow_http` and friends set by the keys below.
                .with_client_options(client.clone())
                .with_retry(retry.clone()).with_bucket_name(bucket_name);
            for (k, v) in options.iter().filter(|(k, _)| k.starts_with("aws_")) {
                b = b.with_config(k.parse().map_err(|e| bad_key(k, e))?, v);
            }
            if let Some(home) = home.clone() {
                b = b.with_http_connector(SpawnedReqwestConnector::new(home));
            }
            Arc::new(b.build().map_err(|e| e.to_string())?)
        }
        "gs" => {
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
                // Client options first: with_client_options replaces them wholesale, which would
                // undo `*_allow_http` and friends set by the keys below.
                .with_client_options(client.clone())
                .with_retry(retry.clone()).with_bucket_name(bucket_name);
            for (k, v) in options.iter().filter(|(k, _)| k.starts_with("google_")) {
                b = b.with_config(k.parse().map_err(|e| bad_key(k, e))?, v);
            }
            if let Some(home) = home.clone() {
                b = b.with_http_connector(SpawnedReqwestConnector::new(home));
            }
            Arc::new(b.build().map_err(|e| e.to_string())?)
        }
        "az" | "azure" => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::new()
                // Client options first: with_client_options replaces them wholesale, which would
                // undo `*_allow_http` and friends set by the keys below.
                .with_client_options(client.clone())
                .with_retry(retry.clone()).with_container_name(bucket_name);
            for (k, v) in options.iter().filter(|(k, _)| k.starts_with("azure_")) {
                b = b.with_config(k.parse().map_err(|e| bad_key(k, e))?, v);
            }
            if let Some(home) = home.clone() {
                b = b.with_http_connector(SpawnedReqwestConnector::new(home));
            }
            Arc::new(b.build().map_err(|e| e.to_string())?)
        }
        other => {
            return Err(format!(
                "bucket URL `{url}`: unknown scheme `{other}` (expected s3://, gs://, az://, file:// or memory://)"
            ))
        }
    };
    let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
        store
    } else {
        Arc::new(PrefixStore::new(store, Path::from(prefix)))
    };
    Ok(ObjectStoreBucket::new(store))
}

fn classify(e: object_store::Error) -> StoreError {
    use object_store::Error as E;
    match e {
        E::NotFound { path, .. } => StoreError::NotFound(path),
        E::AlreadyExists { path, .. } | E::Precondition { path, .. } => {
            StoreError::AlreadyExists(path)
        }
        // Generic covers HTTP failures that outlasted object_store's own retries and local I/O
        // errors: both may pass (throttling, a full disk being cleaned), so they are retried.
        E::Generic { .. } | E::JoinError { .. } => StoreError::Transient(e.to_string()),
        other => StoreError::Permanent(other.to_string()),
    }
}

#[async_trait]
impl Bucket for ObjectStoreBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        let mode = match mode {
            PutMode::Overwrite => object_store::PutMode::Overwrite,
            PutMode::Create => object_store::PutMode::Create,
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        self.store
            .put_opts(&Path::from(key), PutPayload::from_bytes(data), opts)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let r = self.store.get(&Path::from(key)).await.map_err(classify)?;
        r.bytes().await.map_err(classify)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        let expected = range.end - range.start;
        let data = self
            .store
            .get_range(&Path::from(key), range)
            .await
            .map_err(classify)?;
        if data.len() as u64 != expected {
            return Err(StoreError::Permanent(format!(
                "object {key}: ranged read returned {} bytes, expected {expected}",
                data.len()
            )));
        }
        Ok(data)
    }

    /// Either mode: an object store's acknowledged DELETE is durable.
    async fn delete(&self, key: &str, _mode: DeleteMode) -> Result<(), StoreError> {
        match self.store.delete(&Path::from(key)).await.map_err(classify) {
            Err(StoreError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    /// object_store's bulk delete: S3's DeleteObjects (1,000 keys a request), other stores one
    /// DELETE per key, several at once.
    async fn delete_many(&self, keys: Vec<String>) -> Result<(), StoreError> {
        let locations = futures::stream::iter(keys.into_iter().map(|k| Ok(Path::from(k)))).boxed();
        let mut results = self.store.delete_stream(locations);
        while let Some(r) = results.next().await {
            match r.map_err(classify) {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let prefix = Path::from(prefix.trim_end_matches('/'));
        let mut out: Vec<ObjectInfo> = self
            .store
            .list(Some(&prefix))
            .map_ok(|m| ObjectInfo {
                key: m.location.to_string(),
                size_bytes: m.size,
            })
            .try_collect()
            .await
            .map_err(classify)?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}
