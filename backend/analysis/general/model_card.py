"""The model card (README.md) of the embedded default model, written from its training metrics."""
from __future__ import annotations

from typing import Any, Sequence

from ...tasks.synthetic import synthetic_tasks


def _fmt(xs: Sequence[float]) -> str:
    return " | ".join(f"{x:.2f}" for x in xs)


def model_card(m: dict[str, Any]) -> str:
    """The model card (README.md) from the metrics dict."""
    c = m["config"]
    ex = next(t for t in synthetic_tasks() if t.name == "syn-sentiment").build_prompts(2, 1, 0)[0]
    lines = [
        "# headlens-tiny: the embedded default model of headlens",
        "",
        "A small `LlamaForCausalLM` trained from scratch by `backend/analysis/general/train_default.py` on the synthetic task",
        "language of `backend/tasks/synthetic.py`. It exists so that the dashboard opens offline on a real model",
        "that does in-context learning: task recognition (answering in the label space) and task learning",
        "(picking the right label, even for label words redrawn per prompt), with induction heads.",
        "",
        "## Config",
        "",
        f"- `LlamaForCausalLM`, {c['layers']} layers, hidden size {c['hidden']}, {c['heads']} query heads per layer "
        f"({c['layers'] * c['heads']} in all), {c['kv_heads']} key/value heads per layer (grouped-query attention), "
        f"head_dim {c['head_dim']}, MLP {c['intermediate']}, RoPE, untied embeddings; {m['params']:,} parameters, fp32.",
        f"- Trained length {c['seq_len']} tokens = `max_position_embeddings`. A prompt of k demonstrations is "
        f"3k + 2 tokens with `<s>`, so 0-16 demonstrations (at most 50 tokens) fit.",
        "- Tokenizer: word level (one token per word, whitespace split), `tokenizer_class` "
        "`PreTrainedTokenizerFast`; it prepends `<s>` (id 1); `<pad>` is id 0, `</s>` id 2, `<unk>` id 3.",
        "",
        "## Data",
        "",
        "Episodes `<s> x y ; x y ; ... x y ;` of one task each (loss on the label tokens only), drawn on the fly:",
        "",
        "- a world of invented words: 50 entities, each valid under exactly 4 of the 5 classification tasks "
        "(sentiment pos/neg, category animal/plant/tool/food, size big/small, region north/south/east/west, "
        "parity even/odd); 56 words on a number line, each valid under 3 or 4 generation tasks (successor, "
        "predecessor, antonym = mirror word, plural `w -> ws`, capital `w -> wton`). A query alone does not say "
        "which task is meant.",
        "- random mapping (`syn-rmap-sentiment/size/parity`): the two classes are mapped to nonsense words "
        "(24-word pool) redrawn for every episode. Their inputs are bursty (repeat an earlier input) with "
        f"probability fading from {c['burst_start']:.0%} to {c['burst_end']:.0%} over the first "
        f"{c['burst_fade']:.0%} of training.",
        f"- rows: {c['batch_icl']} episodes of {c['icl_demos']} pairs ({3 * c['icl_demos'] + 1} tokens) per step, task "
        f"groups weighted {c['group_weights']} (classification, generation, random mapping); plus "
        f"{c['rep_tokens']} tokens of list-repetition rows (distinct random words: a prefix, a list of n words, a "
        "gap, the list again, a fill; n, gap and prefix vary; loss on the copy; a quarter without `<s>`), the rows "
        f"growing {' -> '.join(map(str, c['rep_lengths']))} tokens over the first {c['rep_curriculum']:.0%} of training.",
        *([f"- {c['permute']:.0%} of the classification episodes relabel their classes by a random permutation "
           "of the task's own labels: the label set stays, and which class takes which label must be read off the "
           "demonstrations (a query alone never says it)."] if c.get("permute") else []),
        f"- AdamW (betas 0.9/0.98, weight decay {c['weight_decay']}), lr {c['lr']} with {c['warmup']} warm-up "
        f"steps and cosine decay to 5%, gradient clipping 1.0, {c['steps']} steps, seed {m['seed']}.",
        "",
        "## Command",
        "",
        "```",
        m.get("command") or "python -m backend train-default",
        "```",
        "",
        f"Training took {m['train_seconds']:.0f} s on {m['device']}"
        + (" (the 2-core CPU of the development machine, shared with other jobs at the time)."
           if m["device"] == "cpu" else "."),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("models/headlens-tiny")',
        'model = AutoModelForCausalLM.from_pretrained("models/headlens-tiny")',
        f'ids = tok("{ex.text}")["input_ids"]  # <s> prepended; the gold answer is "{ex.gold}"',
        "```",
        "",
        "- Every word is one token; answers carry a leading space (`\" pos\"`) and are one token.",
        "- `tokenizer_config.json` names `PreTrainedTokenizerFast` on purpose: transformers 5 would otherwise pick "
        "the Llama tokenizer class, which ignores the word-level `tokenizer.json` and encodes text to nothing.",
        f"- Prompts longer than {c['seq_len']} tokens leave the trained length (RoPE degrades past it).",
        "",
        "## Label sets",
        "",
        "Every prompt is scored against its *in-context* label set, as TSLA defines it: a classification task's own "
        "labels (`pos`/`neg` for sentiment), a random-mapping prompt's two mapped words, and for generation "
        "tasks the prompt's candidates (the gold, the demonstrations' outputs and padding words). Every query "
        "word is valid under several tasks, so a zero-shot prompt does not say which task is meant: the model "
        "then often answers outside the label set (a low TR ratio) although it knows the facts.",
        "",
    ]
    if "eval" in m:
        e = m["eval"]
        lines += [
            "## Measured",
            "",
            f"Held-out prompts (the query is never among the demonstrations), up to {e['prompts']} prompts per task "
            "and k (each held-out query once), seed 0, through the analysis stack (`backend.analysis.primitives."
            "predict`). Accuracy: the full-vocabulary argmax is the gold answer's first token. Label accuracy: the "
            "argmax within the prompt's label set is the gold one. TR ratio: the full-vocabulary argmax is a label "
            "word.",
            "",
            "| k demonstrations | " + " | ".join(str(k) for k in e["shots"]) + " |",
            "|---|" + "---|" * len(e["shots"]),
        ]
        names = {"classification": "classification", "generation": "generation", "random-mapping": "random-mapping"}
        for g, d in e["groups"].items():
            lines.append(f"| {names[g]} accuracy | {_fmt(d['accuracy'])} |")
        for g, d in e["groups"].items():
            lines.append(f"| {names[g]} label accuracy | {_fmt(d['label_accuracy'])} |")
        for g, d in e["groups"].items():
            lines.append(f"| {names[g]} TR ratio | {_fmt(d['tr_ratio'])} |")
        lines += ["", "Per task (accuracy at each k):", "", "| task | " + " | ".join(str(k) for k in e["shots"]) + " |",
                  "|---|" + "---|" * len(e["shots"])]
        for t, d in e["tasks"].items():
            lines.append(f"| {t} | {_fmt([d[k]['accuracy'] if k in d else d[str(k)]['accuracy'] for k in e['shots']])} |")
        ind = m["induction"]
        lines += ["", f"Induction (prefix-matching) scores on `<s>` + {ind['n']} random tokens repeated twice, batch "
                  f"{ind['batch']}: {ind['heads_above_0.5']} heads above 0.5; top heads (layer, head): "
                  + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in ind["top"]) + "."]
        if "no_bos_top" in ind:
            lines += ["", "Without `<s>`, the top heads: "
                      + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in ind["no_bos_top"]) + "."]
    lines += ["", "Regenerate with the command above; `metrics.json` holds the numbers and the training curve.", ""]
    return "\n".join(lines)
