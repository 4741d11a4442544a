"""The command line, in-process, on a tiny model saved to disk."""
from __future__ import annotations

import json

import pytest

from backend.cli import main
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, gpt2_tokenizer):
    d = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    tiny_model("gpt2").save_pretrained(d)
    gpt2_tokenizer.save_pretrained(d)
    return str(d)


def test_tasks_json(capsys):
    assert main(["tasks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["sentiment"]["kind"] == "classification" and by_name["sentiment"]["models"] == "any"
    assert set(by_name["sentiment"]["labels"]) == {"positive", "negative"}
    assert by_name["antonym"]["kind"] == "generation" and by_name["antonym"]["n_examples"] >= 200
    assert all({"name", "kind", "n_examples", "labels", "models"} <= set(r) for r in rows)


def test_scores_writes_the_documented_json(model_dir, tmp_path, capsys):
    out = tmp_path / "s.json"
    args = ["scores", "--model", model_dir, "--task", "sentiment", "--shots", "2", "--prompts", "6", "--json", str(out)]
    assert main(args) == 0
    r = json.loads(out.read_text())
    for key in ("model", "task", "params", "n_layers", "n_heads", "tr", "tl", "dla_tr", "dla_tl", "induction", "icl",
                "zero_shot", "top_k", "top_tr", "top_tl", "cache_hit", "seconds"):
        assert key in r, key
    assert set(r["icl"]) == {"accuracy", "label_accuracy", "tr_ratio", "n", "accuracy_ci", "label_accuracy_ci",
                             "tr_ratio_ci", "per_prompt"}
    lo, hi = r["icl"]["accuracy_ci"]
    assert lo <= r["icl"]["accuracy"] <= hi and len(r["icl"]["per_prompt"]) == r["icl"]["n"]
    assert len(r["tr"]) == r["n_layers"] == 2 and len(r["tr"][0]) == r["n_heads"] == 4
    assert r["cache_hit"] is False
    assert main(args) == 0
    assert json.loads(out.read_text())["cache_hit"] is True
    assert main(["head-scores", *args[1:]]) == 0  # the kind's name: `scores` is its old name (an alias)
    again = json.loads(out.read_text())
    assert again["cache_hit"] is True and again["tr"] == r["tr"]


def test_every_kind_is_its_name_on_the_command_line_and_its_old_names_answer():
    from backend.analysis.kinds import KINDS
    from backend.cli import build_parser

    p = build_parser()
    for k in KINDS.values():
        for name in k.names:
            argv = [name.replace("_", "-"), *(["--task", "t"] if k.uses_task else [])]
            assert p.parse_args(argv).analysis == k.name, name


def test_scores_from_a_prompts_file(model_dir, tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"Q: {w}\nA:", "label": " yes", "labels": [" yes", " no"]})
                           for w in ("red", "blue", "green")))
    assert main(["scores", "--model", model_dir, "--prompts-file", str(f), "--json", "-"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompts"] == 3 and r["zero_shot"] is None


def test_icl_and_ablate(model_dir, tmp_path):
    out = tmp_path / "i.json"
    assert main(["icl", "--model", model_dir, "--task", "sentiment", "--shots", "0,2", "--prompts", "5",
                 "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["shots"] == [0, 2] and len(r["accuracy"]) == 2 == len(r["tr_ratio"]) == len(r["label_accuracy"])
    assert main(["ablation-curves", "--model", model_dir, "--task", "sentiment", "--orders", "tl", "--ks", "0,1,2",
                 "--shots", "2", "--prompts", "5", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["ks"] == [0, 1, 2] and list(r["curves"]) == ["tl"] and len(r["curves"]["tl"]["label_accuracy"]) == 3
    assert main(["ablate", "--model", model_dir, "--task", "sentiment", "--heads", "0.1,1.3", "--shots", "2",
                 "--prompts", "5", "--mode", "mean", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["heads"] == [[0, 1], [1, 3]] and len(r["rows"]) == 5 and "pred_after" in r["rows"][0]


@pytest.mark.parametrize("args, message", [
    (["scores", "--model", "/no/such/dir", "--task", "sentiment"], "does not exist"),
    (["scores", "--task", "no-such-task", "--model", "MODEL"], "no-such-task"),
    (["ablate", "--task", "sentiment", "--model", "MODEL", "--heads", "9.9", "--prompts", "2", "--shots", "1"],
     "outside this model"),
])
def test_errors_are_one_line_messages(args, message, model_dir, capsys):
    args = [model_dir if a == "MODEL" else a for a in args]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_steer_geometry_perturb(model_dir, tmp_path):
    out = tmp_path / "o.json"
    assert main(["steer", "--model", model_dir, "--task", "sentiment", "--vectors", "tr,vanilla", "--layer", "all",
                 "--shots", "2", "--prompts", "4", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["layers"] == [0, 1] and set(r["vectors"]) == {"tr", "vanilla"}
    assert main(["geometry", "--model", model_dir, "--task", "sentiment", "--shots", "2", "--prompts", "4",
                 "--json", str(out)]) == 0
    assert "zero_shot+tl" in json.loads(out.read_text())["conditions"]
    assert main(["perturb", "--model", model_dir, "--task", "sentiment", "--perturbations", "flipped_labels",
                 "--shots", "2", "--prompts", "4", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["perturbations"]) == {"none", "flipped_labels"}
    assert main(["steer", "--model", model_dir, "--task", "sentiment", "--layer", "7", "--prompts", "2"]) == 2


@pytest.mark.parametrize("args, message", [
    (["scores", "--task", "sentiment", "--shots", "x"], "--shots: expected an integer"),
    (["scores", "--task", "sentiment", "--top-pct", "nan"], "--top-pct: Input should be a finite number"),
    (["scores", "--task", "sentiment", "--top-pct", "inf"], "--top-pct: Input should be a finite number"),
    (["scores", "--task", "sentiment", "--top-pct", "-1"], "--top-pct: Input should be greater than 0"),
    (["scores", "--task", "sentiment", "--seed", "-1"], "--seed: Input should be greater than or equal to 0"),
    (["scores", "--task", "sentiment", "--batch-size", "0"], "--batch-size: Input should be greater than or equal to 1"),
    (["scores", "--task", "sentiment", "--prompts", "1000000000"], "over this server's limit"),
    (["steer", "--task", "sentiment", "--alpha", "nan"], "--alpha: Input should be a finite number"),
    (["steer", "--task", "sentiment", "--vectors", "tr,bogus"], "--vectors: 'bogus' is not one of"),
    (["ablate", "--task", "sentiment", "--heads", "3"], "--heads: heads are written layer.head"),
    (["ablation-curves", "--task", "sentiment", "--ks", "1000000000", "--model", "MODEL", "--prompts", "2"],
     "exceed this model's 8 heads"),
    (["scores", "--task", "sentiment", "--model", "x" * 256], "model: a part of the name between slashes is 256 bytes"),
    (["scores", "--task", "sentiment", "--model", "x" * 2000], "model: the name is too long (2000 characters; at most"),
    (["scores", "--task", "sentiment", "--model", "x" * 5000], "model: the name is too long (5000 characters; at most"),
])
def test_cli_validates_like_the_service(args, message, model_dir, capsys):
    """Every bad value is one line on stderr and exit 2 (issue 14's CLI probes), through the params models."""
    code = main([model_dir if a == "MODEL" else a for a in args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len([line for line in err.replace("\r", "\n").splitlines() if line.startswith("error")]) == 1


def test_json_output_is_strict_and_a_directory_is_refused(model_dir, tmp_path, capsys):
    assert main(["scores", "--model", model_dir, "--task", "sentiment", "--prompts", "3", "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    out = tmp_path / "s.json"
    assert main(["scores", "--model", model_dir, "--task", "sentiment", "--prompts", "3", "--json", str(out)]) == 0
    json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


# -- issue 24, item 7: HEADLENS_ALLOW_HUB and HEADLENS_MODEL_ROOT bind the command line as they bind the service -------
def _no_load(monkeypatch) -> None:
    import backend.cli as cli
    import backend.model.loading as models
    import backend.service.warm as warm

    def boom(*a, **k):
        pytest.fail("a model was loaded (or the hub tried) against the access rules")

    for mod, name in ((cli, "load_model_from"), (models, "load_model"), (warm, "warm")):
        monkeypatch.setattr(mod, name, boom)


@pytest.mark.parametrize("command", [["scores", "--task", "sentiment", "--prompts", "2"], ["warm"],
                                     ["sweep", "--tasks", "sentiment", "--kinds", "scores"]])
def test_the_cli_honours_the_service_s_model_rules(command, model_dir, tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from backend.service.errors import Forbidden
    from backend.service.model_pool import ModelPool

    flag = "--models" if command[0] == "sweep" else "--model"
    monkeypatch.setenv("HEADLENS_ALLOW_HUB", "0")
    monkeypatch.delenv("HEADLENS_MODEL_ROOT", raising=False)
    _no_load(monkeypatch)
    with pytest.raises(Forbidden) as hub:  # the service's sentence
        ModelPool().check("someone/some-model")
    assert main([*command, flag, "someone/some-model"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]  # a sweep names the cell first
    assert len(lines) == 1 and lines[0].endswith(hub.value.message) and "HEADLENS_ALLOW_HUB=0" in err, err

    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("HEADLENS_MODEL_ROOT", str(root))
    with pytest.raises(Forbidden) as outside:
        ModelPool().check(model_dir)
    assert main([*command, flag, model_dir]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and lines[0].endswith(outside.value.message) and "HEADLENS_MODEL_ROOT" in err, err
    assert str(root) not in err  # the root's path is not shown, as in the service

    if command[0] == "scores":  # a name relative to the root is the model under it, as in the service
        monkeypatch.undo()
        monkeypatch.setenv("HEADLENS_ALLOW_HUB", "0")
        monkeypatch.setenv("HEADLENS_MODEL_ROOT", str(Path(model_dir).parent))
        monkeypatch.chdir(tmp_path)  # where no `tiny-gpt2` is
        out = tmp_path / "s.json"
        assert main([*command, flag, Path(model_dir).name, "--json", str(out)]) == 0
        assert json.loads(out.read_text())["n_heads"] == 4
