//! Cases on a backend that does not simply work: stopped instances, transient faults, a
//! create that times out midway, and the provider's own check.

use super::{BACKOFF, INSTALLATION, Run, SETTLE, fail, pass, skip};
use crate::faults::FaultKind;
use crate::report::CaseResult;
use crate::sim::{self};
use egress_core::{ErrorClass, InstanceState};
use egress_runtime::Provider;

impl Run {
    pub(super) async fn stopped(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "get/stopped-instance";
        if !self.caps.any_backend() {
            return skip(NAME, "the module uses no backend: nothing can stop");
        }
        let req = self.request(8, 8, INSTALLATION);
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.advance(SETTLE);
        let id = created.provider_id.clone();
        let result = async {
            self.setup
                .stop(&self.caps, &self.block, &req.namespace, &req.name, &id)
                .await
                .map_err(|m| format!("stopping it in the backend: {m}"))?;
            match p.get(&self.subject(&req), &id).await {
                Ok(i) if matches!(i.state, InstanceState::Stopped | InstanceState::Terminated) => {
                    Ok(format!(
                        "reported {:?} after the backend stopped it",
                        i.state
                    ))
                }
                Ok(i) => Err(format!(
                    "reported {:?} after the backend stopped it, want Stopped or Terminated",
                    i.state
                )),
                Err(e) => Err(format!("get failed: {e}")),
            }
        }
        .await;
        self.cleanup(p, &req, Some(&id)).await;
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    pub(super) async fn transient_then_retry(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "fault/transient-then-retry";
        let Some(n) = self.create_calls.filter(|n| *n > 0) else {
            return skip(NAME, "a create makes no mutating backend call to fail");
        };
        let req = self.request(9, 9, INSTALLATION);
        self.setup.faults.arm(1, FaultKind::Transient);
        let first = p.create(&self.subject(&req), &req).await;
        let fired = self.setup.faults.disarm();
        let verdict = match &first {
            _ if !fired => Err("the create made no mutating call this time".to_string()),
            Err(e) if e.class == ErrorClass::Transient => Ok(e.reason.clone()),
            Err(e) => Err(format!(
                "the failure was {:?}, want Transient: {e}",
                e.class
            )),
            Ok(_) => Err("the create succeeded although its first mutating call failed".into()),
        };
        let reason = match verdict {
            Ok(r) => r,
            Err(m) => {
                if let Ok(i) = &first {
                    self.cleanup(p, &req, Some(&i.provider_id)).await;
                }
                return fail(NAME, m);
            }
        };
        self.advance(BACKOFF);
        let retry = p.create(&self.subject(&req), &req).await;
        let result = match &retry {
            Ok(i) if i.uid == req.uid => Ok(format!(
                "the first of {n} mutating calls failed: Transient ({reason}); the retry created {:?}",
                i.provider_id
            )),
            Ok(i) => Err(format!("the retry answered uid {:?}", i.uid)),
            Err(e) => Err(format!("the retry failed: {e}")),
        };
        match &retry {
            Ok(i) => {
                let id = i.provider_id.clone();
                if let Err(m) = self.delete(p, &req, &id).await {
                    return fail(NAME, format!("delete after the retry failed: {m}"));
                }
                if let Err(m) = self.verify_gone(p, &req, &id).await {
                    return fail(NAME, m);
                }
            }
            Err(_) => self.cleanup(p, &req, None).await,
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    pub(super) async fn timeout_mid_create(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "fault/timeout-mid-create";
        let Some(n) = self.create_calls.filter(|n| *n > 0) else {
            return skip(NAME, "a create makes no mutating backend call to interrupt");
        };
        let req = self.request(10, 10, INSTALLATION);
        // The middle of the sequence: some of it done, some not. The first create may have
        // filled a cache (an image) that later creates reuse, so a later create can make fewer
        // calls: then the middle of that shorter sequence is tried once more.
        let mut n = n;
        let mut tries = 0;
        let (k, first) = loop {
            tries += 1;
            let k = (n / 2 + 1).min(n);
            let before = self.setup.faults.mutating_calls();
            self.setup.faults.arm(k, FaultKind::Hang);
            let first = p.create(&self.subject(&req), &req).await;
            let fired = self.setup.faults.disarm();
            if fired {
                break (k, first);
            }
            let made = self.setup.faults.mutating_calls() - before;
            if let Ok(i) = &first {
                self.cleanup(p, &req, Some(&i.provider_id)).await;
            }
            if tries > 1 || made == 0 || made >= k {
                return fail(
                    NAME,
                    format!("the create made {made} mutating calls, fewer than {k}, this time"),
                );
            }
            n = made;
        };
        match &first {
            Err(e) if e.reason == "Timeout" => {}
            Err(e) => return fail(NAME, format!("want the runtime's Timeout, got {e}")),
            Ok(_) => return fail(NAME, "the create answered although a backend call hung"),
        }
        let created = match self.converge(p, &req).await {
            Ok(i) => i,
            Err(m) => {
                return fail(
                    NAME,
                    format!("after call {k} of {n} hung, a later create did not converge: {m}"),
                );
            }
        };
        if created.uid != req.uid {
            return fail(
                NAME,
                format!("the later create answered uid {:?}", created.uid),
            );
        }
        let id = created.provider_id;
        if let Err(m) = self.delete(p, &req, &id).await {
            return fail(
                NAME,
                format!("delete after the interrupted create failed: {m}"),
            );
        }
        match self.verify_gone(p, &req, &id).await {
            Ok(()) => pass(
                NAME,
                format!(
                    "call {k} of {n} hung until the runtime cancelled the create; a later create converged and delete left nothing"
                ),
            ),
            Err(m) => fail(NAME, m),
        }
    }

    pub(super) async fn check(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "check/one-target-per-backend";
        let expected = if self.caps.libvirt {
            sim::libvirt_hosts(&self.block).len()
        } else if self.caps.kube || self.caps.http {
            1
        } else {
            0
        };
        let targets = p.check().await;
        if targets.len() != expected {
            let names: Vec<String> = targets
                .iter()
                .map(|t| format!("{} ({})", t.target, t.reason))
                .collect();
            return fail(
                NAME,
                format!(
                    "{} targets [{}], want {expected}",
                    targets.len(),
                    names.join(", ")
                ),
            );
        }
        if let Some(t) = targets.iter().find(|t| t.reason != "Healthy") {
            return fail(
                NAME,
                format!(
                    "target {:?} is {} against a healthy simulation: {}",
                    t.target, t.reason, t.message
                ),
            );
        }
        pass(NAME, format!("{expected} target(s), all Healthy"))
    }
}
