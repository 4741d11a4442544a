# headlens: the dashboard and its backend service in one image (CPU build of torch; see README for GPU).
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_DISABLE_TELEMETRY=1
WORKDIR /app
# WITH_RAY=1 adds the Ray extra: the same image then serves as a Ray head or worker (see README, "A Ray cluster")
ARG WITH_RAY=0
COPY requirements.txt requirements-ray.txt ./
# the CPU wheel of the pinned torch, so the image does not pull several GB of CUDA build
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install -r requirements.txt \
 && if [ "$WITH_RAY" = "1" ]; then pip install -r requirements-ray.txt; fi
COPY . .
EXPOSE 8501
# the service stays on 127.0.0.1 inside the container; only the dashboard is published
CMD ["python", "-m", "backend", "launch", "--host", "0.0.0.0", "--no-browser"]
