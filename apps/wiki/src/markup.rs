//! YukiWiki's markup, rendered to HTML.
//!
//! A page is plain text; a line's first characters say what it is:
//!
//! | line starts with | becomes |
//! |---|---|
//! | `*`, `**`, `***` | a heading (`h2`–`h4`) |
//! | `-`, `--`, `---` | an item of a bulleted list, nested by the count |
//! | `+`, `++`, `+++` | an item of a numbered list |
//! | `:term:description` | a definition list entry |
//! | `>` | a quotation |
//! | a space or a tab | preformatted text |
//! | `----` | a horizontal rule |
//! | `//` | a comment, not shown |
//! | nothing (an empty line) | the end of a paragraph |
//!
//! Within a line: `''bold''`, `'''italic'''`, `http://` and `https://` addresses become
//! links, and so do page names — a *WikiName* (two or more capitalised words run
//! together, `FrontPage`) or any text in double brackets (`[[日本語のページ]]`). A link to
//! a page that does not exist yet is shown as the name followed by a `?` that opens the
//! editor, as YukiWiki does.
//!
//! Everything the author typed is escaped: raw HTML is shown as text, never rendered.

use regex::Regex;
use std::fmt::Write;
use std::sync::LazyLock;

/// One inline element of a line, in order.
enum Inline<'a> {
    Text(&'a str),
    Url(&'a str),
    Page(&'a str),
    Bold,
    Italic,
}

static INLINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r#"(?P<url>https?://[^\s<>"'\]\[]+)"#,
        r"|\[\[(?P<bracket>[^\]]+)\]\]",
        r"|(?P<wikiname>\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b)",
        r"|(?P<italic>''')",
        r"|(?P<bold>'')",
    ))
    .expect("the inline pattern is valid")
});

/// Splits a line into its inline elements.
fn inline_elements(line: &str) -> Vec<Inline<'_>> {
    let mut elements = Vec::new();
    let mut last = 0;
    for captures in INLINE.captures_iter(line) {
        let whole = captures.get(0).expect("a match has group 0");
        if whole.start() > last {
            elements.push(Inline::Text(&line[last..whole.start()]));
        }
        last = whole.end();
        let element = if let Some(url) = captures.name("url") {
            Inline::Url(url.as_str())
        } else if let Some(name) = captures.name("bracket") {
            match name.as_str().trim() {
                "" => Inline::Text(whole.as_str()),
                title => Inline::Page(title),
            }
        } else if let Some(name) = captures.name("wikiname") {
            Inline::Page(name.as_str())
        } else if captures.name("italic").is_some() {
            Inline::Italic
        } else {
            Inline::Bold
        };
        elements.push(element);
    }
    if last < line.len() {
        elements.push(Inline::Text(&line[last..]));
    }
    elements
}

/// The page names a text links to, each once, in the order they first appear.
pub fn linked_pages(text: &str) -> Vec<String> {
    let mut pages: Vec<String> = Vec::new();
    for line in text.lines() {
        if is_comment(line) || is_preformatted(line) {
            continue;
        }
        for element in inline_elements(line) {
            if let Inline::Page(title) = element {
                if !pages.iter().any(|known| known == title) {
                    pages.push(title.to_string());
                }
            }
        }
    }
    pages
}

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// The address of a page (its title percent-encoded as one path segment).
pub fn page_path(action: &str, title: &str) -> String {
    format!(
        "/{action}/{}",
        percent_encoding::utf8_percent_encode(title, percent_encoding::NON_ALPHANUMERIC)
    )
}

/// Renders one line's inline markup; bold and italic left open are closed at its end.
fn render_inline(out: &mut String, line: &str, exists: &dyn Fn(&str) -> bool) {
    let (mut bold, mut italic) = (false, false);
    for element in inline_elements(line) {
        match element {
            Inline::Text(text) => out.push_str(&escape(text)),
            Inline::Url(url) => {
                let url = escape(url);
                let _ = write!(
                    out,
                    r#"<a class="external" href="{url}" rel="nofollow">{url}</a>"#
                );
            }
            Inline::Page(title) if exists(title) => {
                let _ = write!(
                    out,
                    r#"<a class="page" href="{}">{}</a>"#,
                    escape(&page_path("page", title)),
                    escape(title)
                );
            }
            Inline::Page(title) => {
                let _ = write!(
                    out,
                    r#"<span class="missing">{}<a href="{}" title="Create this page">?</a></span>"#,
                    escape(title),
                    escape(&page_path("edit", title))
                );
            }
            Inline::Bold => {
                out.push_str(if bold { "</strong>" } else { "<strong>" });
                bold = !bold;
            }
            Inline::Italic => {
                out.push_str(if italic { "</em>" } else { "<em>" });
                italic = !italic;
            }
        }
    }
    if italic {
        out.push_str("</em>");
    }
    if bold {
        out.push_str("</strong>");
    }
}

fn is_comment(line: &str) -> bool {
    line.starts_with("//")
}

fn is_preformatted(line: &str) -> bool {
    line.starts_with(' ') || line.starts_with('\t')
}

/// The block a run of lines forms; consecutive lines of one kind join into one block.
#[derive(PartialEq, Clone, Copy)]
enum Block {
    None,
    Paragraph,
    Preformatted,
    Quote,
    Definitions,
    /// Nested lists, innermost last: `true` for a numbered list.
    Lists,
}

/// Renders a page's text to HTML. `exists` tells which linked pages exist.
pub fn render(text: &str, exists: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut block = Block::None;
    let mut lists: Vec<bool> = Vec::new();

    let close = |out: &mut String, block: &mut Block, lists: &mut Vec<bool>| {
        match *block {
            Block::Paragraph => out.push_str("</p>\n"),
            Block::Preformatted => out.push_str("</pre>\n"),
            Block::Quote => out.push_str("</blockquote>\n"),
            Block::Definitions => out.push_str("</dl>\n"),
            Block::Lists => {
                while let Some(numbered) = lists.pop() {
                    out.push_str(if numbered {
                        "</li></ol>\n"
                    } else {
                        "</li></ul>\n"
                    });
                }
            }
            Block::None => {}
        }
        *block = Block::None;
    };

    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if is_comment(line) {
            continue;
        }
        if is_preformatted(line) && !line.trim().is_empty() {
            if block != Block::Preformatted {
                close(&mut out, &mut block, &mut lists);
                out.push_str("<pre>");
                block = Block::Preformatted;
            }
            out.push_str(&escape(&line[1..]));
            out.push('\n');
            continue;
        }
        if line.trim().is_empty() {
            close(&mut out, &mut block, &mut lists);
            continue;
        }
        if line.starts_with("----") {
            close(&mut out, &mut block, &mut lists);
            out.push_str("<hr>\n");
            continue;
        }
        if let Some(level) = marker_count(line, '*') {
            close(&mut out, &mut block, &mut lists);
            let tag = format!("h{}", (level + 1).min(4));
            let _ = write!(out, "<{tag}>");
            render_inline(&mut out, line[level..].trim(), exists);
            let _ = writeln!(out, "</{tag}>");
            continue;
        }
        let list_item = marker_count(line, '-')
            .map(|depth| (depth, false))
            .or_else(|| marker_count(line, '+').map(|depth| (depth, true)));
        if let Some((depth, numbered)) = list_item {
            let depth = depth.min(3);
            if block != Block::Lists {
                close(&mut out, &mut block, &mut lists);
                block = Block::Lists;
            }
            while lists.len() > depth {
                let closed = lists.pop().expect("the stack is deeper than depth");
                out.push_str(if closed {
                    "</li></ol>\n"
                } else {
                    "</li></ul>\n"
                });
            }
            if lists.len() == depth && lists.last() != Some(&numbered) {
                let closed = lists.pop().expect("depth is at least one");
                out.push_str(if closed {
                    "</li></ol>\n"
                } else {
                    "</li></ul>\n"
                });
            }
            if lists.len() == depth {
                out.push_str("</li>\n");
            }
            while lists.len() < depth {
                out.push_str(if numbered { "<ol>\n" } else { "<ul>\n" });
                lists.push(numbered);
            }
            out.push_str("<li>");
            render_inline(&mut out, line[depth..].trim(), exists);
            continue;
        }
        if let Some(rest) = line.strip_prefix(':') {
            if let Some((term, description)) = rest.split_once(':') {
                if block != Block::Definitions {
                    close(&mut out, &mut block, &mut lists);
                    out.push_str("<dl>\n");
                    block = Block::Definitions;
                }
                out.push_str("<dt>");
                render_inline(&mut out, term.trim(), exists);
                out.push_str("</dt><dd>");
                render_inline(&mut out, description.trim(), exists);
                out.push_str("</dd>\n");
                continue;
            }
        }
        if let Some(quoted) = line.strip_prefix('>') {
            if block != Block::Quote {
                close(&mut out, &mut block, &mut lists);
                out.push_str("<blockquote>");
                block = Block::Quote;
            } else {
                out.push_str("<br>\n");
            }
            render_inline(&mut out, quoted.trim(), exists);
            continue;
        }
        if block != Block::Paragraph {
            close(&mut out, &mut block, &mut lists);
            out.push_str("<p>");
            block = Block::Paragraph;
        } else {
            out.push('\n');
        }
        render_inline(&mut out, line, exists);
    }
    close(&mut out, &mut block, &mut lists);
    out
}

/// How many `marker`s a line starts with (at most three count), if any.
fn marker_count(line: &str, marker: char) -> Option<usize> {
    let count = line.chars().take_while(|c| *c == marker).count();
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_exist(_: &str) -> bool {
        true
    }

    fn none_exist(_: &str) -> bool {
        false
    }

    #[test]
    fn headings_lists_quotes_and_definitions() {
        let text = "*Title\n**Sub\n-one\n--nested\n-two\n+first\n:term:meaning\n>quoted\n>more\n----\n pre <b>\n";
        assert_eq!(
            render(text, &all_exist),
            "<h2>Title</h2>\n<h3>Sub</h3>\n\
             <ul>\n<li>one<ul>\n<li>nested</li></ul>\n</li>\n<li>two</li></ul>\n\
             <ol>\n<li>first</li></ol>\n\
             <dl>\n<dt>term</dt><dd>meaning</dd>\n</dl>\n\
             <blockquote>quoted<br>\nmore</blockquote>\n<hr>\n<pre>pre &lt;b&gt;\n</pre>\n"
        );
    }

    #[test]
    fn paragraphs_join_lines_until_an_empty_one() {
        assert_eq!(
            render("one\ntwo\n\nthree\n// hidden\n", &all_exist),
            "<p>one\ntwo</p>\n<p>three</p>\n"
        );
    }

    #[test]
    fn emphasis_closes_at_the_end_of_the_line() {
        assert_eq!(
            render("''bold'' and '''italic''' ''open", &all_exist),
            "<p><strong>bold</strong> and <em>italic</em> <strong>open</strong></p>\n"
        );
    }

    #[test]
    fn raw_html_is_shown_as_text() {
        let html = render("<script>alert('x')</script> & \"q\"", &all_exist);
        assert_eq!(
            html,
            "<p>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;</p>\n"
        );
    }

    #[test]
    fn wiki_names_bracket_names_and_urls_are_links() {
        let html = render(
            "See FrontPage, [[日本語のページ]] and https://example.com/a?b=1&c=2.",
            &all_exist,
        );
        assert!(html.contains(r#"<a class="page" href="/page/FrontPage">FrontPage</a>"#));
        assert!(html.contains(
            r#"<a class="page" href="/page/%E6%97%A5%E6%9C%AC%E8%AA%9E%E3%81%AE%E3%83%9A%E3%83%BC%E3%82%B8">日本語のページ</a>"#
        ));
        assert!(html.contains(
            r#"<a class="external" href="https://example.com/a?b=1&amp;c=2." rel="nofollow">"#
        ));
    }

    #[test]
    fn a_missing_page_offers_to_create_it() {
        assert_eq!(
            render("NewPage", &none_exist),
            "<p><span class=\"missing\">NewPage<a href=\"/edit/NewPage\" title=\"Create this page\">?</a></span></p>\n"
        );
    }

    #[test]
    fn a_bracket_name_cannot_break_out_of_its_attribute() {
        let html = render("[[a\"><script>x</script>]]", &all_exist);
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("/page/a%22%3E%3Cscript%3Ex%3C%2Fscript%3E"),
            "{html}"
        );
    }

    #[test]
    fn linked_pages_lists_each_page_once_in_order() {
        assert_eq!(
            linked_pages("FrontPage [[Other]] FrontPage\n ignored InPre\n// NotThis\nLastOne"),
            ["FrontPage", "Other", "LastOne"]
        );
    }
}
