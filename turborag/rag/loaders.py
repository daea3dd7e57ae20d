"""Files -> documents (id + text). The first step of ingest.

Supported: `.txt`, `.md` (as plain text: Markdown source reads well to a language model), `.html`/`.htm`
(text extracted with BeautifulSoup on the standard-library HTML parser, so no C extension is needed),
`.pdf` (pypdf, pure Python and maintained) and `.jsonl` (one `{"id": ..., "text": ...}` per line, each line
a document of its own). Folders are walked recursively in sorted order; hidden files and folders (a leading
dot) are not entered.

Nothing here raises on bad input: a file that is binary, unreadable, empty or of an unknown type is reported
through `LoadReport.skipped` (path + reason) and the rest goes on. Text that is not valid UTF-8 is decoded
with replacement characters and reported in `LoadReport.warnings`.

A document's id is its absolute path (`/abs/path/file.md`), or `path#id` for a JSONL record, so ids are stable
across working directories. `file_hash` is the sha256 of the source file's bytes: ingest compares it with the
catalog and skips an unchanged file before parsing it at all.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst"}
HTML_SUFFIXES = {".html", ".htm"}
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | {".pdf", ".jsonl"}


@dataclass
class Document:
    doc_id: str  # absolute path, or "path#record-id" for JSONL
    path: str  # the source file (absolute)
    text: str
    file_hash: str  # sha256 of the source file's bytes

    @property
    def content_hash(self) -> str:
        return sha256_text(self.text)


@dataclass
class SourceFile:
    """A file found under the given paths, read but not parsed yet."""

    path: Path  # absolute
    data: bytes

    @property
    def file_hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class LoadReport:
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    warnings: list[str] = field(default_factory=list)

    def skip(self, path: Path | str, reason: str) -> None:
        self.skipped.append((str(path), reason))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# finding files


def find_files(paths: Iterable[str | Path], report: LoadReport) -> list[Path]:
    """Absolute paths of the supported files under `paths` (files or folders), sorted, without duplicates.

    A path that does not exist raises FileNotFoundError (the caller turns it into a one-line error); an
    unsupported file named explicitly, or met in a folder, is reported as skipped.
    """
    out: dict[Path, None] = {}
    for p in paths:
        path = Path(p).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {p}")
        path = path.resolve()
        if path.is_dir():
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if name.startswith("."):
                        continue
                    _add(Path(root) / name, out, report)
        else:
            _add(path, out, report)
    return list(out)


def _add(path: Path, out: dict[Path, None], report: LoadReport) -> None:
    if path.suffix.lower() in SUFFIXES:
        out[path] = None
    else:
        report.skip(path, f"unsupported file type {path.suffix or '(no suffix)'!r}")


def read_source(path: Path, report: LoadReport) -> SourceFile | None:
    try:
        return SourceFile(path, path.read_bytes())
    except OSError as e:
        report.skip(path, f"unreadable: {e.strerror or e}")
        return None


# ---------------------------------------------------------------------------------------------------------
# parsing


def parse(src: SourceFile, report: LoadReport) -> list[Document]:
    """The documents in one file; [] (with the reason in `report`) if it has none."""
    suffix = src.path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_docs(src, report)
    if suffix == ".pdf":
        text = _pdf_text(src, report)
        if text is None:
            return []
    elif _looks_binary(src.data):
        report.skip(src.path, "binary file (contains NUL bytes)")
        return []
    else:
        text = _decode(src, report)
        if suffix in HTML_SUFFIXES:
            text = html_text(text)
    if not text.strip():
        report.skip(src.path, "empty (no text)")
        return []
    return [Document(str(src.path), str(src.path), text, src.file_hash)]


def load(paths: Iterable[str | Path], report: LoadReport | None = None) -> Iterator[Document]:
    """Every document under `paths` (convenience for callers that do not need incremental skipping)."""
    report = report if report is not None else LoadReport()
    for path in find_files(paths, report):
        src = read_source(path, report)
        if src is not None:
            yield from parse(src, report)


def _looks_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]


def _decode(src: SourceFile, report: LoadReport) -> str:
    try:
        return src.data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        report.warnings.append(
            f"{src.path}: not valid UTF-8 (first bad byte at offset {e.start}); "
            "decoded with replacement characters"
        )
        return src.data.decode("utf-8", errors="replace")


_BLOCKS = [
    "address",
    "article",
    "aside",
    "blockquote",
    "caption",
    "dd",
    "div",
    "dl",
    "dt",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "td",
    "th",
    "tr",
    "ul",
]


# The page's chrome: site navigation, sidebars, banners and footers, the same on every page of a site. In a
# chunk it is noise ("Intranet home | HR | Contact") that retrieval matches and the model reads as content.
_CHROME = ["nav", "aside", "header", "footer"]
_CHROME_ROLES = ["navigation", "complementary", "banner", "contentinfo"]  # the same, marked up with ARIA


def html_text(html: str) -> str:
    """Visible text of an HTML page: the title, then the body with one paragraph per block element (inline
    elements such as <b> stay inside their sentence); scripts, styles and the like are dropped, and so is the
    page's navigation, sidebars, header and footer (`_drop_chrome`)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(["head", "script", "style", "noscript", "template", "svg"]):
        tag.decompose()
    _drop_chrome(soup)
    for br in soup("br"):
        br.replace_with("\n")
    for tag in soup(_BLOCKS):
        tag.insert_before("\n\n")
        tag.insert_after("\n\n")
    body = soup.get_text()
    lines = [" ".join(line.split()) for line in body.splitlines()]
    out: list[str] = [title, ""] if title else []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    if out and out[0] == title and len(out) > 2 and out[2] == title:
        out = out[2:]  # the page repeats its title as a heading
    return "\n".join(out).strip()


def _drop_chrome(soup) -> None:
    """Remove the page's chrome (`_CHROME`). A <header> or <footer> inside an <article> or <main> is the
    content's own (an article's heading and byline), so it stays; an explicit ARIA role always goes."""
    for tag in soup.find_all(_CHROME) + soup.find_all(attrs={"role": _CHROME_ROLES}):
        if tag.decomposed:  # inside chrome removed already
            continue
        own = tag.name in ("header", "footer") and tag.get("role") is None
        if own and tag.find_parent(["article", "main"]) is not None:
            continue
        tag.decompose()


def _pdf_text(src: SourceFile, report: LoadReport) -> str | None:
    import io
    import logging

    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # pypdf warns per odd object; we report per file
    try:
        reader = PdfReader(io.BytesIO(src.data))
        if reader.is_encrypted and not reader.decrypt(""):
            report.skip(src.path, "encrypted PDF")
            return None
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except LimitReachedError as e:  # a stream that decompresses past pypdf's bounds (a bomb, or just huge)
        report.skip(src.path, f"PDF over the parser's limits ({e}); convert it to text and add that instead")
        return None
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as e:
        report.skip(src.path, f"unreadable PDF: {e}")
        return None
    text = "\n\n".join(p for p in pages if p)
    if not text.strip():
        report.skip(src.path, "PDF has no extractable text (scanned images?)")
        return None
    return text


def _jsonl_docs(src: SourceFile, report: LoadReport) -> list[Document]:
    text = _decode(src, report)
    docs: dict[str, Document] = {}
    bad = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict) or "id" not in rec or not isinstance(rec.get("text"), str):
            report.warnings.append(f'{src.path}:{n}: not a {{"id": ..., "text": "..."}} object; line skipped')
            bad += 1
            continue
        if not rec["text"].strip():
            report.warnings.append(f"{src.path}:{n}: empty text; line skipped")
            continue
        doc_id = f"{src.path}#{rec['id']}"
        if doc_id in docs:
            report.warnings.append(f"{src.path}:{n}: duplicate id {rec['id']!r}; the later line wins")
        docs[doc_id] = Document(doc_id, str(src.path), rec["text"], src.file_hash)
    if not docs:
        report.skip(src.path, "no usable JSONL line" if bad else "empty (no text)")
    return list(docs.values())
