//! Cases on what must never leave a provider: the cloud-init and the htpasswd it carries.

use super::{Run, fail, pass, skip};
use crate::capture::Captured;
use crate::report::CaseResult;

impl Run {
    /// The sentinel in the characters of a crypt(3) hash, as the htpasswd carries it.
    pub(super) fn hash_sentinel(&self) -> String {
        self.sentinel.replace('-', "")
    }

    pub(super) fn cloud_init_not_leaked(&self, captured: &Captured) -> CaseResult {
        const NAME: &str = "secrets/cloud-init-not-leaked";
        let plan = self.recorder.snapshot();
        let plan_text = serde_json::to_string(&plan).unwrap_or_default();
        let hash = self.hash_sentinel();
        let leaked = |text: &str| text.contains(&self.sentinel) || text.contains(&hash);
        let mut leaks = Vec::new();
        if captured.contains(&self.sentinel) || captured.contains(&hash) {
            leaks.push("logs or spans");
        }
        if leaked(&plan_text) {
            leaks.push("the plan");
        }
        if self.results.iter().any(|r| leaked(&r.message)) {
            leaks.push("errors");
        }
        if !leaks.is_empty() {
            return fail(
                NAME,
                format!(
                    "a line of the cloud-init or the htpasswd appeared in {}",
                    leaks.join(", ")
                ),
            );
        }
        if captured.len() == 0 {
            return skip(NAME, "no tracing output was captured to search");
        }
        pass(
            NAME,
            format!(
                "not in {} bytes of logs and spans, {} plan steps or any error",
                captured.len(),
                plan.len()
            ),
        )
    }
}
