//! The plan: every mutating capability call, in order, with its subject (the Proxy it was made
//! for, or the sweep) and its arguments, secrets redacted.

use serde::Serialize;
use serde_json::Value;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The next number of the process's one sequence of plan steps and Proxy events, so a plan
/// can show both in the order they happened, which their times (often the same virtual
/// instant) cannot.
pub fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanStep {
    /// `namespace/name` of the Proxy, `gc`, or empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subject: String,
    pub provider: String,
    pub capability: String,
    pub call: String,
    pub target: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub args: Value,
    /// Set when the backend refused the call: the step was attempted and changed nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the call was made (Unix ms on the run's clock, virtual in a dry-run).
    #[serde(skip)]
    pub at_ms: u64,
    /// Its place among the run's steps and events (see [`next_seq`]).
    #[serde(skip)]
    pub seq: u64,
}

#[derive(Debug, Default)]
pub struct PlanRecorder {
    steps: Mutex<Vec<PlanStep>>,
}

impl PlanRecorder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&self, step: PlanStep) {
        self.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(step);
    }

    /// Takes the steps recorded so far.
    pub fn take(&self) -> Vec<PlanStep> {
        std::mem::take(&mut *self.steps.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn snapshot(&self) -> Vec<PlanStep> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
