//! `reconcile -o html`: one self-contained page of a run. For each pool, its ready and
//! available counts against its floor over the run, one line per placement, its rotations and
//! replacements marked; for the Proxies, each one's states over time. Charts are SVG drawn by
//! plotters and inlined; the page fetches nothing (its Content-Security-Policy forbids it).

use crate::reconcile::{PoolReport, ProxyReport, Report, ReportEvent};
use plotters::coord::Shift;
use plotters::prelude::*;

const WIDTH: u32 = 960;
/// Proxies drawn in the timeline; the rest are counted under it.
const MAX_PROXY_ROWS: usize = 200;
const ROW_HEIGHT: u32 = 14;

/// Placement lines, in order; the pool's own lines have their fixed colours.
const PLACEMENT_COLOURS: [RGBColor; 6] = [
    RGBColor(0x8e, 0x44, 0xad),
    RGBColor(0xe6, 0x7e, 0x22),
    RGBColor(0x16, 0xa0, 0x85),
    RGBColor(0x7f, 0x8c, 0x8d),
    RGBColor(0xd3, 0x54, 0x00),
    RGBColor(0x27, 0x3c, 0x75),
];
const READY: RGBColor = RGBColor(0x27, 0xae, 0x60);
const AVAILABLE: RGBColor = RGBColor(0x29, 0x80, 0xb9);
const FLOOR: RGBColor = RGBColor(0xc0, 0x39, 0x2b);

/// A Proxy's state between two of its events, as the timeline colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Creating,
    Running,
    Verified,
    Failing,
    Replacing,
}

impl Phase {
    /// The phase an event starts; None for one that changes nothing drawn.
    fn after(e: &ReportEvent) -> Option<Phase> {
        if e.warning {
            return Some(Phase::Failing);
        }
        match e.reason.as_str() {
            "Created" => Some(Phase::Creating),
            "Running" => Some(Phase::Running),
            "EgressVerified" => Some(Phase::Verified),
            "ReplacingUnhealthy" | "Replaced" | "Replacing" => Some(Phase::Replacing),
            _ => None,
        }
    }

    fn colour(self) -> RGBColor {
        match self {
            Phase::Creating => RGBColor(0xbd, 0xc3, 0xc7),
            Phase::Running => AVAILABLE,
            Phase::Verified => READY,
            Phase::Failing => FLOOR,
            Phase::Replacing => RGBColor(0xe6, 0x7e, 0x22),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Phase::Creating => "creating",
            Phase::Running => "running",
            Phase::Verified => "verified",
            Phase::Failing => "failing",
            Phase::Replacing => "replacing",
        }
    }
}

/// The page. A chart that cannot be drawn says so in its place; the rest of the page stands.
pub fn page(report: &Report) -> String {
    let start = report.started_ms;
    let end = start + report.elapsed_seconds.max(1) * 1000;
    let hours = |ms: u64| ms.saturating_sub(start) as f64 / 3_600_000.0;
    let span = hours(end);
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>egress-proxies: {} Proxies, {} ProxyPools, {:.1} h from {}</h1>\n",
        report.proxies.len(),
        report.pools.len(),
        span,
        escape(&report.started_at)
    ));
    for pool in &report.pools {
        let key = format!("{}/{}", pool.namespace, pool.name);
        let series = pool_series(pool);
        body.push_str(&format!(
            "<figure class=\"pool\" data-pool=\"{}\" data-series=\"{}\">\n<figcaption>ProxyPool {}: ready and available against the floor; ticks: rotations (grey), replacements and failures (red)</figcaption>\n",
            escape(&key),
            escape(&series.join(",")),
            escape(&key)
        ));
        body.push_str(&svg_or_error(WIDTH, 340, |root| {
            draw_pool(root, pool, &hours, span)
        }));
        body.push_str("</figure>\n");
        if !pool.targets.is_empty() {
            body.push_str(&format!(
                "<figure class=\"targets\" data-pool=\"{} targets\">\n<figcaption>ProxyPool {}'s crawl: per target, members quarantined (solid), signalled (wide and pale: above quarantined past the cap) and routable (thin)</figcaption>\n",
                escape(&key),
                escape(&key)
            ));
            body.push_str(&svg_or_error(WIDTH, 340, |root| {
                draw_targets(root, pool, &hours, span)
            }));
            body.push_str("</figure>\n");
        }
    }
    // In the order they came: by their first event, then by name.
    let mut order: Vec<&ProxyReport> = report.proxies.iter().collect();
    order.sort_by_key(|p| {
        (
            p.events.first().map_or(u64::MAX, |e| e.at_ms),
            p.namespace.as_str(),
            p.name.as_str(),
        )
    });
    let rows = order.len().min(MAX_PROXY_ROWS);
    body.push_str(&format!(
        "<figure class=\"proxies\" data-rows=\"{rows}\">\n<figcaption>Proxies: creating (grey), running (blue), verified (green), failing (red), replacing (orange)</figcaption>\n"
    ));
    let height = 60 + ROW_HEIGHT * rows.max(1) as u32;
    body.push_str(&svg_or_error(WIDTH, height, |root| {
        draw_proxies(root, &order[..rows], &hours, span, end)
    }));
    if report.proxies.len() > rows {
        body.push_str(&format!(
            "<p>and {} more Proxies</p>\n",
            report.proxies.len() - rows
        ));
    }
    body.push_str("</figure>\n");
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n\
         <title>egress-proxies plan</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

const STYLE: &str = "body{font-family:sans-serif;margin:1em 2em;color:#222}figure{margin:1.5em 0}figcaption{font-size:.9em;color:#555;margin-bottom:.3em}svg{display:block}";

/// Counts what the browser drew, on the body, so a headless browser's DOM dump shows that the
/// charts were parsed as SVG and how many lines each has.
const SCRIPT: &str = "(function(){var figs=document.querySelectorAll('figure');var out=[];for(var i=0;i<figs.length;i++){var f=figs[i];out.push((f.dataset.pool||'proxies')+':'+f.querySelectorAll('svg polyline').length+':'+f.querySelectorAll('svg rect').length);}document.body.setAttribute('data-drawn',out.join(' '));})();";

/// The names of the lines drawn for `pool`, in the order of its legend.
fn pool_series(pool: &PoolReport) -> Vec<String> {
    let mut names = vec!["ready".to_string(), "available".into(), "floor".into()];
    for (i, p) in pool.status.placements.iter().enumerate() {
        names.push(format!("placements[{i}] {}", p.provider));
    }
    names
}

fn svg_or_error(
    width: u32,
    height: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), String>,
) -> String {
    let mut svg = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        draw(&root).and_then(|()| root.present().map_err(|e| e.to_string()))
    };
    match drawn {
        Ok(()) => svg + "\n",
        Err(e) => format!(
            "<p class=\"error\">this chart could not be drawn: {}</p>\n",
            escape(&e)
        ),
    }
}

/// Points of a line drawn in steps.
type StepLine = Vec<(f64, f64)>;

/// A step line: each value holds until the next sample, the last until the end.
fn steps(points: &[(f64, u32)], end: f64) -> StepLine {
    let mut out = Vec::with_capacity(points.len() * 2 + 1);
    for (i, &(t, v)) in points.iter().enumerate() {
        if i > 0 {
            out.push((t, f64::from(points[i - 1].1)));
        }
        out.push((t, f64::from(v)));
    }
    if let Some(&(_, v)) = points.last() {
        out.push((end, f64::from(v)));
    }
    out
}

/// A chart of proxies (0 to `top`) over `span` hours, its mesh drawn, on a white `root`.
fn proxies_over_hours<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: String,
    span: f64,
    top: u32,
) -> Result<
    ChartContext<
        'a,
        SVGBackend<'b>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    String,
> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..span, 0f64..f64::from(top))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("hours")
        .y_desc("proxies")
        .draw()
        .map_err(e)?;
    Ok(chart)
}

fn draw_pool(
    root: &DrawingArea<SVGBackend, Shift>,
    pool: &PoolReport,
    hours: &dyn Fn(u64) -> f64,
    span: f64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let top = pool
        .timeline
        .iter()
        .map(|s| s.replicas.max(s.available).max(s.ready))
        .max()
        .unwrap_or(1)
        + 1;
    let mut chart =
        proxies_over_hours(root, format!("{}/{}", pool.namespace, pool.name), span, top)?;
    let line = |pick: &dyn Fn(&crate::reconcile::PoolSample) -> u32| {
        let points: Vec<(f64, u32)> = pool
            .timeline
            .iter()
            .map(|s| (hours(s.at_ms), pick(s)))
            .collect();
        steps(&points, span)
    };
    // Widest first, so a count that sits on the floor (maxUnavailable 0) still shows: the
    // floor broad and pale, available over it, ready thin on top.
    let mut lines: Vec<(String, StepLine, ShapeStyle)> = vec![
        (
            "floor".into(),
            line(&|s| s.floor),
            FLOOR.mix(0.45).stroke_width(5),
        ),
        (
            "available".into(),
            line(&|s| s.available),
            AVAILABLE.stroke_width(2),
        ),
        ("ready".into(), line(&|s| s.ready), READY.stroke_width(1)),
    ];
    for (i, name) in pool_series(pool).into_iter().skip(3).enumerate() {
        lines.push((
            name,
            line(&move |s| s.placements.get(i).copied().unwrap_or(0)),
            PLACEMENT_COLOURS[i % PLACEMENT_COLOURS.len()].stroke_width(1),
        ));
    }
    for (name, points, colour) in lines {
        chart
            .draw_series(LineSeries::new(points, colour))
            .map_err(e)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    // Rotations and replacements: ticks along the bottom.
    let tick = f64::from(top) * 0.06;
    let marks = pool.events.iter().filter_map(|ev| {
        let colour = match ev.reason.as_str() {
            "Rotated" | "Rebalanced" | "OutOfDate" | "ScaledDown" => RGBColor(0x95, 0xa5, 0xa6),
            "Failed" | "Cordoned" => FLOOR,
            _ if ev.warning => FLOOR,
            _ => return None,
        };
        let t = hours(ev.at_ms);
        Some(PathElement::new(vec![(t, 0.0), (t, tick)], colour))
    });
    chart.draw_series(marks).map_err(e)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Each target of the pool's crawl: its members quarantined, signalled (above quarantined
/// only past the cap) and routable, minute by minute.
fn draw_targets(
    root: &DrawingArea<SVGBackend, Shift>,
    pool: &PoolReport,
    hours: &dyn Fn(u64) -> f64,
    span: f64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let top = pool
        .targets
        .iter()
        .flat_map(|t| &t.timeline)
        .map(|s| s.routable.max(s.signalled))
        .max()
        .unwrap_or(1)
        + 1;
    let mut chart = proxies_over_hours(
        root,
        format!("{}/{}: targets", pool.namespace, pool.name),
        span,
        top,
    )?;
    for (i, t) in pool.targets.iter().enumerate() {
        let colour = PLACEMENT_COLOURS[i % PLACEMENT_COLOURS.len()];
        let line = |pick: &dyn Fn(&egress_control::crawl::TargetSample) -> u32| {
            let points: Vec<(f64, u32)> = t
                .timeline
                .iter()
                .map(|s| (hours(s.at_ms), pick(s)))
                .collect();
            steps(&points, span)
        };
        for (what, points, style) in [
            (
                "quarantined",
                line(&|s| s.quarantined),
                colour.stroke_width(2),
            ),
            (
                "signalled",
                line(&|s| s.signalled),
                colour.mix(0.5).stroke_width(4),
            ),
            ("routable", line(&|s| s.routable), colour.stroke_width(1)),
        ] {
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(e)?
                .label(format!("{} {what}", t.target))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn draw_proxies(
    root: &DrawingArea<SVGBackend, Shift>,
    proxies: &[&ProxyReport],
    hours: &dyn Fn(u64) -> f64,
    span: f64,
    end_ms: u64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let n = proxies.len().max(1);
    let names: Vec<String> = proxies
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let mut chart = ChartBuilder::on(root)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(200)
        .build_cartesian_2d(0f64..span, 0f64..n as f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("hours")
        .draw()
        .map_err(e)?;
    // Each row's name, in the label area beside it (the mesh would label round values of y,
    // not rows).
    let label_style = ("sans-serif", 11).into_font().color(&BLACK);
    for (i, name) in names.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(0.0, (n - i) as f64 - 0.5));
        root.draw(&Text::new(
            name.clone(),
            (x - 195, y - 5),
            label_style.clone(),
        ))
        .map_err(e)?;
    }
    for (i, p) in proxies.iter().enumerate() {
        let y0 = (n - i - 1) as f64 + 0.15;
        let y1 = (n - i) as f64 - 0.15;
        let mut phases: Vec<(u64, Phase)> = Vec::new();
        for ev in &p.events {
            if let Some(ph) = Phase::after(ev)
                && phases.last().is_none_or(|&(_, last)| last != ph)
            {
                phases.push((ev.at_ms, ph));
            }
        }
        let last_ms = if p.deleted {
            p.events.last().map_or(end_ms, |ev| ev.at_ms)
        } else {
            end_ms
        };
        let bars = phases.iter().enumerate().map(|(j, &(from, ph))| {
            let to = phases.get(j + 1).map_or(last_ms, |&(t, _)| t);
            Rectangle::new(
                [(hours(from), y0), (hours(to.max(from)), y1)],
                ph.colour().filled(),
            )
        });
        chart.draw_series(bars).map_err(e)?;
    }
    // The legend: one entry per phase.
    for ph in [
        Phase::Creating,
        Phase::Running,
        Phase::Verified,
        Phase::Failing,
        Phase::Replacing,
    ] {
        let c = ph.colour();
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(e)?
            .label(ph.label())
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 12, y + 4)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_line_holds_each_value_until_the_next() {
        assert_eq!(
            steps(&[(0.0, 3), (1.0, 2), (2.5, 4)], 4.0),
            vec![
                (0.0, 3.0),
                (1.0, 3.0),
                (1.0, 2.0),
                (2.5, 2.0),
                (2.5, 4.0),
                (4.0, 4.0)
            ]
        );
        assert!(steps(&[], 4.0).is_empty());
    }

    /// A crawl's targets are drawn: three lines (and their legend samples) per target.
    #[test]
    fn each_target_of_a_crawl_is_drawn_with_its_three_lines() {
        use egress_control::crawl::{TargetSample, TargetTotals};
        let sample = |minute: u64, quarantined: u32| TargetSample {
            at_ms: minute * 60_000,
            quarantined,
            routable: 100 - quarantined,
            refused: u64::from(quarantined),
            signalled: quarantined + 5,
        };
        let target = |name: &str| TargetTotals {
            target: name.into(),
            timeline: vec![sample(1, 0), sample(60, 30), sample(70, 10), sample(120, 0)],
            ..Default::default()
        };
        let pool = |targets: Vec<TargetTotals>| PoolReport {
            namespace: "crawlers".into(),
            name: "crawl".into(),
            status: Default::default(),
            min_ready_replicas: None,
            min_available_replicas: None,
            deletions_below_floor: 0,
            events: Vec::new(),
            targets,
            cost: None,
            timeline: Vec::new(),
        };
        let hours = |ms: u64| ms as f64 / 3_600_000.0;
        let drawn = |pool: &PoolReport| {
            svg_or_error(WIDTH, 340, |root| draw_targets(root, pool, &hours, 3.0))
        };
        let svg = drawn(&pool(vec![target("example.com"), target("example.org")]));
        assert!(svg.starts_with("<svg"), "{svg}");
        let one = drawn(&pool(vec![target("example.com")]));
        // Per target, its three lines and their three legend samples, beside the axes.
        assert_eq!(
            svg.matches("<polyline").count() - one.matches("<polyline").count(),
            3 * 2,
            "{svg}"
        );
        for legend in [
            "example.com quarantined",
            "example.org routable",
            "example.com signalled",
        ] {
            assert!(svg.contains(legend), "{legend}");
        }
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape("<a href=\"x\">&"),
            "&lt;a href=&quot;x&quot;&gt;&amp;"
        );
    }
}
