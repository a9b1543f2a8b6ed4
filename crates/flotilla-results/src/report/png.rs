//! The report's figures as PNG files: each SVG that `figures.rs` draws, rasterised by resvg (usvg
//! parses it, tiny-skia paints it) at twice its size, so a PNG and its SVG are the same picture.
//! The system's fonts are loaded once per process; the SVGs' `font-family="sans-serif"` is
//! resolved to the first installed of Arial, its metric twin Liberation Sans (what Chromium draws
//! `sans-serif` in on Debian, so text keeps the width it has in the HTML page), Helvetica,
//! DejaVu Sans, Noto Sans, FreeSans, else any font. Without any font the shapes are still
//! drawn, without text ([`font_family`] says so).

use resvg::tiny_skia::{Pixmap, Transform};
use resvg::usvg::{self, fontdb};
use std::sync::{Arc, OnceLock};

/// How many PNG pixels one SVG unit becomes.
pub const SCALE: f32 = 2.0;

/// The families tried, in order, for the generic `sans-serif` the figures name.
const SANS_SERIF: [&str; 6] = [
    "Arial",
    "Liberation Sans",
    "Helvetica",
    "DejaVu Sans",
    "Noto Sans",
    "FreeSans",
];

/// Why a figure could not be rasterised.
#[derive(Debug, thiserror::Error)]
pub enum PngError {
    #[error("the SVG cannot be read: {0}")]
    Svg(#[from] usvg::Error),
    #[error("a {width}×{height} pixel picture cannot be drawn")]
    Size { width: u32, height: u32 },
    #[error("cannot encode the PNG: {0}")]
    Encode(String),
}

/// A font database with the family that `sans-serif` (and text without a family) resolves to.
struct Fonts {
    db: Arc<fontdb::Database>,
    family: Option<String>,
}

impl Fonts {
    /// Picks the sans-serif family among the faces of `db` and makes every generic family
    /// resolve to it (usvg falls back to `serif` when a family is not found).
    fn new(mut db: fontdb::Database) -> Fonts {
        let has = |db: &fontdb::Database, name: &str| {
            db.faces()
                .any(|f| f.families.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)))
        };
        let family = SANS_SERIF
            .iter()
            .find(|name| has(&db, name))
            .map(|name| name.to_string())
            .or_else(|| {
                db.faces()
                    .find_map(|f| f.families.first().map(|(n, _)| n.clone()))
            });
        if let Some(name) = &family {
            db.set_sans_serif_family(name.clone());
            db.set_serif_family(name.clone());
        }
        Fonts {
            db: Arc::new(db),
            family,
        }
    }

    /// The system's fonts, loaded on first use.
    fn system() -> &'static Fonts {
        static FONTS: OnceLock<Fonts> = OnceLock::new();
        FONTS.get_or_init(|| {
            let mut db = fontdb::Database::new();
            db.load_system_fonts();
            Fonts::new(db)
        })
    }
}

/// The font family the PNGs' text is drawn in; `None` when the system has no font at all, and
/// the PNGs then show no text (Debian: `apt-get install fonts-dejavu-core`).
pub fn font_family() -> Option<&'static str> {
    Fonts::system().family.as_deref()
}

/// The PNG of an SVG, [`SCALE`] times its size, with the system's fonts.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, PngError> {
    rasterise(svg, SCALE, Fonts::system())
}

fn rasterise(svg: &str, scale: f32, fonts: &Fonts) -> Result<Vec<u8>, PngError> {
    let mut options = usvg::Options {
        fontdb: fonts.db.clone(),
        ..usvg::Options::default()
    };
    if let Some(family) = &fonts.family {
        options.font_family = family.clone();
    }
    // usvg logs every glyph no font has and every family it cannot match, once per text
    // element, through `log`, which the CLI shows as warnings: dozens of lines for one missing
    // font. The picture is drawn regardless and [`font_family`] tells the caller once.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        let tree = usvg::Tree::from_str(svg, &options)?;
        let size = tree.size().to_int_size().scale_by(scale);
        let (width, height) = size.map_or((0, 0), |s| (s.width(), s.height()));
        let mut pixmap = Pixmap::new(width, height).ok_or(PngError::Size { width, height })?;
        resvg::render(
            &tree,
            Transform::from_scale(scale, scale),
            &mut pixmap.as_mut(),
        );
        pixmap
            .encode_png()
            .map_err(|e| PngError::Encode(e.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 40 20" width="40" height="20" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<polyline points="0,10 40,10" stroke="#4e79a7" stroke-width="4"/>
<text x="2" y="9">ab</text>
</svg>"##;

    fn decode(png: &[u8]) -> Pixmap {
        Pixmap::decode_png(png).expect("a PNG")
    }

    #[test]
    fn a_figure_becomes_a_png_twice_its_size_in_its_colours() {
        let png = svg_to_png(SVG).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let pixmap = decode(&png);
        assert_eq!((pixmap.width(), pixmap.height()), (80, 40));
        // The line's colour in the middle of its stroke.
        let p = pixmap.pixel(40, 20).unwrap();
        assert_eq!((p.red(), p.green(), p.blue()), (0x4e, 0x79, 0xa7));
    }

    #[test]
    fn without_any_font_the_shapes_are_still_drawn() {
        let fonts = Fonts::new(fontdb::Database::new());
        assert_eq!(fonts.family, None);
        let pixmap = decode(&rasterise(SVG, 1.0, &fonts).unwrap());
        let p = pixmap.pixel(20, 10).unwrap();
        assert_eq!((p.red(), p.green(), p.blue()), (0x4e, 0x79, 0xa7));
    }

    #[test]
    fn text_is_drawn_when_a_font_is_installed() {
        if font_family().is_none() {
            eprintln!("SKIPPED: no system font (apt-get install fonts-dejavu-core)");
            return;
        }
        let without_text = SVG.replace("<text x=\"2\" y=\"9\">ab</text>", "");
        let a = decode(&svg_to_png(SVG).unwrap());
        let b = decode(&svg_to_png(&without_text).unwrap());
        assert_ne!(a.data(), b.data(), "the text drew nothing");
    }

    #[test]
    fn a_broken_svg_is_an_error() {
        let err = svg_to_png("<svg").unwrap_err();
        assert!(matches!(err, PngError::Svg(_)), "{err}");
    }
}
