//! A compiled provider module: its InstancePre and its self-description, as the Engine caches
//! it by digest (loading one is `provider/load.rs`).

use crate::bindings::{self as b, ModulePre};
use crate::call::CallState;

/// A compiled module with its InstancePre and its self-description.
pub struct LoadedModule {
    /// Hex sha256 of the module bytes.
    pub digest: String,
    pub(crate) pre: ModulePre<CallState>,
    pub description: b::Description,
}

impl LoadedModule {
    /// Whether the module lists page by page (exports `listing`, contract 0.1.2 and later);
    /// an older module answers its whole listing in one call.
    pub fn pages(&self) -> bool {
        self.pre.pages()
    }

    /// The interfaces the module imports: a module names the capabilities it calls
    /// (`export_provider!`'s `uses`), and each it leaves out is linked and set up at none of
    /// its calls.
    pub fn imports(&self) -> Vec<String> {
        self.pre.import_names()
    }
}
