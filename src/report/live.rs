//! The frame of a status page (the master's and the router's): rendered by the server, it
//! works with scripts off (it then reloads itself every 5 s); with scripts on, an inline script
//! replaces its `<main>` every 2 s from `?part=main` — the same rendering — and says when it
//! could not. Styles, icon and charts are inline: the page fetches nothing else.

use super::{escape, FAVICON, STYLE};

/// Which part of a status page to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Whole,
    /// The contents of `<main>` only, for the page's own refresh.
    Main,
}

impl Part {
    /// From the `part` query parameter: `main`, or anything else for the whole page.
    pub fn from_query(part: Option<&str>) -> Part {
        match part {
            Some("main") => Part::Main,
            _ => Part::Whole,
        }
    }
}

/// Replaces `<main>` every 2 s with `?part=main`; counts its refreshes in
/// `body[data-refreshes]`; says when it could not.
const REFRESH_JS: &str = "(function(){var n=0,live=document.getElementById('live');\
live.textContent='live';live.className='ok';\
function tick(){fetch(location.pathname+'?part=main',{cache:'no-store'})\
.then(function(r){if(!r.ok){throw new Error('HTTP '+r.status);}return r.text();})\
.then(function(t){document.getElementById('main').innerHTML=t;n+=1;\
document.body.dataset.refreshes=String(n);\
live.textContent='live, refreshed '+new Date().toLocaleTimeString();live.className='ok';})\
.catch(function(e){live.textContent='not refreshed: '+e.message;live.className='bad';});}\
setInterval(tick,2000);tick();})();";

/// The page titled `title` around `main`, with `links` (path, label) in its footer; or `main`
/// alone for [`Part::Main`].
pub fn page(title: &str, main: String, links: &[&str], part: Part) -> String {
    if part == Part::Main {
        return main;
    }
    let links: Vec<String> = links
        .iter()
        .map(|l| format!("<a href=\"{0}\">{0}</a>", escape(l)))
        .collect();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}: status</title>\
         <noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>\
         {FAVICON}<style>{STYLE}</style></head><body data-refreshes=\"0\">\
         <h1>{title} <small id=\"live\" class=\"warn\">rendered by the server; reloads every 5 s</small></h1>\
         <main id=\"main\">{main}</main><footer>Also: {}</footer>\
         <script>{REFRESH_JS}</script></body></html>\n",
        links.join(" · "),
        title = escape(title),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_reloads_without_scripts_and_refreshes_its_main_with_them() {
        let html = page(
            "rbgctl <x>",
            "<p>body</p>".into(),
            &["/metrics"],
            Part::Whole,
        );
        assert!(html.contains("<title>rbgctl &lt;x&gt;: status</title>"));
        assert!(html.contains("<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>"));
        assert!(html.contains("<main id=\"main\"><p>body</p></main>"));
        assert!(html.contains("<a href=\"/metrics\">/metrics</a>"));
        assert!(html.contains("?part=main") && html.contains("data-refreshes"));
        assert_eq!(
            page("t", "<p>body</p>".into(), &[], Part::Main),
            "<p>body</p>"
        );
        assert_eq!(Part::from_query(Some("main")), Part::Main);
        assert_eq!(Part::from_query(Some("all")), Part::Whole);
    }
}
