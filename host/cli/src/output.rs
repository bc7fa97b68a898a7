//! Rendering reports: a readable plan, or the report as YAML or JSON.

use crate::check::CheckReport;
use crate::cli::Format;
use crate::reconcile::{Change, Report, ReportEvent};
use std::fmt::Write;

/// Writes the report to `out` as [`reconcile`] renders it. JSON is written as it is serialized,
/// never held whole: the plan of 10,000 Proxies is over 50 MB of it.
pub fn write_reconcile(
    out: &mut impl std::io::Write,
    report: &Report,
    format: Format,
    dry_run: bool,
) -> std::io::Result<()> {
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, report)?;
            out.write_all(b"\n")
        }
        _ => out.write_all(reconcile(report, format, dry_run).as_bytes()),
    }
}

pub fn reconcile(report: &Report, format: Format, dry_run: bool) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(report).unwrap_or_default() + "\n",
        Format::Yaml => serde_yaml::to_string(report).unwrap_or_default(),
        Format::Text => reconcile_text(report, dry_run),
        Format::Html => crate::html::page(report),
    }
}

fn symbol(c: &Change) -> char {
    match c.call.as_str() {
        "create"
        | "domain-define-xml"
        | "domain-create"
        | "volume-create-xml"
        | "volume-upload"
        | "volume-upload-from-url"
        | "POST"
        | "PUT" => '+',
        "delete" | "domain-destroy" | "domain-undefine" | "volume-delete" | "DELETE" => '-',
        _ => '~',
    }
}

/// `+4s`, `+2m10s`, `+13h2m`: how far into the run something happened.
fn offset(at_ms: u64, started_ms: u64) -> String {
    let s = at_ms.saturating_sub(started_ms) / 1000;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("+{sec}s"),
        (0, m, 0) => format!("+{m}m"),
        (0, m, sec) => format!("+{m}m{sec}s"),
        (h, 0, _) => format!("+{h}h"),
        (h, m, _) => format!("+{h}h{m}m"),
    }
}

/// Events the text plan shows beside the calls: the ones the calls do not already say.
fn shown(e: &ReportEvent) -> bool {
    !matches!(e.reason.as_str(), "Created" | "Deleted" | "Replaced")
}

fn change_text(out: &mut String, c: &Change, started_ms: u64) {
    let _ = write!(
        out,
        "  {:>7} {} {} {} {}",
        offset(c.at_ms, started_ms),
        symbol(c),
        c.capability,
        c.call,
        c.target
    );
    if let Some(e) = &c.error {
        // A refused call changed nothing; its arguments repeat in the retry that follows.
        let _ = writeln!(out, "  (refused: {e})");
        return;
    }
    out.push('\n');
    if c.args.is_null() {
        return;
    }
    // Generated XML is shown as XML, everything else as YAML.
    let body = match c.args.get("xml").and_then(|x| x.as_str()) {
        Some(xml) if c.args.as_object().is_some_and(|o| o.len() == 1) => xml.to_string(),
        _ => serde_yaml::to_string(&c.args).unwrap_or_default(),
    };
    for line in body.lines() {
        let _ = writeln!(out, "              {line}");
    }
}

fn event_text(out: &mut String, e: &ReportEvent, started_ms: u64) {
    let _ = writeln!(
        out,
        "  {:>7} {} {}: {}",
        offset(e.at_ms, started_ms),
        if e.warning { "!" } else { "·" },
        e.reason,
        e.message
    );
}

fn reconcile_text(r: &Report, dry_run: bool) -> String {
    let mut out = String::new();
    let total = r.proxies.len();
    let steady = r.proxies.iter().filter(|p| p.steady).count();
    let changes: usize =
        r.proxies.iter().map(|p| p.changes.len()).sum::<usize>() + r.gc.changes.len();
    let _ = writeln!(
        out,
        "{}: {total} proxies, {steady} steady, {changes} changes; {} {} over {}s{}",
        if dry_run {
            "Plan (dry-run, simulated backends)"
        } else {
            "Reconciled"
        },
        r.rounds,
        if dry_run { "rounds" } else { "steps" },
        r.elapsed_seconds,
        if dry_run { " of simulated time" } else { "" },
    );
    for p in &r.proxies {
        let _ = writeln!(
            out,
            "\nProxy {}/{} (provider {}{}){}",
            p.namespace,
            p.name,
            p.provider,
            p.pool
                .as_deref()
                .map(|pool| format!(", pool {pool}"))
                .unwrap_or_default(),
            match (p.deleted, &p.pool) {
                (false, _) => "",
                (true, Some(_)) => " — deleted by its pool",
                (true, None) => " — removed from the file, deleted",
            }
        );
        if p.changes.is_empty() {
            out.push_str("  no changes\n");
        }
        // Calls and events on one timeline; an event follows the call that caused it.
        let mut events = p.events.iter().filter(|e| shown(e)).peekable();
        for c in &p.changes {
            while let Some(e) = events.next_if(|e| e.seq < c.seq) {
                event_text(&mut out, e, r.started_ms);
            }
            change_text(&mut out, c, r.started_ms);
        }
        for e in events {
            event_text(&mut out, e, r.started_ms);
        }
        let s = &p.status;
        let state = s
            .state
            .map(|x| x.to_string())
            .unwrap_or_else(|| "no instance".into());
        let _ = write!(out, "  = {state}");
        if let Some(ip) = &s.ip {
            let _ = write!(out, " {ip}");
        }
        if let Some(id) = &s.provider_id {
            let _ = write!(out, " (providerID {id})");
        }
        if !p.steady {
            out.push_str(" — not steady yet");
        }
        out.push('\n');
        // What a crawler team buys is distinct addresses: a shared one is said where the
        // Proxy is.
        if !s.egress_shared_with.is_empty() {
            let _ = writeln!(
                out,
                "    egress {} shared with {}",
                s.egress_ip.as_deref().unwrap_or("(unknown)"),
                s.egress_shared_with.join(", ")
            );
        }
        for c in &s.conditions {
            let _ = writeln!(
                out,
                "    {}={} {}: {}",
                c.type_, c.status, c.reason, c.message
            );
        }
    }
    for pool in &r.pools {
        let st = &pool.status;
        let _ = writeln!(
            out,
            "\nPool {}/{}: {} replicas, {} ready, {} available, {} up to date{}{}",
            pool.namespace,
            pool.name,
            st.replicas,
            st.ready_replicas,
            st.available_replicas,
            st.updated_replicas,
            match (pool.min_ready_replicas, pool.min_available_replicas) {
                (Some(r), Some(a)) =>
                    format!("; at least {r} ready and {a} available throughout once available"),
                (Some(r), None) => format!("; at least {r} ready throughout once available"),
                _ => String::new(),
            },
            match pool.deletions_below_floor {
                0 => String::new(),
                n => format!("; {n} deletions below its floor"),
            }
        );
        for e in &pool.events {
            event_text(&mut out, e, r.started_ms);
        }
        for p in &st.placements {
            let _ = writeln!(
                out,
                "    placement {}: {} replicas, {} ready, {} available{}",
                p.provider,
                p.replicas,
                p.ready_replicas,
                p.available_replicas,
                p.last_error
                    .as_deref()
                    .map(|e| format!(" (failing: {e})"))
                    .unwrap_or_default()
            );
        }
        for c in &st.conditions {
            let _ = writeln!(
                out,
                "    {}={} {}: {}",
                c.type_, c.status, c.reason, c.message
            );
        }
        if let Some(c) = &pool.cost {
            let _ = writeln!(
                out,
                "    cost: {:.1} member-hours, {} {:.2} (instances {:.2}, addresses {:.2}){}",
                c.member_hours,
                c.currency,
                c.total,
                c.cost.instances,
                c.cost.addresses,
                match c.unpriced_member_hours {
                    0.0 => String::new(),
                    h => format!("; {h:.1} member-hours unpriced"),
                }
            );
        }
        for t in &pool.targets {
            let _ = writeln!(
                out,
                "    target {}: {} requests, {} served, {} refused; {} quarantines, at most {} at once{}; at least {} members routable",
                t.target,
                t.requests,
                t.served,
                t.refused,
                t.quarantines,
                t.max_quarantined,
                match t.minutes_past_cap {
                    0 => String::new(),
                    n => format!(", {n} minutes past the cap"),
                },
                t.min_routable.unwrap_or(0)
            );
        }
    }
    let _ = writeln!(out, "\nSweep");
    if r.gc.verdicts.is_empty() && r.gc.changes.is_empty() && r.gc.incomplete.is_empty() {
        out.push_str("  nothing listed\n");
    }
    for i in &r.gc.incomplete {
        let _ = writeln!(
            out,
            "  {}: sweep incomplete after {} page(s), {}: {}",
            i.provider, i.pages_listed, i.reason, i.message
        );
    }
    for v in &r.gc.verdicts {
        let _ = writeln!(out, "  {} {}: {}", v.provider, v.provider_id, v.verdict);
    }
    for c in &r.gc.changes {
        change_text(&mut out, c, r.started_ms);
    }
    out
}

/// The most unsettled Proxies a run that is not steady names on stderr.
pub const UNSETTLED_SHOWN: usize = 10;

/// The line a run that is not steady ends with: the first few unsettled Proxies by name, and
/// how many more (a large run's would otherwise be thousands of names on one line; the report
/// has them all).
pub fn not_steady(report: &Report) -> String {
    not_steady_line(
        report
            .proxies
            .iter()
            .filter(|p| !p.steady)
            .map(|p| format!("{}/{}", p.namespace, p.name)),
    )
}

fn not_steady_line(mut names: impl Iterator<Item = String>) -> String {
    let shown: Vec<String> = names.by_ref().take(UNSETTLED_SHOWN).collect();
    let more = names.count();
    let mut line = format!("not steady: {}", shown.join(", "));
    if more > 0 {
        let _ = write!(line, " and {more} more");
    }
    line
}

pub fn check(reports: &[CheckReport], format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(reports).unwrap_or_default() + "\n",
        Format::Yaml => serde_yaml::to_string(reports).unwrap_or_default(),
        Format::Text | Format::Html => {
            let mut out = String::new();
            for r in reports {
                let digest: String = r.module.chars().take(12).collect();
                let _ = writeln!(
                    out,
                    "{} ({}, module sha256:{digest})",
                    r.provider, r.type_name
                );
                for t in &r.targets {
                    let _ = writeln!(
                        out,
                        "  {} {} {}: {}",
                        t.target, t.address, t.reason, t.message
                    );
                    for (k, v) in &t.details {
                        let _ = writeln!(out, "    {k}: {v}");
                    }
                }
            }
            out
        }
    }
}

/// Whether every target of every provider is healthy.
pub fn all_healthy(reports: &[CheckReport]) -> bool {
    reports
        .iter()
        .all(|r| r.targets.iter().all(|t| t.reason == "Healthy"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> impl Iterator<Item = String> {
        (0..n).map(|i| format!("ns/p{i}"))
    }

    #[test]
    fn a_few_unsettled_proxies_are_all_named() {
        assert_eq!(not_steady_line(names(2)), "not steady: ns/p0, ns/p1");
        assert_eq!(
            not_steady_line(names(UNSETTLED_SHOWN))
                .matches("ns/p")
                .count(),
            UNSETTLED_SHOWN
        );
        assert!(!not_steady_line(names(UNSETTLED_SHOWN)).contains("more"));
    }

    #[test]
    fn many_unsettled_proxies_show_ten_and_how_many_more() {
        let line = not_steady_line(names(10_000));
        assert_eq!(line.matches("ns/p").count(), UNSETTLED_SHOWN);
        assert!(line.starts_with("not steady: ns/p0, ns/p1,"), "{line}");
        assert!(line.ends_with("ns/p9 and 9990 more"), "{line}");
    }
}
