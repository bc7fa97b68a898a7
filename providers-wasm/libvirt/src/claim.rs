//! One writer per cached base image on a hypervisor, across processes: a claim volume
//! `<base>.claim` created exclusively (libvirt refuses a second volume of that name with
//! VIR_ERR_STORAGE_VOL_EXIST), holding its writer. Only the claim's holder deletes, creates or
//! fills the base and writes its marker, and it writes the marker only while the claim is
//! still its own. A writer that finds another's claim waits for the marker; it breaks the
//! claim only when its writer is known to be gone: a claim of this very process found while
//! holding the in-process image lock (the writer would hold that lock), or a base that has not
//! grown for the stall timeout while the claim stood (a live transfer keeps writing).

use crate::call::Call;
use crate::config::ImageFormat;
use crate::errors::{Op, classify, code, is_code};
use crate::volume::{VolumeSpec, volume_xml};
use guest_sdk::{Level, ProviderError};

/// Claims are tiny; reading more than this means the volume is not a claim.
const CLAIM_MAX_BYTES: u64 = 512;

pub fn claim_name(base: &str) -> String {
    format!("{base}.claim")
}

/// Who holds a claim: the host process and the call within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub holder: String,
    pub writer: String,
}

impl Claim {
    pub fn to_bytes(&self) -> Vec<u8> {
        format!("holder {}\nwriter {}\n", self.holder, self.writer).into_bytes()
    }

    /// None for an empty or foreign content (a claim caught between its creation and its
    /// write, or debris).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let text = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        let mut holder = None;
        let mut writer = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("holder", v)) if is_token(v) => holder = Some(v.to_string()),
                Some(("writer", v)) if is_token(v) => writer = Some(v.to_string()),
                _ => return None,
            }
        }
        Some(Self {
            holder: holder?,
            writer: writer?,
        })
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What a try to claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The claim is this call's.
    Mine(Claim),
    /// Another writer's claim stands; None when its content is not (yet) readable.
    Theirs(Option<Claim>),
}

/// Tries to create the claim volume for `base` and write this call's claim into it.
pub fn take(call: &Call<'_>, host: &str, pool: &str, base: &str) -> Result<Taken, ProviderError> {
    let lv = call.host.libvirt();
    let name = claim_name(base);
    let mine = Claim {
        holder: call.host.locks().holder_id(),
        writer: format!("{:016x}", call.host.random_u64()),
    };
    let bytes = mine.to_bytes();
    let xml = volume_xml(&VolumeSpec {
        name: &name,
        format: ImageFormat::Raw,
        capacity: CLAIM_MAX_BYTES,
        allocation: Some(CLAIM_MAX_BYTES),
        backing: None,
    });
    match lv.volume_create_xml(host, pool, &xml) {
        Ok(()) => {}
        Err(e) if is_code(&e, code::STORAGE_VOL_EXIST) => {
            return Ok(Taken::Theirs(read(call, host, pool, base)?.flatten()));
        }
        Err(e) => return Err(classify(Op::Create, &format!("create claim {name}"), &e)),
    }
    if let Err(e) = lv.volume_upload(host, pool, &name, &bytes) {
        // An empty claim reads as another writer's caught mid-take, which every writer waits
        // out for the stall timeout: take it back now if we can.
        let _ = lv.volume_delete(host, pool, &name);
        return Err(classify(Op::Create, &format!("write claim {name}"), &e));
    }
    Ok(Taken::Mine(mine))
}

/// The claim standing for `base`: None when there is none, Some(None) when its content does
/// not parse.
pub fn read(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
) -> Result<Option<Option<Claim>>, ProviderError> {
    let name = claim_name(base);
    match call
        .host
        .libvirt()
        .volume_download(host, pool, &name, CLAIM_MAX_BYTES)
    {
        Ok(bytes) => Ok(Some(Claim::parse(&bytes))),
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => Ok(None),
        Err(e) => Err(classify(Op::Create, &format!("read claim {name}"), &e)),
    }
}

/// Whether the claim standing for `base` is still `mine` (nobody broke it).
pub fn still_mine(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    mine: &Claim,
) -> Result<bool, ProviderError> {
    Ok(read(call, host, pool, base)? == Some(Some(mine.clone())))
}

/// Removes the claim for `base` when it is (still) `expected`: this call's own when done, or
/// a stale one found exactly as it was judged. A claim that changed in between belongs to a
/// writer that just took it and is left alone.
pub fn remove_if(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
    expected: &Option<Claim>,
) -> Result<(), ProviderError> {
    let name = claim_name(base);
    match read(call, host, pool, base)? {
        None => return Ok(()),
        Some(found) if &found != expected => return Ok(()),
        Some(_) => {}
    }
    match call.host.libvirt().volume_delete(host, pool, &name) {
        Ok(()) => Ok(()),
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => Ok(()),
        Err(e) => Err(classify(Op::Create, &format!("delete claim {name}"), &e)),
    }
}

/// Tracks another writer's claim while waiting: its content and the base's size, and when
/// either last changed.
#[derive(Debug, Clone)]
pub struct Watch {
    seen: Option<Claim>,
    allocation: Option<u64>,
    since_ms: u64,
}

impl Watch {
    pub fn new(seen: Option<Claim>, allocation: Option<u64>, now_ms: u64) -> Self {
        Self {
            seen,
            allocation,
            since_ms: now_ms,
        }
    }

    /// Feeds one look; true when the claim has stood unchanged over a base that did not
    /// grow for `stall_ms`.
    pub fn stalled(
        &mut self,
        seen: &Option<Claim>,
        allocation: Option<u64>,
        now_ms: u64,
        stall_ms: u64,
    ) -> bool {
        if *seen != self.seen || allocation != self.allocation {
            *self = Self::new(seen.clone(), allocation, now_ms);
            return false;
        }
        now_ms.saturating_sub(self.since_ms) >= stall_ms
    }

    pub fn seen(&self) -> &Option<Claim> {
        &self.seen
    }
}

/// The base's allocation, None while it does not exist.
pub fn base_allocation(
    call: &Call<'_>,
    host: &str,
    pool: &str,
    base: &str,
) -> Result<Option<u64>, ProviderError> {
    match call.host.libvirt().volume_info(host, pool, base) {
        Ok(info) => Ok(Some(info.allocation)),
        Err(e) if is_code(&e, code::NO_STORAGE_VOL) => Ok(None),
        Err(e) => Err(classify(
            Op::Create,
            &format!("size of base image {base}"),
            &e,
        )),
    }
}

pub fn log_broken(call: &Call<'_>, host: &str, base: &str, why: &str) {
    call.log(
        Level::Warn,
        "image claim broken",
        &[("host", host), ("volume", base), ("why", why)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_round_trip_and_reject_debris() {
        let c = Claim {
            holder: "00aa".into(),
            writer: "ff01".into(),
        };
        assert_eq!(Claim::parse(&c.to_bytes()), Some(c.clone()));
        let mut padded = c.to_bytes();
        padded.extend_from_slice(&[0; 64]);
        assert_eq!(Claim::parse(&padded), Some(c));
        assert_eq!(Claim::parse(b""), None);
        assert_eq!(Claim::parse(b"holder x\n"), None, "no writer");
        assert_eq!(Claim::parse(b"holder a b\nwriter c\n"), None, "not a token");
        assert_eq!(Claim::parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn a_watch_stalls_only_when_nothing_moves() {
        let c = Some(Claim {
            holder: "a".into(),
            writer: "b".into(),
        });
        let mut w = Watch::new(c.clone(), Some(10), 0);
        assert!(!w.stalled(&c, Some(10), 29_999, 30_000));
        assert!(!w.stalled(&c, Some(20), 40_000, 30_000), "the base grew");
        assert!(!w.stalled(&c, Some(20), 69_999, 30_000));
        assert!(w.stalled(&c, Some(20), 70_000, 30_000));
        let other = Some(Claim {
            holder: "a".into(),
            writer: "c".into(),
        });
        assert!(!w.stalled(&other, Some(20), 80_000, 30_000), "a new claim");
    }
}
