# gpuops: the Slack bot, as the Helm chart (deploy/helm/gpuops) runs it.
#   docker build -t registry.example/gpuops:0.1.0 .
# Two stages: the wheel is built in the first; the final image installs only that wheel
# and its dependencies (no compilers, no sources, no tests), and runs as a non-root user.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY commands ./commands
COPY workflows ./workflows
COPY storage ./storage
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && groupadd --gid 10001 gpuops && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gpuops \
    && mkdir -p /var/lib/gpuops && chown 10001:10001 /var/lib/gpuops
USER 10001:10001
WORKDIR /var/lib/gpuops
EXPOSE 8080 3000
ENTRYPOINT ["gpuops"]
CMD ["run"]
