"""Text out of PDF and DOCX files: one reader for the files customers attach (`bot.files`, within its limits) and
for the operator's own manuals (`kb ingest`, every page).

    pdf_pages()         a PDF's pages, read in a process of its own with a deadline
    pdf_text()          a PDF attachment's text, within the attachments' limits
    docx_paragraphs()   a DOCX's paragraphs with their styles; docx_text() its text
    read_file()         any file `kb ingest` reads, as a `Document`

`Unreadable`: the file says nothing readable; its message says why, in words fit for an agent or an operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import sys
import zipfile
from pathlib import Path
from xml.etree import ElementTree

from agents.errors import AgentsError
from agents.knowledge.documents import SUFFIXES, Document, docx_document, pdf_document, read_document


class Unreadable(AgentsError):
    """A file that says nothing readable (corrupt, encrypted, a scan); the message says why."""


MAX_PDF_PAGES = 50
"""Pages of an attachment read: a customer's file is anyone's."""
PDF_SECONDS = 10.0
"""An attachment's deadline."""
MANUAL_PDF_SECONDS = 120.0
"""A manual's deadline (the operator's own file, every page read): only a file that would never end is stopped."""
_PDF_READER = """
import io, json, sys
from pypdf import PdfReader
reader = PdfReader(io.BytesIO(sys.stdin.buffer.read()))
if reader.is_encrypted:
    sys.exit(3)
most, pages, texts, length = int(sys.argv[1]), int(sys.argv[2]), [], 0
for page in reader.pages if pages < 0 else reader.pages[:pages]:
    texts.append(page.extract_text() or "")
    length += len(texts[-1])
    if 0 <= most < length:
        break
sys.stdout.write(json.dumps(texts))
"""


async def pdf_pages(data: bytes, *, max_chars: int | None, max_pages: int | None, timeout_s: float) -> list[str]:
    """A PDF's text, page by page, read in a process of its own with a deadline: a small PDF can cost minutes of CPU
    (pages that share one huge content stream), which must neither hold the event loop's GIL nor outlive its
    welcome. At most `max_pages` pages, and no more once `max_chars` are read (None: all)."""
    reader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PDF_READER,
        str(-1 if max_chars is None else max_chars), str(-1 if max_pages is None else max_pages),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(reader.communicate(data), timeout=timeout_s)
    except TimeoutError:
        reader.kill()
        await reader.wait()
        raise Unreadable(f"the PDF took more than {timeout_s:g} s to read") from None
    if reader.returncode == 3:
        raise Unreadable("the PDF is password-protected")
    try:
        pages = json.loads(out) if reader.returncode == 0 else None
    except ValueError:
        pages = None
    if not isinstance(pages, list):
        raise Unreadable("not a readable PDF")
    # JSON carries a lone surrogate that Postgres and the model's API would refuse: replaced here.
    texts = [str(page).encode("utf-8", errors="replace").decode("utf-8").replace("\x00", "") for page in pages]
    if not any(text.strip() for text in texts):
        raise Unreadable("it holds no text (a scan, or empty)")
    return texts


async def pdf_text(data: bytes, *, max_chars: int) -> str:
    """An attached PDF's text: at most MAX_PDF_PAGES pages, no further than `max_chars`, within PDF_SECONDS."""
    return "\n".join(await pdf_pages(data, max_chars=max_chars, max_pages=MAX_PDF_PAGES, timeout_s=PDF_SECONDS))


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
DOCX_UNPACKED_BYTES = 20 * 1_000_000


def docx_paragraphs(data: bytes) -> list[tuple[str, str | None]]:
    """The paragraphs of word/document.xml, each with its style's id (`Title`, `Heading1`; None for body text): a
    DOCX is a zip of XML, and the body's text is all a reader needs."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as docx:
            info = docx.getinfo("word/document.xml")
            # A zip bomb is refused before it is inflated: the size it declares is checked, then only that much is
            # read, since the declared size is the file's own claim.
            if info.file_size > DOCX_UNPACKED_BYTES:
                raise Unreadable("the document is too large once unpacked")
            with docx.open(info) as member:
                xml = member.read(DOCX_UNPACKED_BYTES + 1)
            if len(xml) > DOCX_UNPACKED_BYTES:
                raise Unreadable("the document is too large once unpacked")
            root = ElementTree.fromstring(xml)
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError) as exc:
        raise Unreadable("not a readable DOCX") from exc
    paragraphs: list[tuple[str, str | None]] = []
    for paragraph in root.iter(f"{_W}p"):
        nodes = (node for node in paragraph.iter() if node.tag in (f"{_W}t", f"{_W}tab"))
        words = [(node.text or "") if node.tag == f"{_W}t" else "\t" for node in nodes]
        style = paragraph.find(f"{_W}pPr/{_W}pStyle")
        paragraphs.append(("".join(words), style.get(f"{_W}val") if style is not None else None))
    return paragraphs


def docx_text(data: bytes) -> str:
    return re.sub(r"\n{3,}", "\n\n", "\n".join(text for text, _ in docx_paragraphs(data)))


async def read_file(path: Path, *, source: str | None = None) -> Document:
    """A file `kb ingest` reads (`documents.SUFFIXES`) as a document; `source` names it (the path by default). A PDF's
    every page is read. Raises `Unreadable` (the message says why), OSError, or ValueError for another suffix."""
    source = source or str(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind not in ("pdf", "docx"):
        return await asyncio.to_thread(read_document, path, source=source)
    data = await asyncio.to_thread(path.read_bytes)
    content_hash = hashlib.sha256(data).hexdigest()
    if kind == "pdf":
        pages = await pdf_pages(data, max_chars=None, max_pages=None, timeout_s=MANUAL_PDF_SECONDS)
        return pdf_document(source, pages, content_hash)
    paragraphs = await asyncio.to_thread(docx_paragraphs, data)
    if not any(text.strip() for text, _ in paragraphs):
        raise Unreadable("it holds no text (empty)")
    return docx_document(source, paragraphs, content_hash)
