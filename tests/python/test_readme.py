"""Every Python example in the README and in the pages of docs/ runs as
written (the metrics one on a free port instead of 9100, those on etcd
against a test etcd), so none can rot. Their Rust examples are doc tests:
src/lib.rs includes every page, which the last tests here check, along with
the links between the pages."""

from __future__ import annotations

import pathlib
import re
import signal
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from etcd_server import Etcd
from waiting import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

# A fence's language says what a block is: `python` examples run here, `rust`
# ones are doc tests, `sh` is the set-up, and `text` is output or an API
# listing that is not meant to run. Nothing else, so that no example escapes
# its test under an unexpected name (and no bare fence: rustdoc would compile
# it as Rust).
LANGUAGES = {"python", "rust", "rust,no_run", "sh", "text", "yaml"}
OPENING_FENCE = re.compile(r"^```(\S*)$", re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


EXAMPLES: List[Tuple[str, str]] = [(name(page), block) for page in PAGES for block in PYTHON_BLOCK.findall(page.read_text())]


def first_line(block: str) -> str:
    return next(line for line in block.splitlines() if line and not line.startswith("import"))


@pytest.mark.parametrize(("page", "block"), EXAMPLES, ids=[f"{page}: {first_line(b)[:40]}" for page, b in EXAMPLES])
def test_example_runs(page: str, block: str) -> None:
    block = block.replace("port=9100", "port=0")
    namespace: Dict[str, Any] = {"__name__": "readme_example"}
    if any(needs in block for needs in ("LeaderElection(", "Sharding(", "EtcdSource(")):
        return run_etcd_example(page, block, namespace)
    exec(compile(block, page, "exec"), namespace)
    # A block written as a pytest file: run its tests.
    for attribute, value in list(namespace.items()):
        if attribute.startswith("test_") and callable(value):
            value()


def run_etcd_example(
    page: str, block: str, namespace: Dict[str, Any], while_running: Optional[Callable[[Etcd], None]] = None
) -> None:
    """An example on etcd (leader election, sharding, a cache of a prefix),
    against a test etcd holding a key `web` = 3 under each prefix it caches.
    One that calls `c.run()` gets Ctrl-C once it has reconciled and
    `while_running` has returned, as a user would end it; any other runs
    to its end, and its controller `c` is stopped."""
    etcd = Etcd()
    try:
        block = block.replace("http://127.0.0.1:2379", etcd.endpoint)
        for prefix in re.findall(r'EtcdSource\((?:\[[^]]*\]|"[^"]*"), "([^"]+)"', block):
            etcd.put(f"{prefix}web", "3")
        if "c.run()" not in block:
            try:
                exec(compile(block, page, "exec"), namespace)
            finally:
                if "c" in namespace:
                    namespace["c"].stop()
            return
        failed: List[BaseException] = []

        def interrupt_once_reconciled() -> None:
            try:
                wait_for(lambda: "c" in namespace and namespace["c"].stats()["successes"] >= 1, what="a reconcile")
                if while_running is not None:
                    while_running(etcd)
            except BaseException as e:  # noqa: B036 (raised again by the test's thread)
                failed.append(e)
            finally:
                signal.raise_signal(signal.SIGINT)

        threading.Thread(target=interrupt_once_reconciled, daemon=True).start()
        exec(compile(block, page, "exec"), namespace)
        if failed:
            raise failed[0]
        assert namespace["c"].stats()["state"] == "stopped"
    finally:
        etcd.close()


def test_the_cache_example_follows_etcd() -> None:
    """The README's cache example reconciles what etcd holds, and then each
    change: an update, a new key and a delete."""
    (block,) = [b for page, b in EXAMPLES if page == "README.md" and "EtcdSource(" in b and "Sharding(" not in b]
    namespace: Dict[str, Any] = {"__name__": "readme_example"}

    def change_the_desired_state(etcd: Etcd) -> None:
        wait_for(lambda: namespace["running"] == {"web": 3}, what="the listed key to be reconciled")
        etcd.put("/replicas/web", "5")
        etcd.put("/replicas/db", "1")
        wait_for(lambda: namespace["running"] == {"web": 5, "db": 1}, what="the puts to be reconciled")
        etcd.delete("/replicas/web")
        wait_for(lambda: namespace["running"] == {"db": 1}, what="the delete to be reconciled")

    run_etcd_example("README.md", block, namespace, change_the_desired_state)
    assert namespace["replicas"].stats()["synced"]


def test_the_sharded_example_reconciles_its_cache() -> None:
    """The README's sharded example (Scaling out) reconciles the cached key,
    then a key put while it runs."""
    (block,) = [b for page, b in EXAMPLES if page == "README.md" and "Sharding(" in b and "EtcdSource(" in b]
    namespace: Dict[str, Any] = {"__name__": "readme_example"}

    def put_a_key(etcd: Etcd) -> None:
        etcd.put("/apps/team/api", "v1")
        wait_for(lambda: namespace["c"].stats()["successes"] >= 2, what="the put to be reconciled")

    run_etcd_example("README.md", block, namespace, put_a_key)
    assert namespace["c"].stats()["owned_partitions"] == 0, "partitions handed over at the stop"


def test_the_first_example_counts_its_work(capsys: pytest.CaptureFixture[str]) -> None:
    (block,) = [b for page, b in EXAMPLES if page == "README.md" and 'name="sync"' in b]
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "'successes': 3" in printed and "'failures': 1" in printed, printed


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_python_example_is_collected(page: pathlib.Path) -> None:
    """Every fence names a known language, and every `python` one is run."""
    text = page.read_text()
    languages = OPENING_FENCE.findall(text)[::2]  # opening and closing fences alternate
    assert set(languages) <= LANGUAGES, languages
    assert len(PYTHON_BLOCK.findall(text)) == languages.count("python")


def test_the_examples_are_where_a_reader_looks() -> None:
    by_page = {page: sum(1 for p, _ in EXAMPLES if p == page) for page, _ in EXAMPLES}
    assert by_page["README.md"] >= 3, by_page  # the first controller, a test, replicas
    assert len(EXAMPLES) >= 9, by_page


def test_every_page_is_doc_tested() -> None:
    """src/lib.rs includes the README and every page of docs/, so their
    ```rust blocks run as doc tests; a new page must be added there."""
    included = set(re.findall(r'= "\.\./([^"]+\.md)",', (ROOT / "src/lib.rs").read_text()))
    assert included == {name(page) for page in PAGES}


def anchors(page: pathlib.Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    headings = re.findall(r"^#+ (.*)$", re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_link_between_pages_resolves(page: pathlib.Path) -> None:
    """A link to a page or a section that does not exist fails here (the
    README's table of capabilities links each row to its page)."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == []


def test_nothing_points_outside_the_repository() -> None:
    """The guarantees live in docs/guarantees.md: no README line or doc
    comment may send a reader to a file a clone does not have."""
    files = [*PAGES, *ROOT.glob("src/**/*.rs"), *ROOT.glob("python/reconq/*.py*"), *ROOT.glob("tests/**/*.rs"),
             *ROOT.glob("tests/python/*.py"), *ROOT.glob("benches/**/*.*")]
    offenders = [
        name(f)
        for f in files
        if f != pathlib.Path(__file__).resolve()
        and any(outside in f.read_text(errors="replace") for outside in ("shared/spec", "API.md", "shared/research"))
    ]
    assert offenders == []
