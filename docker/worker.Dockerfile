# The etcd-elastic worker image: Python 3.11, torch, etcd-elastic (with the etcd client and the
# rpc extra) and the example training script, run as a non-root user. The Helm chart runs
# `elasticrun` in it (and its wait-for-etcd and etcd auth setup scripts, which need the etcd
# client installed here).
#
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t registry.example.com/etcd-elastic/worker:0.1.0 .
# torch comes from the CPU wheel index by default. For NVIDIA GPUs pick a CUDA index, e.g.
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# (the CUDA driver comes from the node; the device plugin exposes the GPUs to the pod).

ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG UID=10001

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python3 -m pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /opt/etcd-elastic
COPY pyproject.toml README.md ./
COPY backends ./backends
COPY elastic ./elastic
COPY rpc ./rpc
COPY examples ./examples
RUN python3 -m pip install ".[etcd,rpc]" && elasticrun --help >/dev/null

# A fixed, non-root UID/GID (the chart's pod security context runs as the same one).
RUN groupadd --gid "${UID}" elastic \
    && useradd --uid "${UID}" --gid "${UID}" --create-home --home-dir /home/elastic --shell /usr/sbin/nologin elastic
USER 10001:10001
WORKDIR /home/elastic

ENTRYPOINT ["elasticrun"]
CMD ["--help"]
