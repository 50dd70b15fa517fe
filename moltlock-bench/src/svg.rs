//! A hand-written SVG bar chart of contended hand-off latency (p50 and p99)
//! per lock, on a log scale.

use std::fmt::Write as _;

use crate::report::Report;

const ROW: f64 = 34.0;
const LEFT: f64 = 230.0;
const WIDTH: f64 = 560.0;
/// The axis spans 10 µs to 10 s.
const DECADES: [(f64, &str); 7] = [
    (1e1, "10 µs"),
    (1e2, "100 µs"),
    (1e3, "1 ms"),
    (1e4, "10 ms"),
    (1e5, "100 ms"),
    (1e6, "1 s"),
    (1e7, "10 s"),
];

fn x(us: f64) -> f64 {
    let v = us.clamp(10.0, 1e7).log10();
    LEFT + (v - 1.0) / 6.0 * WIDTH
}

/// Rows of (label, p50 µs, p99 µs) from a report.
fn rows(r: &Report) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    for b in &r.backends {
        let modes = [
            ("", &b.contended),
            (" (shared)", &b.contended_shared),
            (" (fair)", &b.contended_fair),
        ];
        for (mode, c) in modes {
            if let Some(c) = c {
                let label = format!("moltlock {}{mode}", b.store);
                out.push((label, c.handoff.p50_us, c.handoff.p99_us));
            }
        }
    }
    for p in &r.peers {
        if let Some(c) = &p.contended {
            out.push((p.name.clone(), c.handoff.p50_us, c.handoff.p99_us));
        }
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The chart as SVG text.
pub fn handoff_chart(r: &Report) -> String {
    let rows = rows(r);
    let height = 70.0 + ROW * rows.len() as f64 + 40.0;
    let total = LEFT + WIDTH + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{total}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">Hand-off latency to a different task ({} tasks on one key; log scale)</text>\n\
         <rect x=\"{LEFT}\" y=\"34\" width=\"12\" height=\"10\" fill=\"#2b6cb0\"/><text x=\"{}\" y=\"43\">p50</text>\n\
         <rect x=\"{}\" y=\"34\" width=\"12\" height=\"10\" fill=\"#ed8936\"/><text x=\"{}\" y=\"43\">p99</text>",
        r.settings.contenders,
        LEFT + 16.0,
        LEFT + 60.0,
        LEFT + 76.0
    );
    let bottom = 60.0 + ROW * rows.len() as f64;
    for (v, label) in DECADES {
        let gx = x(v);
        let _ = writeln!(
            s,
            "<line x1=\"{gx:.1}\" y1=\"55\" x2=\"{gx:.1}\" y2=\"{bottom}\" stroke=\"#ddd\"/>\
             <text x=\"{gx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            bottom + 16.0
        );
    }
    for (i, (label, p50, p99)) in rows.iter().enumerate() {
        let y = 60.0 + ROW * i as f64;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{LEFT}\" y=\"{:.1}\" width=\"{:.1}\" height=\"11\" fill=\"#2b6cb0\"/>\
             <rect x=\"{LEFT}\" y=\"{:.1}\" width=\"{:.1}\" height=\"11\" fill=\"#ed8936\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{:.0} / {:.0} µs</text>",
            LEFT - 8.0,
            y + 16.0,
            escape(label),
            y + 4.0,
            x(*p50) - LEFT,
            y + 16.0,
            x(*p99) - LEFT,
            x(*p99) + 4.0,
            y + 26.0,
            p50,
            p99
        );
    }
    s.push_str("</svg>\n");
    s
}
