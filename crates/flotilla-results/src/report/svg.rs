//! The drawing primitives of the report's SVG figures (no plotting library, no network): the
//! figure frame with its title, axes and ticks (`Svg`), linear and log axes mapping data to
//! pixels (`Axis`), the legend column fitted into the figure by `legend.rs`, the colours and
//! the text escaping. The figures themselves are `figures.rs`'s.

use super::legend;
use super::render::number;
use std::fmt::Write as _;

pub(super) const WIDTH: f64 = 640.0;
pub(super) const HEIGHT: f64 = 360.0;
pub(super) const LEFT: f64 = 64.0;
pub(super) const RIGHT: f64 = 150.0;
pub(super) const TOP: f64 = 34.0;
pub(super) const BOTTOM: f64 = 48.0;
/// The right margin of a figure without a legend.
pub(super) const RIGHT_BARE: f64 = 24.0;
/// The font size of the figures' text (the `<svg>`'s `font-size`).
pub(super) const FONT_SIZE: f64 = 11.0;
/// Room kept between a legend's longest line and the figure's right edge.
pub(super) const LEGEND_MARGIN: f64 = 4.0;
/// Most distinct values an axis ticks one by one.
pub(super) const MAX_VALUE_TICKS: usize = 6;
/// A text's white outline, so that lines under it do not strike it through.
pub(super) const HALO: &str =
    "paint-order=\"stroke\" stroke=\"white\" stroke-width=\"3\" stroke-linejoin=\"round\"";

/// Colours of the jobs' lines (Tableau 10).
pub(super) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

pub(super) fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A linear or log axis mapping data to pixels.
#[derive(Clone, Copy)]
pub(super) struct Axis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) log: bool,
    pub(super) from: f64,
    pub(super) to: f64,
}

impl Axis {
    pub(super) fn new(
        values: impl Iterator<Item = f64> + Clone,
        from: f64,
        to: f64,
        allow_log: bool,
    ) -> Axis {
        let finite = values.filter(|v| v.is_finite());
        let lo = finite.clone().fold(f64::INFINITY, f64::min);
        let hi = finite.fold(f64::NEG_INFINITY, f64::max);
        let (mut lo, mut hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
        let log = allow_log && lo > 0.0 && hi / lo > 100.0;
        if log {
            // 5% of the decades on each side, so no value sits on the axis line.
            let (l, h) = (lo.log10(), hi.log10());
            let pad = (h - l) * 0.05;
            lo = 10f64.powf(l - pad);
            hi = 10f64.powf(h + pad);
        } else {
            if lo == hi {
                let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
                lo -= pad;
                hi += pad;
            } else {
                let pad = (hi - lo) * 0.05;
                lo -= pad;
                hi += pad;
            }
        }
        Axis {
            lo,
            hi,
            log,
            from,
            to,
        }
    }

    pub(super) fn map(&self, v: f64) -> f64 {
        let (lo, hi, v) = if self.log {
            (
                self.lo.log10(),
                self.hi.log10(),
                v.max(f64::MIN_POSITIVE).log10(),
            )
        } else {
            (self.lo, self.hi, v)
        };
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        self.from + t * (self.to - self.from)
    }

    /// The ticks of an axis of swept values: the values themselves when there are few (a grid's
    /// points), else round values.
    pub(super) fn data_ticks(&self, values: impl Iterator<Item = f64>) -> Vec<f64> {
        let mut distinct: Vec<f64> = values.filter(|v| v.is_finite()).collect();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        if distinct.len() <= MAX_VALUE_TICKS {
            distinct
        } else {
            self.ticks()
        }
    }

    /// About five round tick values inside the axis.
    pub(super) fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().floor() as i32,
                self.hi.log10().ceil() as i32,
            );
            return (a..=b)
                .map(|e| 10f64.powi(e))
                .filter(|v| *v >= self.lo * 0.999 && *v <= self.hi * 1.001)
                .collect();
        }
        let span = self.hi - self.lo;
        let raw = span / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(raw);
        let mut v = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while v <= self.hi + step * 1e-9 && out.len() < 20 {
            out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
            v += step;
        }
        out
    }
}

pub(super) struct Svg {
    pub(super) body: String,
    /// The right end of the plot area (left of the legend, when there is one).
    pub(super) right: f64,
}

impl Svg {
    /// A figure with room for a legend on the right.
    pub(super) fn new(title: &str) -> Svg {
        Svg::with_right(title, WIDTH - RIGHT)
    }

    /// A figure without a legend: the plot takes the width.
    pub(super) fn bare(title: &str) -> Svg {
        Svg::with_right(title, WIDTH - RIGHT_BARE)
    }

    pub(super) fn with_right(title: &str, right: f64) -> Svg {
        let mut body = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"{FONT_SIZE}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            body,
            "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            LEFT,
            escape(title)
        );
        Svg { body, right }
    }

    /// A line of small grey text under the title (what a summarised figure leaves out).
    pub(super) fn note(&mut self, text: &str) {
        let _ = writeln!(
            self.body,
            "<text class=\"note\" x=\"{LEFT}\" y=\"32\" font-size=\"10\" fill=\"#555\">{}</text>",
            escape(text)
        );
    }

    /// The axis lines, the y ticks, the x ticks of a numeric x axis (`None`: the caller labels
    /// categories) and both labels.
    pub(super) fn axes(&mut self, x: Option<&Axis>, y: &Axis, x_label: &str, y_label: &str) {
        let (x0, x1, y0, y1) = (LEFT, self.right, HEIGHT - BOTTOM, TOP);
        let _ = writeln!(
            self.body,
            "<path d=\"M{x0},{y1} L{x0},{y0} L{x1},{y0}\" stroke=\"#333\" fill=\"none\"/>"
        );
        for (x, t) in x
            .into_iter()
            .flat_map(|x| x.ticks().into_iter().map(move |t| (x, t)))
        {
            let px = x.map(t);
            let _ = writeln!(
                self.body,
                "<line x1=\"{px:.1}\" y1=\"{y0}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                y0 + 4.0,
                y0 + 16.0,
                number(t)
            );
        }
        for t in y.ticks() {
            let py = y.map(t);
            let _ = writeln!(
                self.body,
                "<line x1=\"{x0}\" y1=\"{py:.1}\" x2=\"{x1}\" y2=\"{py:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                x0 - 4.0,
                py + 4.0,
                number(t)
            );
        }
        let _ = writeln!(
            self.body,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text><text transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            (x0 + x1) / 2.0,
            HEIGHT - 12.0,
            escape(x_label),
            (y0 + y1) / 2.0,
            escape(y_label)
        );
    }

    /// The legend in the column right of the plot: a colour swatch and its label per entry,
    /// each label wrapped, or cut with its whole text as the entry's `<title>`, so that it fits
    /// inside the figure ([`super::legend`]).
    pub(super) fn legend(&mut self, labels: &[(String, &str)]) {
        let x = WIDTH - RIGHT + 12.0;
        let (text_x, first) = (x + 14.0, TOP + 8.0);
        let texts: Vec<&str> = labels.iter().map(|(l, _)| l.as_str()).collect();
        let layout = legend::layout(
            &texts,
            WIDTH - LEGEND_MARGIN - text_x,
            FONT_SIZE,
            first,
            HEIGHT - 12.0,
        );
        for ((entry, y), (label, colour)) in layout
            .entries
            .iter()
            .zip(layout.baselines(first))
            .zip(labels)
        {
            let mut lines = String::new();
            for (k, line) in entry.lines.iter().enumerate() {
                let _ = write!(
                    lines,
                    "<text x=\"{text_x}\" y=\"{}\">{}</text>",
                    y + k as f64 * legend::LINE_STEP,
                    escape(line)
                );
            }
            let swatch = format!(
                "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>",
                y - 9.0
            );
            if entry.cut {
                let _ = writeln!(
                    self.body,
                    "<g class=\"legend-entry\"><title>{}</title>{swatch}{lines}</g>",
                    escape(label)
                );
            } else {
                let _ = writeln!(self.body, "{swatch}{lines}");
            }
        }
        if layout.more > 0 {
            let _ = writeln!(
                self.body,
                "<text x=\"{text_x}\" y=\"{}\" fill=\"#555\">+{} more</text>",
                layout.end(first),
                layout.more
            );
        }
    }

    pub(super) fn finish(mut self) -> String {
        self.body.push_str("</svg>\n");
        self.body
    }
}

/// The values in order of first appearance, each once.
pub(super) fn distinct(values: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    values
        .into_iter()
        .filter(|v| seen.insert(v.clone()))
        .collect()
}
