"""Loaders: every file type, folders, and bad input skipped with a reason (never an exception)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import one_page_pdf

from turborag.rag.loaders import LoadReport, html_text, load


def _load(*paths):
    report = LoadReport()
    docs = list(load(paths, report))
    return docs, report


def test_txt_and_md(tmp_path):
    (tmp_path / "a.txt").write_text("Plain text.\n")
    (tmp_path / "b.md").write_text("# Title\n\nSome *markdown*.\n")
    docs, report = _load(tmp_path)
    assert [Path(d.doc_id).name for d in docs] == ["a.txt", "b.md"]
    assert docs[1].text.startswith("# Title") and not report.skipped and not report.warnings
    assert docs[0].doc_id == str((tmp_path / "a.txt").resolve()) and len(docs[0].file_hash) == 64


def test_html_uses_a_parser():
    page = (
        "<html><head><title>Birds</title><style>p {color: red}</style></head><body>"
        "<h1>Kestrels</h1><p>The <b>kestrel</b> hovers&nbsp;over fields.</p>"
        "<script>var hidden = 1;</script><ul><li>one</li><li>two</li></ul>a<br>b</body></html>"
    )
    text = html_text(page)
    assert text.splitlines()[0] == "Birds"
    assert "The kestrel hovers over fields." in text  # inline elements stay in their sentence
    assert "hidden" not in text and "color" not in text
    assert "one\n\ntwo" in text and "a\nb" in text


def test_html_drops_the_page_chrome():
    """Navigation, banners, sidebars and footers repeat on every page of a site: not the page's text. An
    article's own header (its heading) stays."""
    page = (
        "<html><head><title>Leave policy</title></head><body>"
        "<header><a href='/'>Intranet home</a> | <a href='/hr'>HR</a></header>"
        "<nav><ul><li>Home</li><li>Payroll</li></ul></nav>"
        "<main><article><header><h1>Annual leave</h1></header><p>Staff get 25 days a year.</p></article>"
        "<aside>Related: sick leave</aside></main>"
        "<div role='navigation'>Skip to content</div><footer>Copyright 2024 | Contact us</footer>"
        "</body></html>"
    )
    text = html_text(page)
    assert text == "Leave policy\n\nAnnual leave\n\nStaff get 25 days a year."
    for chrome in ("Intranet home", "HR", "Payroll", "sick leave", "Skip to content", "Copyright"):
        assert chrome not in text


def test_html_file(tmp_path):
    (tmp_path / "p.html").write_text("<p>Hello <i>there</i>.</p>")
    docs, _ = _load(tmp_path / "p.html")
    assert docs[0].text == "Hello there."


def test_pdf(tmp_path):
    (tmp_path / "d.pdf").write_bytes(one_page_pdf(["The harbour opens at dawn.", "Boats unload herring."]))
    docs, report = _load(tmp_path / "d.pdf")
    assert docs[0].text == "The harbour opens at dawn.\nBoats unload herring."
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4\nnot really a pdf")
    docs, report = _load(tmp_path / "bad.pdf")
    assert docs == [] and report.skipped[0][1].startswith("unreadable PDF")


def test_a_pdf_over_the_parsers_limits_says_so(tmp_path):
    """A page stream that decompresses to 80 MB, past pypdf's 75 MB bound (78 KB on disk)."""
    (tmp_path / "big.pdf").write_bytes(one_page_pdf(["Hello."], padding=80_000_000))
    docs, report = _load(tmp_path / "big.pdf")
    assert docs == [] and report.skipped[0][1].startswith("PDF over the parser's limits")


def test_jsonl_records_are_documents(tmp_path):
    lines = [
        json.dumps({"id": "a", "text": "First record."}),
        "not json",
        json.dumps({"id": 7, "text": "Second record."}),
        json.dumps({"id": "a", "text": "Replaces the first."}),
        json.dumps({"text": "no id"}),
        json.dumps({"id": "e", "text": "  "}),
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    docs, report = _load(tmp_path / "r.jsonl")
    path = str((tmp_path / "r.jsonl").resolve())
    assert [(d.doc_id, d.text) for d in docs] == [
        (f"{path}#a", "Replaces the first."),
        (f"{path}#7", "Second record."),
    ]
    assert all(d.path == path for d in docs)
    joined = "\n".join(report.warnings)
    assert "r.jsonl:2:" in joined and "r.jsonl:4: duplicate id" in joined and "r.jsonl:5:" in joined
    assert "r.jsonl:6: empty text" in joined


def test_folders_recursive_hidden_and_unsupported(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "x.md").write_text("deep")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD.txt").write_text("hidden folder")
    (tmp_path / ".hidden.txt").write_text("hidden file")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00")
    docs, report = _load(tmp_path)
    assert [d.text for d in docs] == ["deep"]
    assert report.skipped == [(str((tmp_path / "image.png").resolve()), "unsupported file type '.png'")]


def test_binary_empty_and_non_utf8(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"abc\x00\x01\x02")
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\n ")
    (tmp_path / "latin.txt").write_bytes("café au lait".encode("latin-1"))
    docs, report = _load(tmp_path)
    assert [d.text for d in docs] == ["caf\ufffd au lait"]
    reasons = {Path(p).name: r for p, r in report.skipped}
    assert reasons == {
        "bin.txt": "binary file (contains NUL bytes)",
        "empty.md": "empty (no text)",
        "blank.txt": "empty (no text)",
    }
    assert len(report.warnings) == 1 and "latin.txt: not valid UTF-8" in report.warnings[0]


def test_unreadable_file_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "ok.txt").write_text("fine")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    docs, report = _load(tmp_path)
    assert [d.text for d in docs] == ["fine"]
    assert report.skipped == [(str(locked.resolve()), "unreadable: Permission denied")]


def test_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        _load(tmp_path / "nope")
