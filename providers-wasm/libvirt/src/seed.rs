//! The NoCloud seed: `user-data` (the Proxy's cloud-init, or the generated Squid install when
//! it has none), `meta-data` and `vendor-data` (the guest-agent script, plus the configured
//! vendor-data) on an ISO 9660 image labelled `cidata`, built here in pure Rust.
//!
//! Plain ISO 9660 names are 8.3 upper case (`USER_DAT.;1`), which NoCloud cannot find, so the
//! image also carries a Joliet tree with the real names; Linux mounts Joliet in preference to
//! the plain tree when there is no Rock Ridge. The seed holds cloud-init, a secret: it is only
//! ever uploaded, never logged.

use crate::config::KvmConfig;
use crate::time::civil_from_days;
use guest_sdk::CreateRequest;
use guest_sdk::squid;
use sha2::{Digest, Sha256};
use std::borrow::Cow;

pub const SECTOR: usize = 2048;
pub const VOLUME_LABEL: &str = "cidata";

/// The script that installs and starts the QEMU guest agent, so Get can ask it for the
/// address; it runs even when the agent is present, to make sure it is enabled.
///
/// A script, not cloud-config: cloud-init lets user-data win over vendor-data key by key, so
/// a user-data with its own `packages` or `runcmd` (the generated Squid install has both)
/// would silently drop a cloud-config's agent. Vendor scripts run whatever the user-data sets.
pub const GUEST_AGENT_SCRIPT: &str = r#"#!/bin/sh
# Installs and starts the QEMU guest agent, through which the hypervisor reads this VM's address.
if ! command -v qemu-ga >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-guest-agent
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y qemu-guest-agent
  elif command -v yum >/dev/null 2>&1; then
    yum install -y qemu-guest-agent
  elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install qemu-guest-agent
  fi
fi
systemctl enable --now qemu-guest-agent
"#;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedFile {
    /// The name NoCloud looks for (Joliet).
    pub name: &'static str,
    /// The 8.3 name of the plain ISO 9660 tree.
    pub short_name: &'static str,
    pub data: Vec<u8>,
}

/// The user-data of a Proxy's seed: its own cloud-init when it brings one (it wins, whatever
/// it holds), else the SDK's Squid install for its port, the block's `allowedSourceCIDRs` and
/// `allowedDestinationCIDRs`, and the proxy's htpasswd.
pub fn user_data<'a>(
    cfg: &KvmConfig,
    req: &'a CreateRequest,
    htpasswd: Option<&squid::Htpasswd>,
) -> Cow<'a, str> {
    squid::vm_user_data(
        req,
        &cfg.allowed_source_cidrs,
        &cfg.allowed_destination_cidrs,
        htpasswd,
    )
}

/// The three NoCloud files.
pub fn seed_files(
    instance_id: &str,
    hostname: &str,
    user_data: &str,
    vendor_data: Option<&str>,
    install_guest_agent: bool,
) -> Vec<SeedFile> {
    let user_data = user_data.as_bytes().to_vec();
    let meta_data = format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        yaml_value(instance_id),
        yaml_value(hostname)
    )
    .into_bytes();
    let vendor = vendor_data_text(vendor_data, install_guest_agent).into_bytes();
    vec![
        SeedFile {
            name: "meta-data",
            short_name: "META_DAT.;1",
            data: meta_data,
        },
        SeedFile {
            name: "user-data",
            short_name: "USER_DAT.;1",
            data: user_data,
        },
        SeedFile {
            name: "vendor-data",
            short_name: "VENDOR_D.;1",
            data: vendor,
        },
    ]
}

/// A meta-data value: as it is when YAML reads it back as that very string (the `[a-z0-9-]`
/// names a create uses), else double-quoted with everything but printable ASCII escaped. No
/// value can then add a key or end the document, and none changes type: cloud-init reads
/// YAML 1.1, where `yes`, `off` and `null` are no strings.
fn yaml_value(v: &str) -> String {
    let plain = v.starts_with(|c: char| c.is_ascii_lowercase())
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !matches!(
            v,
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
        );
    if plain {
        return v.to_string();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xff => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if u32::from(c) <= 0xffff => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push_str(&format!("\\U{:08x}", u32::from(c))),
        }
    }
    out.push('"');
    out
}

/// vendor-data: the guest-agent script, the configured text, or both as a MIME multipart
/// archive (cloud-init's way of combining parts). The boundary is derived from the content,
/// not random, so the seed of a given config is byte-for-byte reproducible.
pub fn vendor_data_text(configured: Option<&str>, install_guest_agent: bool) -> String {
    match (configured, install_guest_agent) {
        (None, false) => "#cloud-config\n{}\n".to_string(),
        (None, true) => GUEST_AGENT_SCRIPT.to_string(),
        (Some(v), false) => v.to_string(),
        (Some(v), true) => {
            let digest = hex::encode(Sha256::digest(v.as_bytes()));
            let boundary = format!("==egress-proxies-{}==", &digest[..16]);
            let part = |text: &str| {
                let kind = if text.starts_with("#cloud-config") {
                    "text/cloud-config"
                } else if text.starts_with("#!") {
                    "text/x-shellscript"
                } else {
                    "text/plain"
                };
                format!(
                    "--{boundary}\nContent-Type: {kind}; charset=\"utf-8\"\nMIME-Version: 1.0\n\n{text}\n"
                )
            };
            format!(
                "Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n{}{}--{boundary}--\n",
                part(GUEST_AGENT_SCRIPT),
                part(v)
            )
        }
    }
}

fn both16(v: u16) -> [u8; 4] {
    let l = v.to_le_bytes();
    let b = v.to_be_bytes();
    [l[0], l[1], b[0], b[1]]
}

fn both32(v: u32) -> [u8; 8] {
    let l = v.to_le_bytes();
    let b = v.to_be_bytes();
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

struct Stamp {
    y: i64,
    mo: u32,
    d: u32,
    h: u64,
    mi: u64,
    s: u64,
}

impl Stamp {
    fn from_millis(ms: u64) -> Self {
        let secs = ms / 1000;
        let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
        let rem = secs % 86_400;
        Self {
            y,
            // civil_from_days gives month 1..=12 and day 1..=31.
            mo: mo as u32,
            d: d as u32,
            h: rem / 3600,
            mi: (rem % 3600) / 60,
            s: rem % 60,
        }
    }

    /// The 7-byte directory-record date (UTC).
    fn short(&self) -> [u8; 7] {
        [
            (self.y - 1900).clamp(0, 255) as u8,
            self.mo as u8,
            self.d as u8,
            self.h as u8,
            self.mi as u8,
            self.s as u8,
            0,
        ]
    }

    /// The 17-byte volume-descriptor date: 16 digits and a zero offset.
    fn long(&self) -> [u8; 17] {
        let digits = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            self.y.clamp(0, 9999),
            self.mo,
            self.d,
            self.h,
            self.mi,
            self.s
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&digits.as_bytes()[..16]);
        out
    }
}

fn dir_record(name: &[u8], lba: u32, size: u32, is_dir: bool, date: [u8; 7]) -> Vec<u8> {
    let mut r = Vec::with_capacity(34 + name.len());
    let len = 33 + name.len() + usize::from(name.len().is_multiple_of(2));
    r.push(len as u8);
    r.push(0);
    r.extend_from_slice(&both32(lba));
    r.extend_from_slice(&both32(size));
    r.extend_from_slice(&date);
    r.push(if is_dir { 2 } else { 0 });
    r.push(0);
    r.push(0);
    r.extend_from_slice(&both16(1));
    r.push(name.len() as u8);
    r.extend_from_slice(name);
    if name.len().is_multiple_of(2) {
        r.push(0);
    }
    r
}

fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

/// Fills `field` with `value` padded by spaces (single bytes, or UCS-2 for Joliet).
fn put_str(field: &mut [u8], value: &str, joliet: bool) {
    let pad: Vec<u8> = if joliet {
        [0u8, 0x20]
            .iter()
            .copied()
            .cycle()
            .take(field.len())
            .collect()
    } else {
        vec![b' '; field.len()]
    };
    field.copy_from_slice(&pad);
    let bytes = if joliet {
        ucs2(value)
    } else {
        value.as_bytes().to_vec()
    };
    let n = bytes.len().min(field.len());
    field[..n].copy_from_slice(&bytes[..n]);
}

fn path_table(root_lba: u32, big_endian: bool) -> Vec<u8> {
    let mut t = vec![1u8, 0];
    if big_endian {
        t.extend_from_slice(&root_lba.to_be_bytes());
        t.extend_from_slice(&1u16.to_be_bytes());
    } else {
        t.extend_from_slice(&root_lba.to_le_bytes());
        t.extend_from_slice(&1u16.to_le_bytes());
    }
    t.push(0);
    t.push(0);
    t
}

const PVD: usize = 16;
const SVD: usize = 17;
const TERMINATOR: usize = 18;
const L_PATH: usize = 19;
const M_PATH: usize = 20;
const JL_PATH: usize = 21;
const JM_PATH: usize = 22;
const ROOT: usize = 23;
const JROOT: usize = 24;
const FIRST_FILE: usize = 25;

#[allow(clippy::too_many_arguments)]
fn volume_descriptor(
    joliet: bool,
    total: u32,
    path_table_size: u32,
    l_path: u32,
    m_path: u32,
    root: &[u8],
    stamp: &Stamp,
) -> Vec<u8> {
    let mut d = vec![0u8; SECTOR];
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    put_str(&mut d[8..40], "LINUX", joliet);
    put_str(&mut d[40..72], VOLUME_LABEL, joliet);
    d[80..88].copy_from_slice(&both32(total));
    if joliet {
        // UCS-2 level 3.
        d[88..91].copy_from_slice(b"%/E");
    }
    d[120..124].copy_from_slice(&both16(1));
    d[124..128].copy_from_slice(&both16(1));
    d[128..132].copy_from_slice(&both16(SECTOR as u16));
    d[132..140].copy_from_slice(&both32(path_table_size));
    d[140..144].copy_from_slice(&l_path.to_le_bytes());
    d[148..152].copy_from_slice(&m_path.to_be_bytes());
    d[156..156 + root.len()].copy_from_slice(root);
    put_str(&mut d[190..318], "", joliet);
    put_str(&mut d[318..446], "", joliet);
    put_str(&mut d[446..574], "", joliet);
    put_str(&mut d[574..702], "EGRESS-PROXIES", joliet);
    put_str(&mut d[702..739], "", false);
    put_str(&mut d[739..776], "", false);
    put_str(&mut d[776..813], "", false);
    d[813..830].copy_from_slice(&stamp.long());
    d[830..847].copy_from_slice(&stamp.long());
    let never = {
        let mut z = [b'0'; 17];
        z[16] = 0;
        z
    };
    d[847..864].copy_from_slice(&never);
    d[864..881].copy_from_slice(&never);
    d[881] = 1;
    d
}

/// An ISO 9660 image with a Joliet tree: volume label `cidata`, the given files in the root.
/// `now_ms` stamps the records, so the image is deterministic for a given clock.
pub fn build_iso(files: &[SeedFile], now_ms: u64) -> Vec<u8> {
    let stamp = Stamp::from_millis(now_ms);
    let date = stamp.short();
    // Data extents, in the order given.
    let mut lbas = Vec::with_capacity(files.len());
    let mut next = FIRST_FILE;
    for f in files {
        lbas.push(next as u32);
        next += f.data.len().div_ceil(SECTOR);
    }
    let total = next.max(FIRST_FILE) as u32;

    let directory = |joliet: bool| -> Vec<u8> {
        let own = if joliet { JROOT } else { ROOT } as u32;
        let mut dir = dir_record(&[0], own, SECTOR as u32, true, date);
        dir.extend(dir_record(&[1], own, SECTOR as u32, true, date));
        let mut entries: Vec<(Vec<u8>, usize)> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let name = if joliet {
                    ucs2(f.name)
                } else {
                    f.short_name.as_bytes().to_vec()
                };
                (name, i)
            })
            .collect();
        entries.sort();
        for (name, i) in entries {
            dir.extend(dir_record(
                &name,
                lbas[i],
                files[i].data.len() as u32,
                false,
                date,
            ));
        }
        dir.resize(SECTOR, 0);
        dir
    };

    let mut out = vec![0u8; total as usize * SECTOR];
    let mut put = |sector: usize, bytes: &[u8]| {
        let at = sector * SECTOR;
        out[at..at + bytes.len()].copy_from_slice(bytes);
    };
    let pt_size = path_table(0, false).len() as u32;
    let root = dir_record(&[0], ROOT as u32, SECTOR as u32, true, date);
    let jroot = dir_record(&[0], JROOT as u32, SECTOR as u32, true, date);
    put(
        PVD,
        &volume_descriptor(
            false,
            total,
            pt_size,
            L_PATH as u32,
            M_PATH as u32,
            &root,
            &stamp,
        ),
    );
    put(
        SVD,
        &volume_descriptor(
            true,
            total,
            pt_size,
            JL_PATH as u32,
            JM_PATH as u32,
            &jroot,
            &stamp,
        ),
    );
    let mut term = vec![0u8; 7];
    term[0] = 255;
    term[1..6].copy_from_slice(b"CD001");
    term[6] = 1;
    put(TERMINATOR, &term);
    put(L_PATH, &path_table(ROOT as u32, false));
    put(M_PATH, &path_table(ROOT as u32, true));
    put(JL_PATH, &path_table(JROOT as u32, false));
    put(JM_PATH, &path_table(JROOT as u32, true));
    put(ROOT, &directory(false));
    put(JROOT, &directory(true));
    for (f, lba) in files.iter().zip(&lbas) {
        put(*lba as usize, &f.data);
    }
    out
}
