"""The wiki on a three-node Shoal cluster at replication factor 3: two wiki processes,
each connected through a different node, and editors racing to save over the same
revision — exactly one of them wins each race, the others get the conflict page, and no
save is lost or doubled in the history. It keeps working with one node down."""

import re
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from test_cluster import ADDRESSES, LocalCluster, peers_up_in_status, wait_until
from wiki_process import WikiServer

TOKEN = "00112233445566778899aabbccddeeff"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


OPENER = urllib.request.build_opener(NoRedirect)


def get(url):
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def base_revision(wiki, title):
    """The revision the editor of `title` starts from ('' for a new page)."""
    editor = get(f"{wiki.url}/edit/{urllib.parse.quote(title, safe='')}")
    return re.search(r'name="base" value="([^"]*)"', editor).group(1)


def save(wiki, title, text, base):
    """Posts the editor's form; the HTTP status (303 saved, 409 conflict)."""
    data = urllib.parse.urlencode({"text": text, "base": base, "csrf": TOKEN, "action": "save"}).encode()
    request = urllib.request.Request(f"{wiki.url}/edit/{urllib.parse.quote(title, safe='')}", data=data)
    request.add_header("Cookie", f"wiki_csrf={TOKEN}")
    try:
        with OPENER.open(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        if error.code >= 500:
            print(f"{error.code}: {error.read().decode()}")
        return error.code


def revisions(wiki, title):
    history = get(f"{wiki.url}/history/{urllib.parse.quote(title, safe='')}")
    return re.findall(r'name="to" value="([^"]+)"', history)


@pytest.fixture(scope="module")
def wikis(tmp_path_factory):
    base = tmp_path_factory.mktemp("wiki-cluster")
    cluster = LocalCluster(base)
    servers = []
    try:
        cluster.start()
        for number, address in enumerate(ADDRESSES[:2]):
            server = WikiServer.on_shoal([f"{address}:{cluster.cql_port}"], "wiki", base / f"wiki{number}.log",
                                         replication_factor=3)
            servers.append(server.start())
        yield cluster, servers
    finally:
        for server in servers:
            server.stop()
        cluster.stop()


def race(wikis, title, editors):
    """`editors` saves of `title` at once, all from its current revision, through both
    wikis; the statuses and the texts saved."""
    base = base_revision(wikis[0], title)
    statuses = [None] * editors
    barrier = threading.Barrier(editors)

    def edit(number):
        barrier.wait()
        statuses[number] = save(wikis[number % len(wikis)], title, f"text of editor {number}\n", base)

    threads = [threading.Thread(target=edit, args=(number,)) for number in range(editors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return statuses


def test_of_editors_racing_from_one_revision_exactly_one_wins_through_any_node(wikis):
    cluster, servers = wikis
    title = "RacedPage"
    assert save(servers[0], title, "first text\n", "") == 303
    for round_number in range(5):
        statuses = race(servers, title, editors=6)
        assert sorted(statuses) == [303] + [409] * 5, f"round {round_number}: {statuses}"
    # One revision per winner, and both wikis see the same page.
    assert len(revisions(servers[0], title)) == 6
    assert revisions(servers[1], title) == revisions(servers[0], title)
    winner = re.search(r"text of editor (\d+)", get(f"{servers[1].url}/page/{title}"))
    assert winner, "the page does not hold a winner's text"


def test_the_wiki_keeps_saving_with_one_node_down(wikis):
    cluster, servers = wikis
    title = "PageWithANodeDown"
    assert save(servers[0], title, "before\n", "") == 303
    cluster.nodes[2].kill()
    try:
        # As with Cassandra, a logged batch picks its batchlog nodes among those seen up.
        wait_until(lambda: peers_up_in_status(cluster, 2, ADDRESSES[:2]), message="the node seen down")
        for number, server in enumerate(servers):
            base = base_revision(server, title)
            assert save(server, title, f"saved through wiki {number}\n", base) == 303
        assert "saved through wiki 1" in get(f"{servers[0].url}/page/{title}")
        assert len(revisions(servers[0], title)) == 3
    finally:
        cluster.nodes[2].start()
