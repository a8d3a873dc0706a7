"""The document-conversion libraries side by side (docs/DOCUMENTS.md): speed and what text comes out. Not a test.

    /tmp/libs/bin/python bench/document_libraries.py --pages 300   # a throwaway venv holding the libraries to compare

(Run by path, not ``-m bench…``: the libraries compared are not all in the app environment.)

Each library converts the same PDF (``--pages`` text pages, built here, one code word per page) and the same DOCX
(heading, paragraphs, a table); the table says the time, how many of the code words came out, and whether the
table's cells and the reading order survived. A library that is not installed is skipped.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.documents_build import make_docx, make_pdf


def _pdfium(path: Path) -> str:
    pdfium = importlib.import_module("pypdfium2")

    doc = pdfium.PdfDocument(str(path))
    try:
        return "\n".join(doc[i].get_textpage().get_text_range() for i in range(len(doc)))
    finally:
        doc.close()


def _pypdf(path: Path) -> str:
    pypdf = importlib.import_module("pypdf")

    return "\n".join(page.extract_text() for page in pypdf.PdfReader(str(path)).pages)


def _markitdown(path: Path) -> str:
    MarkItDown = importlib.import_module("markitdown").MarkItDown

    return str(MarkItDown().convert(str(path)).text_content)


def _python_docx(path: Path) -> str:
    docx = importlib.import_module("docx")

    out = []
    for block in docx.Document(str(path)).iter_inner_content():
        if hasattr(block, "rows"):
            out += [" | ".join(c.text for c in row.cells) for row in block.rows]
        else:
            out.append(block.text)
    return "\n".join(out)


def _mammoth(path: Path) -> str:
    mammoth = importlib.import_module("mammoth")

    with path.open("rb") as f:
        return str(mammoth.extract_raw_text(f).value)


def _ours(path: Path) -> str:
    from backend.chat.documents import convert_file

    return convert_file(path, path.name).text


def _time(fn: Callable[[Path], str], path: Path, runs: int) -> tuple[float, str]:
    times, text = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        text = fn(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    words = [f"codeword{i:04d}" for i in range(args.pages)]
    lines = "\n".join(f"Line {j} of the page, some ordinary text to read." for j in range(40))
    pdf = make_pdf([f"Page {i + 1} holds {w}.\n{lines}" for i, w in enumerate(words)])
    docx = make_docx(
        [f"Paragraph {i} holds {w}." for i, w in enumerate(words[:50])],
        heading="Title",
        table=[["cellA1", "cellB1"], ["cellA2", "cellB2"]],
    )
    with tempfile.TemporaryDirectory() as tmp:
        pdf_path, docx_path = Path(tmp, "doc.pdf"), Path(tmp, "doc.docx")
        pdf_path.write_bytes(pdf)
        docx_path.write_bytes(docx)
        print(f"PDF: {args.pages} pages, {len(pdf) / 1e6:.1f} MB; DOCX: 50 paragraphs and a 2x2 table")
        print(f"{'library':<14} {'file':<5} {'median s':>9} {'code words':>11}  table / order")
        cases = [
            ("pypdfium2", _pdfium, pdf_path),
            ("pypdf", _pypdf, pdf_path),
            ("markitdown", _markitdown, pdf_path),
            ("python-docx", _python_docx, docx_path),
            ("mammoth", _mammoth, docx_path),
            ("markitdown", _markitdown, docx_path),
            ("qwenchat", _ours, pdf_path),
            ("qwenchat", _ours, docx_path),
        ]
        for name, fn, path in cases:
            try:
                secs, text = _time(fn, path, args.runs)
            except ImportError as exc:
                print(f"{name:<14} {path.suffix[1:]:<5} skipped ({exc})")
                continue
            want = words if path is pdf_path else words[:50]
            found = sum(w in text for w in want)
            order = all(
                text.find(a) < text.find(b) for a, b in zip(want, want[1:], strict=False) if a in text and b in text
            )
            table = "cells ok" if all(c in text for c in ("cellA1", "cellB2")) else "cells lost"
            extra = f"{table}, " if path is docx_path else ""
            print(
                f"{name:<14} {path.suffix[1:]:<5} {secs:>9.3f} {found:>5}/{len(want):<5}  {extra}order {'ok' if order else 'WRONG'}"
            )


if __name__ == "__main__":
    main()
