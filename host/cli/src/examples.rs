//! The examples under examples/, embedded so `egress-proxies` with no arguments shows a plan.

use crate::inputs::Source;

pub const PROXIES: &str = include_str!("../../../examples/proxies.yaml");
pub const PROVIDERS: &str = include_str!("../../../examples/providers.yaml");
pub const WORLD: &str = include_str!("../../../examples/world.yaml");

pub fn proxies() -> Source {
    Source::Embedded("examples/proxies.yaml", PROXIES)
}

pub fn providers() -> Source {
    Source::Embedded("examples/providers.yaml", PROVIDERS)
}

pub fn world() -> Source {
    Source::Embedded("examples/world.yaml", WORLD)
}
