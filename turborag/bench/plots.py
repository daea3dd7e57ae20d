"""PNG plots of what `bench ttft`, `bench serve` and `eval` measure (matplotlib, the optional `plot` extra).

Each function takes the dict the command prints with `--json`, so a plot can be made from a run's saved
output later (`turborag bench plot`) exactly as `--plot FILE` makes it during the run. Figures are
drawn on matplotlib's Agg canvas without pyplot: no display, no global state, nothing to close.
"""

from __future__ import annotations

from pathlib import Path

from turborag.core.modes import COLORS

MODE_COLORS = COLORS  # one colour per mode, the same in every plot (core/modes.py)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise PlotUnavailable, with the install command, when matplotlib is missing (a command checks this
    before it runs its benchmark, not after)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'turborag[plot]' (or pip install matplotlib)"
        ) from e


def _figure(width: float, height: float):
    require()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path


def _need(result: dict, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in result]
    if missing:
        raise ValueError(f"not the JSON of {what}: no {', '.join(missing)}")


def plot_ttft(result: dict, path: str | Path) -> Path:
    """`bench ttft --json`: full, turbo and floor TTFT against context tokens, both axes logarithmic."""
    _need(result, ("rows",), "`turborag bench ttft --json`")
    rows = sorted(result["rows"], key=lambda r: r["context_tokens"])
    if not rows:
        raise ValueError("no rows to plot")
    x = [r["context_tokens"] for r in rows]
    fig = _figure(7, 4.5)
    ax = fig.subplots()
    for key, label, marker in (
        ("full_ttft_s", "full (prefill everything)", "o"),
        ("turbo_ttft_s", "turbo (chunk caches from the store)", "s"),
        ("floor_ttft_s", "floor (question prefill, context resident)", "^"),
    ):
        name = label.split()[0]
        ax.plot(x, [r[key] for r in rows], marker=marker, color=MODE_COLORS[name], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{v:,}" for v in x])
    ax.minorticks_off()
    ax.set_xlabel("context tokens")
    ax.set_ylabel("TTFT (s, log scale)")
    where = ", ".join(str(result[k]) for k in ("model", "device", "dtype") if result.get(k))
    ax.set_title(f"TTFT: full vs turbo{f' ({where})' if where else ''}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _split_mode(key: str, default_model: str) -> tuple[str, str]:
    """'turbo@runs/ft/model' -> ('turbo', 'runs/ft/model'); 'full' -> ('full', default_model)."""
    mode, _, model = key.partition("@")
    return mode, model or default_model


def plot_eval(result: dict, path: str | Path) -> Path:
    """`eval --json`: accuracy and TTFT p50 per mode, the bars grouped per model (`MODE@MODEL`)."""
    _need(result, ("modes",), "`turborag eval --json`")
    default = str(result.get("model") or "model")
    groups: dict[str, list[tuple[str, dict]]] = {}
    for key, row in result["modes"].items():
        mode, model = _split_mode(key, default)
        groups.setdefault(model, []).append((mode, row))
    if not groups:
        raise ValueError("no modes to plot")
    xs, labels, colors, centers = [], [], [], []
    x = 0.0
    for model, rows in groups.items():
        start = x
        for mode, _row in rows:
            xs.append(x)
            labels.append(mode)
            colors.append(MODE_COLORS.get(mode, "#999999"))
            x += 1
        centers.append(((start + x - 1) / 2, model))
        x += 0.6  # a gap between models
    rows = [row for rs in groups.values() for _, row in rs]
    n = max(len(rows) * 0.9 + 2, 5)
    fig = _figure(n * 2, 4.5)
    acc_ax, ttft_ax = fig.subplots(1, 2)
    acc = [100 * r["accuracy"] for r in rows]
    ttft = [r["ttft_s_p50"] for r in rows]
    for ax, values, fmt, label in (
        (acc_ax, acc, "{:.1f}%", "accuracy (%)"),
        (ttft_ax, ttft, "{:.3f}", "TTFT p50 (s)"),
    ):
        bars = ax.bar(xs, values, color=colors)
        ax.bar_label(bars, [fmt.format(v) for v in values], fontsize=7)
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        if len(groups) > 1:
            for c, model in centers:  # the model's name above its bars
                ax.annotate(
                    _short(model), (c, 1.0), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points",
                )  # fmt: skip
    acc_ax.set_ylim(0, 105)
    n_questions = max(r["n"] for r in rows)
    title = f"eval: {n_questions} questions"
    fig.suptitle(title if len(groups) > 1 else f"{title}, model {_short(default)}", fontsize=10)
    return _save(fig, path)


def _short(name: str, width: int = 32) -> str:
    """A model name or path fit for a label: the end of a long path."""
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def plot_serve(result: dict, path: str | Path) -> Path:
    """`bench serve --json`: TTFT p50/p99, generated tokens/s and requests/s, one request at a time
    (`--max-batch 1`) against continuous batching, side by side; with a `sweep`, also TTFT against the
    number of concurrent clients."""
    _need(result, ("load", "load_max_batch_1"), "`turborag bench serve --json`")
    runs = [result["load_max_batch_1"], result["load"]]
    names = [f"max batch {r['max_batch']}" for r in runs]
    colors = ["#8c8c8c", MODE_COLORS["turbo"]]
    sweep = result.get("sweep") or []
    fig = _figure(15 if sweep else 11, 4)
    ttft_ax, tok_ax, req_ax, *more = fig.subplots(1, 4 if sweep else 3)
    if sweep:
        _plot_sweep(more[0], sweep, dict(zip((r["max_batch"] for r in runs), colors)))
    width = 0.38
    for i, (run, name, color) in enumerate(zip(runs, names, colors)):
        values = [run["ttft_p50_s"] or 0.0, run["ttft_p99_s"] or 0.0]
        bars = ttft_ax.bar([j + (i - 0.5) * width for j in range(2)], values, width, color=color, label=name)
        ttft_ax.bar_label(bars, [f"{v:.3f}" for v in values], fontsize=7)
    ttft_ax.set_xticks([0, 1], ["p50", "p99"])
    ttft_ax.set_ylabel("TTFT (s)")
    ttft_ax.margins(y=0.25)  # room for the legend above the tallest bar's label
    ttft_ax.legend(fontsize=8, loc="upper center", ncols=2)
    for ax, key, label, fmt in (
        (tok_ax, "tokens_per_s", "generated tokens/s", "{:.1f}"),
        (req_ax, "requests_per_s", "requests/s", "{:.2f}"),
    ):
        values = [run[key] for run in runs]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, [fmt.format(v) for v in values], fontsize=7)
        ax.set_ylabel(label)
    for ax in (ttft_ax, tok_ax, req_ax):
        ax.grid(True, axis="y", alpha=0.3)
    load = result["load"]
    errors = sum(r.get("errors", 0) for r in runs)
    fig.suptitle(
        f"bench serve: {load['clients']} concurrent streaming clients, {load['requests']} requests per run, "
        f"max_tokens {load['max_tokens']}"
        + (f", min_tokens {load['min_tokens']}" if load.get("min_tokens") else "")
        + (f", {errors} errors" if errors else "")
        + (f" ({result['model']})" if result.get("model") else ""),
        fontsize=9,
    )
    return _save(fig, path)


def _plot_sweep(ax, sweep: list[dict], colors: dict[int, str]) -> None:
    """TTFT p50 (solid) and p99 (dashed) against concurrent clients, one color per batch width."""
    for width in sorted({r["max_batch"] for r in sweep}):
        rows = sorted((r for r in sweep if r["max_batch"] == width), key=lambda r: r["clients"])
        clients = [r["clients"] for r in rows]
        color = colors.get(width, "#444444")
        for key, style in (("ttft_p50_s", "-"), ("ttft_p99_s", "--")):
            label = f"max batch {width}, {key[5:8]}"
            ax.plot(clients, [r[key] or 0.0 for r in rows], style, marker="o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted({r["clients"] for r in sweep}), [str(c) for c in sorted({r["clients"] for r in sweep})]
    )
    ax.set_xlabel("concurrent clients (turbo only)")
    ax.set_ylabel("TTFT (s)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def plot_any(result: dict, path: str | Path) -> Path:
    """The plot for whichever command's JSON `result` is (ttft, serve or eval)."""
    if "load" in result and "load_max_batch_1" in result:
        return plot_serve(result, path)
    if "modes" in result:
        return plot_eval(result, path)
    if result.get("rows") and "full_ttft_s" in result["rows"][0]:
        return plot_ttft(result, path)
    raise ValueError(
        "not the --json output of `bench ttft`, `bench serve` or `eval` (nothing else is plotted yet)"
    )
