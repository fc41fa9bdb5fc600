# gpuops: the Slack bot, as the Helm chart (deploy/helm/gpuops) runs it.
#   docker build -t registry.example/gpuops:0.1.0 .
# Two stages. The first builds wheels: gpuops's own (the product packages only, as
# pyproject.toml lists them) and every dependency's. The final stage installs those wheels
# and nothing else: no compiler, no sources, no tests, no network, and it runs as a
# numeric non-root user, so Kubernetes's runAsNonRoot can check it.

FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# pyproject.toml names README.md as the package's readme: the build reads it.
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY commands ./commands
COPY workflows ./workflows
COPY storage ./storage
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# matplotlib (run timelines, capacity charts) keeps its font cache here: the home is
# /nonexistent and the root filesystem read-only, /tmp the chart's writable emptyDir.
ENV MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /wheels /wheels
# --no-index: everything comes from the wheels built above, nothing from an index.
RUN pip install --no-cache-dir --no-index --find-links=/wheels gpuops && rm -rf /wheels \
    && groupadd --gid 10001 gpuops \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpuops \
    && mkdir -p /var/lib/gpuops && chown 10001:10001 /var/lib/gpuops
USER 10001:10001
# The database's default place in a pod (the chart mounts its volume here).
WORKDIR /var/lib/gpuops
# 8080: /healthz, /readyz (the kubelet's); 8081: /metrics; 3000: Slack's requests in HTTP mode.
EXPOSE 8080 8081 3000
ENTRYPOINT ["gpuops"]
CMD ["run"]
