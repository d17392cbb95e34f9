# syntax=docker/dockerfile:1
# inferd's image: a wheel built in one stage, installed into a venv in a slim runtime stage,
# run as a non-root user with `inferd serve` as the entrypoint. Extras by build argument:
#   docker build -t inferd .                                  # ONNX Runtime only
#   docker build --build-arg EXTRAS=sklearn,xgboost -t inferd .
# The install steps are docs/scale-out/image.md's; a test keeps them the same.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip install "build>=1.2" && python -m build --wheel --outdir dist .

FROM python:${PYTHON_VERSION}-slim
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin inferd
WORKDIR /build
COPY --from=build /src/dist ./dist
RUN python -m venv /opt/inferd && /opt/inferd/bin/pip install "$(ls dist/inferd-*.whl)${EXTRAS:+[$EXTRAS]}"
WORKDIR /
# Models come from s3:// (INFERD_MODEL_REPOSITORY) or a volume at /models; S3 copies are cached
# in /var/cache/inferd, which may be the only writable path besides /tmp (read-only root).
RUN mkdir -p /models /var/cache/inferd && chown inferd:inferd /var/cache/inferd
ENV PATH=/opt/inferd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    INFERD_MODEL_REPOSITORY=/models \
    INFERD_MODEL_CACHE_DIR=/var/cache/inferd \
    INFERD_HTTP_PORT=8080 \
    INFERD_GRPC_PORT=8081
USER 10001:10001
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('INFERD_HTTP_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["inferd", "serve"]
