"""The answering modes: one table that the engine dispatches on and the server, the plots and the commands
read. Importable without torch.

A mode says what is prefilled at query time and how the chunk caches are placed:

| mode | context | positions | recompute | attention after the context |
|---|---|---|---|---|
| `full` | prefilled with the question (standard RAG) | contiguous | - | plain |
| `turbo` | chunk caches from the store | reordered: rotated to be contiguous | - | plain |
| `turbo-composite` | chunk caches | composite: each keeps its own offsets | - | plain |
| `turbo-epic` | chunk caches | reordered | the first k tokens of each chunk | plain |
| `turbo-blend` | chunk caches | reordered | the `ratio` most-deviating tokens | plain |
| `turbo-ape` | chunk caches | reordered | - | APE's temperature and scaling |
| `turbo-ape-epic` | chunk caches | reordered | the first k tokens of each chunk | APE's |

`auto` is not a mode of its own: the engine resolves it to one of these (`Engine.resolve_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    positions: str | None  # how chunk caches are placed: "reordered", "composite"; None: no caches (full)
    recompute: str | None = None  # "epic" or "blend": context tokens refreshed after assembly (recompute.py)
    ape: bool = False  # APE's attention for every token after the context (ape.py)
    color: str = "#8c8c8c"  # the same in every plot

    @property
    def reuses_caches(self) -> bool:
        return self.positions is not None


AUTO = "auto"
TABLE: tuple[Mode, ...] = (
    Mode("full", None, color="#4c72b0"),
    Mode("turbo", "reordered", color="#dd8452"),
    Mode("turbo-composite", "composite", color="#55a868"),
    Mode("turbo-epic", "reordered", recompute="epic", color="#c44e52"),
    Mode("turbo-blend", "reordered", recompute="blend", color="#8172b3"),
    Mode("turbo-ape", "reordered", ape=True, color="#64b5cd"),
    Mode("turbo-ape-epic", "reordered", recompute="epic", ape=True, color="#da8bc3"),
)
BY_NAME = {m.name: m for m in TABLE}
MODES = (AUTO, *BY_NAME)  # what `--mode` and the server's `mode` take
COLORS = {**{m.name: m.color for m in TABLE}, AUTO: "#937860", "floor": "#8c8c8c"}


def check_mode(name: str) -> str:
    """`name` if it is a mode (or `auto`), else ValueError listing the modes."""
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}: use one of {', '.join(MODES)}")
    return name


def get(name: str) -> Mode:
    """The mode called `name` (`auto` must be resolved first: Engine.resolve_mode)."""
    if name not in BY_NAME:
        raise ValueError(f"unknown mode {name!r}: use one of {', '.join(BY_NAME)}")
    return BY_NAME[name]
