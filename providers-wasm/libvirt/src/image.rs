//! The base-image cache per host and pool: the base volume plus a marker volume holding the
//! sha256 of the bytes, written last. A base without a valid marker is debris of an
//! interrupted fetch and is discarded. Bytes move through the host's streamed
//! url -> volume transfer and never enter the module.

use crate::Call;
use crate::config::{ImageFormat, ResolvedImage};
use crate::errors::{Op, classify, classify_transfer, code, is_code};
use crate::volume::{VolumeSpec, base_marker_name, volume_xml};
use guest_sdk::{Level, ProviderError};

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
    crate::delete::remove_volume(call, Op::Create, host, pool, name)
}

/// Fetches the image into `base`: debris first discarded, the base created and filled by the
/// host's streamed transfer, the pool refreshed, the marker written last.
pub fn fetch(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    image: &ResolvedImage,
    size: Option<u64>,
    max_bytes: u64,
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
            // The half-written base must not be mistaken for a cached image.
            let _ = lv.volume_delete(host, pool, base);
            return Err(classify_transfer(
                &format!("fetch image {:?}", image.key),
                &e,
            ));
        }
    };
    lv.pool_refresh(host, pool)
        .map_err(|e| classify(Op::Create, &format!("refresh pool {pool}"), &e))?;
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
