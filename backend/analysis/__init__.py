"""The analyses, one package per paper.

    kernel.py, kinds.py, params.py, results.py   the cached call and Context; the registry; the base models
    primitives/                                  building blocks several methods share (no kind imports them back)
    tsla/  ltv/  site/                           each paper's kinds (one module each: params, result, function)
                                                 and the building blocks only that paper uses
    general/                                     kinds of no one paper: model_info, fit, head; train_default
    methods.py                                   the three papers side by side, through the registry only

A paper's package imports the kernel, the shared layer and itself, never another paper; another kind's result
comes through `ctx.call` (tests/unit/test_architecture.py keeps these rules).
"""
