"""The wiki (`apps/wiki`) driven through its real pages in headless Chromium, on Shoal and
on MariaDB: the same tests pass on both stores.

Debian's `chromium` and `chromium-driver` (installed by `scripts/test.sh`) run the pages;
Selenium drives them. Each store gets a fresh wiki: a new keyspace on the suite's Shoal
node, a private MariaDB server.
"""

import itertools
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from wiki_process import MariaDb, WikiServer

pytestmark = pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium-driver")

_titles = itertools.count()


def fresh_title(stem="TestPage"):
    """A page name no other test uses (a WikiName)."""
    return f"{stem}{next(_titles)}X{uuid.uuid4().hex[:6].upper()}"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1200,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module", params=["shoal", "mariadb"])
def wiki(request, node, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"wiki-{request.param}")
    if request.param == "shoal":
        keyspace = f"wiki_{uuid.uuid4().hex[:8]}"
        with WikiServer.on_shoal([f"{node.address}:{node.port}"], keyspace, directory / "wiki.log") as server:
            yield server
    else:
        with MariaDb(directory / "mariadb") as mariadb:
            with WikiServer.on_mariadb(mariadb.url, directory / "wiki.log") as server:
                yield server


def page_url(wiki, action, title):
    return f"{wiki.url}/{action}/{urllib.parse.quote(title, safe='')}"


def find(browser, css):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, css)


def find_all(browser, css):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, css)


def click_and_wait(browser, css):
    """Clicks what navigates to another page and waits until that page has loaded: the
    old page carries a mark the new one has not. (While the browser swaps documents,
    asking it anything can fail with a transient error: those are retried.)"""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_script("window.leftBehind = true;")
    find(browser, css).click()

    def new_page_loaded(driver):
        return driver.execute_script(
            "return window.leftBehind === undefined && document.readyState === 'complete'")

    WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(new_page_loaded)


def type_text(browser, text):
    area = find(browser, "#editor textarea")
    area.clear()
    # Selenium types newlines as Enter in a textarea; set the value directly so the text
    # arrives exactly as written (then the browser posts it as a user's would).
    browser.execute_script("arguments[0].value = arguments[1];", area, text)


def save_page(browser, wiki, title, text):
    browser.get(page_url(wiki, "edit", title))
    type_text(browser, text)
    click_and_wait(browser, "#save")


def test_front_page_links_to_a_new_page_that_is_created_through_the_editor(browser, wiki):
    browser.get(wiki.url + "/")
    assert find(browser, "h1").text.startswith("FrontPage")
    title = fresh_title("新しいページ")
    save_page(browser, wiki, "FrontPage", f"*Welcome\nSee [[{title}]] and FrontPage.\n")
    # The link to the missing page offers to create it.
    assert find(browser, ".missing").text == f"{title}?"
    click_and_wait(browser, ".missing a")
    assert find(browser, "h1").text == f"Editing {title}"
    type_text(browser, "**Heading\n-one ''bold''\n--nested\n:term:meaning\n>quoted\nBack to FrontPage.\n")
    click_and_wait(browser, "#preview")
    assert find(browser, ".preview h3").text == "Heading"
    assert find(browser, ".preview li strong").text == "bold"
    click_and_wait(browser, "#save")
    assert browser.current_url == page_url(wiki, "page", title)
    assert find(browser, "article h3").text == "Heading"
    assert find(browser, "article ul ul li").text == "nested"
    assert find(browser, "article dl dt").text == "term"
    assert find(browser, "article blockquote").text == "quoted"
    click_and_wait(browser, "article a.page")
    assert find(browser, "h1").text.startswith("FrontPage")
    # Now that the page exists, FrontPage links to it directly.
    link = [a for a in find_all(browser, "article a.page") if a.text == title]
    assert link, "FrontPage does not link to the new page"


def test_raw_html_is_shown_as_text_never_run(browser, wiki):
    title = fresh_title()
    save_page(browser, wiki, title, "<script>document.title='owned'</script>\n<b>not bold</b>\n")
    assert "owned" not in browser.title
    assert find_all(browser, "article script") == []
    assert find_all(browser, "article b") == []
    assert "<b>not bold</b>" in find(browser, "article").text


def test_two_editors_of_one_revision_the_second_sees_a_conflict_with_both_texts(browser, wiki):
    title = fresh_title()
    save_page(browser, wiki, title, "original text\n")
    first = browser.current_window_handle
    # Two editors open on the same revision, in two tabs.
    browser.get(page_url(wiki, "edit", title))
    browser.switch_to.new_window("tab")
    second = browser.current_window_handle
    browser.get(page_url(wiki, "edit", title))
    type_text(browser, "the second editor's text\n")
    browser.switch_to.window(first)
    type_text(browser, "the first editor's text\n")
    click_and_wait(browser, "#save")
    assert find(browser, "article").text == "the first editor's text"
    browser.switch_to.window(second)
    click_and_wait(browser, "#save")
    assert "Someone else saved this page" in find(browser, "#conflict").text
    assert find(browser, "#theirs").get_attribute("value") == "the first editor's text\n"
    assert find(browser, "#yours").get_attribute("value") == "the second editor's text\n"
    # The merge editor saves over the page as it is now.
    type_text(browser, "merged text\n")
    click_and_wait(browser, "#save")
    assert find(browser, "article").text == "merged text"
    browser.close()
    browser.switch_to.window(first)


def test_history_lists_every_revision_and_shows_the_differences_between_two(browser, wiki):
    title = fresh_title()
    save_page(browser, wiki, title, "line one\nline two\n")
    save_page(browser, wiki, title, "line one\nline 2\nline three\n")
    save_page(browser, wiki, title, "line one\nline 2\nline three\nline four\n")
    click_and_wait(browser, "#history")
    rows = find_all(browser, "table.history tbody tr")
    assert len(rows) == 3
    # Compare the oldest with the newest.
    find_all(browser, "input[name=from]")[-1].click()
    find_all(browser, "input[name=to]")[0].click()
    click_and_wait(browser, "#show-diff")
    removed = [line.text for line in find_all(browser, ".diff .removed")]
    added = [line.text for line in find_all(browser, ".diff .added")]
    assert removed == ["- line two"]
    assert added == ["+ line 2", "+ line three", "+ line four"]
    if os.environ.get("WIKI_SCREENSHOT"):
        browser.back()
        browser.save_screenshot(os.environ["WIKI_SCREENSHOT"])
        browser.forward()
    # An old revision can be read as it was.
    browser.back()
    click_and_wait(browser, "tbody tr:last-child a.revision")
    assert find(browser, "article").text == "line one line two"
    assert "As it was on" in find(browser, ".notice").text


def test_search_finds_pages_by_words_and_by_part_of_a_japanese_word(browser, wiki):
    title = fresh_title()
    marker = f"zebra{uuid.uuid4().hex[:8]}"
    save_page(browser, wiki, title, f"Shoal stores {marker} pages.\n日本語のページです。\n")
    browser.get(f"{wiki.url}/search?q={marker}+shoal")
    assert [a.text for a in find_all(browser, "#results a")] == [title]
    browser.get(f"{wiki.url}/search?q={urllib.parse.quote(marker + ' 日本語')}")
    assert [a.text for a in find_all(browser, "#results a")] == [title]
    # A word the page lost is no longer found.
    save_page(browser, wiki, title, "Shoal stores other pages.\n")
    browser.get(f"{wiki.url}/search?q={marker}")
    assert find_all(browser, "#results a") == []


def test_saving_an_empty_page_deletes_it(browser, wiki):
    title = fresh_title()
    save_page(browser, wiki, title, "soon gone\n")
    browser.get(f"{wiki.url}/index")
    assert title in [a.text for a in find_all(browser, "#pages a")]
    save_page(browser, wiki, title, "")
    assert find(browser, "h1").text.startswith("FrontPage")
    browser.get(page_url(wiki, "page", title))
    assert find(browser, "#create").text == "Create it"
    browser.get(f"{wiki.url}/index")
    assert title not in [a.text for a in find_all(browser, "#pages a")]
    browser.get(f"{wiki.url}/recent")
    changes = [line.text for line in find_all(browser, "#changes li") if title in line.text]
    assert len(changes) == 2 and changes[0].endswith("(deleted)"), changes
    # The history keeps the deletion and the text before it.
    browser.get(page_url(wiki, "history", title))
    sizes = [row.find_elements("css selector", "td")[3].text for row in find_all(browser, "table.history tbody tr")]
    assert sizes == ["deleted", "10 bytes"]


def post_form(url, fields, cookie=None):
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_form_posted_without_the_editor_token_is_refused(wiki):
    title = fresh_title()
    url = page_url(wiki, "edit", title)
    assert post_form(url, {"text": "forged", "base": "", "action": "save"}) == 403
    token = "0123456789abcdef0123456789abcdef"
    other = "fedcba9876543210fedcba9876543210"
    assert post_form(url, {"text": "forged", "base": "", "action": "save", "csrf": other},
                     cookie=f"wiki_csrf={token}") == 403
    # Neither forged form created the page.
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(page_url(wiki, "page", title), timeout=30)
    assert missing.value.code == 404


def test_bad_titles_and_revisions_get_a_clear_error(wiki):
    for path in ["/page/%20padded", "/revision/not-a-uuid/FrontPage", "/diff/FrontPage"]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(wiki.url + path, timeout=30)
        assert refused.value.code == 400, path
        assert "Bad request" in refused.value.read().decode()
