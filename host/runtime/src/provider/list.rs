//! A provider's listing, page by page: each page one call of the module, a page that failed
//! transiently asked again, a listing that would not end stopped.

use crate::call::{Op, OpOut};
use crate::provider::calls::from_wit_instance;
use crate::provider::{
    CALL_FAILURES, ListPage, PAGE_RETRIES, PAGE_RETRY_BASE, Provider, TARGET, failed_in,
};
use crate::redact::Redactor;
use egress_core::{ErrorClass, Instance, ProviderError};

/// A listing stops after this many pages: a module whose cursors never end must not keep a
/// sweep going forever (100,000 pages of the default 500 is 50 million instances).
const MAX_LIST_PAGES: u32 = 100_000;

/// Whether a page's failure is one asking again may cure: a transient error the module
/// reported from its backend.
fn page_retryable(e: &ProviderError) -> bool {
    e.class == ErrorClass::Transient && !CALL_FAILURES.contains(&e.reason.as_str())
}

impl Provider {
    /// Every instance of this installation, the listing's pages collected (see
    /// [`Provider::list_pages`], which hands them over one at a time instead).
    pub async fn list_by_tag(
        &self,
        subject: &str,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        self.list_pages(subject, installation, self.entry.list_page_size(), |page| {
            out.extend(page)
        })
        .await?;
        Ok(out)
    }

    /// The page size of this entry's listings (`limits.listPageSize`).
    pub fn list_page_size(&self) -> u32 {
        self.entry.list_page_size()
    }

    /// Drives the listing page by page, each page a call of its own on a fresh instance, and
    /// hands each page to `each` as it comes, so neither the guest nor the caller need hold
    /// more than a page. A module without `listing` answers in one page. Answers the number
    /// of pages. A page that fails transiently is asked again (the same cursor) up to
    /// [`PAGE_RETRIES`] times, backing off from [`PAGE_RETRY_BASE`] on the provider's clock
    /// (virtual in simulated runs); a page that still fails, or fails otherwise, ends the
    /// listing with its error. The CLI's sweep and the operator's sweeper both list here.
    pub async fn list_pages(
        &self,
        subject: &str,
        installation: &str,
        limit: u32,
        mut each: impl FnMut(Vec<Instance>),
    ) -> Result<u32, ProviderError> {
        let limit = limit.max(1);
        let mut cursor: Option<String> = None;
        let mut pages = 0u32;
        loop {
            let page = self
                .list_page_again_on_failure(subject, installation, cursor.as_deref(), limit)
                .await?;
            pages += 1;
            each(page.instances);
            match page.next {
                None => return Ok(pages),
                Some(next) if cursor.as_deref() == Some(next.as_str()) => {
                    return Err(self.fail(
                        "listByTag",
                        ErrorClass::Transient,
                        "CursorStuck",
                        "the module answered the cursor it was given: the listing would never end"
                            .into(),
                    ));
                }
                Some(_) if pages >= MAX_LIST_PAGES => {
                    return Err(self.fail(
                        "listByTag",
                        ErrorClass::Transient,
                        "TooManyPages",
                        format!("still listing after {MAX_LIST_PAGES} pages"),
                    ));
                }
                Some(next) => cursor = Some(next),
            }
        }
    }

    /// [`Self::list_page`], asked again after a transient failure (see [`Self::list_pages`]).
    async fn list_page_again_on_failure(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let mut wait = PAGE_RETRY_BASE;
        for retry in 1..=PAGE_RETRIES {
            match self.list_page(subject, installation, cursor, limit).await {
                Err(e) if page_retryable(&e) => {
                    tracing::info!(
                        target: TARGET,
                        provider = %self.name,
                        retry,
                        reason = %e.reason,
                        "a listing page failed; asking again in {wait:?}"
                    );
                    self.backends
                        .clock
                        .sleep_millis(wait.as_millis() as u64)
                        .await;
                    wait *= 2;
                }
                answered => return answered,
            }
        }
        self.list_page(subject, installation, cursor, limit).await
    }

    /// One page of the listing: at most `limit` instances after `cursor`. A module without
    /// `listing` answers everything, with no cursor.
    pub async fn list_page(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let started = std::time::Instant::now();
        let r = self
            .list_page_inner(subject, installation, cursor, limit)
            .await;
        self.observed("listByTag", started, r)
    }

    async fn list_page_inner(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            target: TARGET,
            "provider.list-by-tag",
            provider = %self.name,
            subject,
            paged = self.module.pages(),
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = if self.module.pages() {
            Op::ListPage(
                self.ctx(),
                installation.into(),
                cursor.map(str::to_string),
                limit,
            )
        } else {
            Op::List(self.ctx(), installation.into())
        };
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::ListPage(r2) => r2
                    .map(|(v, next)| ListPage {
                        instances: v.into_iter().map(from_wit_instance).collect(),
                        next: next.filter(|c| !c.is_empty()),
                    })
                    .map_err(|e| self.guest_error("listByTag", e, &r)),
                OpOut::List(r2) => r2
                    .map(|v| ListPage {
                        instances: v.into_iter().map(from_wit_instance).collect(),
                        next: None,
                    })
                    .map_err(|e| self.guest_error("listByTag", e, &r)),
                _ => Err(self.wrong_shape("listByTag")),
            });
        failed_in(&span, out)
    }
}
