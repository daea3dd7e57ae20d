"""Small builders shared by the ingest/ask tests: a made-up corpus with questions, and a one-page PDF."""

from __future__ import annotations

from pathlib import Path

# A made-up town, one topic per document, so retrieval has one right answer per question.
CORPUS = {
    "harbour.md": "# The harbour\n\nThe harbour of Velmora opens at dawn. Fishing boats unload herring and "
    "mackerel on the north quay. The harbour master, Odrun Pask, rings a brass bell at six.",
    "bakery.txt": "Tilla's bakery on Salt Lane bakes rye bread with caraway seeds. Its most famous pastry is "
    "a honey knot sold only on Fridays. The ovens are fired with beech wood.",
    "library.md": "The Velmora library holds eleven thousand books. Its oldest item is a hand-drawn map of "
    "the coastline from 1702. Readers may borrow four books at a time.",
    "festival.txt": "Every autumn the town holds the Lantern Walk. Children carry paper lanterns shaped like "
    "fish from the church to the lighthouse, and the parade ends with a bonfire on the beach.",
    "school.md": "The village school teaches forty pupils in two classrooms. Lessons start at half past "
    "eight, and every pupil learns to swim in the sea before the age of ten.",
    "railway.txt": "A narrow-gauge railway links Velmora to the market town of Greby. The steam engine is "
    "called Old Moll and makes the trip three times a day in forty minutes.",
    "lighthouse.md": "The lighthouse on Gull Point is painted red and white. Its lamp can be seen from "
    "twenty-two nautical miles away, and the keeper climbs 131 steps to reach it.",
    "football.txt": "The Velmora Rovers football club plays in green shirts. The club won the county cup "
    "in 1987, beating Greby two goals to one in the final.",
    "market.md": "The Saturday market fills the square with stalls of cheese, wool and smoked fish. "
    "Farmers from the hills sell goat cheese wrapped in nettle leaves.",
    "weather.txt": "Winters in Velmora are mild but windy. Storms from the west arrive mostly in "
    "November, and snow falls on fewer than five days a year.",
}
QUESTIONS = [  # (question, file holding the answer)
    ("Who rings the bell at the harbour?", "harbour.md"),
    ("Which pastry is sold only on Fridays?", "bakery.txt"),
    ("How many books can a reader borrow at once?", "library.md"),
    ("What shape are the children's lanterns in the autumn parade?", "festival.txt"),
    ("At what age do pupils learn to swim?", "school.md"),
    ("What is the name of the steam engine?", "railway.txt"),
    ("How many steps does the lighthouse keeper climb?", "lighthouse.md"),
    ("When did the football club win the county cup?", "football.txt"),
    ("What is the goat cheese wrapped in?", "market.md"),
    ("In which month do storms usually arrive?", "weather.txt"),
]


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (folder / name).write_text(text + "\n", encoding="utf-8")
    return folder


def one_page_pdf(lines: list[str], padding: int = 0) -> bytes:
    """A minimal valid PDF with the lines in Helvetica (built by hand: no PDF writer dependency). With
    `padding`, the page's content stream ends in that many spaces and is Flate-compressed (a page whose
    stream decompresses past a parser's limit)."""
    import zlib

    content = ("BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({t}) '" for t in lines) + " ET").encode()
    stream_dict = f"<< /Length {len(content)} >>".encode()
    if padding:
        content = zlib.compress(content + b" " * padding, 9)
        stream_dict = f"<< /Length {len(content)} /Filter /FlateDecode >>".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        stream_dict + b"\nstream\n" + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + obj + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def cli_json(result) -> dict:
    """The last stdout line of a successful CLI run (typer's CliRunner result), parsed as JSON."""
    import json

    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def ingest_collections(store: Path, home: Path, texts: dict[str, str], model: str) -> None:
    """One Markdown document per collection (`{name: text}`), each ingested with `--collection name`."""
    from typer.testing import CliRunner

    from turborag.cli import app

    for name, text in texts.items():
        folder = home / name
        folder.mkdir()
        (folder / f"{name}.md").write_text(text)
        args = ["ingest", str(folder), "--store", str(store), "--collection", name, "--model", model]
        r = CliRunner().invoke(app, [*args, "--chunk-tokens", "64"])
        assert r.exit_code == 0, r.output


def add_key(keys_file: Path, name: str, *scopes: str) -> str:
    """`turborag keys add NAME --keys FILE SCOPES...`: the new key."""
    import json

    from typer.testing import CliRunner

    from turborag.cli import app

    r = CliRunner().invoke(app, ["keys", "add", name, "--keys", str(keys_file), *scopes, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])["key"]


def health(url: str, timeout: float = 1.0) -> dict | None:
    """The server's /health, or None while it does not answer."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout).json()
    except httpx.HTTPError:
        return None


def served_subprocess(args: list[str], home: Path):
    """`turborag serve ARGS` in a subprocess on a free loopback port (TURBORAG_HOME=home/home, its log in
    home/serve.log), as a context manager yielding its URL once /health answers; stopped on exit."""
    import contextlib
    import os
    import socket
    import subprocess
    import sys
    import time

    @contextlib.contextmanager
    def run():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "TURBORAG_HOME": str(home / "home")}
        cmd = [sys.executable, "-m", "turborag", "serve", *args, "--port", str(port)]
        log = home / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 180
            while not health(url):
                assert proc.poll() is None and time.time() < deadline, log.read_text()
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return run()
