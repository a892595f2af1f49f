//! The wiki's pages: axum handlers and their HTML (maud templates, which escape every
//! value they are given).
//!
//! | address | page |
//! |---|---|
//! | `/` | redirects to FrontPage |
//! | `/page/{title}` | a page, rendered; a missing one offers to create it |
//! | `/edit/{title}` | the editor (GET); preview or save (POST) |
//! | `/history/{title}` | every revision, with a choice of two to compare |
//! | `/diff/{title}?from=&to=` | the differences between two revisions |
//! | `/revision/{revision}/{title}` | a page as it was |
//! | `/recent` | RecentChanges |
//! | `/index` | every page |
//! | `/search?q=` | full-text search |
//!
//! Forms are protected against cross-site requests by a token kept in a `SameSite=Strict`,
//! `HttpOnly` cookie and repeated in the form (double submit): a POST whose two copies
//! differ is refused.

use crate::markup::{self, page_path};
use crate::search;
use crate::store::{self, Edit, Page, SaveOutcome, WikiStore};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Router};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;
use std::sync::Arc;
use std::time::SystemTime;
use uuid::Uuid;

/// The page every wiki starts at.
pub const FRONT_PAGE: &str = "FrontPage";
/// Lines shown by RecentChanges.
const RECENT_CHANGES: usize = 100;
/// The cookie that holds the form token.
const CSRF_COOKIE: &str = "wiki_csrf";

/// The wiki's routes over a store.
pub fn router(store: Arc<dyn WikiStore>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { Redirect::to(&page_path("page", FRONT_PAGE)) }),
        )
        .route("/page/{*title}", get(view_page))
        .route("/edit/{*title}", get(edit_page).post(submit_edit))
        .route("/history/{*title}", get(history))
        .route("/diff/{*title}", get(diff))
        .route("/revision/{revision}/{*title}", get(view_revision))
        .route("/recent", get(recent_changes))
        .route("/index", get(index))
        .route("/search", get(search_pages))
        .with_state(store)
}

type Store = State<Arc<dyn WikiStore>>;

/// A page of the wiki as an HTTP response.
struct WikiResponse {
    status: StatusCode,
    body: Markup,
    set_cookie: Option<String>,
}

impl WikiResponse {
    fn ok(body: Markup) -> WikiResponse {
        WikiResponse {
            status: StatusCode::OK,
            body,
            set_cookie: None,
        }
    }

    fn with_status(status: StatusCode, body: Markup) -> WikiResponse {
        WikiResponse {
            status,
            body,
            set_cookie: None,
        }
    }
}

impl IntoResponse for WikiResponse {
    fn into_response(self) -> Response {
        let mut response = (self.status, Html(self.body.into_string())).into_response();
        if let Some(cookie) = self.set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response.headers_mut().insert(header::SET_COOKIE, cookie);
        }
        response
    }
}

/// Anything that stops a page from being shown: a bad request or a failed store.
enum Failure {
    BadRequest(String),
    Forbidden(String),
    Store(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Store(error)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, heading, message) = match self {
            Failure::BadRequest(message) => (StatusCode::BAD_REQUEST, "Bad request", message),
            Failure::Forbidden(message) => (StatusCode::FORBIDDEN, "Refused", message),
            Failure::Store(error) => {
                tracing::error!("store failed: {error:#}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The wiki's store failed",
                    format!("{error:#}"),
                )
            }
        };
        WikiResponse::with_status(status, layout(heading, html! { p.error { (message) } }))
            .into_response()
    }
}

type Outcome = Result<WikiResponse, Failure>;

fn checked_title(title: &str) -> Result<(), Failure> {
    store::check_title(title).map_err(|error| Failure::BadRequest(error.to_string()))
}

fn format_time(time: SystemTime) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
    time::OffsetDateTime::from(time)
        .format(&format)
        .unwrap_or_default()
}

fn revision_time(revision: Uuid) -> String {
    format_time(store::revision_time(revision))
}

/// The frame of every page.
fn layout(title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — Shoal wiki" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav {
                    a href=(page_path("page", FRONT_PAGE)) { "FrontPage" }
                    a href="/recent" { "RecentChanges" }
                    a href="/index" { "Index" }
                    form.search action="/search" method="get" {
                        input type="search" name="q" placeholder="Search" aria-label="Search";
                        button type="submit" { "Search" }
                    }
                }
                main { (content) }
            }
        }
    }
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; max-width: 56rem; margin: 0 auto; padding: 0 1rem; line-height: 1.5; }
nav { display: flex; gap: 1rem; align-items: center; border-bottom: 1px solid #ccc; padding: .5rem 0; }
nav form.search { margin-left: auto; }
h1 small { font-size: .5em; font-weight: normal; margin-left: 1rem; }
h1 small a { margin-right: .5rem; }
.missing { background: #fff3cd; }
.error { color: #a00; }
textarea { width: 100%; font-family: monospace; }
pre { background: #f5f5f5; padding: .5rem; overflow-x: auto; }
blockquote { border-left: 4px solid #ccc; margin-left: 0; padding-left: 1rem; color: #555; }
table.history td, table.history th { padding: 0 .75rem; text-align: left; }
.diff .added { background: #e6ffec; }
.diff .removed { background: #ffebe9; }
.diff div { white-space: pre-wrap; font-family: monospace; }
.preview { border: 2px dashed #ccc; padding: 0 1rem; margin-bottom: 1rem; }
.conflict { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
";

/// A page's text as HTML, its links resolved against the store.
async fn render(store: &dyn WikiStore, text: &str) -> Result<Markup, Failure> {
    let linked = markup::linked_pages(text);
    let existing = store.existing(&linked).await?;
    Ok(PreEscaped(markup::render(text, &|title| {
        existing.contains(title)
    })))
}

/// The address of a page as it was at `revision`.
fn revision_path(revision: Uuid, title: &str) -> String {
    page_path(&format!("revision/{revision}"), title)
}

fn page_heading(title: &str, actions: Markup) -> Markup {
    html! {
        h1 { (title) small { (actions) } }
    }
}

async fn view_page(State(store): Store, Path(title): Path<String>) -> Outcome {
    checked_title(&title)?;
    let Some(page) = store.page(&title).await? else {
        return Ok(WikiResponse::with_status(
            StatusCode::NOT_FOUND,
            layout(
                &title,
                html! {
                    (page_heading(&title, html! { a href=(page_path("history", &title)) { "History" } }))
                    p.missing-page {
                        "This page does not exist yet. "
                        a #create href=(page_path("edit", &title)) { "Create it" }
                    }
                },
            ),
        ));
    };
    let body = render(store.as_ref(), &page.text).await?;
    Ok(WikiResponse::ok(layout(
        &title,
        html! {
            (page_heading(&title, html! {
                a #edit href=(page_path("edit", &title)) { "Edit" }
                a #history href=(page_path("history", &title)) { "History" }
            }))
            article.content { (body) }
            footer { "Last saved " (revision_time(page.revision)) }
        },
    )))
}

/// The form token of a request's cookie, if it has one.
fn csrf_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|cookie| cookie.trim().split_once('='))
        .find(|(name, _)| *name == CSRF_COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|value| value.len() == 32 && value.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The request's form token, or a new one to set as a cookie.
fn csrf_token(headers: &HeaderMap) -> (String, Option<String>) {
    match csrf_cookie(headers) {
        Some(token) => (token, None),
        None => {
            let token = format!("{:032x}", rand::random::<u128>());
            let cookie = format!("{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
            (token, Some(cookie))
        }
    }
}

/// The editor: `text` in a form that saves it over revision `base`.
fn editor(title: &str, text: &str, base: Option<Uuid>, token: &str) -> Markup {
    html! {
        form #editor method="post" action=(page_path("edit", title)) {
            input type="hidden" name="csrf" value=(token);
            input type="hidden" name="base" value=(base.map(|b| b.to_string()).unwrap_or_default());
            textarea name="text" rows="20" aria-label="Page text" { (text) }
            p {
                button #preview type="submit" name="action" value="preview" { "Preview" }
                " "
                button #save type="submit" name="action" value="save" { "Save" }
                " Saving an empty page deletes it."
            }
        }
        details {
            summary { "Markup" }
            pre { (MARKUP_HELP) }
        }
    }
}

const MARKUP_HELP: &str = "*Heading  **Subheading  ***Minor heading
-item  --nested item  +numbered item
:term:description
>quotation
 (a leading space) preformatted text
----  horizontal rule
''bold''  '''italic'''
WikiName  [[Any page name]]  https://example.com
// a comment, not shown";

async fn edit_page(State(store): Store, Path(title): Path<String>, headers: HeaderMap) -> Outcome {
    checked_title(&title)?;
    let page = store.page(&title).await?;
    let (token, set_cookie) = csrf_token(&headers);
    let (text, base) = match &page {
        Some(page) => (page.text.as_str(), Some(page.revision)),
        None => ("", None),
    };
    Ok(WikiResponse {
        status: StatusCode::OK,
        body: layout(
            &format!("Editing {title}"),
            html! {
                h1 { "Editing " a href=(page_path("page", &title)) { (title) } }
                (editor(&title, text, base, &token))
            },
        ),
        set_cookie,
    })
}

#[derive(Deserialize)]
struct EditForm {
    text: String,
    #[serde(default)]
    base: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
}

async fn submit_edit(
    State(store): Store,
    Path(title): Path<String>,
    headers: HeaderMap,
    Form(form): Form<EditForm>,
) -> Result<Response, Failure> {
    checked_title(&title)?;
    match csrf_cookie(&headers) {
        Some(token) if !form.csrf.is_empty() && token == form.csrf => {}
        _ => {
            return Err(Failure::Forbidden(
                "This form did not come from the wiki's own editor (or its session expired): \
                 open the editor again and resubmit."
                    .into(),
            ))
        }
    }
    if form.text.len() > store::MAX_TEXT_BYTES {
        return Err(Failure::BadRequest(format!(
            "A page has at most {} KiB of text.",
            store::MAX_TEXT_BYTES / 1024
        )));
    }
    let base = match form.base.as_str() {
        "" => None,
        base => Some(
            Uuid::parse_str(base)
                .map_err(|_| Failure::BadRequest(format!("{base:?} is not a revision")))?,
        ),
    };
    // Browsers send CRLF line ends; pages keep LF.
    let text = form.text.replace("\r\n", "\n");
    let text = if text.trim().is_empty() {
        String::new()
    } else {
        text
    };
    if form.action == "preview" {
        let preview = render(store.as_ref(), &text).await?;
        return Ok(WikiResponse::ok(layout(
            &format!("Previewing {title}"),
            html! {
                h1 { "Previewing " (title) }
                section.preview { (preview) }
                (editor(&title, &text, base, &form.csrf))
            },
        ))
        .into_response());
    }
    let edit = Edit {
        title: title.clone(),
        text,
        base,
    };
    match store.save(&edit).await? {
        SaveOutcome::Saved(_) | SaveOutcome::NothingToDelete if edit.text.is_empty() => {
            Ok(Redirect::to(&page_path("page", FRONT_PAGE)).into_response())
        }
        SaveOutcome::Saved(_) | SaveOutcome::NothingToDelete => {
            Ok(Redirect::to(&page_path("page", &title)).into_response())
        }
        SaveOutcome::Conflict(current) => {
            Ok(conflict(&title, &edit.text, current, &form.csrf).into_response())
        }
    }
}

/// Someone saved the page while this editor had it open: both texts, and an editor that
/// saves over the page as it is now.
fn conflict(title: &str, yours: &str, current: Option<Page>, token: &str) -> WikiResponse {
    let (theirs, base) = match &current {
        Some(page) => (page.text.as_str(), Some(page.revision)),
        None => ("", None),
    };
    WikiResponse::with_status(
        StatusCode::CONFLICT,
        layout(
            &format!("Conflict on {title}"),
            html! {
                h1 { "Conflict on " a href=(page_path("page", title)) { (title) } }
                p #conflict {
                    "Someone else saved this page while you were editing it"
                    @if current.is_none() { " (and deleted it)" }
                    ". Your text was not saved. Merge your changes into the text below and save again."
                }
                div.conflict {
                    section {
                        h2 { "Saved meanwhile" }
                        textarea #theirs readonly rows="12" aria-label="Text saved meanwhile" { (theirs) }
                    }
                    section {
                        h2 { "Yours" }
                        textarea #yours readonly rows="12" aria-label="Your text" { (yours) }
                    }
                }
                h2 { "Merge" }
                (editor(title, yours, base, token))
            },
        ),
    )
}

async fn history(State(store): Store, Path(title): Path<String>) -> Outcome {
    checked_title(&title)?;
    let revisions = store.history(&title).await?;
    Ok(WikiResponse::ok(layout(
        &format!("History of {title}"),
        html! {
            h1 { "History of " a href=(page_path("page", &title)) { (title) } }
            @if revisions.is_empty() {
                p { "This page has never been saved." }
            } @else {
                form #compare method="get" action=(page_path("diff", &title)) {
                    table.history {
                        thead { tr { th { "From" } th { "To" } th { "Saved" } th { "Size" } th {} } }
                        tbody {
                            @for (position, revision) in revisions.iter().enumerate() {
                                tr {
                                    td { input type="radio" name="from" value=(revision.revision) checked[position == 1 || revisions.len() == 1] aria-label="from"; }
                                    td { input type="radio" name="to" value=(revision.revision) checked[position == 0] aria-label="to"; }
                                    td { a.revision href=(revision_path(revision.revision, &title)) { (revision_time(revision.revision)) } }
                                    td { @if revision.deleted { "deleted" } @else { (revision.size) " bytes" } }
                                    td {}
                                }
                            }
                        }
                    }
                    p { button #show-diff type="submit" { "Show differences" } }
                }
            }
        },
    )))
}

#[derive(Deserialize)]
struct DiffQuery {
    from: Uuid,
    to: Uuid,
}

async fn diff(
    State(store): Store,
    Path(title): Path<String>,
    query: Result<Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
) -> Outcome {
    checked_title(&title)?;
    let Ok(Query(query)) = query else {
        return Err(Failure::BadRequest(
            "choose two revisions to compare (from and to)".into(),
        ));
    };
    let (from, to) = futures::try_join!(
        store.revision(&title, query.from),
        store.revision(&title, query.to)
    )?;
    let (Some(from), Some(to)) = (from, to) else {
        return Err(Failure::BadRequest(format!("{title} has no such revision")));
    };
    let differences = similar::TextDiff::from_lines(&from.text, &to.text);
    Ok(WikiResponse::ok(layout(
        &format!("Differences in {title}"),
        html! {
            h1 { "Differences in " a href=(page_path("page", &title)) { (title) } }
            p { "From " (revision_time(from.revision)) " to " (revision_time(to.revision)) }
            section.diff {
                @for change in differences.iter_all_changes() {
                    @let line = change.value().trim_end_matches('\n');
                    @match change.tag() {
                        similar::ChangeTag::Delete => div.removed { "- " (line) },
                        similar::ChangeTag::Insert => div.added { "+ " (line) },
                        similar::ChangeTag::Equal => div { "  " (line) },
                    }
                }
            }
        },
    )))
}

async fn view_revision(
    State(store): Store,
    Path((revision, title)): Path<(String, String)>,
) -> Outcome {
    checked_title(&title)?;
    let revision = Uuid::parse_str(&revision)
        .map_err(|_| Failure::BadRequest(format!("{revision:?} is not a revision")))?;
    let Some(old) = store.revision(&title, revision).await? else {
        return Err(Failure::BadRequest(format!("{title} has no such revision")));
    };
    let body = render(store.as_ref(), &old.text).await?;
    Ok(WikiResponse::ok(layout(
        &title,
        html! {
            (page_heading(&title, html! { a href=(page_path("history", &title)) { "History" } }))
            p.notice {
                "As it was on " (revision_time(old.revision))
                @if old.deleted { " (deleted)" }
                ". " a href=(page_path("page", &title)) { "The current version" }
            }
            article.content { (body) }
        },
    )))
}

async fn recent_changes(State(store): Store) -> Outcome {
    let changes = store.recent_changes(RECENT_CHANGES).await?;
    Ok(WikiResponse::ok(layout(
        "RecentChanges",
        html! {
            h1 { "RecentChanges" }
            ul #changes {
                @for change in &changes {
                    li {
                        (revision_time(change.revision)) " "
                        a href=(page_path("page", &change.title)) { (change.title) }
                        @if change.deleted { " (deleted)" }
                    }
                }
            }
        },
    )))
}

async fn index(State(store): Store) -> Outcome {
    let titles = store.titles().await?;
    Ok(WikiResponse::ok(layout(
        "Index",
        html! {
            h1 { "Index" }
            p { (titles.len()) " pages" }
            ul #pages {
                @for title in &titles {
                    li { a href=(page_path("page", title)) { (title) } }
                }
            }
        },
    )))
}

#[derive(Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
}

async fn search_pages(State(store): Store, Query(query): Query<SearchQuery>) -> Outcome {
    let terms = search::terms(&query.q);
    let found = store.search(&terms).await?;
    Ok(WikiResponse::ok(layout(
        "Search",
        html! {
            h1 { "Search" }
            form method="get" action="/search" {
                input #query type="search" name="q" value=(query.q) aria-label="Words to find";
                button type="submit" { "Search" }
            }
            @if !terms.is_empty() {
                p { (found.len()) " pages contain " q { (query.q) } }
                ul #results {
                    @for title in &found {
                        li { a href=(page_path("page", title)) { (title) } }
                    }
                }
            }
        },
    )))
}

/// Creates FrontPage if the wiki has none yet.
pub async fn ensure_front_page(store: &dyn WikiStore) -> anyhow::Result<()> {
    if store.page(FRONT_PAGE).await?.is_some() {
        return Ok(());
    }
    let edit = Edit {
        title: FRONT_PAGE.to_string(),
        text: FRONT_PAGE_TEXT.to_string(),
        base: None,
    };
    // Another wiki process may have created it first: either way there is one.
    store.save(&edit).await?;
    Ok(())
}

const FRONT_PAGE_TEXT: &str = "*Welcome to the Shoal wiki
This wiki keeps its pages in ''Shoal''. Edit this page, or start a new one by writing its
name as a WikiName or in double brackets, like [[最初のページ]], and following the ? link.

-Every page keeps its full history: see ''History'' at the top of a page.
-RecentChanges lists the latest edits; Index lists every page.
-Saving an empty page deletes it.

:Markup:open the editor and unfold ''Markup'' for the rules.
";
