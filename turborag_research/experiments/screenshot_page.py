"""Screenshot of the web page of a running `turborag serve` after a real "Compare full / turbo".

    turborag serve --store ~/.cache/turborag/demo-store --port 8123 &
    python -m turborag_research.experiments.screenshot_page --url http://127.0.0.1:8123 \\
        --out docs/web-page.png --question "What does the break statement do?"

Drives Debian's headless `chromium` through `chromedriver` (apt-get install chromium chromium-driver), named
by path so that Selenium Manager downloads nothing. `--key` for a server that needs one (put in
sessionStorage, where the page keeps it); `--open-source` opens the first passage of the turbo answer;
`--warmup N` compares N times before the one shown, so that a cold first request does not set the TTFTs.
"""

from __future__ import annotations

import argparse
import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8123")
    ap.add_argument("--question", default="What does the break statement do?")
    ap.add_argument("--out", default="docs/web-page.png")
    ap.add_argument("--key", default=None, help="API key of a server that needs one")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for both answers")
    ap.add_argument(
        "--warmup", type=int, default=1, help="compares run first, not shown (a cold first one is slow)"
    )
    ap.add_argument("--open-source", action="store_true", help="open the turbo answer's first passage")
    args = ap.parse_args()

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        # the viewport itself, not the window (whose size includes the browser's frame)
        metrics = {"width": args.width, "height": args.height, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.get(args.url)
        if args.key:
            driver.execute_script("sessionStorage.setItem('turborag.apiKey', arguments[0])", args.key)
            driver.refresh()
        wait = WebDriverWait(driver, args.timeout)
        wait.until(lambda d: d.find_element(By.ID, "doc-list").text.strip())  # the documents are listed
        driver.find_element(By.ID, "question").send_keys(args.question)
        for _ in range(1 + args.warmup):  # the last compare is the one shown
            driver.find_element(By.ID, "compare-button").click()
            try:
                wait.until(ec.visibility_of_element_located((By.ID, "speedup")))
            finally:
                error = driver.find_element(By.ID, "error")
                if error.is_displayed():
                    print(f"the page shows an error: {error.text}", file=sys.stderr)
        if args.open_source:
            driver.find_element(By.CSS_SELECTOR, '.answer[data-mode="turbo"] .sources summary').click()
        for mode in ("full", "turbo"):
            stats = driver.find_element(By.CSS_SELECTOR, f'.answer[data-mode="{mode}"] .stats').text
            print(f"{mode}: {stats}")
        print(driver.find_element(By.ID, "speedup").text)
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
