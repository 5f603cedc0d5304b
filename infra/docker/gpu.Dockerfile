# The GPU image: what every node of a GPU cluster runs (Ray cluster launcher and KubeRay alike).
# A CUDA base whose CUDA is torch's (torch 2.14's wheels are built for CUDA 13.0: one toolkit in the image, and
# the base's NVIDIA_REQUIRE_CUDA=cuda>=13.0 stops the container on a driver older than 580 instead of letting torch
# fail later), exact pins of the stack (the same versions as pyproject.toml; infra/validate.py checks both), this
# package installed last, a non-root user. Nodes need an NVIDIA driver >= 580 (the label below; docs/deploy.md).
# Build from the repository root for the nodes' architecture, and push where your nodes pull:
#   docker build --platform linux/amd64 -f infra/docker/gpu.Dockerfile -t credit-orchestrator:0.1.0-gpu .
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

LABEL org.opencontainers.image.title="credit-orchestrator (GPU)" \
      ai.credit-orchestrator.cuda="13.0" \
      ai.credit-orchestrator.min-nvidia-driver="580"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# python3.12 (Ubuntu 24.04); gcc for Triton's and FlashInfer's JIT; openssh-client + rsync for the Ray cluster
# launcher, which runs its commands in this container over `docker exec` and syncs files with rsync.
# A non-root user; its home holds Ray's token file (~/.ray/auth_token) and the Hugging Face cache.
# Distribution packages follow the pinned base image's release (apt pins would break on every security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git \
       openssh-client rsync ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && pip install --upgrade pip==25.3 setuptools==80.9.0 wheel==0.45.1 \
    && useradd --create-home --uid 1001 --shell /bin/bash ray

# The stack, pinned exactly as in pyproject.toml (dependencies + the gpu extra). boto3 and
# google-api-python-client let the Ray autoscaler on the head start AWS / GCP nodes.
# torch from PyTorch's cu130 index: the CUDA build named, not whatever the package index defaults to.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cu130 torch==2.14.0 vllm==0.33.0 "ray[tune,train,default]==2.60.0" transformers==5.19.0 \
        peft==0.21.2 wandb==0.31.0 math-verify==0.9.0 boto3==1.44.5 google-api-python-client==2.202.0

WORKDIR /home/ray/credit-orchestrator

# This package last, so code changes rebuild only this layer. Campaign files come along (the RayJob runs them).
COPY --chown=1001:1001 pyproject.toml README.md ./
COPY --chown=1001:1001 orchestrator ./orchestrator
COPY --chown=1001:1001 workers ./workers
COPY --chown=1001:1001 campaigns ./campaigns
# Its own dependencies that the stack above did not bring (pinned ones are already satisfied, so nothing moves).
# hadolint ignore=DL3013
RUN pip install ".[gpu]"

USER 1001:1001
ENV HOME=/home/ray \
    HF_HOME=/home/ray/.cache/huggingface
CMD ["/bin/bash"]
