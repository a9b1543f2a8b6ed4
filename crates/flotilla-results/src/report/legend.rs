//! Fitting a figure's legend into its column, so that no label runs past the figure's edge in
//! the HTML page, the SVG files or their PNGs. Each label is measured in the figures' font with
//! the advance widths of DejaVu Sans, the widest of the sans-serif faces a browser or the PNG
//! rasteriser picks (Arial and Liberation Sans are narrower), each glyph rounded up to a whole
//! pixel as a hinting renderer may place it: a label that fits by this measure fits in any of
//! them. A label too wide is wrapped at its spaces (a word too wide for a line is broken after
//! `=`, `/`, `,`, `_`, `-` or `.` where it can be, else anywhere) onto as many lines as the
//! column's height leaves every entry, at most [`MAX_LINES`]; what still does not fit ends in
//! an ellipsis, and the entry then carries the whole label as its `<title>` (the page's tooltip).
//! When even one line per entry is too many, the last line counts the entries left out
//! (`+N more`).
//!
//! Wrapping rather than widening the figure keeps every figure the same size, side by side in
//! the page and in `--plot`, with the same plot area; wrapping rather than always truncating
//! keeps the whole label in the PNGs, which have no tooltip, whenever there is room for it.

/// Most lines one entry is wrapped onto.
pub const MAX_LINES: usize = 6;
/// Baseline to baseline within an entry.
pub const LINE_STEP: f64 = 12.0;
/// Baseline of an entry's last line to the first of the next one's.
pub const ENTRY_STEP: f64 = 15.0;

/// Advance widths of DejaVu Sans (per 1000 units of the font size) of the printable ASCII
/// characters, from the space (32) to the tilde (126).
const ADVANCES: [u16; 95] = [
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636,
    636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1015, 684, 686, 698, 770, 632,
    575, 775, 752, 295, 295, 656, 557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685,
    611, 685, 390, 337, 390, 838, 500, 500, 613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579,
    278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838,
];

/// The ellipsis that ends a cut line.
pub const ELLIPSIS: char = '…';

/// The width, in pixels, of `text` drawn at `font_size` (see the module doc): an upper bound
/// for the sans-serif faces the figures are drawn in. Characters outside ASCII count one em.
pub fn text_width(text: &str, font_size: f64) -> f64 {
    text.chars()
        .map(|c| {
            let units = match c as u32 {
                32..=126 => f64::from(ADVANCES[c as usize - 32]),
                _ => 1000.0,
            };
            (units * font_size / 1000.0).ceil()
        })
        .sum()
}

/// One legend entry: its lines, and whether part of the label was cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub lines: Vec<String>,
    pub cut: bool,
}

/// A legend laid out in its column: the entries shown, in order, and how many were left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub entries: Vec<Entry>,
    pub more: usize,
}

impl Layout {
    /// The baseline of each shown entry's first line, from `first`.
    pub fn baselines(&self, first: f64) -> Vec<f64> {
        let mut y = first;
        self.entries
            .iter()
            .map(|e| {
                let at = y;
                y += (e.lines.len() - 1) as f64 * LINE_STEP + ENTRY_STEP;
                at
            })
            .collect()
    }

    /// The baseline of the line after the last entry (where `+N more` goes).
    pub fn end(&self, first: f64) -> f64 {
        let last = self.baselines(first).last().copied();
        match (last, self.entries.last()) {
            (Some(y), Some(e)) => y + (e.lines.len() - 1) as f64 * LINE_STEP + ENTRY_STEP,
            _ => first,
        }
    }
}

/// Lays `labels` out in a column `width` pixels wide at `font_size`, whose first baseline is
/// `first` and whose baselines may go down to `last` (see the module doc): the most lines per
/// entry (up to [`MAX_LINES`]) with which every entry fits, else one line each for as many
/// entries as fit with a `+N more` line after them.
pub fn layout(labels: &[&str], width: f64, font_size: f64, first: f64, last: f64) -> Layout {
    let fits = |entries: &[Entry], extra_lines: usize| {
        let lines: usize = entries.iter().map(|e| e.lines.len() - 1).sum();
        let height = lines as f64 * LINE_STEP
            + (entries.len() + extra_lines).saturating_sub(1) as f64 * ENTRY_STEP;
        first + height <= last + 1e-9
    };
    for max_lines in (1..=MAX_LINES).rev() {
        let entries: Vec<Entry> = labels
            .iter()
            .map(|l| wrap(l, width, font_size, max_lines))
            .collect();
        if fits(&entries, 0) {
            return Layout { entries, more: 0 };
        }
    }
    // One line each, as many as fit with the `+N more` line.
    let mut entries: Vec<Entry> = Vec::new();
    for l in labels {
        let e = wrap(l, width, font_size, 1);
        let mut with = entries.clone();
        with.push(e);
        if !fits(&with, 1) {
            break;
        }
        entries = with;
    }
    let more = labels.len() - entries.len();
    Layout { entries, more }
}

/// `label` on at most `max_lines` lines of at most `width` pixels, the last one cut with an
/// ellipsis when the rest does not fit.
pub fn wrap(label: &str, width: f64, font_size: f64, max_lines: usize) -> Entry {
    let w = |s: &str| text_width(s, font_size);
    // Each line, and whether it ends inside a word (the next line goes on without a space).
    let mut lines: Vec<(String, bool)> = Vec::new();
    let mut line = String::new();
    for word in label.split(' ').filter(|w| !w.is_empty()) {
        let joined = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if w(&joined) <= width {
            line = joined;
            continue;
        }
        let mut rest = word.to_string();
        if !line.is_empty() {
            // A word broken anyway starts on this line, up to a separator that fits.
            let room = width - w(&format!("{line} "));
            match break_word(&rest, room, font_size, true).filter(|_| w(&rest) > width) {
                Some((head, tail)) => {
                    lines.push((format!("{line} {head}"), true));
                    rest = tail;
                }
                None => lines.push((std::mem::take(&mut line), false)),
            }
        }
        while w(&rest) > width {
            let Some((head, tail)) = break_word(&rest, width, font_size, false) else {
                break;
            };
            lines.push((head, true));
            rest = tail;
        }
        line = rest;
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push((line, false));
    }
    if lines.len() <= max_lines {
        return Entry {
            lines: lines.into_iter().map(|(l, _)| l).collect(),
            cut: false,
        };
    }
    let mut rest = String::new();
    for (l, mid_word) in &lines[max_lines - 1..] {
        rest.push_str(l);
        if !mid_word {
            rest.push(' ');
        }
    }
    let mut kept: Vec<String> = lines
        .into_iter()
        .take(max_lines - 1)
        .map(|(l, _)| l)
        .collect();
    kept.push(ellipsize(rest.trim_end(), width, font_size));
    Entry {
        lines: kept,
        cut: true,
    }
}

/// `word` (wider than `width`) as a head that fits and the rest: the longest head that fits,
/// cut after a separator when one lies in its second half; with `at_separator`, only ever
/// after a separator (`None` when no separator fits).
fn break_word(
    word: &str,
    width: f64,
    font_size: f64,
    at_separator: bool,
) -> Option<(String, String)> {
    let chars: Vec<char> = word.chars().collect();
    let mut n = 0;
    while n < chars.len() {
        let head: String = chars[..n + 1].iter().collect();
        if text_width(&head, font_size) > width {
            break;
        }
        n += 1;
    }
    let separator = chars[..n]
        .iter()
        .rposition(|c| "=/,_-.".contains(*c))
        .map(|i| i + 1)
        .filter(|&i| i < chars.len());
    let at = if at_separator {
        separator?
    } else {
        // Even a column too narrow for one character takes one, so that breaking ends.
        separator.filter(|&i| i * 2 >= n).unwrap_or(n.max(1))
    };
    Some((chars[..at].iter().collect(), chars[at..].iter().collect()))
}

/// The longest head of `text` that fits in `width` with an ellipsis after it.
fn ellipsize(text: &str, width: f64, font_size: f64) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut n = chars.len();
    loop {
        let head: String = chars[..n].iter().collect::<String>().trim_end().to_string();
        let cut = format!("{head}{ELLIPSIS}");
        if n == 0 || text_width(&cut, font_size) <= width {
            return cut;
        }
        n -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: f64 = 11.0;

    #[test]
    fn widths_are_dejavu_sans_rounded_up_per_glyph() {
        // '0' is 636/1000 em: 6.996 px at 11 px, drawn in 7.
        assert_eq!(text_width("0000", SIZE), 28.0);
        assert_eq!(text_width("i", SIZE), 4.0);
        assert_eq!(text_width("", SIZE), 0.0);
        assert_eq!(text_width("é", SIZE), 11.0);
    }

    #[test]
    fn a_short_label_stays_whole_on_one_line() {
        let e = wrap("3 lr=0.001", 120.0, SIZE, 3);
        assert_eq!(
            e,
            Entry {
                lines: vec!["3 lr=0.001".into()],
                cut: false
            }
        );
    }

    #[test]
    fn a_long_label_wraps_at_spaces_and_every_line_fits() {
        let label = "12 lr=0.0003 warmup_steps=100 weight_decay=0.01";
        let e = wrap(label, 120.0, SIZE, 3);
        assert!(!e.cut, "{e:?}");
        assert!(e.lines.len() >= 2, "{e:?}");
        assert_eq!(e.lines.join(" "), label);
        assert!(
            e.lines.iter().all(|l| text_width(l, SIZE) <= 120.0),
            "{e:?}"
        );
    }

    #[test]
    fn a_word_too_wide_breaks_after_a_separator_and_what_is_left_ends_in_an_ellipsis() {
        let label = "7 model.init_from=/checkpoints/very/long/path/to/a/base/model/final";
        let e = wrap(label, 120.0, SIZE, 2);
        assert!(e.cut, "{e:?}");
        assert_eq!(e.lines.len(), 2);
        assert!(e.lines[1].ends_with(ELLIPSIS), "{e:?}");
        // Cut inside the word: no space put into it.
        assert!(!e.lines[1].contains(' '), "{e:?}");
        // The word starts on the first line, cut after a separator.
        assert!(e.lines[0].starts_with("7 model.init_from="), "{e:?}");
        assert!(
            e.lines.iter().all(|l| text_width(l, SIZE) <= 120.0),
            "{e:?}"
        );
        assert!(e.lines[0].starts_with("7"), "{e:?}");
        // Unlimited lines: the whole label, broken only where it must be.
        let all = wrap(label, 120.0, SIZE, 99);
        assert!(!all.cut);
        assert_eq!(all.lines.concat().replace(' ', ""), label.replace(' ', ""));
        assert!(
            all.lines[1].ends_with('/') || all.lines[1].ends_with('='),
            "{all:?}"
        );
    }

    #[test]
    fn entries_get_fewer_lines_as_they_grow_in_number_and_the_rest_is_counted() {
        let long = "1 alpha=0.123456 beta=0.654321 gamma=0.111";
        // Few entries: each wrapped whole.
        let few = layout(&[long, long], 120.0, SIZE, 42.0, 348.0);
        assert!(
            few.entries.iter().all(|e| !e.cut && e.lines.len() > 1),
            "{few:?}"
        );
        assert_eq!(few.more, 0);
        // Many: one line each, cut, and a `+N more` line for those left out.
        let many: Vec<&str> = vec![long; 30];
        let l = layout(&many, 120.0, SIZE, 42.0, 348.0);
        assert!(
            l.entries.iter().all(|e| e.lines.len() == 1 && e.cut),
            "{l:?}"
        );
        assert_eq!(l.entries.len() + l.more, 30);
        assert!(l.more > 0);
        assert!(l.end(42.0) <= 348.0, "{}", l.end(42.0));
        // Short labels keep the legend's 15-pixel pitch.
        let short = layout(&["a", "b", "c"], 120.0, SIZE, 42.0, 348.0);
        assert_eq!(short.baselines(42.0), [42.0, 57.0, 72.0]);
    }
}
