//! Captures every span (name and fields) and event of the suite's provider calls as text, so
//! the cloud-init case can search it for its sentinel.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

#[derive(Clone, Default)]
pub struct Captured {
    text: Arc<Mutex<String>>,
}

impl Captured {
    pub fn contains(&self, needle: &str) -> bool {
        self.text
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(needle)
    }

    pub fn len(&self) -> usize {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn push(&self, line: String) {
        let mut t = self.text.lock().unwrap_or_else(|p| p.into_inner());
        t.push_str(&line);
        t.push('\n');
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl<S: Subscriber> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut f = Fields(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut f);
        self.push(f.0);
    }

    fn on_record(&self, _id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields("record".into());
        values.record(&mut f);
        self.push(f.0);
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields(format!("event {}", event.metadata().level()));
        event.record(&mut f);
        self.push(f.0);
    }
}
