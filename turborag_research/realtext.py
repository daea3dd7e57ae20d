"""Reading questions over real prose: the Python standard library's own docstrings and signatures.

The synthetic facts of synth.py teach a reader to find one invented value among look-alike passages, but
their passages are short, templated and their answers one to three words; a model trained only on them
learns to answer in one word and never sees real documentation.  This module builds multi-document QA from
text that is already on every machine that runs the project: the docstrings and `inspect.signature` of the
standard library.  Each passage reads like a retrieved documentation chunk ("textwrap.fill(text, width=70,
**kwargs)" on one line, then the docstring, whitespace-normalised and cut at a sentence boundary after about
150 words), and each answer is a span of its passage: a default value, the first sentence ("what does it
do"), a "Return ..." sentence, or a sentence naming the exception it raises.

Modules are split once, by a stable hash of their package name, into a training set and a held-out
evaluation set (about a fifth of the packages), so that an eval question never asks about text the model
was trained on.  Distractors come from the same split: first look-alikes from the entity's own module
(similar names, the same parameter), then same-named functions of other modules (`gzip.open` for
`bz2.open`), then anything else.  A distractor never states any accepted answer, so every answerable
question has exactly one passage that answers it.  An unanswerable question keeps those look-alikes but
drops the passage about its entity; its only accepted answer is the fixed abstention string.

The CPython language reference (`pydoc_data.topics`) is reserved for evaluation and the demo, so neither it
nor `pydoc` is ever read here; modules that print, open windows or browsers, or change the terminal on
import are never imported either (see `_EXCLUDED`).  The standard library is read in a fresh Python
process (`_load_entities`), so the records do not depend on what the calling process imported or patched,
and its own modules stay untouched.  Output is deterministic for a seed on a given Python build (docstrings
differ between Python versions).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import io
import json
import os
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from turborag.eval.metrics import ABSTAIN, normalize_answer
from turborag_research.text import SENTENCE_END, mentions, needles

# --- which modules -------------------------------------------------------------------------------------

# Top-level standard-library modules that are never imported or read.  Reasons: reserved for evaluation and
# the demo (pydoc_data, and pydoc, which is its reader); side effects on import (this prints, antigravity
# opens a browser, readline/rlcompleter change the terminal and its completer, idlelib/tkinter/turtle*
# want a display); test and tooling packages (lib2to3, ensurepip, encodings' codec internals); platform
# modules absent here (Windows); deprecated modules that warn on import and are removed in Python 3.13
# (PEP 594, distutils, imp, asyncore & co, sre_*), whose text would be wasted training; and the modules
# whose contents are read under another name (posixpath/genericpath as os.path, posix as os; ntpath and
# nturl2path duplicate them for Windows).
_EXCLUDED = frozenset(
    """
    pydoc pydoc_data
    this antigravity readline rlcompleter idlelib tkinter turtle turtledemo
    lib2to3 ensurepip encodings test
    msvcrt winreg winsound nt ntpath nturl2path msilib
    aifc audioop cgi cgitb chunk crypt imghdr mailcap nis nntplib ossaudiodev pipes sndhdr spwd sunau
    telnetlib uu xdrlib distutils imp asynchat asyncore smtpd sre_compile sre_constants sre_parse
    posixpath genericpath posix
    """.split()
)
# Public submodules worth reading: in many packages (email, urllib, xml, http, ...) the package itself
# holds little and the documented functions live one level down.
_SUBMODULES = (
    "collections.abc",
    "concurrent.futures",
    "ctypes.util",
    "curses.ascii",
    "curses.textpad",
    "dbm.dumb",
    "email.charset",
    "email.generator",
    "email.header",
    "email.headerregistry",
    "email.message",
    "email.parser",
    "email.policy",
    "email.utils",
    "html.parser",
    "http.client",
    "http.cookiejar",
    "http.cookies",
    "http.server",
    "importlib.abc",
    "importlib.machinery",
    "importlib.metadata",
    "importlib.resources",
    "importlib.util",
    "json.decoder",
    "json.encoder",
    "logging.config",
    "logging.handlers",
    "multiprocessing.managers",
    "multiprocessing.pool",
    "multiprocessing.shared_memory",
    "os.path",
    "unittest.mock",
    "urllib.error",
    "urllib.parse",
    "urllib.request",
    "urllib.robotparser",
    "wsgiref.headers",
    "wsgiref.simple_server",
    "wsgiref.util",
    "wsgiref.validate",
    "xml.dom.minidom",
    "xml.dom.pulldom",
    "xml.etree.ElementTree",
    "xml.sax",
    "xml.sax.handler",
    "xml.sax.saxutils",
    "xmlrpc.client",
    "xmlrpc.server",
)
# Where the objects of a module are documented under another module's name: os.path.join is
# posixpath.join, os.stat is posix.stat.
_ALIASES = {"posixpath": "os.path", "genericpath": "os.path", "posix": "os"}
# Modules so alike that they must fall on the same side of the split (cProfile copies profile's docs).
_GROUPS = {"cProfile": "profile"}
# About this fraction of the packages is held out for evaluation.
EVAL_FRACTION = 0.2


def _candidate_modules() -> tuple[str, ...]:
    """Every module name considered, sorted: public top-level stdlib modules and `_SUBMODULES`."""
    names = {n for n in sys.stdlib_module_names if not n.startswith("_") and n not in _EXCLUDED}
    return tuple(sorted(names | set(_SUBMODULES)))


def split_of(module: str) -> str:
    """ "train" or "eval" for a module name, from a SHA-256 of its package name; fixed forever.

    The hash is taken of the top-level package (so `email` and `email.utils` go together, and a question
    about one cannot be answered from memory of the other) after `_GROUPS` (cProfile goes with profile).
    A package is held out when the first 8 bytes of the hash, read as a fraction of 2**64, fall below
    `EVAL_FRACTION`; this does not depend on which other modules exist, so a new Python version adds
    modules to either side without moving any old one.
    """
    top = module.split(".", 1)[0]
    group = _GROUPS.get(top, top)
    digest = hashlib.sha256(group.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < EVAL_FRACTION else "train"


_SPLITS = ("train", "eval")
# The module names of each split (before import: a module that fails to import here simply yields nothing).
TRAIN_MODULES: tuple[str, ...] = tuple(m for m in _candidate_modules() if split_of(m) == "train")
EVAL_MODULES: tuple[str, ...] = tuple(m for m in _candidate_modules() if split_of(m) == "eval")


# --- entities and their passages -------------------------------------------------------------------------

# A passage body is cut after the sentence that reaches this many words (the first sentence always stays).
_PASSAGE_WORDS = 150
# Answer sentences of natural length: long enough to be a sentence, short enough to be generated whole.
_MIN_SENTENCE_WORDS = 4
_MAX_SENTENCE_WORDS = 30
_MAX_DEFAULT_REPR = 20
_MIN_DOC_WORDS = 6
_BOILERPLATE = re.compile(
    r"^(Initialize self|Create and return a new object|Return self|Implement |An enumeration)"
)
_RETURN = re.compile(r"^Returns?\b")
_RAISE = re.compile(r"\b(raise|raises|raised|raising)\b", re.IGNORECASE)
_EXCEPTION = re.compile(r"\b([A-Z][A-Za-z]*(?:Error|Exception|Warning|Exit|Interrupt)|StopIteration)\b")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_RULE = re.compile(r"^[-=~^*]{3,}$")
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")
# "... instead of raising StopIteration" names an exception that is *not* raised.
_NEGATED_RAISE = re.compile(
    r"\b(instead of|rather than|without|not|never|n't)[*_`]*\s+(be\s+)?rais", re.IGNORECASE
)


@dataclass(frozen=True)
class _Entity:
    """One documented function, class or method, its passage, and the questions its passage can answer."""

    module: str
    name: str  # qualified inside the module: "fill", "TextWrapper.wrap"
    passage: str
    params: frozenset[str]
    defaults: tuple[tuple[str, str], ...]  # (parameter, repr of its default) that make a clean question
    first: str | None  # the first sentence, if it is of answer length
    returns: str | None  # the first "Return ..." sentence of answer length
    raises: tuple[tuple[str, str, str], ...]  # (question tail, sentence, exception name)
    is_class: bool = False
    # lower-case name tokens ("text", "wrapper", "wrap"), for the look-alike ranking
    tokens: frozenset[str] = field(default_factory=frozenset)

    @property
    def display(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def bare(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _import(name: str):
    """Import a stdlib module quietly; None if it fails (missing C extension, platform module)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # any import failure just means "not on this machine"
            return None


def _owner(module_attr: str | None, modules: frozenset[str]) -> str | None:
    """The considered module an object is documented under, from its `__module__`.

    `_heapq` counts as heapq (C accelerators), posixpath as os.path (`_ALIASES`), `asyncio.tasks` as
    asyncio (the longest considered prefix).  Private submodules (`concurrent.futures._base`) resolve to
    their public parent.
    """
    if not module_attr:
        return None
    name = _ALIASES.get(module_attr, module_attr)
    if name.startswith("_") and name[1:] in modules:
        return name[1:]
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            return prefix
    return None


class _Shown:
    """A default as the header shows it: literals as written, functions and classes by name, anything
    else as "..." (object reprs carry memory addresses, and mutable defaults such as logging.shutdown's
    handler list show the state of the process, so neither would be the same in every run)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    @classmethod
    def of(cls, value: object) -> object:
        if value is inspect.Parameter.empty:
            return value
        if value is None or type(value) in (bool, int, float, complex, str, bytes):
            return cls(repr(value))
        if type(value) in (tuple, frozenset) and all(
            v is None or type(v) in (bool, int, float, str, bytes) for v in value
        ):
            return cls(repr(value))
        if type(value) in (list, dict, set) and not value:
            return cls(repr(value))
        if inspect.isroutine(value) or inspect.isclass(value):
            return cls(getattr(value, "__qualname__", None) or getattr(value, "__name__", "..."))
        return cls("...")


def _signature(obj, bare: str, doc: str, method: bool) -> tuple[str, inspect.Signature | None, str]:
    """(signature text, Signature or None, docstring without its signature lines).

    Many C functions start their docstring with their signature ("log(x, [base=math.e])"); those lines are
    removed, as the header shows the signature, and are its source when `inspect.signature` has none.
    """
    lines = doc.splitlines()
    sig_lines = []
    # "log(x, [base=math.e])", "S.split(sep=None)", "rangeobject.index(value) -> integer -- ..."
    signature_line = re.compile(rf"^(?:\w+\.)*{re.escape(bare)}\(")
    while lines and signature_line.match(lines[0]):
        sig_lines.append(lines.pop(0))
    text = "\n".join(lines)
    try:
        sig = inspect.signature(obj)
    except Exception:  # ValueError/TypeError, and C signatures that name constants absent here
        sig = None
    if sig is not None:
        params = list(sig.parameters.values())
        if method and params and params[0].name in ("self", "cls"):
            params = params[1:]
        sig = sig.replace(parameters=params)
        shown = sig.replace(parameters=[p.replace(default=_Shown.of(p.default)) for p in params])
        return str(shown), sig, text
    if sig_lines:
        return "(" + sig_lines[0].split("(", 1)[1].split(" -- ", 1)[0], None, text
    return "" if inspect.isclass(obj) else "(...)", None, text


def _paragraphs(doc: str) -> list[str]:
    """Whitespace-normalised prose paragraphs: doctest examples and RST rules dropped, and clinic-style
    parameter lists ("path\\n    Path to be examined") written as "path: Path to be examined"."""
    out = []
    for block in re.split(r"\n\s*\n", doc):
        if ">>>" in block:
            continue
        lines = [line for line in block.splitlines() if not _RULE.match(line.strip())]
        pieces = []
        for i, line in enumerate(lines):
            stripped = line.strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            indent = len(line) - len(line.lstrip())
            if _IDENT.match(stripped) and len(nxt) - len(nxt.lstrip()) > indent and nxt.strip():
                pieces.append(stripped + ":")
            else:
                pieces.append(stripped)
        text = " ".join(" ".join(pieces).split())
        if not text:
            continue
        if text[-1] not in ".!?:;":
            text += "."
        out.append(text)
    return out


def _sentences(paragraphs: Sequence[str]) -> list[str]:
    """Sentences, never across a paragraph break ("e.g. foo" does not split: the next word is lower-case)."""
    return [s for p in paragraphs for s in SENTENCE_END.split(p) if s]


def _truncate(sentences: Sequence[str]) -> list[str]:
    """The leading sentences up to about `_PASSAGE_WORDS` words: a chunk, not a whole page."""
    kept, words = [], 0
    for sentence in sentences:
        if kept and words + len(sentence.split()) > _PASSAGE_WORDS:
            break
        kept.append(sentence)
        words += len(sentence.split())
    return kept


def _answer_length(sentence: str | None) -> bool:
    return sentence is not None and _MIN_SENTENCE_WORDS <= len(sentence.split()) <= _MAX_SENTENCE_WORDS


def _clean_default(value: object) -> str | None:
    """The repr of a default if it makes a clean short answer, else None.

    Only None, booleans, numbers and strings; not long reprs, nor strings that answer normalisation would
    garble (',' normalises to nothing, '%Y-%m' to "ym", so a wrong prediction could score): a string
    default must be letters, digits, spaces and "-_." only.
    """
    if value is not None and type(value) not in (bool, int, float, str):
        return None
    text = repr(value)
    if len(text) > _MAX_DEFAULT_REPR or "\\" in text or (isinstance(value, str) and not _PLAIN.match(value)):
        return None
    return text if normalize_answer(text) else None


def _raise_questions(sentences: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    """(question tail, sentence, exception) for sentences that name one exception as raised.

    "Raises KeyError if the key is missing." and "If the key is missing, KeyError is raised." give the tail
    "if the key is missing"; when no condition can be cut out cleanly and the passage names a single raised
    exception, the tail is ", according to its documentation" (the question stays unambiguous).
    """
    found = []
    for sentence in sentences:
        if not _RAISE.search(sentence) or not _answer_length(sentence):
            continue
        names = set(_EXCEPTION.findall(sentence))
        if len(names) != 1 or _NEGATED_RAISE.search(sentence):
            continue
        (exc,) = names
        e = re.escape(exc)
        # The exception must be the thing raised, not merely mentioned near the verb.
        if not re.search(
            rf"\b(?i:rais)(es?|ed|ing):? (?:an? |the )?{e}\b|\b{e},? (?:is|are|will be) raised", sentence
        ):
            continue
        cond = None
        match = re.match(rf"^(?:Raises?:?|Will raise) (?:an? )?{e}:? (if|when|If|When) (.+)\.$", sentence)
        if match:
            cond = f"{match[1].lower()} {match[2]}"
        match = match or re.match(rf"^(If|When) (.+?), (?:an? )?{e} (?:is|will be) raised\.$", sentence)
        match = match or re.match(rf"^(If|When) (.+?), (?:then )?(?:it )?raises? (?:an? )?{e}\.$", sentence)
        if match and cond is None:
            cond = f"{match[1].lower()} {match[2]}"
        found.append((cond, sentence, exc))
    # A condition with a comma was cut at the wrong place ("if no value is defined, default is returned").
    out = [
        (" " + c.replace("``", "`"), s, exc)
        for c, s, exc in found
        if c and "," not in c and len(c.split()) <= 15
    ]
    if not out and len({exc for _, _, exc in found}) == 1:
        _, sentence, exc = found[0]
        out.append((", according to its documentation", sentence, exc))
    return tuple(out)


def _tokens(name: str) -> frozenset[str]:
    """ "TextWrapper.wrap" -> {"text", "wrapper", "wrap"}: words of snake_case and CamelCase names."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace(".", " ")
    return frozenset(spaced.lower().split())


def _entity(module: str, name: str, obj, method: bool = False) -> _Entity | None:
    """Build an entity from a function, class or method object; None if it has no usable docstring."""
    raw = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
    if not raw or _BOILERPLATE.match(raw.strip()):
        return None
    bare = name.rsplit(".", 1)[-1]
    is_class = inspect.isclass(obj)
    sig_text, sig, doc = _signature(obj, bare, inspect.cleandoc(raw), method)
    sentences = _truncate(_sentences(_paragraphs(doc)))
    body = " ".join(sentences)
    if len(body.split()) < _MIN_DOC_WORDS:
        return None
    header = f"{'class ' if is_class else ''}{module}.{name}{sig_text}"
    defaults = []
    if sig is not None:
        for p in sig.parameters.values():
            if p.default is not inspect.Parameter.empty and (text := _clean_default(p.default)):
                defaults.append((p.name, text))
    returns = next((s for s in sentences if _RETURN.match(s)), None)
    return _Entity(
        module=module,
        name=name,
        passage=f"{header}\n{body}",
        params=frozenset(sig.parameters) if sig is not None else frozenset(),
        defaults=tuple(defaults),
        first=sentences[0] if _answer_length(sentences[0]) else None,
        returns=returns if _answer_length(returns) else None,
        raises=_raise_questions(sentences),
        is_class=is_class,
        tokens=_tokens(name),
    )


def _documented(obj) -> bool:
    return inspect.isroutine(obj) or inspect.isclass(obj)


def _from_stdlib(method) -> bool:
    """False for methods that another library patched onto a stdlib class (transformers adds
    `logging.Logger.warning_once`): they exist only in processes that imported it."""
    home = getattr(method, "__module__", None)
    return not isinstance(home, str) or home.split(".")[0].lstrip("_") in sys.stdlib_module_names


def _members(module: str, mod, modules: frozenset[str], seen: set[int]) -> list[_Entity]:
    """The module's own public functions and classes, and the public methods of those classes.

    Re-exports are skipped (json.JSONDecodeError belongs to json.decoder), as are objects already claimed
    by an earlier module (`seen`, by identity), so each object is one entity in one split.  The names read
    are `__all__` where the module has one: a module's globals can depend on what the process did before
    (concurrent.futures caches ThreadPoolExecutor there on first use), and the records must not.
    """
    public = getattr(mod, "__all__", None)
    if not isinstance(public, (list, tuple)) or not all(isinstance(name, str) for name in public):
        public = list(vars(mod))
    members = {}
    for attr in sorted(set(public)):
        try:
            members[attr] = getattr(mod, attr)
        except AttributeError:  # listed in __all__ but absent on this platform
            continue
    out = []
    by_id: dict[int, list[str]] = {}
    for attr, obj in members.items():
        if attr.startswith("_") or not _documented(obj):
            continue
        home = getattr(obj, "__module__", None)
        owner = _owner(home, modules)
        private_home = home and any(part.startswith("_") for part in home.split("."))
        if owner != module and not (private_home and owner and module.startswith(owner + ".")):
            continue
        by_id.setdefault(id(obj), []).append(attr)
    for attr, obj in members.items():
        names = by_id.get(id(obj))
        if not names or id(obj) in seen:
            continue
        # Of aliases (currentThread / current_thread) keep the object's own name.
        own_name = getattr(obj, "__name__", None)
        if attr != (own_name if own_name in names else names[0]):
            continue
        seen.add(id(obj))
        entity = _entity(module, attr, obj)
        if entity:
            out.append(entity)
        if inspect.isclass(obj):
            for mname in sorted(vars(obj)):
                member = vars(obj)[mname]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if mname.startswith("_") or not inspect.isroutine(member) or id(member) in seen:
                    continue
                if not _from_stdlib(member):
                    continue
                seen.add(id(member))
                entity = _entity(module, f"{attr}.{mname}", member, method=True)
                if entity:
                    out.append(entity)
    return out


@dataclass(frozen=True)
class _Split:
    """The entities of one split, with the indexes that find look-alikes quickly."""

    entities: tuple[_Entity, ...]
    by_module: dict[str, tuple[int, ...]]
    by_bare: dict[str, tuple[int, ...]]
    by_param: dict[str, tuple[int, ...]]


# Modules that must never be imported while reading the standard library; the worker checks.
_NEVER_IMPORTED = frozenset({"pydoc_data", "this", "antigravity", "tkinter", "turtle", "idlelib", "lib2to3"})
_WORKER_MARK = "turborag-realtext-inventory:"


def _read_stdlib() -> dict[str, list[_Entity]]:
    """Import the candidate modules and collect their entities by split (the worker's job, ~1 s)."""
    modules = frozenset(_candidate_modules())
    entities: dict[str, list[_Entity]] = {s: [] for s in _SPLITS}
    seen: set[int] = set()
    for name in sorted(modules):
        mod = _import(name)
        if mod is not None:
            with warnings.catch_warnings():  # reading typing.io & co warns that they are deprecated
                warnings.simplefilter("ignore")
                entities[split_of(name)].extend(_members(name, mod, modules, seen))
    return entities


def _worker() -> None:
    """Entry point of the inventory subprocess: read the stdlib, print the entities as one JSON line.

    It fails instead of printing if a reserved or side-effect module got imported along the way.
    """
    entities = _read_stdlib()
    bad = sorted(m for m in sys.modules if m.split(".")[0] in _NEVER_IMPORTED)
    if bad:
        raise SystemExit(f"reading the standard library imported {', '.join(bad)}")
    rows = {
        split: [{**vars(e), "params": sorted(e.params), "tokens": sorted(e.tokens)} for e in items]
        for split, items in entities.items()
    }
    sys.stdout.write("\n" + _WORKER_MARK + json.dumps(rows) + "\n")


def _load_entities() -> dict[str, list[_Entity]]:
    """The entities, read in a fresh Python process.

    Reading them here would make the records depend on what this process imported before: libraries
    patch the standard library (torch replaces inspect.getfile, transformers adds methods to
    logging.Logger) and lazy module attributes appear on first use.  A fresh process (with a fixed hash
    seed) sees the same standard library every time, and importing ~200 modules does not touch this one.
    """
    root = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); from turborag_research.realtext import _worker; _worker()"
    )
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith(_WORKER_MARK)), None)
    if proc.returncode or line is None:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"reading the standard library's docstrings failed: {tail or 'no output'}")
    rows = json.loads(line[len(_WORKER_MARK) :])
    return {
        split: [
            _Entity(
                **{
                    **row,
                    "params": frozenset(row["params"]),
                    "tokens": frozenset(row["tokens"]),
                    "defaults": tuple(tuple(d) for d in row["defaults"]),
                    "raises": tuple(tuple(r) for r in row["raises"]),
                }
            )
            for row in items
        ]
        for split, items in rows.items()
    }


@cache
def inventory() -> dict[str, _Split]:
    """The entities of each split with their look-alike indexes, built once per process (about a second)."""
    out = {}
    for split, items in _load_entities().items():
        by_module: dict[str, list[int]] = {}
        by_bare: dict[str, list[int]] = {}
        by_param: dict[str, list[int]] = {}
        for i, e in enumerate(items):
            by_module.setdefault(e.module, []).append(i)
            by_bare.setdefault(e.bare, []).append(i)
            for p in e.params:
                by_param.setdefault(p, []).append(i)

        def freeze(index: dict[str, list[int]]) -> dict[str, tuple[int, ...]]:
            return {k: tuple(v) for k, v in index.items()}

        out[split] = _Split(tuple(items), freeze(by_module), freeze(by_bare), freeze(by_param))
    return out


def split_stats() -> dict[str, dict[str, int]]:
    """Per split: candidate modules, modules that yielded passages, entities, and questions of each kind."""
    stats = {}
    for split, data in inventory().items():
        stats[split] = {
            "candidate_modules": len(TRAIN_MODULES if split == "train" else EVAL_MODULES),
            "modules": len(data.by_module),
            "entities": len(data.entities),
            **{f"{kind}_questions": len(_eligible(split, kind)) for kind in KINDS},
        }
    return stats


# --- questions -------------------------------------------------------------------------------------------

KINDS: tuple[str, ...] = ("default", "does", "returns", "raises")
# How often each kind is asked (renormalised over the kinds a split has): defaults are the exact-value case
# that the cache error hurts most; the sentence kinds teach natural-length answers.
_KIND_WEIGHTS = {"default": 0.35, "does": 0.3, "returns": 0.2, "raises": 0.15}
_DEFAULT_WEIGHTS = {"None": 0.25, "True": 0.5, "False": 0.5}
# Candidate distractors examined per record before giving up (a split has thousands of passages).
_MAX_TRIES = 4000


@cache
def _eligible(split: str, kind: str) -> tuple[int, ...]:
    """Indexes of the entities of a split that can be asked a question of this kind."""
    entities = inventory()[split].entities
    attr = {"default": "defaults", "does": "first", "returns": "returns", "raises": "raises"}[kind]
    return tuple(i for i, e in enumerate(entities) if getattr(e, attr))


@dataclass(frozen=True)
class _Question:
    question: str
    answers: tuple[str, ...]  # natural-length target first, then short spans the scorer accepts
    param: str | None = None  # the parameter asked about (default questions), for look-alike ranking


def _question(rng: random.Random, entity: _Entity, kind: str, default: int = 0) -> _Question:
    """A question of this kind about the entity (`default` picks the parameter of a default question);
    every answer is a span of its passage but the first of a default question, which is the sentence that
    states it ("The default value of `width` is 70.")."""
    name = entity.display
    if kind == "default":
        param, value = entity.defaults[default]
        return _Question(
            f"What is the default value of the `{param}` parameter of `{name}`?",
            (f"The default value of `{param}` is {value}.", value),
            param,
        )
    if kind == "does":
        asked = f"What is `{name}`?" if entity.is_class else f"What does `{name}` do?"
        return _Question(asked, (entity.first,))
    if kind == "returns":
        return _Question(f"What does `{name}` return?", (entity.returns,))
    tail, sentence, exc = rng.choice(entity.raises)
    verb = "can instances of" if entity.is_class else "does"
    return _Question(f"Which exception {verb} `{name}` raise{tail}?", (sentence, exc))


@cache
def _default_pool(split: str) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """(entity index, default index) pairs of a split with cumulative weights for `random.choices`.

    Over half of all stdlib defaults are None and a fifth are booleans; asked uniformly, a reader could
    score by guessing "None".  They are kept (reading a header is the skill) but asked less often.
    """
    pairs, cumulative, total = [], [], 0.0
    for i in _eligible(split, "default"):
        for j, (_, value) in enumerate(inventory()[split].entities[i].defaults):
            total += _DEFAULT_WEIGHTS.get(value, 1.0)
            pairs.append((i, j))
            cumulative.append(total)
    return tuple(pairs), tuple(cumulative)


def _pick(rng: random.Random, split: str) -> tuple[_Entity, str, int]:
    """An entity, a question kind and (default questions) which default: the kind first, by
    `_KIND_WEIGHTS`, then an entity that has it."""
    kinds = [k for k in KINDS if _eligible(split, k)]
    kind = rng.choices(kinds, weights=[_KIND_WEIGHTS[k] for k in kinds])[0]
    entities = inventory()[split].entities
    if kind == "default":
        pairs, cumulative = _default_pool(split)
        i, j = rng.choices(pairs, cum_weights=cumulative)[0]
        return entities[i], kind, j
    return entities[rng.choice(_eligible(split, kind))], kind, 0


def _lookalike_order(rng: random.Random, data: _Split, entity: _Entity, param: str | None) -> list[int]:
    """Candidate distractor indexes, most confusable first.

    Own module first, ranked by shared name words and a shared asked-about parameter (with a random
    tie-break), then same-named entities of other modules, then entities of other modules that take the
    same parameter; the caller falls back to random entities of the split.
    """
    own = [i for i in data.by_module[entity.module] if data.entities[i] is not entity]

    def score(i: int) -> float:
        other = data.entities[i]
        shared = len(entity.tokens & other.tokens) / max(len(entity.tokens | other.tokens), 1)
        return 2.0 * (param in other.params) + shared + (other.is_class == entity.is_class) * 0.25

    jitter = {i: rng.random() for i in own}
    own.sort(key=lambda i: (-score(i), jitter[i]))
    same_name = [i for i in data.by_bare.get(entity.bare, ()) if data.entities[i].module != entity.module]
    same_param = [i for i in data.by_param.get(param or "", ()) if data.entities[i].module != entity.module]
    rng.shuffle(same_name)
    rng.shuffle(same_param)
    return own + same_name + same_param[:64]


def _entity_needles(entity: _Entity) -> list[tuple[str, str]]:
    """Dotted names that would make a passage talk about the entity: "textwrap.TextWrapper.wrap",
    "TextWrapper.wrap" (a bare "open(" is not one: bz2.open's passage is the look-alike to keep)."""
    parts = entity.display.split(".")
    names = {".".join(parts[i:]) for i in range(len(parts) - 1)}
    return [(name.lower(), "") for name in sorted(names)]


def _refers_to(passage: str, entity: _Entity) -> bool:
    """True if a passage of the entity's own module refers to it by its bare name ("... see fill()")."""
    if passage.split(".", 1)[0].removeprefix("class ") != entity.module.split(".")[0]:
        return False
    body = passage.split("\n", 1)[-1]
    return re.search(rf"\b{re.escape(entity.bare)}\(", body) is not None


def _distractors(
    rng: random.Random, split: str, entity: _Entity, question: _Question, k: int, unanswerable: bool
) -> list[str]:
    """k passages that state none of the accepted answers (and, for an unanswerable question, never
    mention the entity), look-alikes first; RuntimeError if the split cannot supply them."""
    data = inventory()[split]
    forbidden = needles(question.answers)
    if unanswerable:
        forbidden += _entity_needles(entity)
    out: list[str] = []
    used = {entity.passage}
    order = _lookalike_order(rng, data, entity, question.param)
    tries = 0
    while len(out) < k and tries < _MAX_TRIES:
        i = order[tries] if tries < len(order) else rng.randrange(len(data.entities))
        tries += 1
        passage = data.entities[i].passage
        if passage in used or mentions(passage, forbidden):
            continue
        if unanswerable and _refers_to(passage, entity):
            continue
        used.add(passage)
        out.append(passage)
    if len(out) < k:
        raise RuntimeError(f"could not find {k} distractors for {entity.display} in {_MAX_TRIES} tries")
    return out


def _record(rng: random.Random, split: str, contexts: int, answerable: bool) -> dict:
    """One record: an entity's question with its passage among contexts - 1 distractors, or (unanswerable)
    the same kind of question over `contexts` look-alike passages that do not include the entity's."""
    entity, kind, default = _pick(rng, split)
    question = _question(rng, entity, kind, default)
    if not answerable:
        passages = _distractors(rng, split, entity, question, contexts, unanswerable=True)
        rng.shuffle(passages)
        return {
            "question": question.question,
            "answers": [ABSTAIN],
            "contexts": passages,
            "source": f"stdlib:{entity.module}",
            "kind": kind,
            "entity": entity.display,
            "answer_index": None,
            "answerable": False,
        }
    distractors = _distractors(rng, split, entity, question, contexts - 1, unanswerable=False)
    rng.shuffle(distractors)
    position = rng.randrange(contexts)
    return {
        "question": question.question,
        "answers": list(question.answers),
        "contexts": distractors[:position] + [entity.passage] + distractors[position:],
        "source": f"stdlib:{entity.module}",
        "kind": kind,
        "entity": entity.display,
        "answer_index": position,
        "answerable": True,
    }


def check_request(n: int, contexts: int, split: str, unanswerable: float) -> None:
    """ValueError for a record request no generator over the stdlib splits can fill."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if contexts < 1:
        raise ValueError(f"contexts must be at least 1, got {contexts}")
    if split not in _SPLITS:
        raise ValueError(f"split must be train or eval, got {split!r}")
    if not 0.0 <= unanswerable <= 1.0:
        raise ValueError(f"unanswerable must be a fraction in 0..1, got {unanswerable}")


def generate_realtext(
    n: int, contexts: int, seed: int = 0, split: str = "train", unanswerable: float = 0.0
) -> list[dict]:
    """n stdlib-documentation QA records with `contexts` passages each, deterministic for a seed.

    `split` chooses the modules ("train", or the held-out "eval"); a fraction `unanswerable` of the records
    (exactly round(n * unanswerable), at random positions) ask about an entity whose passage is left out,
    with the abstention string as their only answer.  Records: question, answers (natural-length target
    first), contexts, source ("stdlib:<module>"), kind (one of KINDS), entity, answer_index (None when
    unanswerable) and answerable.
    """
    check_request(n, contexts, split, unanswerable)
    rng = random.Random(seed)
    missing = set(rng.sample(range(n), round(n * unanswerable)))
    return [_record(rng, split, contexts, answerable=i not in missing) for i in range(n)]
