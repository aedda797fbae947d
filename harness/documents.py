"""Small documents made by hand for tests and benchmarks: PDFs and DOCX files the readers must read, without a
library that writes them."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib


def pdf(*pages: str) -> bytes:
    """A PDF with a page showing each text in Helvetica, written by hand (objects, then the xref table)."""
    kids = " ".join(f"{4 + 2 * n} 0 R" for n in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for n, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * n} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return _pdf_file(objects)


def docx(*paragraphs: str | tuple[str | None, str]) -> bytes:
    """A DOCX of paragraphs: body text, or (style id, text) with a style such as `Title` or `Heading1`."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"

    def paragraph(style: str | None, text: str) -> str:
        properties = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
        return f"<w:p>{properties}<w:r><w:t>{text}</w:t></w:r></w:p>"

    body = "".join(paragraph(*((None, p) if isinstance(p, str) else p)) for p in paragraphs)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as docx:
        docx.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        docx.writestr(
            "word/document.xml", f'<?xml version="1.0"?><w:document xmlns:w="{w}"><w:body>{body}</w:body></w:document>'
        )
    return buffer.getvalue()


def docx_bomb(unpacked: int) -> bytes:
    """A DOCX whose word/document.xml inflates to `unpacked` bytes while its headers declare 1,000: a reader that
    trusts the declared size inflates it all."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = b"\0" * (1 << 20)
    payload = squeeze.compress(b"<a>") + b"".join(squeeze.compress(block) for _ in range(unpacked >> 20))
    payload += squeeze.compress(b"</a>") + squeeze.flush()
    name = b"word/document.xml"
    small = io.BytesIO()
    with zipfile.ZipFile(small, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name.decode(), b"<a>tiny</a>")
    data = small.getvalue()
    central_at = data.find(b"PK\x01\x02")
    local = bytearray(data[: 30 + len(name)]) + payload
    central = bytearray(data[central_at:])
    for header, at in ((local, 18), (central, 20)):  # compressed size, then the declared (false) unpacked size
        struct.pack_into("<II", header, at, len(payload), 1000)
    struct.pack_into("<I", central, central.find(b"PK\x05\x06") + 16, len(local))
    return bytes(local + central)


def docx_of_xml(unpacked: int, *, element: str = "<w:p><w:r><w:t>x</w:t></w:r></w:p>") -> bytes:
    """A DOCX whose word/document.xml is `unpacked` bytes of real XML: `element` again and again in the body (a
    paragraph of text by default). Some 58 KB for 20 MB: within every size limit, yet parsing it takes a core for
    a second or more and hundreds of MB, in one call that holds the GIL."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    head, tail = f'<?xml version="1.0"?><w:document xmlns:w="{w}"><w:body>', "</w:body></w:document>"
    body = element * ((unpacked - len(head) - len(tail)) // len(element))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as docx:
        docx.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        docx.writestr("word/document.xml", head + body + tail)
    return buffer.getvalue()


PROOF_MARKS = '<w:proofErr w:type="spellStart"/>'
"""A body element with no text: a document of these is all parsing (in C, holding the GIL) and no text."""


def pdf_of_operators(operators: int) -> bytes:
    """A one-page PDF whose content stream is `operators` path operators, compressed: some KB that cost pypdf's text
    extraction seconds of CPU and a growing amount of memory (every operator is parsed into Python objects)."""
    stream = zlib.compress(b"BT /F1 12 Tf 72 720 Td (cheap) Tj ET\n" + b"0 0 m 1 1 l S\n" * operators, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 5 0 R "
        b"/Resources << /Font << /F1 3 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    return _pdf_file(objects)


def _pdf_file(objects: list[bytes]) -> bytes:
    """The objects numbered from 1 (the catalogue first), then the cross-reference table a reader seeks by."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
