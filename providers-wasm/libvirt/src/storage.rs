//! Volume operations a call makes on a host's storage pool, shared by create, delete, the
//! image cache and the listing: reading a marker volume, removing a volume.

use crate::call::Call;
use crate::errors::{Op, classify, code, is_code};
use crate::metadata::VolumeMark;
use guest_sdk::ProviderError;

/// Marker volumes are tiny; reading more than this means the volume is not a marker.
pub const MARK_MAX_BYTES: u64 = 4096;

fn trimmed(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    &bytes[..end]
}

/// Reads a marker volume; Ok(None) when it does not exist.
pub fn read_volume_mark(
    call: &Call<'_>,
    op: Op,
    host: &str,
    pool: &str,
    volume: &str,
) -> Result<Option<Option<VolumeMark>>, ProviderError> {
    match call
        .host
        .libvirt()
        .volume_download(host, pool, volume, MARK_MAX_BYTES)
    {
        Ok(bytes) => Ok(Some(VolumeMark::parse(trimmed(&bytes)))),
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => Ok(None),
        Err(e) => Err(classify(op, &format!("read marker {volume}"), &e)),
    }
}

/// Deletes a volume if it exists; a volume or pool already gone is success.
pub fn remove_volume(
    call: &Call<'_>,
    op: Op,
    host: &str,
    pool: &str,
    volume: &str,
) -> Result<(), ProviderError> {
    let lv = call.host.libvirt();
    let gone = |e: &guest_sdk::libvirt::LibvirtError| {
        is_code(e, code::NO_STORAGE_VOL) || is_code(e, code::NO_STORAGE_POOL)
    };
    match lv.volume_lookup(host, pool, volume) {
        Ok(_) => {}
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(classify(op, &format!("look up volume {volume}"), &e)),
    }
    match lv.volume_delete(host, pool, volume) {
        Ok(()) => Ok(()),
        Err(e) if gone(&e) => Ok(()),
        Err(e) => Err(classify(op, &format!("delete volume {volume}"), &e)),
    }
}
