"""Learned task vectors: train a vector through the frozen model, compare it with extracted vectors, and see how it
works (key heads, OV reconstruction, linear propagation), and how the tasks' vectors relate.

Two service jobs, cached by the service, each with a progress bar and a Cancel button: `ltv` (train and compare;
the loss curve is drawn live while it trains) and `ltv_tasks` (every task's vector at one layer: the paper's table,
the similarity matrix, compositions). A job computes once its Run button is pressed; a result the service already
has (a shared link) shows at once without retraining. Every setting is in the URL (`ltv_*` fields).
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from ui import figures, fit, jobs, layout, settings, share, snippets, state
from ui.sections import LiveChart, download, guard, run
from ui import api
from ui.ltv import figures as lf
from ui.ltv import stages as ls
from ui import metrics as M

def positions_from(text: str) -> list[int]:
    """The typed offsets, or the current ones (with a warning on the next run) when they do not parse."""
    try:
        return state.offsets(text)
    except ValueError:
        st.session_state["_hl_ltv_bad_positions"] = text
        return list(state.value("ltv_positions"))


s, caps = layout.page_setup("Learned task vectors", ":material/model_training:")
st.title(":material/model_training: Learned task vectors")
st.caption("Train a task vector through the frozen model (added to the hidden state at a decoder layer's input), "
           "compare it with the vectors extracted from demonstrations, and see how it works.")
layout.need_task(s)
fit.check(s)

L, H = layout.fit_shape(layout.needed("model_info", {"model": s.model}, "Loading the model", "Model"))
ctx = figures.subtitle(figures.caption(s.model, s.task_title, s.shots))
default_layer = state.ltv_default_layer(L)  # the sweep on a shallow model, else the middle layer

# -- settings (all in the URL) -------------------------------------------------------------------------------------
st.subheader("Training", divider="gray")
c1, c2, c3, c4, c5, c6 = st.columns([1.4, 1, 1, 0.8, 0.8, 1], vertical_alignment="bottom")
with c1:
    state.bind(st.selectbox, "Injection layer", "ltv_layer", options=["all", *range(L)],
               to_widget=lambda v: default_layer if v is None else v,
               format_func=lambda l: "every layer (sweep)" if l == "all"
               else f"layer {l}" + (" (middle)" if l == L // 2 else ""),
               help="θ is added to the hidden state at the INPUT of this decoder layer (layer 0: the embeddings). "
                    "The sweep trains one vector per layer; the table shows the middle layer. It is the default on "
                    f"models of at most {state.LTV_SWEEP_MAX_LAYERS} layers; a deeper model starts at its middle layer "
                    "(a sweep of SmolLM2-135M's 30 layers takes hours on a CPU).")
with c2:
    state.bind(st.text_input, "Positions", "ltv_positions", to_widget=state.fmt_ints, from_widget=positions_from,
               help=settings.help_text("ltv_positions", "E.g. -1,-2."))
with c3:
    state.bind(st.number_input, "Learning rate", "ltv_lr", **settings.widget_bounds("ltv_lr"), format="%g", step=1e-3,
               help=settings.help_text("ltv_lr", f"The default, {settings.default('ltv_lr'):g}, is the reference "
                                                 "implementation's (the paper's text says 1e-3)."))
with c4:
    state.bind(st.number_input, "Epochs", "ltv_epochs", **settings.widget_bounds("ltv_epochs"), step=1,
               help=f"At most this many epochs of {settings.kind_default('ltv_layers', 'train_prompts')} training prompts; "
                    f"early stopping (patience {settings.kind_default('ltv_layers', 'patience')}) on held-out accuracy "
                    "keeps the best vector.")
with c5:
    state.bind(st.number_input, "Batch", "ltv_batch", **settings.widget_bounds("ltv_batch"), step=1,
               help=f"Training batch size. The reference uses 1; {settings.default('ltv_batch')} (the default) trains "
                    "~4x faster on a CPU at the same held-out accuracy on the default model's tasks "
                    "(bench/bench_ltv.py).")
with c6:
    state.bind(st.selectbox, "Units", "ltv_units", options=state.options("ltv_units"),
               format_func=lambda u: {"residual": "residual scale", "absolute": "absolute (reference)"}[u],
               help="residual scale: θ = r·φ with r the RMS of the residual stream where θ is added; lr and the "
                    f"initial ±{settings.kind_default('ltv_layers', 'init_scale'):g} apply to φ, so they mean the same on "
                    "every model. absolute: θ trained as is, "
                    "as the reference implementation (tuned on Llama's scale).")
bad = st.session_state.pop("_hl_ltv_bad_positions", None)
if bad is not None:
    st.warning(f"Positions {bad!r} ignored: give negative offsets from the last token, e.g. -1 or -1,-2.",
               icon=":material/warning:")
layer = default_layer if state.value("ltv_layer") is None else state.value("ltv_layer")
params = s.job(layer=layer, positions=list(state.value("ltv_positions")), lr=float(state.value("ltv_lr")),
               epochs=int(state.value("ltv_epochs")), batch_size=int(state.value("ltv_batch")),
               units=state.value("ltv_units"), **s.selection())


def stage_seconds(base: dict[str, Any]) -> dict[str, float | None]:
    """What each mechanism stage adds to the estimate (memoised per job params in this session)."""
    memo = st.session_state.setdefault("_hl_ltv_stage_seconds", {})
    key = state.result_key("ltv_layers", base)
    if key not in memo:
        try:
            memo[key] = ls.stage_seconds(api.estimate, "ltv_layers", base)
        except api.ApiError:
            return {}
    return memo[key]


state.bind(st.pills, "How it works (per layer)", "ltv_mech", options=list(state.LTV_MECHANISM),
           selection_mode="multi", to_widget=list, from_widget=lambda v: list(v or []),
           format_func=lambda stage, secs=stage_seconds(params): ls.stage_label(stage, secs.get(stage)),
           help=ls.HELP)
params = ls.stage_params(params, state.value("ltv_mech"))


def live_drawer(live: LiveChart):
    """An `on_live` callback drawing the running training's loss curve into `live` (when it grew, ~3 times a second)."""
    def draw(data: dict[str, Any]) -> None:
        if data.get("kind") != "ltv_vector":  # a sub-call's own live data (e.g. the head scores' partial maps)
            return
        where = ", ".join(str(x) for x in data.get("layers") or [])
        live.draw(lambda d: lf.loss_curve(d, f"Training at layer {where}: epoch {d.get('epoch')}/{d.get('epochs')}, "
                                             f"step {d.get('step')}/{d.get('steps')}"),
                  data, signature=(where, len(data.get("loss") or [])), config=figures.png_config("ltv-loss-live"))
    return draw


live = LiveChart("ltv")  # drawn below the Run row and the progress bar, so the page does not jump
where = "every layer (one vector each)" if layer == "all" else f"layer {layer}"
res = run(jobs.Job("ltv_layers", params, "Learned task vectors", "Learned task vectors", on_live=live_drawer(live)),
          f"Train at **{where}**, positions {state.fmt_ints(state.value('ltv_positions'))} · lr "
          f"{float(state.value('ltv_lr')):g} · ≤ {state.value('ltv_epochs')} epochs · batch "
          f"{state.value('ltv_batch')} · compared on **{s.prompts}** held-out queries, ICL with **{s.shots}** shots",
          "Zero-shot training prompts come from the demonstration pool, never the scored queries. The loss "
          "curve is drawn while it trains; a finished result is cached (a shared link reopens it).",
          "ltv", "Press **Run** to train (a few seconds per layer on the default model).")
live.clear()

if res is not None:
    with guard("Learned task vectors"):
        per = res["per_layer"]
        layers = [int(x) for x in res["layers"]]
        show_at = state.value("ltv_show")
        idx = next((i for i, e in enumerate(per) if e["layers"][0] == show_at), None)
        if idx is None:
            idx = next(i for i, e in enumerate(per) if e["layers"][0] == res["layer"])
        tr = per[idx]["training"]

        # -- the table ----------------------------------------------------------------------------------------------
        st.subheader(f"Comparison at layer {res['layer']}", divider="gray")
        rows = [{"condition": lf.condition_name(c), **{f"{M.LABEL[m]} %": 100 * res["table"][c][m] for m in M.NAMES},
                 **{f"{M.LABEL[m]} 95% interval": M.span(M.ci_of(res["table"][c], m)) for m in M.NAMES}}
                for c in res["conditions"]]
        share.dataframe("Learned task vectors against the other methods", pd.DataFrame(rows), hide_index=True,
                        key="ltv_table",
                     column_config={f"{M.LABEL[m]} %": st.column_config.NumberColumn(format="%.1f") for m in M.NAMES})
        t = res["table"]
        acc = {c: t[c]["accuracy"] for c in ("ltv", "vanilla", "fv") if c in t}
        if len(acc) == 3:
            order = lf.ordering(acc)
            holds = acc["ltv"] > max(acc["vanilla"], acc["fv"])
            st.markdown(f"The paper (Llama-3.1-8B, layer 16, mean over its tasks): vanilla 37.8%, function vector "
                        f"37.3%, LTV 83.5%. Here: {order} — LTV "
                        + ("**above both**." if holds else
                           "**not above both**" + (" (they tie at the ceiling)." if acc["ltv"] >= max(acc.values())
                                                   else ".")))
        main_tests = next((e.get("tests") or {} for e in per if e["layers"][0] == res["layer"]), {})
        said = [M.paired_text(main_tests[f"ltv vs {c}"]["accuracy"], f"LTV vs {lf.condition_name(c)}")
                for c in ("vanilla", "fv", "icl") if (main_tests.get(f"ltv vs {c}") or {}).get("accuracy")]
        if said:
            st.markdown("Accuracy, paired on the same queries: " + "; ".join(said) + ".")
        st.caption(f"Brackets and error bars: 95% Wilson intervals. {M.noise_sentence(res['prompts'])}")
        st.caption(f"{res['prompts']} held-out queries; vanilla, FV, TR and TL vectors added at the last token, the LTV "
                   f"at positions {res['positions']}; ICL and LTV + ICL with {res['shots']} demonstrations. "
                   + " · ".join(f"**{M.LABEL[n]}**: {M.HELP[n]}" for n in M.NAMES) + " · " + jobs.timing(res))

        # -- the sweep ------------------------------------------------------------------------------------------------
        if len(layers) > 1:
            st.subheader("Layer sweep", divider="gray")
            metric = state.bind(st.segmented_control, "Measure", "ltv_metric", options=list(M.NAMES),
                                format_func=lambda m: M.LABEL[m], required=True) or "accuracy"
            share.chart(lf.layer_sweep(res, metric, f"{M.LABEL[metric]} against the injection layer{ctx}"), "ltv-sweep",
                        key="ltv_sweep", heads="")
            if any(x is not None for x in res.get("rotation") or []):  # linear propagation was asked for
                share.chart(lf.rotation_stretch(res, f"Linear propagation of θ to the last layer (W = QS){ctx}"),
                            "ltv-rotation", key="ltv_rotation", heads="")
                st.caption("W maps perturbed vectors θᵢ = θ + λᵢ‖θ‖εᵢ to the change of the last layer's output "
                           "(least squares); its polar decomposition W = QS splits that map into a rotation Q and "
                           "a stretch S. The paper finds early layers rotate θ (cosine well below 1) and late "
                           "layers stretch it.")

        # -- one layer in detail ------------------------------------------------------------------------------------
        st.subheader("How it works", divider="gray")
        if len(layers) > 1:
            state.bind(st.select_slider, "Layer", "ltv_show", options=layers,
                       to_widget=lambda v: v if v in layers else res["layer"],
                       help="The injection layer whose training and mechanism are shown.")
        e = per[idx]
        at = e["layers"][0] if len(e["layers"]) == 1 else e["layers"]
        g1, g2 = st.columns([1.3, 1])
        with g1:
            share.chart(lf.loss_curve(tr, f"Training at layer {at}: best epoch {tr['best_epoch']} of "
                                              f"{tr['epochs_run']} ({tr['stopped']}){ctx}"), f"ltv-loss-layer{at}",
                        key="ltv_loss", heads="")
            st.caption(lf.epoch_sentence(tr, int(res.params.get("patience") or settings.kind_default("ltv_layers", "patience"))))
        with g2:
            st.markdown(f"**‖θ‖** = {', '.join(f'{x:.3g}' for x in tr['norm'])} · trained on **{tr['n_train']}** "
                        f"zero-shot prompts, early-stopped on **{tr['n_val']}** · {tr['train_seconds']:.1f} s")
            st.caption(f"Saved as safetensors (model fingerprint, d_model, task hash and recipe in its metadata), "
                       f"id `{tr.get('tensor')}`: `load` takes it; the file is GET /tensors/{tr.get('tensor')}"
                       + (" — not saved on the server (see the warnings)" if res.get("unsaved_tensors") else ""))
            prop = e.get("propagation")
            if prop:
                rec = "n/a" if prop["recovered"] is None else f"{100 * prop['recovered']:.0f}%"
                st.markdown(f"**Linear surrogate** (R² {prop['r2']:.3f}, {prop['n']} perturbations): rotation "
                            f"cos {prop['rotation']:.3f}, stretch {prop['stretch']:.3g}×; zero-shot prompts with Wθ "
                            f"added to the last layer's output reach accuracy **{M.pct(prop['surrogate']['accuracy'])}**"
                            f" (LTV {M.pct(e['conditions']['ltv']['accuracy'])}, zero-shot "
                            f"{M.pct(e['conditions']['zero_shot']['accuracy'])}): {rec} of LTV's gain.")
            ov = e.get("ov")
            if ov:
                st.markdown(f"**OV reconstruction** r = Σ heads A·W_O W_V θ (‖r‖ {ov['norm']:.3g}, cos(r, θ) "
                            f"{ov['cosine']:.2f}): accuracy **{M.pct(ov['final']['accuracy'])}** with r at the last "
                            f"layer's output, {M.pct(ov['same_layer']['accuracy'])} with r where θ was; θ itself at "
                            f"the last layer's output (its residual path alone) "
                            f"{M.pct(ov['direct']['accuracy'])}, θ + r there {M.pct(ov['direct_and_ov']['accuracy'])}.")
        kh = e.get("key_heads")
        if kh:
            k1, k2 = st.columns([1.4, 1])
            with k1:
                fig = figures.head_heatmap(kh["saliency"], "ltv_saliency", top=lf.heads_of(kh),
                                           top_name=f"{len(kh['heads'])} key heads",
                                           title=f"Head saliency with the LTV at layer {at} (key heads outlined){ctx}")
                share.chart(fig, f"ltv-saliency-layer{at}", key="ltv_saliency", heads=f"key{len(kh['heads'])}")
                st.caption(figures.map_spec("ltv_saliency")["caption"] + " Key heads: the top "
                           f"{len(kh['heads'])} among the layers that see θ (≥ {at}).")
            with k2:
                share.chart(lf.ablation_bars(kh, f"Ablating the {len(kh['heads'])} key heads vs random sets"),
                            f"ltv-ablation-layer{at}", key="ltv_ablation", heads=f"key{len(kh['heads'])}")
                gp = kh.get("gold_prob") or {}
                if gp:
                    st.caption(f"Mean gold probability: LTV {gp['ltv']:.3f}, key heads ablated {gp['ablated']:.3f}, "
                               f"random heads ablated {gp['random']:.3f} (zero ablation at the last token)."
                               + (" Ablating the key heads *raises* it: saliency |a · ∂p/∂a| ranks heads by the size "
                                  "of their effect on p(gold), of either sign, so some key heads were holding the "
                                  "answer back." if gp["ablated"] > gp["ltv"] else "")
                               + " The random sets are drawn from the other heads of those layers.")
                ov_rows = [{"ranking": name.upper() if name != "induction" else "induction",
                            "top-k Jaccard": o["jaccard"], "Spearman": o.get("spearman"), "Kendall": o.get("kendall")}
                           for name, o in kh["overlap"].items()]
                share.dataframe("Key heads against the head maps", pd.DataFrame(ov_rows), hide_index=True,
                                key="ltv_overlap", placeholder="—",
                             column_config={c: st.column_config.NumberColumn(format="%.2f")
                                            for c in ("top-k Jaccard", "Spearman", "Kendall")})
                st.caption("Overlap of the saliency map with the TR, TL and induction maps of the Head map page "
                           "(top-k sets of the same size, rank correlations over all heads).")
        d1, d2 = st.columns([1, 4])
        with d1:
            download("Result (JSON)", res, f"headlens-ltv-{s.task}.json", "dl_ltv")
        with d2:
            snippets.show("ltv_layers", params, "r.table['ltv'].accuracy, r.sweep['ltv'].accuracy, r.rotation, r.tensor\n"
                                         "r.table['ltv'].accuracy_ci                       # 95% Wilson interval\n"
                                         "r.per_layer[0].tests['ltv vs vanilla']['accuracy']  # paired test")

# -- across tasks --------------------------------------------------------------------------------------------------
st.subheader("Across tasks", divider="gray")
one_layer = L // 2 if layer == "all" else int(layer)
tparams = {**{k: v for k, v in params.items() if k != "task" and k != "mechanism" and k not in ls.STAGES},
           "layer": one_layer}  # the same recipe, every task (no mechanism)
live_tasks = LiveChart("ltv_tasks")
many = run(jobs.Job("ltv_across_tasks", tparams, "Learned task vectors of every task", "Across tasks",
                    slot="ltv_tasks", on_live=live_drawer(live_tasks)),
           f"Every built-in task of this model at **layer {one_layer}**: the comparison task by task, the "
           f"similarity of their vectors, and sums of two tasks' vectors on composed tasks",
           "One vector per task (cached: a task trained above is not retrained).", "ltv_tasks",
           "Press **Run** to train a vector for every task.")
live_tasks.clear()
if many is not None:
    with guard("Across tasks"):
        rows = [{"task": n, "kind": many["kinds"][n],
                 **{lf.condition_name(c): 100 * many["table"][n][c]["accuracy"] for c in many["conditions"]},
                 "order": many["ordering"][n]} for n in many["tasks"]]
        rows.append({"task": "mean", "kind": "",
                     **{lf.condition_name(c): 100 * v for c, v in many["mean"].items()}, "order": ""})
        rows.append({"task": "paper (Llama-3.1-8B, L16)", "kind": "",
                     **{lf.condition_name(c): many["paper"].get(c) for c in ("vanilla", "fv", "ltv")}, "order": ""})
        share.dataframe("Across tasks", pd.DataFrame(rows), hide_index=True, key="ltv_tasks_table",
                     column_config={lf.condition_name(c): st.column_config.NumberColumn(format="%.0f")
                                    for c in many["conditions"]})
        beats = many["ltv_beats_vanilla"]
        n_kind = {k: sum(1 for n in many["tasks"] if many["kinds"][n] == k) for k in beats}
        st.caption("Accuracy (%) at layer " + str(many["layer"]) + ". LTV above the vanilla task vector on "
                   + ", ".join(f"{len(v)} of {n_kind[k]} {k} tasks" for k, v in beats.items()) + ".")
        share.chart(lf.similarity(many, f"Cosine similarity of the tasks' learned vectors (layer "
                                            f"{many['layer']}){figures.subtitle(s.model)}"), "ltv-similarity",
                    key="ltv_similarity", heads="")
        wk = many.get("within_kind") or {}
        st.caption("Tasks that share a label space: "
                   + "; ".join(sorted({v for v in many["label_spaces"].values() if "|" in v}) or ["none"])
                   + f". Mean similarity within a shared label space {many['within_space'] if many['within_space'] is None else round(many['within_space'], 2)}, "
                   f"across {many['across_spaces'] if many['across_spaces'] is None else round(many['across_spaces'], 2)}; "
                   + ", ".join(f"within {k} {v:.2f}" for k, v in wk.items() if v is not None)
                   + (f", classification-generation {many['across_kinds']:.2f}" if many.get("across_kinds") is not None
                      else "") + ".")
        if many["compositions"]:
            st.markdown("**Composition**: θ_a + θ_b on zero-shot prompts of the composed task x → b(a(x))")
            comp = pd.DataFrame([{"composed task": c["task"], "zero-shot": 100 * c["zero_shot"]["accuracy"],
                                  "ICL": 100 * c["icl"]["accuracy"], "θ_a": 100 * c["a_only"]["accuracy"],
                                  "θ_b": 100 * c["b_only"]["accuracy"], "θ_a + θ_b": 100 * c["sum"]["accuracy"]}
                                 for c in many["compositions"]])
            share.dataframe("Composed tasks", comp, hide_index=True, key="ltv_compositions")
            st.caption("Accuracy (%). The composed tasks are evaluation-only: their answers are words of the "
                       "language, but the model never trained on a composition (the ICL column says whether it can "
                       "compose at all).")
        d1, d2 = st.columns([1, 4])
        with d1:
            download("Result (JSON)", many, "headlens-ltv_tasks.json", "dl_ltv_tasks")
        with d2:
            snippets.show("ltv_across_tasks", tparams, "r.similarity, r.table, r.compositions")
