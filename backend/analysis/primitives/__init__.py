"""The building blocks several methods share: prompts and batches (`batching`), the configuration engine
(`engine`, `engine_rows`, `engine_fast`: batches of head masks and injections, read as outcomes by `configs`),
capture (`capture`), injection (`inject`), prediction (`predict`), head selection (`selection`), the TSLA math
(`tsla`), induction scores (`induction`),
the task-model fit (`fit`), saved tensors (`saved`) and CPU threads (`threads`). They import nothing of the kernel
or of a method; a building block only one method uses lives in that method's package."""
