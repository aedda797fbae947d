"""Reading Markdown, plain text and HTML into titled sections; the text of PDF and DOCX files (extracted by
`agents.knowledge.readers`) too."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

SUFFIXES = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
"""What `kb ingest` reads: the text formats with `read_document`, all of them with `readers.read_file`."""


@dataclass(frozen=True)
class Section:
    heading: str | None
    """The nearest heading above the text (None before the first one)."""
    text: str


@dataclass(frozen=True)
class Document:
    source: str
    title: str
    sections: tuple[Section, ...]
    content_hash: str
    superseded: bool = False
    """The document says it no longer applies (see `says_superseded`): ranked below current ones, still found."""


_STALE = r"(?:superseded|archived|outdated|out of date|obsolete|deprecated|legacy|no longer (?:applies|valid|current))"
STALE_TITLE = re.compile(rf"[(\[]\s*{_STALE}\s*[)\]]|^\s*{_STALE}\s*[:\-–—]", re.I)
"""A title marked as help centres mark old pages: `Warranty (archived)`, `[Outdated] Pricing`, `Legacy: …`."""
STALE_OPENING = re.compile(
    rf"^\W*{_STALE}\b|\b(?:superseded|replaced) by\b|\bno longer (?:applies|apply|valid|current|maintained)\b"
    r"|\bthis (?:page|article|policy|document|version) (?:is|has been) (?:archived|outdated|out of date|retired)\b",
    re.I,
)
"""A banner at the top of the page: `Superseded.`, `Archived:`, `… superseded by …`, `This page is outdated.`"""
STALE_CLASS = re.compile(r"\b(?:superseded|archived|outdated|obsolete|deprecated)\b", re.I)
"""An HTML element's class naming the banner (`<div class="banner superseded">`)."""
OPENING = 300
"""Characters at the top of a document where a banner is looked for: further down, such words describe
something else ("text-message codes are no longer offered")."""


def says_superseded(title: str, sections: tuple[Section, ...]) -> bool:
    opening = sections[0].text[:OPENING] if sections else ""
    return bool(STALE_TITLE.search(title) or STALE_OPENING.search(opening))


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _named_title(source: str) -> str:
    """A title from the file's name, for a document that gives none."""
    return Path(source).stem.replace("-", " ").title()


def read_markdown(source: str, raw: str) -> Document:
    title: str | None = None
    heading: str | None = None
    sections: list[Section] = []
    buffer: list[str] = []
    in_code = False

    def flush() -> None:
        text = "\n".join(buffer).strip()
        if text:
            sections.append(Section(heading, text))
        buffer.clear()

    for line in raw.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            flush()
            if len(match[1]) == 1 and title is None:
                title = match[2]
            heading = match[2] if len(match[1]) > 1 or title != match[2] else None
            continue
        buffer.append(line)
    flush()
    title = title or _named_title(source)
    return Document(source, title, tuple(sections), _hash(raw), says_superseded(title, tuple(sections)))


def read_text(source: str, raw: str) -> Document:
    lines = raw.strip().splitlines()
    # A plain-text file's first line is its title when it stands alone, as it usually does.
    if len(lines) > 1 and lines[0].strip() and not lines[1].strip():
        title, body = lines[0].strip(), "\n".join(lines[2:])
    else:
        title, body = _named_title(source), raw
    sections = (Section(None, body.strip()),) if body.strip() else ()
    return Document(source, title, sections, _hash(raw), says_superseded(title, sections))


class _HtmlSections(HTMLParser):
    """A page's sections under its headings. Its first <h1> is the title (<title> when it has none, as that
    usually carries the site's name too); the site's chrome (navigation, banner, sidebars, forms, footers) is
    left out, so that every page does not share the same menu text."""

    _BLOCKS = frozenset({"p", "li", "tr", "br", "div", "section", "article", "table", "ul", "ol", "dd", "dt"})
    _SKIP = frozenset({"script", "style", "nav", "footer", "head", "aside", "form", "noscript", "svg", "template"})
    _CONTENT = frozenset({"main", "article", "section"})
    """A <header> inside these is the content's own (its title, a date); outside them, it is the site's banner."""

    def __init__(self) -> None:
        super().__init__()
        self.title: str | None = None
        self.page_title: str | None = None
        self.heading: str | None = None
        self.sections: list[Section] = []
        self.text: list[str] = []
        self.capture: list[str] | None = None
        self.titling = False
        """Capturing the page's <title>."""
        self.in_head = 0
        self.level = 0
        self.skipping = 0
        self.content = 0
        self.stale_banner = False
        """An element in the content whose class marks the page as superseded (a banner)."""

    def _skips(self, tag: str) -> bool:
        return tag in self._SKIP or (tag == "header" and not self.content)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            # The page's <title> only: an icon's <svg><title> inside a heading names the icon, not the page.
            if self.skipping == self.in_head and self.capture is None:
                self.capture, self.level, self.titling = [], 0, True
        elif self._skips(tag):
            self.in_head += tag == "head"
            self.skipping += 1
        elif self.skipping:
            return
        if STALE_CLASS.search(dict(attrs).get("class") or ""):
            self.stale_banner = True
        if tag in self._CONTENT:
            self.content += 1
            self.text.append("\n")
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self.capture, self.level = [], int(tag[1])
        elif tag in self._BLOCKS:
            self.text.append("\n")
        elif tag in ("td", "th"):
            self.text.append(" | ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and not self.titling:
            return
        if self.capture is not None and re.fullmatch(r"h[1-6]|title", tag):
            text = " ".join("".join(self.capture).split())
            if tag == "title":
                self.titling = False
                self.page_title = self.page_title or text
            elif self.level <= 1 and self.title is None:
                self.title, self.heading = text, None
            else:
                self.heading = text
            self.capture = None
        elif self._skips(tag):
            self.skipping = max(0, self.skipping - 1)
            self.in_head = max(0, self.in_head - (tag == "head"))
        elif tag in self._CONTENT and not self.skipping:
            self.content = max(0, self.content - 1)

    def handle_data(self, data: str) -> None:
        if self.skipping and not self.titling:
            return
        if self.capture is not None:
            self.capture.append(data)
        else:
            self.text.append(data)

    def _flush(self) -> None:
        lines = [" ".join(line.split()) for line in "".join(self.text).splitlines()]
        text = "\n".join(line.strip(" |") for line in lines if line.strip(" |"))
        if text:
            self.sections.append(Section(self.heading, text))
        self.text = []

    def close(self) -> None:
        super().close()
        self._flush()


def read_html(source: str, raw: str) -> Document:
    parser = _HtmlSections()
    parser.feed(raw)
    parser.close()
    title = parser.title or parser.page_title or _named_title(source)
    sections = tuple(parser.sections)
    return Document(source, title, sections, _hash(raw), parser.stale_banner or says_superseded(title, sections))


def pdf_document(source: str, pages: Sequence[str], content_hash: str) -> Document:
    """A PDF's pages as sections headed by their numbers (`page 3`), so that a citation says where to look. Titled by
    the file's name: a PDF's own title field is often its authoring tool's, or empty."""
    sections = tuple(Section(f"page {n}", text.strip()) for n, text in enumerate(pages, 1) if text.strip())
    title = _named_title(source)
    return Document(source, title, sections, content_hash, says_superseded(title, sections))


_DOCX_HEADING = re.compile(r"heading\s*[1-6]", re.I)


def docx_document(source: str, paragraphs: Sequence[tuple[str, str | None]], content_hash: str) -> Document:
    """A DOCX's paragraphs (text, style id) under their headings (styles `Heading1` to `Heading6`); its first
    `Title`-styled paragraph is the title, else the file's name."""
    title: str | None = None
    heading: str | None = None
    sections: list[Section] = []
    buffer: list[str] = []

    def flush() -> None:
        # A blank line between paragraphs: the chunker packs paragraphs, and cuts only an oversized one at sentences.
        text = "\n\n".join(buffer).strip()
        if text:
            sections.append(Section(heading, text))
        buffer.clear()

    for text, style in paragraphs:
        words = " ".join(text.split())
        if style and style.lower() == "title" and title is None and words:
            flush()
            title, heading = words, None
        elif style and _DOCX_HEADING.fullmatch(style) and words:
            flush()
            heading = words
        elif text.strip():
            buffer.append(text.strip())
    flush()
    title = title or _named_title(source)
    return Document(source, title, tuple(sections), content_hash, says_superseded(title, tuple(sections)))


def read_document(path: Path, *, source: str | None = None) -> Document:
    """A text document (Markdown, text, HTML); PDF and DOCX are read by `agents.knowledge.readers.read_file`."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind in ("pdf", "docx"):
        raise ValueError(f"{path}: a {kind.upper()} is read by agents.knowledge.readers.read_file")
    if kind is None:
        raise ValueError(f"{path}: unsupported file type (supported: {', '.join(sorted(SUFFIXES))})")
    raw = path.read_text(encoding="utf-8", errors="replace")
    reader = {"markdown": read_markdown, "text": read_text, "html": read_html}[kind]
    return reader(source or str(path), raw)


def find_documents(paths: list[Path]) -> list[Path]:
    """The files under the given paths that a reader understands, each once, in a stable order; a folder's README.md
    is left out (it describes the folder). A file named explicitly must be of a type read (ValueError), a path must
    exist (FileNotFoundError)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in SUFFIXES and p.name.lower() != "readme.md"
            )
        elif path.is_file():
            if path.suffix.lower() not in SUFFIXES:
                raise ValueError(f"{path}: not a type of document that is read (only {', '.join(sorted(SUFFIXES))})")
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return list(dict.fromkeys(found))
