//! The browser checks of pictures: a page loaded in headless Chromium (Debian's `chromium`),
//! saved as a PNG under `target/pictures/`, with no console errors and the expected charts.

use rbgctl::testkit::browser::{self, Browser, LoadOptions, Loaded};
use std::path::{Path, PathBuf};

/// The browser, or None (SKIPPED) where none is installed; under CI it must be there.
pub fn browser() -> Option<Browser> {
    let Some(program) = browser::program() else {
        super::skip("no chromium on the PATH (set RBGCTL_CHROMIUM or install chromium)");
        return None;
    };
    Some(Browser::start(&program).expect("chromium starts"))
}

/// Where the PNGs go: `target/pictures/`, kept after the run for people to look at.
pub fn pictures() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/")
        .join("pictures");
    std::fs::create_dir_all(&dir).expect("target/pictures");
    dir
}

/// Loads `url`, saves its PNG as `name.png`, and checks it has no errors and every figure
/// in `expect` names every one of its series.
pub fn check(
    b: &mut Browser,
    url: &str,
    name: &str,
    o: &LoadOptions,
    expect: &[(&str, &[&str])],
) -> Loaded {
    let page = b.load(url, o).unwrap_or_else(|e| panic!("{name}: {e}"));
    let png = pictures().join(format!("{name}.png"));
    std::fs::write(&png, &page.png).unwrap();
    assert!(page.png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    assert!(
        page.png.len() > 10_000,
        "{name}: a blank picture? {} bytes",
        page.png.len()
    );
    assert!(
        page.errors.is_empty(),
        "{name}: console errors: {:?}",
        page.errors
    );
    for (id, series) in expect {
        let f = page
            .figure(id)
            .unwrap_or_else(|| panic!("{name}: no figure #{id} in {:?}", ids(&page)));
        for s in *series {
            assert!(
                f.texts.iter().any(|t| t == s),
                "{name}: figure #{id} does not name {s:?}: {:?}",
                f.texts
            );
        }
    }
    eprintln!("{name}: {} ({} figures)", png.display(), page.figures.len());
    page
}

pub fn ids(p: &Loaded) -> Vec<&str> {
    p.figures.iter().map(|f| f.id.as_str()).collect()
}

pub fn file_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Checks one report file in a browser of its own (None: no browser here, SKIPPED).
pub fn check_report(path: &Path, name: &str, expect: &[(&str, &[&str])]) -> Option<Loaded> {
    let mut b = browser()?;
    Some(check(
        &mut b,
        &file_url(path),
        name,
        &LoadOptions::default(),
        expect,
    ))
}
