//! The operator console: three static files (a page, its script, its style sheet) served
//! under `/admin/`, embedded in the binary. It serves bytes and headers only; the page
//! reads and acts through the JSON admin API with the token the operator types, so these
//! routes need none and hold no data.

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpResponse};

const INDEX_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");

/// The page may load its own script, style sheet and images, talk to its own node, and
/// nothing else: no inline script or style, no frames around it, no form posted anywhere.
/// Every payload it shows is text, and this stops whatever slipped through from running.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Registers `GET /`, `/console.js` and `/console.css` of the `/admin` scope it is called
/// in, and `/admin` itself as a redirect to `/admin/`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("", web::get().to(to_index))
        .route("/", web::get().to(index))
        .route("/console.js", web::get().to(script))
        .route("/console.css", web::get().to(style));
}

async fn index() -> HttpResponse {
    serve("text/html; charset=utf-8", INDEX_HTML)
}

async fn script() -> HttpResponse {
    serve("text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn style() -> HttpResponse {
    serve("text/css; charset=utf-8", CONSOLE_CSS)
}

async fn to_index() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, "/admin/"))
        .finish()
}

/// One console file with the headers every console answer carries.
fn serve(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, HeaderValue::from_static(content_type)))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_or_style_and_the_script_makes_no_markup() {
        let index = INDEX_HTML.to_ascii_lowercase();
        assert!(!index.contains("style="), "an inline style attribute");
        assert!(!index.contains("<style"), "an inline style sheet");
        assert_eq!(index.matches("<script").count(), 1);
        assert!(index.contains(r#"<script type="module" src="/admin/console.js"></script>"#));
        // An event handler attribute: ` on` + letters + `=`.
        let handler = index.match_indices(" on").any(|(at, _)| {
            let rest = &index[at + 3..];
            let name = rest.len()
                - rest
                    .trim_start_matches(|c: char| c.is_ascii_lowercase())
                    .len();
            name > 0 && rest[name..].starts_with('=')
        });
        assert!(!handler, "an inline event handler");
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "'style'",
            "setHTML",
            "DOMParser",
        ] {
            assert!(!CONSOLE_JS.contains(sink), "console.js uses {sink}");
        }
    }

    /// The names a JS array constant of console.js holds: `const NAME = ['a', 'b', ...];`.
    fn js_names(name: &str) -> Vec<&'static str> {
        let start = CONSOLE_JS
            .find(&format!("const {name} = ["))
            .unwrap_or_else(|| panic!("console.js has no {name}"));
        let body = &CONSOLE_JS[start..];
        let body = &body[body.find('[').unwrap() + 1..body.find("];").unwrap()];
        body.split(',')
            .map(|word| word.trim().trim_matches('\''))
            .filter(|word| !word.is_empty())
            .collect()
    }

    #[test]
    fn the_console_knows_every_path_and_status_the_node_names() {
        let mut paths = js_names("PATHS");
        paths.sort_unstable();
        let mut expected: Vec<&str> = crate::claim::Path::ALL.iter().map(|p| p.as_str()).collect();
        expected.sort_unstable();
        assert_eq!(paths, expected, "console.js's PATHS against claim::Path");
        for path in expected {
            assert!(
                CONSOLE_CSS.contains(&format!(".path-{path} {{")),
                "console.css has no colour for the path {path}"
            );
        }
        let mut statuses = js_names("STATUSES");
        statuses.sort_unstable();
        let mut expected: Vec<&str> = crate::claim::Status::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        expected.sort_unstable();
        assert_eq!(
            statuses, expected,
            "console.js's STATUSES against claim::Status"
        );
    }
}
