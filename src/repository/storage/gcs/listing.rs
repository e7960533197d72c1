//! Listing a GCS bucket: `objects.list` with `prefix` and `fields`, following `pageToken`
//! (<https://cloud.google.com/storage/docs/json_api/v1/objects/list>). Each item is the object
//! resource, so one listing gives every object's `updated` time (`forget --prune`) or its
//! `retention` (`forget`, `Storage::latest_retention`) without a request per object.

use super::*;

/// An object of an `objects.list` page, with the fields a listing asks for.
#[derive(Deserialize)]
pub(super) struct ListedItem {
    pub(super) name: String,
    /// RFC 3339 time of the object's last change.
    #[serde(default)]
    pub(super) updated: Option<String>,
    /// The object's retention (`storage.object_lock`), when it has one.
    #[serde(default)]
    pub(super) retention: Option<ListedRetention>,
}

/// The `retention` of an object resource.
#[derive(Deserialize)]
pub(super) struct ListedRetention {
    /// RFC 3339 end of the retention.
    #[serde(rename = "retainUntilTime", default)]
    pub(super) retain_until_time: Option<String>,
}

impl GcsBackend {
    /// Every object under `prefix`, asking for the resource fields `fields` (`name` among
    /// them), handed to `each` in the order listed; names that [`validate_key`] refuses are
    /// skipped.
    ///
    /// Errors: `Storage error: Failed to list <prefix>: ...`.
    pub(super) fn list_items(
        &self,
        prefix: &str,
        fields: &str,
        mut each: impl FnMut(ListedItem),
    ) -> Result<()> {
        validate_prefix(prefix)?;
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            items: Vec<ListedItem>,
            #[serde(rename = "nextPageToken")]
            next_page_token: Option<String>,
        }
        let ctx = format!(
            "Failed to list {}",
            if prefix.is_empty() { "/" } else { prefix }
        );
        let mut token: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?maxResults=1000&fields=items({fields}),nextPageToken",
                self.base,
                enc(&self.bucket)
            );
            if !prefix.is_empty() {
                url.push_str(&format!("&prefix={}", enc(prefix)));
            }
            if let Some(t) = &token {
                url.push_str(&format!("&pageToken={}", enc(t)));
            }
            let page: Page = retry::run(self.policy, &ctx, || {
                let mut resp = self.call(&ctx, http::Request::get(&url), ())?;
                match resp.status().as_u16() {
                    200 => read_json(&mut resp, &ctx),
                    _ => Err(self.status_error(&ctx, resp)),
                }
            })?;
            for item in page.items {
                if !item.name.starts_with(prefix) {
                    continue;
                }
                if validate_key(&item.name).is_ok() {
                    each(item);
                } else {
                    log::debug!("gcs: skipping object {:?}: not a valid key", item.name);
                }
            }
            match page.next_page_token {
                // A server that hands back the token it was given would loop forever.
                Some(t) if token.as_deref() == Some(t.as_str()) => {
                    return Err(Error::Storage(format!(
                        "{ctx}: the server repeated a page token"
                    )))
                }
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(()),
            }
        }
    }
}
