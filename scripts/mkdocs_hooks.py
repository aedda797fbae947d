"""MkDocs hooks (mkdocs.yml): README.md is the site's home page and CHANGELOG.md a page, read from the repository's
root so that each has one copy. Their links and those of docs/ are written for GitHub, relative to the file's place
in the repository (`docs/slack.md` in the README, `../README.md` in docs/); here they are pointed at the site's
pages. A link to anything else outside docs/ is left as it is, and `mkdocs build --strict` reports it (a warning
about `index.md` is about the README).

Two kinds of content are generated rather than written, so that they cannot drift from what they describe:
`<!-- settings -->` becomes the configuration reference, one table per group of `bot.settings` with each field's
docstring, and `<!-- bench: NAME -->` the table of `bench/results/NAME.json` (`bench.tables`)."""

import inspect
import json
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
SITE_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
"""Files outside docs/, by their path in the repository, and the page each is on the site."""
REPOSITORY_PATHS = {page: path for path, page in SITE_PAGES.items()}
LINK = re.compile(r"(\]\()([^)\s#]+)")
SETTINGS = "<!-- settings -->"
BENCH = re.compile(r"<!-- bench: ([\w-]+) -->")
RESULTS = ROOT / "bench" / "results"


def on_config(config: MkDocsConfig, /) -> MkDocsConfig:
    # `mkdocs` runs from the virtualenv's bin/, where `bench` is not importable (and mkdocs restores sys.path after
    # loading this module, so it is done here).
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_files(files: Files, /, *, config: MkDocsConfig) -> Files:
    for path, page in SITE_PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, /, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    source = REPOSITORY_PATHS.get(page.file.src_uri, f"docs/{page.file.src_uri}")
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, settings_reference())
    markdown = BENCH.sub(lambda marker: bench_table(marker[1]), markdown)

    def to_site(link: re.Match[str]) -> str:
        target = link[2]
        if ":" in target:  # https:, mailto:
            return link[0]
        path = posixpath.normpath(posixpath.join(posixpath.dirname(source), target))
        on_site = SITE_PAGES.get(path) or (path.removeprefix("docs/") if path.startswith("docs/") else None)
        if on_site is None:
            return link[0]
        return link[1] + posixpath.relpath(on_site, posixpath.dirname(page.file.src_uri) or ".")

    return LINK.sub(to_site, markdown)


def settings_reference() -> str:
    """One table per group of settings: its variables, defaults and descriptions, under the group's heading."""
    from bot.settings import GROUPS, env_name

    sections = []
    for group in GROUPS:
        title, _, about = _one_line(inspect.getdoc(group) or "").partition(": ")
        rows = [
            f"| `{env_name(name)}` | {_default(field.default)} | {_one_line(field.description or '')} |"
            for name, field in group.model_fields.items()
        ]
        table = "\n".join(["| variable | default | meaning |", "|---|---|---|", *rows])
        sections.append(f"### {title}\n\n{about[:1].upper()}{about[1:]}\n\n{table}")
    return "\n\n".join(sections)


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if not text:
        return "empty"
    if len(text) > 40:  # a customer-facing text: its beginning says which
        return '"' + text[:36].rsplit(" ", 1)[0] + '…"'
    return f"`{text}`"


def bench_table(name: str) -> str:
    """The table of `bench/results/NAME.json`, with NAME-other.json as the "before" where there is one."""
    from bench.tables import RENDERERS

    result, other = RESULTS / f"{name}.json", RESULTS / f"{name}-other.json"
    before = json.loads(other.read_text()) if other.is_file() else None
    return RENDERERS[name](json.loads(result.read_text()), before).markdown()
