"""MkDocs hooks (mkdocs.yml): README.md is the site's home page and CHANGELOG.md a page, read from the repository's
root so that each has one copy. Their links and those of docs/ are written for GitHub, relative to the file's place
in the repository (`docs/slack.md` in the README, `../README.md` in docs/); here they are pointed at the site's
pages. A link to anything else outside docs/ is left as it is, and `mkdocs build --strict` reports it (a warning
about `index.md` is about the README)."""

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
SITE_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
"""Files outside docs/, by their path in the repository, and the page each is on the site."""
REPOSITORY_PATHS = {page: path for path, page in SITE_PAGES.items()}
LINK = re.compile(r"(\]\()([^)\s#]+)")


def on_files(files: Files, /, *, config: MkDocsConfig) -> Files:
    for path, page in SITE_PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, /, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    source = REPOSITORY_PATHS.get(page.file.src_uri, f"docs/{page.file.src_uri}")

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
