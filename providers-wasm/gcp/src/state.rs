//! A Compute instance to a contract instance: the seeds' state table, the address the config
//! asks for (external NAT IP, or the NIC's internal one), the marks, and the creation time.

use crate::id::format_id;
use crate::insert::{LABEL_INSTALLATION, LABEL_UID};
use guest_sdk::{Host, Instance, InstanceState, Level};
use serde_json::Value;

/// The seeds' mapState: an instance serves once RUNNING with an address.
pub fn map_state(status: &str, has_ip: bool) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Provisioning,
        "RUNNING" if has_ip => InstanceState::Running,
        "RUNNING" => InstanceState::Provisioning,
        "TERMINATED" => InstanceState::Terminated,
        // STOPPING, STOPPED, SUSPENDING, SUSPENDED, and anything newer the API adds.
        _ => InstanceState::Stopped,
    }
}

/// The proxy's address: the first NIC's external NAT IP, or its internal IP in internal mode.
pub fn address(instance: &Value, internal_ip: bool) -> Option<String> {
    let nic = &instance["networkInterfaces"][0];
    let ip = if internal_ip {
        nic["networkIP"].as_str()
    } else {
        nic["accessConfigs"][0]["natIP"].as_str()
    };
    ip.filter(|s| !s.is_empty()).map(str::to_string)
}

/// The last segment of a resource URL (`.../zones/europe-west1-b` gives `europe-west1-b`).
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

pub fn to_instance(host: &dyn Host, instance: &Value, internal_ip: bool) -> Instance {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let name = text(&instance["name"]);
    let zone = last_segment(instance["zone"].as_str().unwrap_or("")).to_string();
    let ip = address(instance, internal_ip);
    let state = map_state(instance["status"].as_str().unwrap_or(""), ip.is_some());
    let created_at = match instance["creationTimestamp"].as_str() {
        None | Some("") => String::new(),
        Some(ts) => match normalize_timestamp(ts) {
            Some(t) => t,
            None => {
                // The contract's zero time; said out loud, because GC treats an unknown
                // creation time as old.
                host.log(
                    Level::Warn,
                    "instance creationTimestamp does not parse; reporting no creation time",
                    &[("name", &name), ("zone", &zone), ("creationTimestamp", ts)],
                );
                String::new()
            }
        },
    };
    Instance {
        provider_id: format_id(&zone, &name),
        name,
        uid: text(&instance["labels"][LABEL_UID]),
        installation: text(&instance["labels"][LABEL_INSTALLATION]),
        state,
        ip: match state {
            InstanceState::Running => ip,
            _ => None,
        },
        created_at,
    }
}

/// RFC 3339 with any offset and fraction (the API writes `2026-01-01T04:05:06.789-08:00`)
/// to UTC seconds (`2026-01-01T12:05:06Z`). None when it does not parse.
pub fn normalize_timestamp(s: &str) -> Option<String> {
    let secs = parse_rfc3339(s)?;
    Some(format_rfc3339(secs))
}

pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            let o = rest.get(1..)?;
            let (oh, om) = o.split_once(':')?;
            if oh.len() != 2 || om.len() != 2 {
                return None;
            }
            let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset)
}

pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// Howard Hinnant's civil calendar algorithms: exact for every proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}
