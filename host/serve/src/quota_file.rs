//! The installation's quotas file ([`egress_core::quota`]), read within its bound: the
//! gateway, the operator and `reconcile --listen` read the same one.

use egress_core::quota::{MAX_FILE_BYTES, QuotaRule};
use std::path::Path;

/// The rules of the quotas file at `path`; an error names the file and the field at fault.
pub fn read(path: &Path) -> Result<Vec<QuotaRule>, String> {
    let error = |message: String| format!("{}: {message}", path.display());
    let size = std::fs::metadata(path)
        .map_err(|e| error(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(error(format!(
            "{size} bytes, more than the {MAX_FILE_BYTES} a quotas file may have"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    egress_core::quota::parse(&text).map_err(error)
}
