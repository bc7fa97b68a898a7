//! What one run of the suite found: one result per case.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseResult {
    pub name: String,
    pub outcome: Outcome,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The type the module was configured as.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Hex sha256 of the module.
    pub digest: String,
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn failed(&self) -> bool {
        self.cases.iter().any(|c| c.outcome == Outcome::Fail)
    }

    pub fn count(&self, outcome: Outcome) -> usize {
        self.cases.iter().filter(|c| c.outcome == outcome).count()
    }

    /// One line per case, `PASS|FAIL|SKIP name — message`, and a summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.cases {
            let tag = match c.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
            };
            out.push_str(&format!("{tag} {} — {}\n", c.name, c.message));
        }
        out.push_str(&format!(
            "{}: {} passed, {} failed, {} skipped\n",
            self.type_name,
            self.count(Outcome::Pass),
            self.count(Outcome::Fail),
            self.count(Outcome::Skip)
        ));
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}
