//! The base-image cache per host and pool: the base volume plus a marker volume holding the
//! sha256 of the bytes, written last. A base without a valid marker is debris of an
//! interrupted fetch and is discarded, by the writer holding the image's claim only (see
//! `claim`): in one process the image lock serializes fetches, across processes the claim
//! does. Bytes move through the host's streamed url -> volume transfer and never enter the
//! module.

use crate::call::Call;
use crate::claim::{self, Claim, Taken, Watch};
use crate::config::{ImageFormat, ResolvedImage};
use crate::errors::{Op, classify, classify_transfer, code, is_code};
use crate::volume::{VolumeSpec, base_marker_name, volume_xml};
use guest_sdk::{ErrorClass, Level, ProviderError, transient};

/// How long another writer's claim may stand over a base that does not grow before it is
/// taken for the claim of a writer that is gone. A live transfer writes continuously; the
/// host's own transfer budget ends one that stalls.
pub const CLAIM_STALL_MS: u64 = 60_000;
/// How long a claim may stand empty before it is taken for debris. A writer writes its claim
/// in the call right after creating it, so one left empty for longer is a take cut off
/// between the two (a crash there cannot take it back); waiting the full stall timeout for it
/// would let every crash at that point cost a minute of polling in every writer, and a writer
/// whose calls fail now and then might never see a minute of it in one call.
pub const CLAIM_TAKE_MS: u64 = 10_000;
/// How often a writer waiting on another's claim looks again.
pub const CLAIM_POLL_MS: u64 = 1_000;
/// Left of the call's time when a waiting writer gives up, so it returns its own error.
const WAIT_MARGIN_MS: u64 = 5_000;

/// The in-process lock key of a cached image.
pub fn lock_key(host: &str, pool: &str, base: &str) -> String {
    format!("image/{host}/{pool}/{base}")
}

/// Capacity given to a base volume whose size the server does not announce: the upload
/// replaces the contents and the refresh that follows records the real size.
const UNKNOWN_SIZE_CAPACITY: u64 = 1 << 20;

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// The cached image's sha256 when both the base and a valid marker exist.
pub fn cached(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    image: &ResolvedImage,
) -> Result<Option<String>, ProviderError> {
    let lv = call.host.libvirt();
    let marker = base_marker_name(base);
    let bytes = match lv.volume_download(host, pool, &marker, 128) {
        Ok(b) => b,
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => return Ok(None),
        Err(e) => {
            return Err(classify(
                Op::Create,
                &format!("read image marker {marker}"),
                &e,
            ));
        }
    };
    let text = String::from_utf8_lossy(&bytes)
        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_lowercase();
    if !is_sha256_hex(&text) {
        return Ok(None);
    }
    if image
        .sha256
        .as_deref()
        .is_some_and(|want| !want.eq_ignore_ascii_case(&text))
    {
        return Ok(None);
    }
    match lv.volume_lookup(host, pool, base) {
        Ok(_) => Ok(Some(text)),
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => Ok(None),
        Err(e) => Err(classify(
            Op::Create,
            &format!("look up base image {base}"),
            &e,
        )),
    }
}

/// The image's size for the space precheck; None when the server does not say, in which
/// case the transfer itself is bounded by the pool's free space.
pub fn remote_size(call: &Call<'_>, image: &ResolvedImage) -> Result<Option<u64>, ProviderError> {
    let size = call
        .host
        .libvirt()
        .url_size(&image.url)
        .map_err(|e| classify_transfer(&format!("size of image {:?}", image.key), &e))?;
    if size.is_none() {
        call.log(
            Level::Info,
            "image size not announced; the transfer is bounded by the pool's free space",
            &[("image", &image.key)],
        );
    }
    Ok(size.filter(|n| *n > 0))
}

fn delete_if_present(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    name: &str,
) -> Result<(), ProviderError> {
    crate::storage::remove_volume(call, Op::Create, host, pool, name)
}

/// Makes the image cached in `base`, fetching it unless another writer does. Called with the
/// image's in-process lock held (see [`lock_key`]): a claim of this very process found then
/// is debris of a call that ended.
pub fn ensure(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    image: &ResolvedImage,
    size: Option<u64>,
    max_bytes: u64,
) -> Result<(), ProviderError> {
    let mut watch: Option<Watch> = None;
    loop {
        let failed_look = match step(call, host, pool, base, image, size, max_bytes, &mut watch) {
            Ok(Step::Done(result)) => return result,
            Ok(Step::Again) => continue,
            Ok(Step::Wait) => None,
            // A look at the claim or the base that failed transiently tells nothing new: the
            // wait goes on with what was seen before, so a flaky link cannot restart the stall
            // timeout on every poll (under a steady error rate it would never run out, and a
            // stale claim would never be broken).
            Err(e) if e.class == ErrorClass::Transient => Some(e),
            Err(e) => return Err(e),
        };
        let now = call.host.now_millis();
        if now + CLAIM_POLL_MS + WAIT_MARGIN_MS > call.host.call_deadline_millis() {
            return Err(failed_look.unwrap_or_else(|| {
                transient(
                    "ImageBeingFetched",
                    format!(
                        "image {:?} is being fetched into {host}/{pool} by another writer",
                        image.key
                    ),
                )
            }));
        }
        call.host.sleep_millis(CLAIM_POLL_MS);
    }
}

/// What one look at the image's claim led to.
enum Step {
    /// The claim was ours: the image is cached, or the fetch's error.
    Done(Result<(), ProviderError>),
    /// A stale claim was broken: try to claim again at once.
    Again,
    /// Another writer's claim stands: look again after a poll.
    Wait,
}

#[allow(clippy::too_many_arguments)]
fn step(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    image: &ResolvedImage,
    size: Option<u64>,
    max_bytes: u64,
    watch: &mut Option<Watch>,
) -> Result<Step, ProviderError> {
    match claim::take(call, host, pool, base)? {
        Taken::Mine(mine) => {
            // Another writer may have finished between our look and our claim.
            let fetched = match cached(call, host, pool, base, image) {
                Ok(Some(_)) => Ok(()),
                Ok(None) => fetch(call, host, pool, base, image, size, max_bytes, &mine),
                Err(e) => Err(e),
            };
            let released = claim::remove_if(call, host, pool, base, &Some(mine));
            Ok(Step::Done(fetched.and(released)))
        }
        Taken::Theirs(seen) => {
            if cached(call, host, pool, base, image)?.is_some() {
                return Ok(Step::Done(Ok(())));
            }
            let now = call.host.now_millis();
            let ours = seen
                .as_ref()
                .is_some_and(|c| c.holder == call.host.locks().holder_id());
            // An empty claim has no writer to watch the base of: only how long it stays so.
            let (allocation, stall_ms) = match &seen {
                Some(_) => (
                    claim::base_allocation(call, host, pool, base)?,
                    CLAIM_STALL_MS,
                ),
                None => (None, CLAIM_TAKE_MS),
            };
            let w = watch.get_or_insert_with(|| Watch::new(seen.clone(), allocation, now));
            if ours || w.stalled(&seen, allocation, now, stall_ms) {
                let why = if ours {
                    "its writer, a call of this process, has ended"
                } else if seen.is_none() {
                    "the claim stayed empty: its take was cut off"
                } else {
                    "the base did not grow while the claim stood"
                };
                claim::log_broken(call, host, base, why);
                claim::remove_if(call, host, pool, base, &seen)?;
                *watch = None;
                return Ok(Step::Again);
            }
            Ok(Step::Wait)
        }
    }
}

/// Fetches the image into `base` under this call's claim: debris first discarded, the base
/// created and filled by the host's streamed transfer, the pool refreshed, the marker written
/// last and only while the claim is still ours.
#[allow(clippy::too_many_arguments)]
fn fetch(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    image: &ResolvedImage,
    size: Option<u64>,
    max_bytes: u64,
    mine: &Claim,
) -> Result<(), ProviderError> {
    let lv = call.host.libvirt();
    let marker = base_marker_name(base);
    delete_if_present(call, host, pool, &marker)?;
    delete_if_present(call, host, pool, base)?;
    let xml = volume_xml(&VolumeSpec {
        name: base,
        format: image.format,
        capacity: size.unwrap_or(UNKNOWN_SIZE_CAPACITY),
        allocation: None,
        backing: None,
    });
    lv.volume_create_xml(host, pool, &xml)
        .map_err(|e| classify(Op::Create, &format!("create base volume {base}"), &e))?;
    call.log(
        Level::Info,
        "fetching image",
        &[("host", host), ("image", &image.key), ("volume", base)],
    );
    let transfer = match lv.volume_upload_from_url(
        host,
        pool,
        base,
        &image.url,
        image.sha256.as_deref(),
        max_bytes,
    ) {
        Ok(t) => t,
        Err(e) => {
            // The half-written base must not be mistaken for a cached image; it is ours to
            // remove only while the claim is.
            if claim::still_mine(call, host, pool, base, mine).unwrap_or(false) {
                let _ = lv.volume_delete(host, pool, base);
            }
            return Err(classify_transfer(
                &format!("fetch image {:?}", image.key),
                &e,
            ));
        }
    };
    lv.pool_refresh(host, pool)
        .map_err(|e| classify(Op::Create, &format!("refresh pool {pool}"), &e))?;
    if !claim::still_mine(call, host, pool, base, mine)? {
        // Another writer took the image over (ours looked stalled): its bytes, its marker.
        return Err(transient(
            "ImageClaimLost",
            format!(
                "another writer took over fetching image {:?} into {host}/{pool}",
                image.key
            ),
        ));
    }
    let digest = transfer.sha256.to_lowercase();
    let marker_xml = volume_xml(&VolumeSpec {
        name: &marker,
        format: ImageFormat::Raw,
        capacity: digest.len() as u64,
        allocation: Some(digest.len() as u64),
        backing: None,
    });
    lv.volume_create_xml(host, pool, &marker_xml)
        .map_err(|e| classify(Op::Create, &format!("create image marker {marker}"), &e))?;
    lv.volume_upload(host, pool, &marker, digest.as_bytes())
        .map_err(|e| classify(Op::Create, &format!("write image marker {marker}"), &e))?;
    let bytes = transfer.bytes.to_string();
    call.log(
        Level::Info,
        "image cached",
        &[
            ("host", host),
            ("volume", base),
            ("bytes", &bytes),
            ("sha256", &digest),
        ],
    );
    Ok(())
}
