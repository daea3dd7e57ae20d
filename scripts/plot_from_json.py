"""Draw the plot of a saved `--json` output of `turborag bench ttft`, `bench serve` or `eval`, the same plot
that `--plot FILE` draws during the run:

    turborag bench ttft --context-tokens 512,2048,8192 --json > ttft.json
    python scripts/plot_from_json.py ttft.json ttft.png

The command is told from the JSON's shape. A file of several lines (e.g. a log with the JSON last) is read
from its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from turborag.bench.plots import PlotUnavailable, plot_any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json_file", type=Path, help="the saved --json output")
    p.add_argument("png", type=Path, help="the PNG to write")
    args = p.parse_args(argv)
    try:
        lines = args.json_file.read_text().strip().splitlines()
        result = json.loads(lines[-1]) if lines else None
        if not isinstance(result, dict):
            raise ValueError("no JSON object on its last line")
        plot_any(result, args.png)
    except (OSError, ValueError, KeyError, PlotUnavailable) as e:
        print(f"error: {args.json_file}: {e}", file=sys.stderr)
        return 2
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
