"""Tasks: templates, prompt building, built-in data files, task-file and prompt-file loaders."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from backend.tasks import (Prompt, Task, TaskError, Template, builtin_tasks, load_prompts_file, load_task,
                           load_task_file, task_summary)
from backend.tasks.files import infer_kind
from backend.tasks.registry import DATA_DIR

FV_DIR = Path(__file__).resolve().parents[3] / "shared" / "fv_datasets"

REQUIRED = {"sentiment": 200, "topic": 200, "antonym": 200, "country-capital": 100, "english-french": 200,
            "present-past": 100}


def toy_task(n: int = 20, kind: str = "generation") -> Task:
    if kind == "classification":
        return Task("toy-cls", "classification", [(f"review {i}", "good" if i % 2 else "bad") for i in range(n)])
    return Task("toy-gen", "generation", [(f"w{i}", f"W{i}") for i in range(n)])


# -- templates ------------------------------------------------------------------------------------------
def test_default_template_forms():
    t = Template()
    assert t.demo("hot", "cold") == "Q: hot\nA: cold\n\n"
    assert t.query("hot") == "Q: hot\nA:"
    assert t.answer("cold") == " cold"
    assert t.query("hot") + t.answer("cold") + "\n\n" == t.demo("hot", "cold")


def test_custom_template_forms():
    t = Template("{input} Sentiment: {output}\n")
    assert t.demo("great film", "positive") == "great film Sentiment: positive\n"
    assert t.query("great film") == "great film Sentiment:"
    assert t.answer("positive") == " positive"
    glued = Template("{input}={output};")
    assert glued.query("2+2") == "2+2=" and glued.answer("4") == "4"


def test_template_keeps_braces_in_inputs_verbatim():
    t = Template()
    assert t.demo("say {output}", "ok") == "Q: say {output}\nA: ok\n\n"
    assert t.query("{input}") == "Q: {input}\nA:"


@pytest.mark.parametrize("bad", ["{input} only", "{output} then {input}", "{input}{input}{output}", "no slots"])
def test_bad_templates_are_refused(bad):
    with pytest.raises(TaskError, match="must contain"):
        Template(bad)


# -- split and prompts --------------------------------------------------------------------------------
def test_split_is_disjoint_seeded_and_covers_everything():
    task = toy_task(21)
    demos, queries = task.split(0)
    assert not set(demos) & set(queries)
    assert sorted(demos + queries) == sorted(task.examples)
    assert abs(len(demos) - len(queries)) <= 1
    assert task.split(0) == (demos, queries)
    assert task.split(1) != (demos, queries)


def test_build_prompts_count_shots_and_disjointness():
    task = toy_task(30)
    demos, queries = task.split(3)
    demo_inputs, query_inputs = {x for x, _ in demos}, {x for x, _ in queries}
    prompts = task.build_prompts(shots=4, n=12, seed=3)
    assert len(prompts) == 12
    for p in prompts:
        assert p.n_shots == 4 and p.text.count("Q: ") == 5 and p.text.endswith(f"Q: {p.query}\nA:")
        assert p.query in query_inputs
        shown = {line[3:] for line in p.text.split("\n") if line.startswith("Q: ")} - {p.query}
        assert len(shown) == 4 and shown <= demo_inputs
        assert p.gold == " " + p.query.upper() and p.gold in p.labels and len(p.labels) >= 4


def test_build_prompts_is_deterministic_per_seed():
    task = toy_task(30)
    assert task.build_prompts(3, 8, seed=5) == task.build_prompts(3, 8, seed=5)
    assert [p.text for p in task.build_prompts(3, 8, seed=5)] != [p.text for p in task.build_prompts(3, 8, seed=6)]
    zero = task.build_prompts(0, 3, seed=0)
    assert all(p.n_shots == 0 and p.text.count("Q: ") == 1 for p in zero)


def test_build_prompts_refuses_bad_requests():
    task = toy_task(10)
    with pytest.raises(TaskError, match="6 shots asked"):
        task.build_prompts(6, 2)
    with pytest.raises(TaskError, match="shots >= 0"):
        task.build_prompts(-1, 2)
    with pytest.raises(TaskError, match="prompts > 0"):
        task.build_prompts(1, 0)


def test_classification_labels():
    task = toy_task(20, "classification")
    assert task.labels == ("bad", "good")
    for p in task.build_prompts(2, 6, seed=0):
        assert p.labels == (" bad", " good") and p.gold in p.labels
    fixed = Task("t", "classification", [("a", "yes"), ("b", "no")], labels=("yes", "no", "maybe"))
    assert fixed.build_prompts(0, 1)[0].labels == (" yes", " no", " maybe")
    with pytest.raises(TaskError, match="not among the labels"):
        Task("t", "classification", [("a", "yes"), ("b", "no")], labels=("yes",))
    with pytest.raises(TaskError, match="duplicated labels"):
        Task("t", "classification", [("a", "yes"), ("b", "no")], labels=("yes", "no", "yes"))


def test_prompt_gold_must_be_a_label():
    with pytest.raises(TaskError, match="not among"):
        Prompt("x", " a", (" b", " c"))


# -- built-in tasks -----------------------------------------------------------------------------------
def test_every_builtin_file_loads_with_required_counts():
    tasks = builtin_tasks()
    for name, minimum in REQUIRED.items():
        task = tasks[name]
        assert task.name == name and task.models == "any" and task.description
        assert len(task.examples) >= minimum, name
        inputs = [x for x, _ in task.examples]
        assert len(set(inputs)) == len(inputs), name
        assert all(x == x.strip() and y == y.strip() and x and y for x, y in task.examples)
    assert {p.stem for p in DATA_DIR.glob("*.json")} == {n.replace("-", "_") for n in REQUIRED}


def test_builtin_classification_tasks_are_balanced():
    tasks = builtin_tasks()
    assert tasks["sentiment"].kind == "classification" and set(tasks["sentiment"].labels) == {"positive", "negative"}
    assert tasks["topic"].kind == "classification" and len(tasks["topic"].labels) == 4
    for name in ("sentiment", "topic"):
        counts = Counter(y for _, y in tasks[name].examples)
        assert set(counts) == set(tasks[name].labels) and max(counts.values()) - min(counts.values()) <= 2
    for name in ("antonym", "country-capital", "english-french", "present-past"):
        assert tasks[name].kind == "generation"


def test_builtin_label_first_tokens_are_distinct_single_tokens(gpt2_tokenizer):
    for name in ("sentiment", "topic"):
        task = builtin_tasks()[name]
        ids = [gpt2_tokenizer.encode(task.template.answer(w)) for w in task.labels]
        assert all(len(i) == 1 for i in ids), (name, ids)
        assert len({i[0] for i in ids}) == len(ids)


def test_antonym_inputs_never_appear_as_outputs():
    task = builtin_tasks()["antonym"]
    assert not {x for x, _ in task.examples} & {y for _, y in task.examples}


def test_builtins_are_cached_but_callers_get_copies():
    a = builtin_tasks()["antonym"]
    a.examples.clear()
    assert len(builtin_tasks()["antonym"].examples) >= 200


def test_load_task_by_name_path_and_errors(tmp_path):
    assert load_task("country-capital").name == "country-capital"
    assert load_task("country_capital").name == "country-capital"
    overridden = load_task("present-past", kind="classification")
    assert overridden.kind == "classification" and overridden.labels
    f = tmp_path / "mine.jsonl"
    f.write_text('{"input": "a", "output": "b"}\n{"input": "c", "output": "d"}\n')
    assert load_task(str(f)).name == "mine" and load_task(f).examples == [("a", "b"), ("c", "d")]
    with pytest.raises(TaskError) as e:
        load_task("no-such-task")
    assert "sentiment" in str(e.value) and "antonym" in str(e.value) and "existing file" in str(e.value)


def test_task_summary():
    s = task_summary(builtin_tasks()["sentiment"])
    n = len(builtin_tasks()["sentiment"].examples)
    assert s == {"name": "sentiment", "kind": "classification", "n_examples": n, "n_queries": n - n // 2,
                 "labels": ["positive", "negative"], "models": "any", "description": s["description"]}
    assert s["n_queries"] == builtin_tasks()["sentiment"].n_queries(7)  # the same for every seed
    assert task_summary(builtin_tasks()["antonym"])["labels"] is None
    json.dumps([task_summary(t) for t in builtin_tasks().values()])


# -- task files: formats --------------------------------------------------------------------------------
ROWS = [("great film", "positive"), ("dull plot", "negative"), ("loved it", "positive"), ("awful", "negative")]


def write_all_formats(d: Path) -> list[Path]:
    js = d / "tiny.json"
    js.write_text(json.dumps([{"input": x, "output": y} for x, y in ROWS]))
    jl = d / "tiny.jsonl"
    jl.write_text("\n".join(json.dumps({"input": f"  {x} ", "output": y}) for x, y in ROWS) + "\n\n")
    cs = d / "tiny.csv"
    cs.write_text("input,output,source\n" + "".join(f'"{x}",{y},web\n' for x, y in ROWS))
    ts = d / "tiny.tsv"
    ts.write_text("output\tinput\n" + "".join(f"{y}\t{x}\n" for x, y in ROWS))
    return [js, jl, cs, ts]


def test_json_jsonl_csv_tsv_load_the_same_task(tmp_path):
    tasks = [load_task_file(p) for p in write_all_formats(tmp_path)]
    for t in tasks:
        assert t.name == "tiny" and t.examples == ROWS and t.kind == "classification"
        assert t.labels == ("negative", "positive") and t.template.text == Template().text
    assert len({t.content_hash() for t in tasks}) == 1


def test_builtin_object_format_and_overrides(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"name": "yn", "kind": "classification", "template": "{input} -> {output}\n",
                             "labels": ["yes", "no", "maybe"], "description": "d",
                             "examples": [{"input": "a", "output": "yes"}, {"input": "b", "output": "no"}]}))
    t = load_task_file(f)
    assert (t.name, t.kind, t.labels, t.description) == ("yn", "classification", ("yes", "no", "maybe"), "d")
    assert t.build_prompts(1, 1)[0].text.endswith(" ->")
    t2 = load_task_file(f, kind="generation", name="other", template="<{input}|{output}>")
    assert (t2.name, t2.kind, t2.labels, t2.template.text) == ("other", "generation", None, "<{input}|{output}>")


def test_exact_duplicates_are_dropped_and_whitespace_stripped(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps([{"input": " a ", "output": "b\n"}, {"input": "a", "output": "b"},
                             {"input": "c", "output": "d"}]))
    assert load_task_file(f).examples == [("a", "b"), ("c", "d")]


# -- task files: errors ---------------------------------------------------------------------------------
def _error(path: Path, **kw) -> str:
    with pytest.raises(TaskError) as e:
        load_task_file(path, **kw)
    return str(e.value)


@pytest.mark.parametrize("name, content, expected", [
    ("a.json", "", ["empty file"]),
    ("a.json", "[{\"input\": \"x\", ", ["not valid JSON", "line 1"]),
    ("a.json", '{"input": "x", "output": "y"}', ["needs an \"examples\" list"]),
    ("a.json", '{"input": "x", "output": "y"}\n{"input": "z", "output": "w"}\n', ["line 2", "name the file .jsonl"]),
    ("a.json", '"text"', ["expected a JSON list", "str"]),
    ("a.json", "[]", ["no examples"]),
    ("a.json", '[{"input": "a", "output": "b"}, ["c", "d"]]', ["record 2", "expected an object", "list"]),
    ("a.json", '[{"input": "a", "output": "b"}, {"input": "c"}]', ["record 2", "missing key 'output'"]),
    ("a.json", '[{"input": "a", "output": "b"}, {"input": "c", "output": 3}]', ["record 2", "must be a string", "int"]),
    ("a.json", '[{"input": "a", "output": "b"}, {"input": " ", "output": "d"}]', ["record 2", "'input' is empty"]),
    ("a.json", '[{"input": "a", "output": "b"}, {"input": "a", "output": "c"}]', ["record 2", "already appears in record 1"]),
    ("a.json", '{"examples": [{"input": "a", "output": "b"}], "kind": "regression"}', ["kind must be"]),
    ("a.json", '{"examples": [{"input": "a", "output": "b"}], "colour": 1}', ["unknown key", "colour"]),
    ("a.json", '{"examples": [{"input": "a", "output": "b"}, {"input": "c", "output": "z"}], "labels": ["b"]}',
     ["record 2", "not among the declared labels"]),
    ("a.jsonl", "", ["empty file"]),
    ("a.jsonl", '{"input": "a", "output": "b"}\n\n{"input": "c", "output": "d"\n', ["record 2 (line 3)", "not valid JSON"]),
    ("a.jsonl", '{"input": "a", "output": "b"}\n{"input": "c", "out": "d"}\n', ["record 2 (line 2)", "missing key 'output'"]),
    ("a.csv", "", ["empty file"]),
    ("a.csv", "input,input,output\nx,y,z\n", ["duplicated header", "'input'"]),
    ("a.csv", "text,label\nx,y\n", ["lacks column", "input", "output"]),
    ("a.csv", "input,output\n", ["no examples"]),
    ("a.csv", "input,output\na,b\nc,d,e\n", ["record 2 (line 3)", "3 fields"]),
    ("a.csv", "input,output\na,b\nc,\n", ["record 2 (line 3)", "'output' is empty"]),
    ("a.xml", "<x/>", ["unknown extension '.xml'", ".jsonl", ".csv"]),
    ("noext", "[]", ["unknown extension '(none)'"]),
])
def test_malformed_task_files_name_file_record_and_problem(tmp_path, name, content, expected):
    f = tmp_path / name
    f.write_text(content)
    msg = _error(f)
    assert str(f) in msg
    for part in expected:
        assert part in msg, (part, msg)


def test_missing_non_utf8_and_oversized_files(tmp_path, monkeypatch):
    assert "no such file" in _error(tmp_path / "gone.json")
    bad = tmp_path / "latin.csv"
    bad.write_bytes("input,output\ncaf\xe9,x\n".encode("latin-1"))
    assert "not UTF-8" in _error(bad)
    big = tmp_path / "big.json"
    big.write_text(json.dumps([{"input": f"w{i}", "output": f"v{i}"} for i in range(200)]))
    msg = _error(big, max_bytes=1000)
    assert str(big) in msg and "over the" in msg and "limit" in msg
    monkeypatch.setenv("HEADLENS_MAX_FILE_MB", "0.001")
    assert "limit" in _error(big)
    monkeypatch.delenv("HEADLENS_MAX_FILE_MB")
    assert len(load_task_file(big).examples) == 200


# -- kind inference ---------------------------------------------------------------------------------------
def test_infer_kind_rule():
    assert infer_kind(["a", "b", "a", "b"]) == "classification"
    assert infer_kind(["a", "b", "c", "d"]) == "generation"  # too few examples per distinct output
    assert infer_kind(["a"] * 10) == "generation"  # a single output is not a choice
    assert infer_kind([str(i % 10) for i in range(20)]) == "classification"
    assert infer_kind([str(i % 11) for i in range(100)]) == "generation"  # more than 10 classes


@pytest.mark.parametrize("fname, kind, labels", [
    ("sentiment.json", "classification", ("negative", "positive")),
    ("ag_news.json", "classification", ("Business", "Science", "Sports", "World")),
    ("antonym.json", "generation", None),
    ("country-capital.json", "generation", None),
    ("english-french.json", "generation", None),
    ("present-past.json", "generation", None),
    ("person-occupation.json", "generation", None),
])
def test_kind_inference_on_function_vector_files(fname, kind, labels):
    if not FV_DIR.is_dir():
        pytest.skip(f"{FV_DIR} is absent")
    t = load_task_file(FV_DIR / fname)
    assert t.kind == kind and t.labels == labels and t.name == fname[:-5]
    assert all(x and y and x == x.strip() and y == y.strip() for x, y in t.examples)


def test_kind_override_on_function_vector_file():
    if not FV_DIR.is_dir():
        pytest.skip(f"{FV_DIR} is absent")
    t = load_task_file(FV_DIR / "person-occupation.json", kind="classification")
    assert t.kind == "classification" and len(t.labels) == len({y for _, y in t.examples}) > 10


# -- bring-your-own prompts -------------------------------------------------------------------------------
def test_prompts_file_is_scored_as_given(tmp_path):
    f = tmp_path / "p.jsonl"
    recs = [{"prompt": "great film\nSentiment:", "label": " positive", "labels": [" positive", " negative"]},
            {"prompt": "x = ", "label": "1", "labels": ["1", "2", "3"], "query": "x", "n_shots": 2},
            {"prompt": "Q: hot\nA:", "label": "cold", "labels": ["cold", " cold"]}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    ps = load_prompts_file(f)
    assert ps[0] == Prompt("great film\nSentiment:", " positive", (" positive", " negative"))
    assert (ps[1].text, ps[1].gold, ps[1].labels, ps[1].query, ps[1].n_shots) == ("x = ", "1", ("1", "2", "3"), "x", 2)
    assert ps[2].gold == "cold" and ps[2].labels == ("cold", " cold")  # no space added
    g = tmp_path / "p.json"
    g.write_text(json.dumps(recs))
    assert load_prompts_file(g) == ps


@pytest.mark.parametrize("content, expected", [
    ("", ["empty file"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", " c"]}\n{"prompt": "a"', ["record 2 (line 2)", "not valid JSON"]),
    ('{"prompt": "a", "labels": [" b", " c"]}', ["record 1 (line 1)", "missing key 'label'"]),
    ('{"prompt": "a", "label": " b"}', ["record 1", "missing key 'labels'"]),
    ('\n{"prompt": "a", "label": " b", "labels": " b"}', ["record 1 (line 2)", "'labels' must be a list"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", 3]}', ["record 1", "labels[2] must be a string"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", ""]}', ["record 1", "labels[2] is empty"]),
    ('{"prompt": "a", "label": " b", "labels": [" b"]}', ["record 1", "at least 2"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", " b"]}', ["record 1", "duplicated label"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", " c"]}\n{"prompt": "a", "label": "b", "labels": [" b", " c"]}',
     ["record 2 (line 2)", "label 'b' is not among labels", "only in whitespace"]),
    ('{"prompt": "", "label": " b", "labels": [" b", " c"]}', ["record 1", "'prompt' is empty"]),
    ('{"prompt": "a", "label": " b", "labels": [" b", " c"], "n_shots": -1}', ["record 1", "n_shots"]),
    ('[1, 2]', ["record 1", "expected an object"]),
])
def test_malformed_prompt_files(tmp_path, content, expected):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(TaskError) as e:
        load_prompts_file(f)
    msg = str(e.value)
    assert str(f) in msg
    for part in expected:
        assert part in msg, (part, msg)


def test_prompt_file_extension_and_size(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("prompt,label\n")
    with pytest.raises(TaskError, match="unknown extension"):
        load_prompts_file(f)
    g = tmp_path / "p.jsonl"
    g.write_text(json.dumps({"prompt": "a" * 500, "label": " b", "labels": [" b", " c"]}))
    with pytest.raises(TaskError, match="limit"):
        load_prompts_file(g, max_bytes=100)


# -- synthetic tasks hook ---------------------------------------------------------------------------------
def test_synthetic_tasks_are_merged_and_only_their_absence_is_tolerated(monkeypatch):
    import types

    from backend.tasks import registry

    fake = types.ModuleType("backend.tasks.synthetic")
    fake.synthetic_tasks = lambda: {"synth-copy": Task("synth-copy", "generation", [("a", "a"), ("b", "b")],
                                                       models="default")}
    monkeypatch.setitem(__import__("sys").modules, "backend.tasks.synthetic", fake)
    registry.clear_cache()
    try:
        tasks = builtin_tasks()
        assert tasks["synth-copy"].models == "default" and "sentiment" in tasks

        def missing(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        monkeypatch.setattr(registry.importlib, "import_module", missing)
        registry.clear_cache()
        assert "synth-copy" not in builtin_tasks()

        def broken(name):
            raise ModuleNotFoundError("No module named 'somedep'", name="somedep")

        monkeypatch.setattr(registry.importlib, "import_module", broken)
        registry.clear_cache()
        with pytest.raises(ModuleNotFoundError, match="somedep"):
            builtin_tasks()
    finally:
        monkeypatch.undo()
        registry.clear_cache()


def test_prompts_from_the_demonstration_pool_never_show_a_held_out_query():
    """Vectors are extracted (and trained) from the demonstration pool: no held-out query appears in them."""
    from backend.tasks.registry import load_task

    task = load_task("sentiment")
    held_out = {x for x, _ in task.split(3)[1]}
    pool = task.build_prompts(4, 40, 3, queries="pool")
    assert len({p.query for p in pool}) == 40 and not {p.query for p in pool} & held_out
    assert all(x not in p.text for p in pool for x in held_out)
    assert all(p.text.count(p.query) == 1 for p in pool)  # a prompt's query is not among its own demonstrations
    assert task.n_queries(3, "pool") == len(task.split(3)[0])
    rmap = load_task("syn-rmap-sentiment")  # builds its own prompts: asking its pool is an error, not held-out queries
    with pytest.raises(TaskError, match="builds its own prompts"):
        rmap.build_prompts(2, 4, 3, queries="pool")
