"""The documentation held to the project: the docs site builds offline with mkdocs --strict
(every page in its navigation, no broken link or anchor), README.md links every page, its
table of commands is the command line's, the text the README shares with the site is the
same in both, and the source layout names each module of the package once."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml
from docpages import DOCS, REPO, modules_named, package_modules, section

README = REPO / "README.md"


def nav_pages() -> list[str]:
    """The pages of mkdocs.yml's navigation, in order."""
    def walk(entries) -> list[str]:
        found = []
        for entry in entries:
            for value in entry.values():
                found += walk(value) if isinstance(value, list) else [value]
        return found
    return walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])


def doc_links(text: str, prefix: str) -> list[tuple[str, str]]:
    """(page, anchor) of each Markdown link to a page under ``prefix`` (``docs/`` or "")."""
    return re.findall(rf"\]\({re.escape(prefix)}([\w-]+\.md)(?:#([\w-]+))?\)", text)


def anchors(page: str) -> set[str]:
    """The ids mkdocs (and GitHub) give the page's headings."""
    headings = re.findall(r"^#+ (.+)$", (DOCS / page).read_text(), re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.lower()).strip()) for h in headings}


def fenced(text: str, first_line: str) -> str:
    """The fenced block whose first line is ``first_line``, fences left out."""
    start = text.index("\n" + first_line + "\n") + len(first_line) + 2
    return text[start:text.index("```", start)]


def test_the_site_builds_offline_with_every_page_in_its_navigation(tmp_path):
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["plugins"] == ["search"]  # no privacy or social plugin: nothing fetched at build time
    assert config["theme"]["font"] is False  # and no web fonts on the page
    assert {key: config["validation"][key] for key in ("omitted_files", "anchors", "not_found")} == {
        "omitted_files": "warn", "anchors": "warn", "not_found": "warn"}  # warnings fail a --strict build
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    pages = nav_pages()
    assert sorted(pages) == sorted(path.name for path in DOCS.glob("*.md"))
    for page in pages:
        html = (site / page).with_suffix(".html").read_text()
        assert not re.search(r'(?:src=|<link[^>]*href=)"(?:https?:)?//', html), page  # loads nothing from the web
    assert "clusterjob submit SPEC" in (site / "commands.html").read_text()
    assert 'href="install.html"' in (site / "index.html").read_text()  # pages link to files, not folders


def test_the_readme_and_the_home_page_link_every_page_and_each_anchor_exists():
    pages = set(nav_pages())
    readme = doc_links(README.read_text(), "docs/")
    assert {page for page, _ in readme} == pages
    home = {page for page, _ in doc_links((DOCS / "index.md").read_text(), "")}
    assert home == pages - {"index.md"}
    missing = [(page, anchor) for page, anchor in readme if anchor and anchor not in anchors(page)]
    assert missing == []


def test_the_readmes_table_of_commands_is_the_command_line_and_the_commands_page():
    from clusterjob.cli import build_parser

    table = section(README.read_text(), "Commands")
    rows = [row.replace("\\|", "|") for row in re.findall(r"^\| `([^`]+)` \|", table, re.M)]
    (subparsers,) = [action for action in build_parser()._actions if action.choices and action.dest == "command"]
    commands = {row.split()[1] for row in rows if row.startswith("clusterjob ")}
    assert commands == set(subparsers.choices)
    page = fenced((DOCS / "commands.md").read_text(), "```")
    assert [re.split(r"\s+# ", line)[0] for line in page.splitlines()] == rows


def test_the_site_gives_the_readmes_set_up_slurm_and_own_code_as_they_are():
    readme = README.read_text()
    setup = fenced(readme, "```bash")
    assert setup.splitlines()[0].startswith("bash scripts/quickstart") and len(setup.splitlines()) == 2
    assert fenced((DOCS / "index.md").read_text(), "```bash") == setup
    assert fenced((DOCS / "install.md").read_text(), "```bash") == setup
    local_slurm = fenced(section(readme, "Try it on Slurm without a cluster"), "```bash")
    assert fenced((DOCS / "slurm.md").read_text(), "```bash") == local_slurm
    own = fenced(section(readme, "Your own training code"), "```yaml")
    assert fenced((DOCS / "own-code.md").read_text(), "```yaml") == own


def test_the_layout_page_names_each_module_of_the_package_once():
    named = modules_named(section((DOCS / "layout.md").read_text(), "The package"))
    twice = sorted({name for name in named if named.count(name) > 1})
    present = package_modules()
    assert (sorted(present - set(named)), sorted(set(named) - present), twice) == ([], [], [])


def test_the_module_lists_are_read_with_their_part():
    text = "Entry: `cli.py`.\n\n- `core/`: `env.py` and\n  `files.py` (atomic)\n- `launch/`: `executors/local.py`\n" \
           "| core | `core/rundir.py`, `core/env.py` | ... |"
    assert modules_named(text) == ["cli.py", "core/env.py", "core/files.py", "launch/executors/local.py",
                                   "core/rundir.py", "core/env.py"]
