//! Cases on what a provider entry's block may hold: a field it does not know, one it needs.

use super::{Run, UNKNOWN_FIELD, fail, pass, skip};
use crate::report::CaseResult;
use serde_json::Value;

impl Run {
    pub(super) async fn unknown_field(&self) -> CaseResult {
        const NAME: &str = "validate-config/unknown-field";
        let mut block = self.block.clone();
        if let Some(m) = block.as_object_mut() {
            m.insert(UNKNOWN_FIELD.into(), Value::from(1));
        }
        match self.load(block).await {
            Ok(_) => fail(
                NAME,
                format!("a block with `{UNKNOWN_FIELD}: 1` was accepted"),
            ),
            Err(e) if !e.path.starts_with(&self.block_path) => fail(
                NAME,
                format!("rejected, but not under {}: {e}", self.block_path),
            ),
            Err(e) if e.path.contains(UNKNOWN_FIELD) || e.message.contains(UNKNOWN_FIELD) => {
                pass(NAME, format!("rejected: {e}"))
            }
            Err(e) => fail(
                NAME,
                format!("rejected without naming {UNKNOWN_FIELD}: {e}"),
            ),
        }
    }

    pub(super) async fn missing_field(&self) -> CaseResult {
        const NAME: &str = "validate-config/missing-field";
        if !self.settings.required.is_empty() {
            let mut notes = Vec::new();
            for field in &self.settings.required {
                let mut block = self.block.clone();
                if let Some(m) = block.as_object_mut() {
                    m.remove(field);
                }
                let at = format!("{}.{field}", self.block_path);
                match self.load(block).await {
                    Ok(_) => return fail(NAME, format!("a block without {field:?} was accepted")),
                    Err(e) if e.path.starts_with(&at) || e.message.contains(field.as_str()) => {
                        notes.push(e.to_string())
                    }
                    Err(e) => return fail(NAME, format!("without {field:?}: want {at}, got {e}")),
                }
            }
            return pass(NAME, notes.join("; "));
        }
        match self.load(Value::Object(Default::default())).await {
            Ok(_) => skip(
                NAME,
                "an empty block is accepted: every field has a default (list fields that must not be missing in `conformance.required`)",
            ),
            Err(e) if e.path.starts_with(&format!("{}.", self.block_path)) => {
                pass(NAME, format!("an empty block is rejected: {e}"))
            }
            Err(e) => fail(
                NAME,
                format!(
                    "an empty block is rejected without naming a field under {}: {e}",
                    self.block_path
                ),
            ),
        }
    }
}
