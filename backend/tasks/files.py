"""Task files and bring-your-own prompt files: parsing and validation.

Accepted task formats (chosen by extension):

- ``.json``: a list of ``{"input", "output"}`` objects (the function-vectors format), or the built-in
  object format ``{"name", "kind", "description", "template", "labels", "models", "examples": [...]}``
  (every key but ``examples`` optional; ``labels`` only for classification, as raw words).
- ``.jsonl`` / ``.ndjson``: one ``{"input", "output"}`` object per line (blank lines are skipped).
- ``.csv`` / ``.tsv``: a header row naming an ``input`` and an ``output`` column (other columns ignored).

Inputs and outputs are stripped of surrounding whitespace; the template puts the space back in front of
the answer. An exact duplicate record is dropped; the same input with two different outputs is an error.
Every error is a `TaskError` whose message names the file and, where it applies, the 1-based record
number (for JSONL/CSV also the line).

Kind inference (`infer_kind`): a task is *classification* when its outputs take between 2 and
`MAX_CLASSES` (10) distinct values and there are at least `MIN_PER_CLASS` (2) examples per distinct
value on average (n_examples >= 2 * n_distinct); otherwise it is *generation*. So sentiment (2 labels)
and AG News (4) are classification; antonyms, capitals, translations are generation; a 4-row file of 4
different answers stays generation. ``kind=`` overrides the rule.

The parsing functions (`parse_task_text`, `parse_prompts_text`) are pure; `load_task_file` and
`load_prompts_file` add the file reading (size limit, UTF-8 decoding) around them.

JSON nested deeper than `MAX_DEPTH` (64) levels is refused with a TaskError naming the file, the record
and the line ("nested too deeply"), never a RecursionError: the parser's own recursion guard is caught,
and parsed values are measured without recursing. Error messages echo at most ~200 characters of any
value from the file (`clip`).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from ..text import clip
from .base import Kind, Prompt, Task, TaskError, Template

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
"""Files larger than this are refused; override per call (`max_bytes=`) or with HEADLENS_MAX_FILE_MB."""

MAX_CLASSES = 10
MIN_PER_CLASS = 2
TASK_EXTENSIONS = (".json", ".jsonl", ".ndjson", ".csv", ".tsv")
PROMPT_EXTENSIONS = (".jsonl", ".ndjson", ".json")
_OBJECT_KEYS = {"name", "kind", "description", "template", "labels", "models", "examples", "version"}
MAX_DEPTH = 64
"""JSON nesting deeper than this (a task record needs 3 levels) is refused."""


# -- kind inference -----------------------------------------------------------------------------------
def infer_kind(outputs: list[str]) -> Kind:
    """'classification' when 2 <= distinct outputs <= MAX_CLASSES and len(outputs) >= MIN_PER_CLASS * distinct."""
    distinct = len(set(outputs))
    if 2 <= distinct <= MAX_CLASSES and len(outputs) >= MIN_PER_CLASS * distinct:
        return "classification"
    return "generation"


# -- reading ------------------------------------------------------------------------------------------
def max_file_bytes() -> int:
    """The size limit in bytes: HEADLENS_MAX_FILE_MB when set, else DEFAULT_MAX_BYTES."""
    env = os.environ.get("HEADLENS_MAX_FILE_MB")
    if env:
        try:
            return int(float(env) * 1024 * 1024)
        except ValueError:
            raise TaskError(f"HEADLENS_MAX_FILE_MB must be a number of megabytes, not {env!r}") from None
    return DEFAULT_MAX_BYTES


def _read_text(path: Path, max_bytes: int | None) -> str:
    limit = max_file_bytes() if max_bytes is None else max_bytes
    if not path.exists():
        raise TaskError(f"{path}: no such file")
    if not path.is_file():
        raise TaskError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise TaskError(f"{path}: file is {size / 2**20:.1f} MB, over the {limit / 2**20:.1f} MB limit "
                        f"(raise it with max_bytes= or HEADLENS_MAX_FILE_MB)")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None


def _format_of(source: str, allowed: tuple[str, ...]) -> str:
    suffix = Path(source).suffix.lower()
    if suffix not in allowed:
        raise TaskError(f"{source}: unknown extension {suffix or '(none)'!r}; expected one of {', '.join(allowed)}")
    return suffix


# -- records ------------------------------------------------------------------------------------------
def _where(source: str, n: int, line: int | None = None) -> str:
    return f"{source}: record {n}" + (f" (line {line})" if line is not None else "")


def _text_field(rec: dict, key: str, where: str, strip: bool = True) -> str:
    if key not in rec:
        raise TaskError(f"{where}: missing key {key!r} (keys present: {_keys(rec)})")
    value = rec[key]
    if not isinstance(value, str):
        raise TaskError(f"{where}: {key!r} must be a string, not {type(value).__name__} ({value!r:.60})")
    if not value.strip():
        raise TaskError(f"{where}: {key!r} is empty")
    return value.strip() if strip else value


def _keys(rec: dict) -> str:
    return clip(sorted(map(str, rec)) or "none", 200)


# -- nesting depth ------------------------------------------------------------------------------------
def _too_deep(where: str) -> TaskError:
    return TaskError(f"{where}: nested too deeply (JSON nesting over {MAX_DEPTH} levels)")


def _depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion; stops counting past `limit`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            d += 1
            if d > deepest:
                deepest = d
                if d > limit:
                    return d
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (list, dict)))
    return deepest


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]|,')


def _deep_spot(text: str) -> tuple[int | None, int, int]:
    """(record number, line, column) where `text` first nests deeper than MAX_DEPTH: a bracket scan that
    skips strings. The record is the element of the outermost list. Used only to report the error."""
    stack: list[list] = []  # [opener, element index]
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in "[{":
            stack.append([tok, 0])
            if len(stack) > MAX_DEPTH:
                lists = [e for e in stack if e[0] == "["]
                line = text.count("\n", 0, m.start()) + 1
                col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
                return (lists[0][1] + 1 if lists else None), line, col
        elif tok in "]}":
            if stack:
                stack.pop()
        elif tok == "," and stack:
            stack[-1][1] += 1
    return None, 1, 1


def _loads(text: str, where: str) -> Any:
    """json.loads, with nesting over MAX_DEPTH refused (TaskError) instead of a RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where) from None
    if _depth(value) > MAX_DEPTH:
        raise _too_deep(where)
    return value


def _json_lines(text: str, source: str) -> Iterator[tuple[int, int, Any]]:
    """(record number, line number, parsed value) for each non-blank line of a JSONL text."""
    n = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        n += 1
        try:
            yield n, lineno, _loads(line, _where(source, n, lineno))
        except json.JSONDecodeError as e:
            raise TaskError(f"{_where(source, n, lineno)}: not valid JSON ({e.msg} at column {e.colno})") from None


def _load_json(text: str, source: str) -> Any:
    if not text.strip():
        raise TaskError(f"{source}: empty file")
    try:
        value = json.loads(text)
        deep = _depth(value) > MAX_DEPTH
    except json.JSONDecodeError as e:
        hint = "; one object per line is JSONL: name the file .jsonl" if e.msg == "Extra data" else ""
        raise TaskError(f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}){hint}") from None
    except RecursionError:
        deep = True
    if deep:
        record, line, col = _deep_spot(text)
        where = f"{source}: record {record} (line {line})" if record else f"{source}: line {line}, column {col}"
        raise _too_deep(where)
    return value


def _csv_records(text: str, source: str, delimiter: str) -> Iterator[tuple[int, int, dict]]:
    if not text.strip():
        raise TaskError(f"{source}: empty file")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
        header = [h.strip() for h in header]
        dupes = sorted(h for h, c in Counter(header).items() if c > 1)
        if dupes:
            raise TaskError(f"{source}: duplicated header column(s) {clip(dupes)} on line 1")
        missing = [k for k in ("input", "output") if k not in header]
        if missing:
            raise TaskError(f"{source}: header (line 1) lacks column(s) {missing}; it has {clip(header)}")
        n = 0
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            n += 1
            if len(row) != len(header):
                raise TaskError(f"{_where(source, n, reader.line_num)}: {len(row)} fields, but the header has "
                                f"{len(header)}")
            yield n, reader.line_num, dict(zip(header, row))
    except csv.Error as e:
        raise TaskError(f"{source}: CSV error on line {reader.line_num}: {clip(e)}") from None


def _examples(records: Iterator[tuple[int, int | None, Any]], source: str,
              labels: list[str] | None = None) -> list[tuple[str, str]]:
    """Validate `{"input","output"}` records; drop exact duplicates, refuse conflicting ones.

    `labels`, when given, is the declared label set every output must belong to.
    """
    seen: dict[str, tuple[str, int]] = {}
    out: list[tuple[str, str]] = []
    for n, line, rec in records:
        where = _where(source, n, line)
        if not isinstance(rec, dict):
            raise TaskError(f"{where}: expected an object with 'input' and 'output', got {type(rec).__name__}")
        x, y = _text_field(rec, "input", where), _text_field(rec, "output", where)
        if labels is not None and y not in labels:
            raise TaskError(f"{where}: output {clip(y, 80)!r} is not among the declared labels {clip(labels)}")
        if x in seen:
            y0, n0 = seen[x]
            if y0 != y:
                raise TaskError(f"{where}: input {x!r:.80} already appears in record {n0} with a different output "
                                f"({clip(y0, 80)!r} vs {clip(y, 80)!r})")
            continue
        seen[x] = (y, n)
        out.append((x, y))
    if not out:
        raise TaskError(f"{source}: no examples")
    return out


def _list_records(items: Any, source: str) -> Iterator[tuple[int, None, Any]]:
    if not isinstance(items, list):
        raise TaskError(f"{source}: expected a JSON list of {{\"input\", \"output\"}} objects (or an object with "
                        f"\"examples\"), got {type(items).__name__}")
    return ((i, None, rec) for i, rec in enumerate(items, 1))


# -- tasks --------------------------------------------------------------------------------------------
def parse_task_text(text: str, source: str, kind: Kind | None = None, name: str | None = None,
                    template: str | Template | None = None) -> Task:
    """Parse the text of a task file; `source` is its path (it picks the format and names the file in errors)."""
    fmt = _format_of(source, TASK_EXTENSIONS)
    meta: dict[str, Any] = {}
    if fmt in (".jsonl", ".ndjson"):
        if not text.strip():
            raise TaskError(f"{source}: empty file")
        examples = _examples(_json_lines(text, source), source)
    elif fmt in (".csv", ".tsv"):
        examples = _examples(_csv_records(text, source, "," if fmt == ".csv" else "\t"), source)
    else:
        data = _load_json(text, source)
        if isinstance(data, dict):
            meta = _task_object_meta(data, source)
            data = data["examples"]
        examples = _examples(_list_records(data, source), source, meta.get("labels"))

    if kind is not None and kind not in ("classification", "generation"):
        raise TaskError(f"kind must be 'classification' or 'generation', not {clip(kind, 60)!r}")
    kind = kind or meta.get("kind") or infer_kind([y for _, y in examples])
    labels = tuple(meta["labels"]) if kind == "classification" and meta.get("labels") is not None else None
    tmpl = template if isinstance(template, Template) else Template(template or meta.get("template") or Template().text)
    return Task(name=name or meta.get("name") or Path(source).stem, kind=kind, examples=examples, template=tmpl,
                labels=labels, description=meta.get("description", ""), models=meta.get("models", "any"),
                version=meta.get("version", ""))


def _task_object_meta(data: dict, source: str) -> dict[str, Any]:
    """Check the built-in object format's fields (all but `examples` optional)."""
    if "examples" not in data:
        raise TaskError(f"{source}: a task object needs an \"examples\" list (keys present: {_keys(data)})")
    if not isinstance(data["examples"], list):
        raise TaskError(f"{source}: \"examples\" must be a list, not {type(data['examples']).__name__}")
    unknown = sorted(set(data) - _OBJECT_KEYS)
    if unknown:
        raise TaskError(f"{source}: unknown key(s) {clip(unknown)}; allowed: {sorted(_OBJECT_KEYS)}")
    for key in ("name", "kind", "description", "template", "models", "version"):
        if key in data and not isinstance(data[key], str):
            raise TaskError(f"{source}: {key!r} must be a string, not {type(data[key]).__name__}")
    if data.get("kind") not in (None, "classification", "generation"):
        raise TaskError(f"{source}: kind must be 'classification' or 'generation', not {clip(data['kind'], 60)!r}")
    labels = data.get("labels")
    if labels is not None:
        if not isinstance(labels, list) or not all(isinstance(w, str) and w.strip() for w in labels):
            raise TaskError(f"{source}: 'labels' must be a list of non-empty strings")
        labels = [w.strip() for w in labels]
        dupes = sorted(w for w, c in Counter(labels).items() if c > 1)
        if dupes:
            raise TaskError(f"{source}: duplicated label(s) {clip(dupes)}")
        if data.get("kind") == "generation":
            raise TaskError(f"{source}: 'labels' given for a generation task")
    return {**data, "labels": labels}


def load_task_file(path: str | os.PathLike, kind: Kind | None = None, name: str | None = None,
                   template: str | Template | None = None, max_bytes: int | None = None) -> Task:
    """Load a task from a JSON / JSONL / CSV / TSV file (see the module docstring for the formats).

    `kind` overrides the inferred (or declared) kind; `name` defaults to the file's declared name, else its
    stem; `template` overrides the file's template (default `Q: {input}\\nA: {output}\\n\\n`).
    """
    p = Path(path)
    return parse_task_text(_read_text(p, max_bytes), str(p), kind=kind, name=name, template=template)


# -- bring-your-own prompts ---------------------------------------------------------------------------
def _prompt(rec: Any, where: str) -> Prompt:
    if not isinstance(rec, dict):
        raise TaskError(f"{where}: expected an object with 'prompt', 'label' and 'labels', got {type(rec).__name__}")
    text = _text_field(rec, "prompt", where, strip=False)
    label = _text_field(rec, "label", where, strip=False)
    if "labels" not in rec:
        raise TaskError(f"{where}: missing key 'labels' (keys present: {_keys(rec)})")
    labels = rec["labels"]
    if not isinstance(labels, list):
        raise TaskError(f"{where}: 'labels' must be a list of strings, not {type(labels).__name__}")
    for j, w in enumerate(labels, 1):
        if not isinstance(w, str):
            raise TaskError(f"{where}: labels[{j}] must be a string, not {type(w).__name__} ({w!r:.60})")
        if not w.strip():
            raise TaskError(f"{where}: labels[{j}] is empty")
    dupes = sorted(w for w, c in Counter(labels).items() if c > 1)
    if dupes:
        raise TaskError(f"{where}: duplicated label(s) {clip(dupes)}")
    if len(labels) < 2:
        raise TaskError(f"{where}: 'labels' needs at least 2 candidates (the gold label and another), has {len(labels)}")
    if label not in labels:
        near = [w for w in labels if w.strip() == label.strip()]
        hint = f"; {near[0]!r} differs from it only in whitespace" if near else ""
        raise TaskError(f"{where}: label {clip(label, 80)!r} is not among labels {clip(labels)}{hint}")
    query = rec.get("query", "")
    if not isinstance(query, str):
        raise TaskError(f"{where}: 'query' must be a string, not {type(query).__name__}")
    shots = rec.get("n_shots", 0)
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
        raise TaskError(f"{where}: 'n_shots' must be a non-negative integer, not {clip(repr(shots), 60)}")
    return Prompt(text=text, gold=label, labels=tuple(labels), query=query, n_shots=shots)


def parse_prompts_text(text: str, source: str) -> list[Prompt]:
    """Parse bring-your-own prompts: JSONL (or a JSON list) of `{"prompt", "label", "labels"}` records.

    Texts are kept exactly as given, whitespace included: `label` and `labels` are the answers as they
    continue the prompt, so `{"prompt": "...Sentiment:", "label": " positive"}` wants the leading space.
    A label without one after a prompt that does not end in whitespace is kept as given (the model then
    scores a glued-on continuation, which is sometimes what is meant, e.g. for code). Optional keys:
    `query` (shown in reports) and `n_shots` (demonstrations in the prompt, for bookkeeping).
    """
    fmt = _format_of(source, PROMPT_EXTENSIONS)
    if not text.strip():
        raise TaskError(f"{source}: empty file")
    if fmt == ".json":
        records: Iterator[tuple[int, int | None, Any]] = _list_records(_load_json(text, source), source)
    else:
        records = _json_lines(text, source)
    prompts = [_prompt(rec, _where(source, n, line)) for n, line, rec in records]
    if not prompts:
        raise TaskError(f"{source}: no prompts")
    return prompts


def load_prompts_file(path: str | os.PathLike, max_bytes: int | None = None) -> list[Prompt]:
    """Load bring-your-own prompts from a JSONL file (see `parse_prompts_text`), scored as given."""
    p = Path(path)
    return parse_prompts_text(_read_text(p, max_bytes), str(p))
