"""The web page at `/` (turborag/serve/static): served without a key, and driven in a real headless Chromium
through Selenium against a real `turborag serve` on a tiny model: upload, ask (streamed), compare, remove,
and the key asked for on a 401 (a wrong one shown as an error).

The browser is Debian's `chromium` and `chromedriver` (`apt-get install chromium chromium-driver`), named by
path so that Selenium Manager never downloads a driver. Without them the browser test skips, except under
CI (`CI` set), where it fails: CI must run it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app

KEY = "sk-page-test"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FACT = "The zorblat festival of Quintara is held on the ninth moon and honours the glass-blowers."
# counts the changes of an answer's text: one per streamed piece, where a non-streamed answer would make one
COUNT_ANSWER_UPDATES = """
window.answerUpdates = 0;
new MutationObserver((records) => {
  for (const r of records) if (r.target.classList?.contains("text")) window.answerUpdates++;
}).observe(document.getElementById("results"), { subtree: true, childList: true });
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    """`turborag serve` with a key, over a store whose corpus is in collection `seed`: the page opens on the
    empty `default` collection, and the only document there is the one the test uploads."""
    home = tmp_path_factory.mktemp("page")
    env = {**os.environ, "TURBORAG_HOME": str(home / "home")}
    store = home / "store"
    args = ["ingest", str(write_corpus(home / "docs")), "--store", str(store), "--model", tiny_model_dir]
    r = CliRunner().invoke(app, [*args, "--chunk-tokens", "64", "--collection", "seed"], env=env)
    assert r.exit_code == 0, r.output
    port = _free_port()
    cmd = [sys.executable, "-m", "turborag", "serve", "--store", str(store), "--port", str(port)]
    cmd += ["--api-key", KEY, "--max-tokens", "8"]
    log = home / "serve.log"  # a file, not a pipe: nobody reads the server's output while it runs
    with log.open("wb") as out:  # the server keeps its own copy of the file
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            break
        except httpx.TransportError:
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, "turborag serve did not start in 120 s"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def test_page_and_its_assets_are_served_without_a_key(server):
    page = httpx.get(server + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js"' in page.text and 'href="/static/style.css"' in page.text
    js = httpx.get(server + "/static/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "/v1/chat/completions" in js.text
    css = httpx.get(server + "/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert all("://" not in r.text for r in (page, js, css))  # no CDN, no external font: works offline
    assert httpx.get(server + "/static/nope.js").status_code == 404
    assert httpx.get(server + "/v1/models").status_code == 401  # the API itself still needs the key


@pytest.fixture
def browser():
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        reason = f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("needs selenium (pip install -e '.[dev]')")

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)  # --no-sandbox: CI containers run as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # a driver path given: Selenium Manager is skipped (it would download one)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


def test_upload_ask_compare_in_chromium(browser, server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    wait = WebDriverWait(d, 30)

    def text_of(css: str) -> str:
        return d.find_element(By.CSS_SELECTOR, css).text

    def enter_key(key: str) -> None:
        wait.until(ec.visibility_of_element_located((By.ID, "key"))).send_keys(key)
        d.find_element(By.CSS_SELECTOR, "#key-form button").click()

    d.get(server + "/")
    # the page's first API call gets a 401: the page asks for the key; a wrong one is shown as a message
    enter_key("wrong-key")
    error = wait.until(ec.visibility_of_element_located((By.ID, "error")))
    assert "401" in error.text and "wrong API key" in error.text

    # the wrong key was forgotten: the upload asks again, and the right key is kept for what follows
    doc = tmp_path / "zorblat.md"
    doc.write_text(FACT + "\n")
    d.find_element(By.ID, "file").send_keys(str(doc))
    enter_key(KEY)
    wait.until(lambda _: "zorblat.md" in text_of("#doc-list"))
    assert not d.find_element(By.ID, "error").is_displayed()
    assert d.execute_script("return sessionStorage.getItem('turborag.apiKey')") == KEY

    # ask: the streamed answer, then its stats and the passage it read (text shown on click)
    d.execute_script(COUNT_ANSWER_UPDATES)
    d.find_element(By.ID, "question").send_keys("When is the zorblat festival?")
    d.find_element(By.ID, "ask-button").click()
    wait.until(lambda _: "TTFT" in text_of(".answer .stats"))
    assert d.execute_script("return window.answerUpdates") >= 2  # drawn piece by piece as it streamed
    stats = text_of(".answer .stats")
    assert "prompt tokens" in stats and "cached" in stats
    assert text_of(".answer .text")
    source = d.find_element(By.CSS_SELECTOR, ".answer .sources summary")
    assert "zorblat.md" in source.text
    source.click()
    assert "ninth moon" in text_of(".answer .sources pre")

    # compare: full and turbo side by side, each with its TTFT, and the speedup
    d.find_element(By.ID, "compare-button").click()
    wait.until(ec.visibility_of_element_located((By.ID, "speedup")))
    for mode in ("full", "turbo"):
        stats = text_of(f'.answer[data-mode="{mode}"] .stats')
        assert f"mode {mode}" in stats and "TTFT" in stats
    assert "· 0 cached" in text_of('.answer[data-mode="full"] .stats')  # full prefills everything
    assert "×" in text_of("#speedup")
    assert not d.find_element(By.ID, "error").is_displayed()
    d.save_screenshot(str(tmp_path / "page.png"))  # on failure, pytest keeps tmp_path to look at

    # remove the document: the list is empty again
    d.find_element(By.CSS_SELECTOR, "#doc-list .remove").click()
    wait.until(lambda _: "No documents yet." in text_of("#doc-list"))

    # no JavaScript error besides the browser's own notes on the two 401 responses
    logs = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert [m for m in logs if "status of 401" not in m] == [], logs
