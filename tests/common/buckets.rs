//! Buckets and containers on the local storage emulators (scripts/setup-storage.sh), one per
//! test, removed on drop.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "rmqb-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub const AZ_ACCOUNT: &str = "devstoreaccount1";
pub const AZ_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
pub const AZ_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// A container on Azurite for one test, deleted with its blobs on drop.
pub struct AzContainer(
    pub rmq_backup::repository::storage::azure::AzureBlobStorage,
    pub String,
);

impl AzContainer {
    pub fn new(tag: &str) -> AzContainer {
        use rmq_backup::repository::storage::azure::{AzureBlobStorage, AzureOptions};
        let name = unique(tag);
        let cfg = rmq_backup::config::AzureStorage {
            account_name: AZ_ACCOUNT.into(),
            container_name: name.clone(),
            account_key: Some(rmq_backup::config::Secret::new(AZ_KEY)),
            prefix: None,
            endpoint: Some(AZ_ENDPOINT.into()),
            use_workload_identity: None,
            client_id: None,
            tenant_id: None,
            client_secret: None,
            sas_token: None,
            account_key_file: None,
            client_secret_file: None,
            sas_token_file: None,
            object_lock: None,
        };
        let opts = AzureOptions::from_config(&cfg, &|_| None).expect("options");
        let s = AzureBlobStorage::new(opts).expect("Azurite (scripts/setup-storage.sh)");
        s.create_container().expect("create container");
        AzContainer(s, name)
    }
}

impl Drop for AzContainer {
    fn drop(&mut self) {
        let _ = self.0.delete_container();
    }
}

pub const GCS_ENDPOINT: &str = "http://127.0.0.1:4443";

/// A bucket on fake-gcs-server for one test, emptied and deleted on drop.
pub struct GcsBucket(pub String);

impl GcsBucket {
    pub fn new(tag: &str) -> GcsBucket {
        let name = unique(tag);
        ureq::post(&format!("{GCS_ENDPOINT}/storage/v1/b?project=test"))
            .send_json(serde_json::json!({ "name": name }))
            .unwrap_or_else(|e| panic!("create bucket {name} (scripts/setup-storage.sh): {e}"));
        GcsBucket(name)
    }

    pub fn storage(&self) -> std::sync::Arc<dyn rmq_backup::repository::storage::Storage> {
        use rmq_backup::repository::storage::gcs::{Credentials, GcsBackend, GcsOptions};
        let mut opts = GcsOptions::new(&self.0, Credentials::Anonymous);
        opts.endpoint = Some(GCS_ENDPOINT.into());
        std::sync::Arc::new(GcsBackend::new(opts).expect("fake-gcs-server"))
    }
}

impl Drop for GcsBucket {
    fn drop(&mut self) {
        let s = self.storage();
        for k in s.list("").unwrap_or_default() {
            let _ = s.delete(&k);
        }
        let _ = ureq::delete(&format!("{GCS_ENDPOINT}/storage/v1/b/{}", self.0)).call();
    }
}
