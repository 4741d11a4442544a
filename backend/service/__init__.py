"""The headlens service: FastAPI routes, the job queue, per-key locks, limits and the model pool.

`create_app()` (in `app.py`) builds the app; `python -m backend serve` runs it with uvicorn.
Nothing here imports torch at import time; the model pool and the job kinds load it when first used.
"""
