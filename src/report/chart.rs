//! Charts drawn as SVG by `plotters`: lines over a numeric axis (CDFs, curves over time or
//! size) and bars over categories with an optional line series on a second axis (seed 000's
//! figures). Each chart names its series in a legend, as SVG `<text>`, so a reader (and a
//! test) finds them by name. The browser sets the text; nothing here needs a font.

use super::ReportError;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const WIDTH: u32 = 880;
const HEIGHT: u32 = 400;
const FONT: &str = "sans-serif";
/// The legend column of a line chart.
const LEGEND_WIDTH: u32 = 250;
/// About how wide a character of a 12-pixel tick label is.
const CHAR_PX: f64 = 6.5;
/// Room above the tallest bar for the legend.
const HEADROOM: f64 = 1.45;

/// Tableau's ten colours: distinct, and readable by most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// How an axis writes its numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// Up to three significant decimals, thousands as `k`.
    #[default]
    Number,
    /// A fraction shown as a percentage.
    Percent,
    /// A byte count (`4 KiB`, `1 MiB`).
    Bytes,
    /// Whole numbers only (rounds, counts): other ticks are left blank.
    Integer,
}

impl Format {
    /// `v` as this format writes it on an axis or a label.
    pub fn write(self, v: f64) -> String {
        match self {
            Format::Percent => format!("{:.0}%", v * 100.0),
            Format::Bytes => bytes(v),
            Format::Number => number(v),
            Format::Integer if (v - v.round()).abs() < 1e-9 => format!("{v:.0}"),
            Format::Integer => String::new(),
        }
    }
}

/// A tick label: short, and exact for round numbers.
fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 10_000.0 {
        format!("{}k", trim(v / 1000.0))
    } else {
        trim(v)
    }
}

/// A byte count in binary units, without trailing zeros: `4 KiB`, `1.5 MiB`.
fn bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut unit) = (v.max(0.0), 0);
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{} {}", trim((v * 100.0).round() / 100.0), UNITS[unit])
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// One named curve.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed: a reference (a machine limit, a published figure), not a measurement.
    pub reference: bool,
}

impl Series {
    /// A curve named `name` through `points` (x, y).
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            reference: false,
        }
    }

    /// A dashed horizontal line at `y` across `[x0, x1]`.
    pub fn level(name: impl Into<String>, y: f64, x0: f64, x1: f64) -> Series {
        Series {
            name: name.into(),
            points: vec![(x0, y), (x1, y)],
            reference: true,
        }
    }

    /// The empirical CDF of `values`: (value, share of values at or below it).
    pub fn cdf(name: impl Into<String>, values: &[f64]) -> Series {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        // At most ~400 points: a CDF of 100k requests draws the same at that resolution.
        let step = v.len().div_ceil(400).max(1);
        let mut points: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .filter(|(i, _)| i % step == 0 || i + 1 == v.len())
            .map(|(i, x)| (*x, (i + 1) as f64 / n))
            .collect();
        if let Some(&(x, _)) = points.first() {
            points.insert(0, (x, 0.0));
        }
        Series::new(name, points)
    }
}

impl Series {
    /// A rate over time: `events` (time in seconds, amount) summed in buckets of about a
    /// sixtieth of the span (at least 0.5 s), each point the bucket's amount per second at
    /// its middle.
    pub fn per_second(name: impl Into<String>, events: &[(f64, f64)]) -> Series {
        let end = events.iter().map(|e| e.0).fold(0.0, f64::max);
        let width = (end / 60.0).max(0.5);
        let buckets = ((end / width).ceil() as usize).max(1);
        let mut sums = vec![0.0; buckets];
        for &(t, amount) in events.iter().filter(|e| e.0.is_finite() && e.0 >= 0.0) {
            sums[((t / width) as usize).min(buckets - 1)] += amount;
        }
        let points = sums
            .iter()
            .enumerate()
            .map(|(i, s)| ((i as f64 + 0.5) * width, s / width))
            .collect();
        Series::new(name, points)
    }
}

/// Curves over a numeric x axis.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// The figure's id in the page (`id` attribute): letters, digits and `-`.
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_format: Format,
    pub y_format: Format,
    /// Logarithmic x axis (sizes spanning decades).
    pub x_log: bool,
    /// Logarithmic y axis (latencies spanning decades).
    pub y_log: bool,
    /// A fixed x range (a time window), instead of the data's.
    pub x_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
}

impl LineChart {
    /// An empty line chart: its element id on the page, title and axis labels.
    pub fn new(id: &str, title: &str, x_label: &str, y_label: &str) -> LineChart {
        LineChart {
            id: id.into(),
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_format: Format::Number,
            y_format: Format::Number,
            x_log: false,
            y_log: false,
            x_range: None,
            series: Vec::new(),
        }
    }

    /// Adds a curve.
    pub fn series(mut self, s: Series) -> LineChart {
        self.series.push(s);
        self
    }

    /// How the x and y axes write their values.
    pub fn formats(mut self, x: Format, y: Format) -> LineChart {
        self.x_format = x;
        self.y_format = y;
        self
    }

    /// A logarithmic x axis.
    pub fn log_x(mut self) -> LineChart {
        self.x_log = true;
        self
    }

    /// A logarithmic y axis.
    pub fn log_y(mut self) -> LineChart {
        self.y_log = true;
        self
    }

    /// Shows x from `from` to `to` whatever the data covers (on a linear axis).
    pub fn x_range(mut self, from: f64, to: f64) -> LineChart {
        self.x_range = Some((from, to));
        self
    }

    /// The chart as one `<svg>` element: the plot on the left, its legend on the right.
    pub fn svg(&self) -> Result<String, ReportError> {
        // A log axis is drawn linear in log2 (sizes: ticks fall on powers of two) or log10.
        let log_base = |format| if format == Format::Bytes { 2f64 } else { 10f64 };
        let (xb, yb) = (log_base(self.x_format), log_base(self.y_format));
        let tx = |x: f64| if self.x_log { x.max(1e-12).log(xb) } else { x };
        let ty = |y: f64| if self.y_log { y.max(1e-12).log(yb) } else { y };
        let series: Vec<(&Series, Vec<(f64, f64)>)> = self
            .series
            .iter()
            .map(|s| {
                let pts = s
                    .points
                    .iter()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .filter(|(x, y)| (!self.x_log || *x > 0.0) && (!self.y_log || *y > 0.0))
                    .map(|&(x, y)| (tx(x), ty(y)))
                    .collect();
                (s, pts)
            })
            .collect();
        let all = || series.iter().flat_map(|(_, p)| p.iter());
        let (x0, x1) = match self.x_range {
            Some(r) if !self.x_log && r.0 < r.1 => r,
            _ => span(all().map(|p| p.0), false),
        };
        let (y0, y1) = span(all().map(|p| p.1), !self.y_log);
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
            draw(root.fill(&WHITE))?;
            let (plot, legend) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
            let mut chart = draw(
                ChartBuilder::on(&plot)
                    .caption(&self.title, (FONT, 17))
                    .margin(12)
                    .x_label_area_size(44)
                    .y_label_area_size(64)
                    .build_cartesian_2d(x0..x1, y0..y1),
            )?;
            let (xf, yf, xlog, ylog) = (self.x_format, self.y_format, self.x_log, self.y_log);
            let x_text = move |x: &f64| axis_text(xf, *x, xlog.then_some(xb));
            let y_text = move |y: &f64| axis_text(yf, *y, ylog.then_some(yb));
            let mut mesh = chart.configure_mesh();
            if self.x_log {
                // One tick per power: the span in whole powers, plus one.
                mesh.x_labels(((x1 - x0).ceil() as usize + 1).clamp(2, 24));
            }
            draw(
                mesh.x_desc(&self.x_label)
                    .y_desc(&self.y_label)
                    .x_label_formatter(&x_text)
                    .y_label_formatter(&y_text)
                    .label_style((FONT, 12))
                    .light_line_style(RGBColor(238, 238, 238))
                    .draw(),
            )?;
            for (i, (s, pts)) in series.iter().enumerate() {
                let c = colour(i);
                let style = c.stroke_width(2);
                if s.reference {
                    // A reference known at one x only holds across the chart.
                    let pts = match pts.as_slice() {
                        [(_, y)] => vec![(x0, *y), (x1, *y)],
                        _ => pts.clone(),
                    };
                    draw(chart.draw_series(DashedLineSeries::new(pts, 8, 5, style)))?;
                } else {
                    if pts.len() <= 24 {
                        draw(
                            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))),
                        )?;
                    }
                    draw(chart.draw_series(LineSeries::new(pts.clone(), style)))?;
                }
            }
            let names: Vec<(&str, bool)> = self
                .series
                .iter()
                .map(|s| (s.name.as_str(), s.reference))
                .collect();
            side_legend(&legend, &names)?;
            draw(root.present())?;
        }
        Ok(out)
    }
}

/// A tick label; on a log axis (`Some(base)`) the tick is the exponent, and only whole powers
/// get a label.
fn axis_text(format: Format, v: f64, log_base: Option<f64>) -> String {
    match log_base {
        None => format.write(v),
        Some(_) if (v - v.round()).abs() > 1e-6 => String::new(),
        Some(b) => format.write(b.powf(v.round())),
    }
}

/// The legend in its own column: a line sample (dashed for references) and each name.
fn side_legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    names: &[(&str, bool)],
) -> Result<(), ReportError> {
    let style = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (name, reference)) in names.iter().enumerate() {
        let y = 48 + 20 * i as i32;
        let c = colour(i).stroke_width(2);
        if *reference {
            draw(area.draw(&PathElement::new(vec![(4, y), (10, y)], c)))?;
            draw(area.draw(&PathElement::new(vec![(14, y), (22, y)], c)))?;
        } else {
            draw(area.draw(&PathElement::new(vec![(4, y), (22, y)], c)))?;
        }
        draw(area.draw(&Text::new(name.to_string(), (28, y), style.clone())))?;
    }
    Ok(())
}

/// Values of one named series over the categories (`None`: no figure for that category).
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

impl Group {
    /// A group of bars named `name`: a value per category (`None`: not measured).
    pub fn new(name: impl Into<String>, values: Vec<Option<f64>>) -> Group {
        Group {
            name: name.into(),
            values,
        }
    }
}

/// One panel of a [`BarChart`]: grouped bars over the categories on the left axis, and
/// optionally lines over the same categories on a right axis of their own.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub bar_label: String,
    pub bar_format: Format,
    pub bars: Vec<Group>,
    pub line_label: String,
    pub line_format: Format,
    pub lines: Vec<Group>,
}

impl Panel {
    /// A panel of `bars` titled `title`, its values labelled `label` and written in `format`.
    pub fn bars(title: &str, label: &str, format: Format, bars: Vec<Group>) -> Panel {
        Panel {
            title: title.into(),
            bar_label: label.into(),
            bar_format: format,
            bars,
            line_label: String::new(),
            line_format: Format::Number,
            lines: Vec::new(),
        }
    }

    /// Adds lines on a right axis.
    pub fn with_lines(mut self, label: &str, format: Format, lines: Vec<Group>) -> Panel {
        self.line_label = label.into();
        self.line_format = format;
        self.lines = lines;
        self
    }
}

/// Bars over named categories, in one or more panels side by side, each with its own scale
/// (ours beside a published figure, whose units or machine differ).
#[derive(Debug, Clone)]
pub struct BarChart {
    pub id: String,
    pub title: String,
    pub categories: Vec<String>,
    pub panels: Vec<Panel>,
}

impl BarChart {
    /// An empty bar chart: its element id on the page, title and categories.
    pub fn new(id: &str, title: &str, categories: Vec<String>) -> BarChart {
        BarChart {
            id: id.into(),
            title: title.into(),
            categories,
            panels: Vec::new(),
        }
    }

    /// Adds a panel (charts with several panels stack them, sharing the categories).
    pub fn panel(mut self, p: Panel) -> BarChart {
        self.panels.push(p);
        self
    }

    /// The chart as an SVG element.
    pub fn svg(&self) -> Result<String, ReportError> {
        if let Some(p) = self.horizontal() {
            return self.horizontal_svg(p);
        }
        let mut out = String::new();
        {
            let width = if self.panels.len() > 1 { 1100 } else { WIDTH };
            let root = SVGBackend::with_string(&mut out, (width, HEIGHT + 30)).into_drawing_area();
            draw(root.fill(&WHITE))?;
            let root = draw(root.titled(&self.title, (FONT, 18)))?;
            let cols = self.panels.len().max(1);
            for (area, panel) in root.split_evenly((1, cols)).iter().zip(&self.panels) {
                self.draw_panel(area, panel)?;
            }
            draw(root.present())?;
        }
        Ok(out)
    }

    /// The one panel, when its category names are too long to sit side by side under
    /// vertical bars (and it has no lines): then the bars lie down, names on the left.
    fn horizontal(&self) -> Option<&Panel> {
        let [p] = self.panels.as_slice() else {
            return None;
        };
        let longest = self.categories.iter().map(|c| c.chars().count()).max()?;
        let slot = (WIDTH as f64 - 110.0) / self.categories.len() as f64;
        (p.lines.is_empty() && longest as f64 * CHAR_PX > slot - 6.0).then_some(p)
    }

    fn horizontal_svg(&self, p: &Panel) -> Result<String, ReportError> {
        let n = self.categories.len();
        let groups = p.bars.len().max(1);
        let per = (groups as u32 * 13 + 10).max(26);
        let height = per * n as u32 + 120;
        let longest = self
            .categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(0);
        let names_px = ((longest as f64 * CHAR_PX) as u32 + 16).min(380);
        let values = p
            .bars
            .iter()
            .flat_map(|g| g.values.iter().flatten().copied());
        let (_, x1) = span(values, true);
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
            draw(root.fill(&WHITE))?;
            let mut chart = draw(
                ChartBuilder::on(&root)
                    .caption(&self.title, (FONT, 18))
                    .margin(12)
                    .x_label_area_size(40)
                    .y_label_area_size(names_px)
                    .build_cartesian_2d(0f64..x1 * 1.6, -0.5f64..(n as f64 - 0.5)),
            )?;
            // The first category on top.
            let cat_text = category_label(self.categories.clone(), true);
            let bf = p.bar_format;
            draw(
                chart
                    .configure_mesh()
                    .disable_y_mesh()
                    .y_labels(n.max(1) * 2 + 1)
                    .y_label_formatter(&cat_text)
                    .x_desc(&p.bar_label)
                    .x_label_formatter(&move |x: &f64| bf.write(*x))
                    .label_style((FONT, 12))
                    .light_line_style(RGBColor(238, 238, 238))
                    .draw(),
            )?;
            let h = 0.8 / groups as f64;
            for (g, group) in p.bars.iter().enumerate() {
                let c = colour(g);
                let row = |i: usize| (n - 1 - i) as f64 + 0.4 - g as f64 * h;
                let rects = group.values.iter().enumerate().filter_map(|(i, v)| {
                    let top = row(i);
                    Some(Rectangle::new(
                        [(0.0, top - 0.01), ((*v)?, top - h + 0.01)],
                        c.filled(),
                    ))
                });
                let style =
                    TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
                let labels = group.values.iter().enumerate().filter_map(|(i, v)| {
                    let v = (*v)?;
                    let at = (v, row(i) - h / 2.0);
                    Some(EmptyElement::at(at) + Text::new(bf.write_value(v), (4, 0), style.clone()))
                });
                draw(chart.draw_series(labels))?;
                draw(chart.draw_series(rects))?
                    .label(group.name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                    });
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight)?;
            draw(root.present())?;
        }
        Ok(out)
    }

    fn draw_panel(
        &self,
        area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        p: &Panel,
    ) -> Result<(), ReportError> {
        let n = self.categories.len();
        let bar_values = p
            .bars
            .iter()
            .flat_map(|g| g.values.iter().flatten().copied());
        let (_, y1) = span(bar_values, true);
        let has_lines = !p.lines.is_empty();
        let line_values = p
            .lines
            .iter()
            .flat_map(|g| g.values.iter().flatten().copied());
        let (_, l1) = span(line_values, true);
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(&p.title, (FONT, 14))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .right_y_label_area_size(if has_lines { 56 } else { 0 });
        let mut chart = draw(
            builder
                .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..y1 * HEADROOM)
                .map(|c| c.set_secondary_coord(-0.5f64..(n as f64 - 0.5), 0f64..l1 * HEADROOM)),
        )?;
        let cat_text = category_label(self.categories.clone(), false);
        let bf = p.bar_format;
        let lf = p.line_format;
        draw(
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n.max(1) * 2 + 1)
                .x_label_formatter(&cat_text)
                .y_desc(&p.bar_label)
                .y_label_formatter(&move |y: &f64| bf.write(*y))
                .label_style((FONT, 12))
                .light_line_style(RGBColor(238, 238, 238))
                .draw(),
        )?;
        if has_lines {
            draw(
                chart
                    .configure_secondary_axes()
                    .y_desc(&p.line_label)
                    .y_label_formatter(&move |y: &f64| lf.write(*y))
                    .label_style((FONT, 12))
                    .draw(),
            )?;
        }
        let groups = p.bars.len().max(1) as f64;
        let width = 0.8 / groups;
        for (g, group) in p.bars.iter().enumerate() {
            let c = colour(g);
            let left = -0.4 + g as f64 * width;
            let rects = group.values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                let x = i as f64 + left;
                Some(Rectangle::new(
                    [(x + 0.01, 0.0), (x + width - 0.01, v)],
                    c.filled(),
                ))
            });
            let labels = group.values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                let x = i as f64 - 0.4 + (g as f64 + 0.5) * width;
                let style = TextStyle::from((FONT, 11).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom));
                Some(Text::new(bf.write_value(v), (x, v), style))
            });
            draw(chart.draw_series(labels))?;
            draw(chart.draw_series(rects))?
                .label(group.name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        for (l, line) in p.lines.iter().enumerate() {
            let c = colour(p.bars.len() + l);
            let style = c.stroke_width(2);
            let pts: Vec<(f64, f64)> = line
                .values
                .iter()
                .enumerate()
                .filter_map(|(i, v)| Some((i as f64, (*v)?)))
                .collect();
            draw(chart.draw_secondary_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled()))))?;
            draw(chart.draw_secondary_series(LineSeries::new(pts, style)))?
                .label(line.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        Ok(())
    }
}

/// The name of the category at a whole tick of a category axis (`reversed`: counted from the
/// far end), blank between them.
fn category_label(cats: Vec<String>, reversed: bool) -> impl Fn(&f64) -> String {
    move |at: &f64| {
        let i = at.round();
        if (at - i).abs() > 1e-6 || i < 0.0 || i as usize >= cats.len() {
            return String::new();
        }
        let i = i as usize;
        cats[if reversed { cats.len() - 1 - i } else { i }].clone()
    }
}

/// The chart's legend, in a box at `position`.
fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<(), ReportError> {
    draw(
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(position)
            .draw(),
    )
}

impl Format {
    /// A value printed on a bar: a little more precise than a tick.
    fn write_value(self, v: f64) -> String {
        match self {
            Format::Percent => format!("{:.1}%", v * 100.0),
            Format::Number if v.abs() < 100.0 => format!("{v:.2}"),
            Format::Number | Format::Integer => format!("{v:.0}"),
            Format::Bytes => self.write(v),
        }
    }
}

/// The range an axis shows for `values`: from 0 when `from_zero`, widened when empty or flat.
fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-12 {
        let d = if lo.abs() > 0.0 { lo.abs() } else { 1.0 };
        if from_zero {
            hi = lo + d;
        } else {
            // One value: centred, a twentieth of it or a unit (on a log axis, a power) either
            // side, whichever is more.
            let d = (d * 0.05).max(1.0);
            (lo, hi) = (lo - d, hi + d);
        }
    }
    if from_zero {
        hi += (hi - lo) * 0.05;
    }
    (lo, hi)
}

fn draw<T, E: std::fmt::Debug>(r: Result<T, E>) -> Result<T, ReportError> {
    r.map_err(|e| ReportError::Draw(format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trimmed contents of the SVG's `<text>` elements.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    #[test]
    fn a_line_chart_names_its_series_in_svg_text() {
        let svg = LineChart::new("c", "TTFT <CDF>", "s", "share")
            .series(Series::cdf("rate 4", &[0.3, 0.1, 0.2]))
            .series(Series::level("loopback TCP", 4.0, 0.0, 1.0))
            .svg()
            .unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let t = texts(&svg);
        assert!(t.iter().any(|t| t == "rate 4"), "{t:?}");
        assert!(t.iter().any(|t| t == "loopback TCP"), "{t:?}");
        assert!(
            t.iter().any(|t| t == "TTFT &lt;CDF&gt;"),
            "the title is escaped: {t:?}"
        );
    }

    #[test]
    fn a_cdf_climbs_to_one_over_sorted_values() {
        let s = Series::cdf("x", &[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!(
            s.points,
            vec![(1.0, 0.0), (1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]
        );
        let big: Vec<f64> = (0..100_000).map(f64::from).collect();
        let s = Series::cdf("big", &big);
        assert!(s.points.len() <= 402, "{}", s.points.len());
        assert_eq!(s.points.last(), Some(&(99_999.0, 1.0)));
    }

    #[test]
    fn a_rate_over_time_sums_each_bucket_per_second() {
        let events: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i) * 0.1, 1.0)).collect();
        let s = Series::per_second("req/s", &events);
        assert_eq!(s.points, vec![(0.25, 10.0), (0.75, 10.0)]);
        let long: Vec<(f64, f64)> = (0..=600).map(|i| (f64::from(i), 2.0)).collect();
        let s = Series::per_second("long", &long);
        assert_eq!(s.points.len(), 60);
        assert!(s.points[..59].iter().all(|p| p.1 == 2.0), "{:?}", s.points);
    }

    #[test]
    fn bar_panels_name_bars_and_lines_and_skip_missing_values() {
        let svg = BarChart::new("t", "tiers", vec!["L1".into(), "L1+L2".into()])
            .panel(
                Panel::bars(
                    "ours",
                    "hit rate",
                    Format::Percent,
                    vec![Group::new("hit rate", vec![Some(0.1), None])],
                )
                .with_lines(
                    "TTFT (s)",
                    Format::Number,
                    vec![Group::new("mean TTFT", vec![Some(2.0), Some(1.0)])],
                ),
            )
            .panel(Panel::bars(
                "seed 000 (published)",
                "tok/s",
                Format::Number,
                vec![Group::new("seed", vec![Some(6576.86), Some(10054.21)])],
            ))
            .svg()
            .unwrap();
        let t = texts(&svg);
        for name in [
            "hit rate",
            "mean TTFT",
            "seed",
            "L1+L2",
            "seed 000 (published)",
            "10.0%",
        ] {
            assert!(t.iter().any(|t| t == name), "{name}: {t:?}");
        }
    }

    #[test]
    fn bars_with_long_names_lie_down_and_keep_every_name() {
        let names: Vec<String> = (0..6)
            .map(|i| format!("describe, 1 client, puts streaming, case {i}"))
            .collect();
        let chart = BarChart::new("h", "long", names.clone()).panel(Panel::bars(
            "",
            "ops/s",
            Format::Number,
            vec![
                Group::new("ours", (0..6).map(|i| Some(f64::from(i) * 10.0)).collect()),
                Group::new("ceiling", vec![None, None, None, None, None, Some(99.0)]),
            ],
        ));
        assert!(chart.horizontal().is_some());
        let t = texts(&chart.svg().unwrap());
        for name in names
            .iter()
            .map(String::as_str)
            .chain(["ours", "ceiling", "99.00"])
        {
            assert!(t.iter().any(|t| t == name), "{name}: {t:?}");
        }
        let short = BarChart::new("v", "short", vec!["L1".into(), "L2".into()]).panel(Panel::bars(
            "",
            "x",
            Format::Number,
            vec![],
        ));
        assert!(short.horizontal().is_none());
    }

    #[test]
    fn empty_and_flat_data_still_draw() {
        assert!(LineChart::new("e", "empty", "x", "y").svg().is_ok());
        let flat = LineChart::new("f", "flat", "x", "y").series(Series::new("s", vec![(1.0, 5.0)]));
        assert!(flat.svg().is_ok());
        assert_eq!(span([2.0, 2.0].into_iter(), false), (1.0, 3.0));
        assert_eq!(span([18.0].into_iter(), false), (17.0, 19.0));
        assert_eq!(span([1e6].into_iter(), false), (0.95e6, 1.05e6));
        assert_eq!(span([0.5].into_iter(), false), (-0.5, 1.5));
        assert_eq!(span([2.0].into_iter(), true), (0.0, 2.1));
        assert_eq!(span(std::iter::empty(), true), (0.0, 1.0));
    }

    #[test]
    fn axis_numbers_are_short() {
        assert_eq!(Format::Number.write(15000.0), "15k");
        assert_eq!(Format::Number.write(0.25), "0.25");
        assert_eq!(Format::Number.write(2.0), "2");
        assert_eq!(Format::Percent.write(0.4062), "41%");
        assert_eq!(Format::Bytes.write(1048576.0), "1 MiB");
    }
}
