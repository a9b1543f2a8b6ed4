//! The report as one self-contained HTML page (no network): a line saying what "best" means,
//! the figures first (`figures.rs`), then the results table, sortable by any column (a
//! grouped report's table of configurations, then its jobs'). A table of more than
//! [`TABLE_ROWS`] rows shows its best rows; all its rows are on the page as data that the
//! page's script renders on demand (the "show all" link, `page.html#all`), so that a sweep of
//! thousands of jobs is a small page that opens at once.

use super::figures::figures;
use super::group::Groups;
use super::render::{grouped_cell, mean_header, number, param};
use super::svg::escape;
use super::{param_header, JobRow, Mode, Report};
use std::fmt::Write as _;

/// Rows a table shows before its "show all" button.
pub const TABLE_ROWS: usize = 50;

/// One cell: its text, and the number it sorts by (`None`: a text cell).
struct Cell {
    text: String,
    sort: Option<f64>,
}

impl Cell {
    fn text(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            sort: None,
        }
    }

    fn number(v: Option<f64>) -> Cell {
        Cell {
            text: v.map(number).unwrap_or_default(),
            sort: Some(v.unwrap_or(f64::NAN)),
        }
    }
}

/// A sortable table: its header (with whether each column holds text), its rows (the best
/// flagged), the best first when there are more than [`TABLE_ROWS`].
struct Table {
    id: &'static str,
    header: Vec<(String, bool)>,
    rows: Vec<(bool, Vec<Cell>)>,
    /// What the first rows are: `by best eval_loss`.
    order: String,
    /// What a row is: `job`, `configuration`.
    noun: &'static str,
}

impl Table {
    fn header_html(&self, html: &mut String) {
        let _ = write!(
            html,
            "<table class=\"report\" id=\"{}\"><thead><tr>",
            self.id
        );
        for (name, text) in &self.header {
            let _ = write!(
                html,
                "<th{}>{}</th>",
                if *text { " class=\"text\"" } else { "" },
                escape(name)
            );
        }
        html.push_str("</tr></thead><tbody>\n");
    }

    fn row_html(&self, html: &mut String, best: bool, cells: &[Cell]) {
        html.push_str(if best { "<tr class=\"best\">" } else { "<tr>" });
        for (cell, (_, text)) in cells.iter().zip(&self.header) {
            match (cell.sort, text) {
                (Some(v), false) if !v.is_nan() => {
                    let _ = write!(html, "<td data-v=\"{v}\">{}</td>", escape(&cell.text));
                }
                (Some(_), false) => html.push_str("<td data-v=\"\"></td>"),
                (_, true) => {
                    let _ = write!(html, "<td class=\"text\">{}</td>", escape(&cell.text));
                }
                (None, false) => {
                    let _ = write!(html, "<td>{}</td>", escape(&cell.text));
                }
            }
        }
        html.push_str("</tr>\n");
    }

    /// The rows as data for the page's script: `{"shown", "text": [...], "rows": [[best, cell,
    /// ...]]}`,
    /// a number cell as `[text, value]` (a missing value `null`), a text cell as its text.
    fn data_json(&self) -> String {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|(best, cells)| {
                let mut row = vec![serde_json::Value::from(u8::from(*best))];
                row.extend(cells.iter().map(|c| match c.sort {
                    Some(v) if v.is_finite() => {
                        // Six significant digits order the rows as the values do.
                        let rounded: f64 = format!("{v:.5e}").parse().unwrap_or(v);
                        serde_json::json!([c.text, rounded])
                    }
                    Some(_) => serde_json::json!([c.text, null]),
                    None => serde_json::Value::from(c.text.as_str()),
                }));
                serde_json::Value::Array(row)
            })
            .collect();
        let text: Vec<bool> = self.header.iter().map(|(_, t)| *t).collect();
        serde_json::json!({ "shown": TABLE_ROWS, "text": text, "rows": rows })
            .to_string()
            .replace("</", "<\\/")
    }

    fn html(&self, html: &mut String) {
        let total = self.rows.len();
        if total > TABLE_ROWS {
            let _ = writeln!(
                html,
                "<p class=\"more\">The {TABLE_ROWS} best of {total} {}s {}: <a href=\"#all\">show all {total}</a></p>",
                self.noun, self.order
            );
        }
        self.header_html(html);
        for (best, cells) in self.rows.iter().take(TABLE_ROWS) {
            self.row_html(html, *best, cells);
        }
        html.push_str("</tbody></table>\n");
        if total > TABLE_ROWS {
            let _ = writeln!(
                html,
                "<script type=\"application/json\" id=\"{}-data\">{}</script>",
                self.id,
                self.data_json()
            );
        }
    }
}

/// The jobs' table: every job, the best first when there are more than [`TABLE_ROWS`].
fn jobs_table(report: &Report) -> Table {
    let keys = report.param_keys();
    let sweeps = report.spans_sweeps();
    let mut header = vec![("num".to_string(), false)];
    if sweeps {
        header.push(("sweep".into(), true));
    }
    header.push(("state".into(), true));
    header.extend(keys.iter().map(|k| (param_header(k), true)));
    header.extend([
        (format!("final {}", report.metric), false),
        (report.best_header(), false),
        ("best step".into(), false),
        ("steps".into(), false),
        ("wall s".into(), false),
        ("tokens/s".into(), false),
        ("note".into(), true),
    ]);
    let mut order: Vec<&JobRow> = report.jobs.iter().collect();
    if order.len() > TABLE_ROWS {
        order.sort_by(|a, b| {
            let known = |v: Option<f64>| v.filter(|v| v.is_finite());
            super::nones_last(known(a.best), known(b.best), |x, y| match report.mode {
                Mode::Min => x.total_cmp(&y),
                Mode::Max => y.total_cmp(&x),
            })
        });
    }
    let rows = order
        .into_iter()
        .map(|r| {
            let mut cells = vec![Cell::text(r.num.to_string())];
            if sweeps {
                cells.push(Cell::text(r.sweep.as_deref().unwrap_or("")));
            }
            cells.push(Cell::text(r.state.to_string()));
            cells.extend(
                keys.iter()
                    .map(|k| Cell::text(r.params.get(k).map(param).unwrap_or_default())),
            );
            cells.extend([
                Cell::number(r.final_value),
                Cell::number(r.best),
                Cell::number(r.best_step.map(|s| s as f64)),
                Cell::number(Some(r.steps as f64)),
                Cell::number(r.wall_s),
                Cell::number(r.tokens_per_s.map(f64::round)),
                Cell::text(r.reason.as_deref().unwrap_or("")),
            ]);
            (report.is_best(r), cells)
        })
        .collect();
    Table {
        id: "jobs",
        header,
        rows,
        order: format!("by {}", report.best_header()),
        noun: "job",
    }
}

/// The configurations' table of a grouped report, in the report's order.
fn groups_table(report: &Report, groups: &Groups) -> Table {
    let keys = groups.param_keys();
    let mut header: Vec<(String, bool)> = keys.iter().map(|k| (param_header(k), true)).collect();
    header.extend(groups.by.iter().map(|k| (k.clone(), true)));
    header.extend([
        ("n".to_string(), false),
        (mean_header(report), false),
        ("std".into(), false),
        (format!("final {} mean", report.metric), false),
        ("final std".into(), false),
        ("jobs".into(), true),
        ("note".into(), true),
    ]);
    let rows = groups
        .groups
        .iter()
        .map(|g| {
            let mut cells: Vec<Cell> = keys
                .iter()
                .map(|k| Cell::text(g.params.get(k).map(param).unwrap_or_default()))
                .collect();
            cells.extend(g.grouped.values().map(|vs| Cell::text(grouped_cell(vs))));
            cells.extend([
                Cell::number(Some(g.n as f64)),
                Cell::number(g.mean),
                Cell::number(g.std),
                Cell::number(g.final_mean),
                Cell::number(g.final_std),
                Cell::text(grouped_cell(
                    &g.jobs
                        .iter()
                        .map(|n| serde_json::Value::from(*n))
                        .collect::<Vec<_>>(),
                )),
                Cell::text(g.reason.as_deref().unwrap_or("")),
            ]);
            (groups.is_best(g, report.mode), cells)
        })
        .collect();
    Table {
        id: "configurations",
        header,
        rows,
        order: format!("by {}", mean_header(report)),
        noun: "configuration",
    }
}

/// Sorting by a column (the rows on the page, or, for a table shown in part, all its rows'
/// data, of which the first are shown again), and "show all" (the link to `#all`, which also
/// opens the page with every row).
const TABLE_SCRIPT: &str = r#"
function tableData(table) {
  const el = document.getElementById(table.id + '-data');
  if (!el) return null;
  if (!table.data) { table.data = JSON.parse(el.textContent); table.limit = table.data.shown; }
  return table.data;
}
function renderRows(table) {
  const data = table.data, body = table.tBodies[0];
  const rows = data.rows.slice(0, table.limit);
  body.textContent = '';
  for (const r of rows) {
    const tr = document.createElement('tr');
    if (r[0]) tr.className = 'best';
    r.slice(1).forEach((c, i) => {
      const td = document.createElement('td');
      if (Array.isArray(c)) { td.textContent = c[0]; td.dataset.v = c[1] === null ? '' : c[1]; }
      else { td.textContent = c; }
      if (data.text[i]) td.className = 'text';
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}
function compare(x, y, dir) {
  const nx = parseFloat(x), ny = parseFloat(y);
  if (x === '' && y !== '') return 1;
  if (y === '' && x !== '') return -1;
  return (isNaN(nx) || isNaN(ny) ? String(x).localeCompare(String(y)) : nx - ny) * dir;
}
document.querySelectorAll('table.report').forEach(table => {
  table.querySelectorAll('th').forEach((th, col) => {
    th.addEventListener('click', () => {
      const dir = th.dataset.dir === 'asc' ? -1 : 1;
      th.dataset.dir = dir === 1 ? 'asc' : 'desc';
      const data = tableData(table);
      if (data) {
        const key = r => { const c = r[col + 1]; return Array.isArray(c) ? (c[1] === null ? '' : c[1]) : c; };
        data.rows.sort((a, b) => compare(key(a), key(b), dir));
        renderRows(table);
        return;
      }
      const body = table.tBodies[0];
      const rows = Array.from(body.rows);
      const key = r => r.cells[col].dataset.v ?? r.cells[col].textContent;
      rows.sort((a, b) => compare(key(a), key(b), dir));
      rows.forEach(r => body.appendChild(r));
    });
  });
});
function showAll() {
  document.querySelectorAll('table.report').forEach(table => {
    const data = tableData(table);
    if (!data) return;
    table.limit = data.rows.length;
    renderRows(table);
  });
  document.querySelectorAll('p.more').forEach(p => { p.hidden = true; });
}
window.addEventListener('hashchange', () => { if (location.hash === '#all') showAll(); });
if (location.hash === '#all') showAll();
document.body.dataset.ready = 'yes';
"#;

/// One self-contained page: what the report is, every figure, then the sortable table(s).
pub fn page(report: &Report, title: &str) -> String {
    let mut html = String::new();
    let grouped = report.groups.as_ref().map(|g| {
        format!(
            "; grouped over <b>{}</b>: {} configuration{}, each its jobs' mean ± sample standard deviation (n − 1)",
            escape(&g.by.join(", ")),
            g.groups.len(),
            if g.groups.len() == 1 { "" } else { "s" }
        )
    });
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>body{{font-family:sans-serif;margin:24px;color:#222}} table.report{{border-collapse:collapse;font-size:13px;margin-bottom:24px}} th,td{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}} th{{cursor:pointer;background:#f4f4f4;position:sticky;top:0}} td.text,th.text{{text-align:left}} tr.best td{{font-weight:bold;background:#eef6ee}} .figures{{display:flex;flex-wrap:wrap}} .figures svg{{margin:8px;border:1px solid #eee}}</style></head>\n<body><h1>{t}</h1>\n<p>metric: <b>{m}</b> ({mode}; a job's best is its {extreme} value at any step, the best is marked); {n} job{s}{g}; click a column to sort.</p>\n<div class=\"figures\">\n",
        t = escape(title),
        m = escape(&report.metric),
        mode = if report.mode == Mode::Min { "lower is better" } else { "higher is better" },
        extreme = if report.mode == Mode::Min { "lowest" } else { "highest" },
        n = report.jobs.len(),
        s = if report.jobs.len() == 1 { "" } else { "s" },
        g = grouped.unwrap_or_default(),
    );
    for (_, svg) in figures(report) {
        html.push_str(&svg);
    }
    html.push_str("</div>\n");
    if let Some(groups) = &report.groups {
        html.push_str("<h2>Configurations</h2>\n");
        groups_table(report, groups).html(&mut html);
        html.push_str("<h2>Jobs</h2>\n");
    }
    jobs_table(report).html(&mut html);
    let _ = write!(html, "<script>{TABLE_SCRIPT}</script>\n</body></html>\n");
    html
}
