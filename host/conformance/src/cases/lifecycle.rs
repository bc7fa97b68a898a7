//! Cases on an instance's life: create, get, adopt, refuse, list in pages, delete.

use super::{ABSENT_NAME, BACKOFF, INSTALLATION, OTHER_INSTALLATION, Run, SETTLE, fail, pass};
use crate::report::CaseResult;
use egress_core::{CreateRequest, ErrorClass};
use egress_runtime::Provider;

impl Run {
    pub(super) async fn create_returns_gettable_id(&mut self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/returns-gettable-id";
        let req = self.request(1, 1, INSTALLATION);
        let before = self.setup.faults.mutating_calls();
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.create_calls = Some(self.setup.faults.mutating_calls() - before);
        let result = async {
            if created.provider_id.is_empty() {
                return Err("create returned an empty provider-id".to_string());
            }
            if created.uid != req.uid {
                return Err(format!(
                    "create returned uid {:?}, want the request's {:?}",
                    created.uid, req.uid
                ));
            }
            let got = p
                .get(&self.subject(&req), &created.provider_id)
                .await
                .map_err(|e| format!("get of {:?} failed: {e}", created.provider_id))?;
            if got.provider_id != created.provider_id || got.uid != req.uid {
                return Err(format!(
                    "get of {:?} answered id {:?} uid {:?}, want uid {:?}",
                    created.provider_id, got.provider_id, got.uid, req.uid
                ));
            }
            if got.installation != INSTALLATION {
                return Err(format!(
                    "get answered installation {:?}, want {INSTALLATION:?}",
                    got.installation
                ));
            }
            Ok(format!(
                "created {:?} ({:?}, {} mutating calls); get agrees",
                created.provider_id,
                created.state,
                self.create_calls.unwrap_or(0)
            ))
        }
        .await;
        self.cleanup(p, &req, Some(&created.provider_id)).await;
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    pub(super) async fn adopts_repeat(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/adopts-repeat";
        let req = self.request(2, 2, INSTALLATION);
        let first = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("first create failed: {e}")),
        };
        self.advance(BACKOFF);
        let second = p.create(&self.subject(&req), &req).await;
        self.cleanup(p, &req, Some(&first.provider_id)).await;
        match second {
            Ok(i) if i.provider_id == first.provider_id && i.uid == req.uid => pass(
                NAME,
                format!("the repeated create adopted {:?}", i.provider_id),
            ),
            Ok(i) => fail(
                NAME,
                format!(
                    "the repeated create answered id {:?} uid {:?}, want {:?} uid {:?}",
                    i.provider_id, i.uid, first.provider_id, req.uid
                ),
            ),
            Err(e) => fail(NAME, format!("the repeated create failed: {e}")),
        }
    }

    pub(super) async fn refuses_other_uid(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/refuses-other-uid";
        let req = self.request(3, 3, INSTALLATION);
        let first = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("first create failed: {e}")),
        };
        self.advance(BACKOFF);
        let mut other = self.request(3, 33, INSTALLATION);
        if let Some(o) = other.owner.as_mut() {
            o.name = "conformance-impostor".into();
        }
        let second = p.create(&self.subject(&other), &other).await;
        self.cleanup(p, &req, Some(&first.provider_id)).await;
        match second {
            Err(e) if e.class == ErrorClass::Permanent => {
                pass(NAME, format!("refused: {} ({})", e.reason, e.message))
            }
            Err(e) => fail(
                NAME,
                format!("refused as {:?}, want Permanent: {e}", e.class),
            ),
            Ok(i) => fail(
                NAME,
                format!(
                    "an instance of uid {:?} was adopted for uid {:?} (answered uid {:?})",
                    req.uid, other.uid, i.uid
                ),
            ),
        }
    }

    pub(super) async fn unknown_is_not_found(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "get/unknown-is-not-found";
        let req = self.request(4, 4, INSTALLATION);
        // An id of the provider's own shape, for an instance that was never created.
        let id = match p.create(&self.subject(&req), &req).await {
            Ok(i) => {
                self.cleanup(p, &req, Some(&i.provider_id)).await;
                i.provider_id.replace(&req.name, ABSENT_NAME)
            }
            Err(e) => return fail(NAME, format!("create (to learn the id shape) failed: {e}")),
        };
        match p.get("conformance/absent", &id).await {
            Err(e) if e.class == ErrorClass::NotFound => {
                pass(NAME, format!("get {id:?}: NotFound ({})", e.reason))
            }
            Err(e) => fail(NAME, format!("get {id:?}: want NotFound, got {e}")),
            Ok(i) => fail(
                NAME,
                format!("get {id:?}: want NotFound, got an instance {:?}", i.name),
            ),
        }
    }

    pub(super) async fn delete_idempotent(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "delete/idempotent-leaves-nothing";
        let req = self.request(5, 5, INSTALLATION);
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.advance(SETTLE);
        let id = created.provider_id;
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("first delete failed: {e}"));
        }
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("second delete failed: {e}"));
        }
        self.advance(SETTLE);
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("delete of a gone instance failed: {e}"));
        }
        match self.verify_gone(p, &req, &id).await {
            Ok(()) => pass(NAME, format!("deleted {id:?} three times; nothing remains")),
            Err(m) => fail(NAME, m),
        }
    }

    pub(super) async fn own_installation_only(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "list-by-tag/own-installation-only";
        let ours = self.request(6, 6, INSTALLATION);
        let theirs = self.request(7, 7, OTHER_INSTALLATION);
        let a = p.create(&self.subject(&ours), &ours).await;
        let b = p.create(&self.subject(&theirs), &theirs).await;
        let result = match (&a, &b) {
            (Err(e), _) | (_, Err(e)) => Err(format!("create failed: {e}")),
            (Ok(a), Ok(b)) => match p.list_by_tag("gc", INSTALLATION).await {
                Err(e) => Err(format!("list-by-tag failed: {e}")),
                Ok(list) => {
                    if !list.iter().any(|i| i.provider_id == a.provider_id) {
                        Err(format!(
                            "this installation's {:?} is missing",
                            a.provider_id
                        ))
                    } else if list.iter().any(|i| i.provider_id == b.provider_id) {
                        Err(format!(
                            "another installation's {:?} is listed",
                            b.provider_id
                        ))
                    } else if let Some(i) = list.iter().find(|i| i.installation != INSTALLATION) {
                        Err(format!(
                            "{:?} of installation {:?} is listed",
                            i.provider_id, i.installation
                        ))
                    } else if let Some(i) = list.iter().find(|i| i.uid.is_empty()) {
                        Err(format!("unmarked {:?} is listed", i.provider_id))
                    } else {
                        Ok(format!(
                            "{} listed, all of installation {INSTALLATION:?}; the other installation's is not",
                            list.len()
                        ))
                    }
                }
            },
        };
        if let Ok(i) = &a {
            self.cleanup(p, &ours, Some(&i.provider_id)).await;
        }
        if let Ok(i) = &b {
            self.cleanup(p, &theirs, Some(&i.provider_id)).await;
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    /// A listing in pages of a few items lists each instance once and no page is larger than
    /// asked; a module built before `listing` answers in one page.
    pub(super) async fn pages(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "list-by-tag/pages";
        const PAGE: u32 = 2;
        let ours: Vec<CreateRequest> = (11..16).map(|n| self.request(n, n, INSTALLATION)).collect();
        let theirs = self.request(16, 16, OTHER_INSTALLATION);
        let mut created: Vec<(CreateRequest, Option<String>)> = Vec::new();
        let mut failed = None;
        for req in ours.iter().chain([&theirs]) {
            match p.create(&self.subject(req), req).await {
                Ok(i) => created.push((req.clone(), Some(i.provider_id))),
                Err(e) => {
                    failed.get_or_insert(format!("create failed: {e}"));
                    created.push((req.clone(), None));
                }
            }
        }
        self.advance(SETTLE);
        let result = match failed {
            Some(m) => Err(m),
            None => {
                let mut sizes = Vec::new();
                let mut listed: Vec<String> = Vec::new();
                match p
                    .list_pages("gc", INSTALLATION, PAGE, |page| {
                        sizes.push(page.len());
                        listed.extend(page.into_iter().map(|i| i.provider_id));
                    })
                    .await
                {
                    Err(e) => Err(format!("listing in pages of {PAGE} failed: {e}")),
                    Ok(pages) => {
                        let ids: Vec<&str> = created
                            .iter()
                            .take(ours.len())
                            .filter_map(|(_, id)| id.as_deref())
                            .collect();
                        let theirs_id = created.last().and_then(|(_, id)| id.as_deref());
                        let twice = listed
                            .iter()
                            .find(|id| listed.iter().filter(|o| o == id).count() > 1);
                        if let Some(missing) =
                            ids.iter().find(|id| !listed.iter().any(|l| l == *id))
                        {
                            Err(format!(
                                "{missing:?} is missing from {pages} pages of {PAGE}"
                            ))
                        } else if let Some(id) = twice {
                            Err(format!("{id:?} is listed twice across {pages} pages"))
                        } else if theirs_id.is_some_and(|t| listed.iter().any(|l| l == t)) {
                            Err("another installation's instance is listed".to_string())
                        } else if !p.module.pages() {
                            Ok(format!(
                                "{} listed in one page: the module predates `listing` and lists through list-by-tag",
                                listed.len()
                            ))
                        } else if let Some(n) = sizes.iter().find(|n| **n > PAGE as usize) {
                            Err(format!("a page of {n} instances, asked for {PAGE}"))
                        } else if pages < 3 {
                            Err(format!(
                                "{} instances in {pages} pages of {PAGE}: the module ignored the limit",
                                listed.len()
                            ))
                        } else {
                            Ok(format!(
                                "{} listed once each in {pages} pages of at most {PAGE}",
                                listed.len()
                            ))
                        }
                    }
                }
            }
        };
        for (req, id) in &created {
            self.cleanup(p, req, id.as_deref()).await;
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }
}
