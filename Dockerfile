# One image for every rbgctl role: master, store, router, operator, sim-engine, bench, kv.
# The role is the command: `docker run IMAGE store --master ...` (or `rbgctl store ...`, or a
# program name such as `mooncake_master`); `docker run IMAGE --help` lists the roles.
#
#   scripts/build-image.sh                  # base image if missing, release build, labels
#   docker build -t rbgctl:0.1.0 .          # the same by hand, after `cargo build --release`
#
# The image takes the binary built on the host: no stage compiles, so it builds offline with
# the legacy builder (Docker without BuildKit builds every stage before the target). The base
# image is a build argument; where nothing can be pulled, scripts/build-base-images.sh builds
# rbgctl-base:bookworm from Debian's packages (scripts/build-image.sh passes it as RUNTIME).
ARG RUNTIME=debian:bookworm-slim

# --- what every final image has: tini, a non-root user, the Python client, the layout ------
FROM ${RUNTIME} AS base
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="rbgctl" \
      org.opencontainers.image.description="Every role of an LLM inference service with an externalized KV-cache pool: master, store, router, operator, benchmarks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/rbgctl/rbgctl"
# tini is PID 1 so SIGTERM reaches the role (a store then tells the master it will be back);
# ibverbs-providers brings libibverbs and its providers, which the RDMA data path loads
# (`protocol = "rdma"`; the container needs the host's /dev/infiniband devices and IPC_LOCK).
# The locally built base (scripts/build-base-images.sh) already has all three.
RUN if ! command -v tini >/dev/null || ! ldconfig -p | grep -q libibverbs.so.1; then \
        apt-get update && apt-get install -y --no-install-recommends tini ca-certificates \
            ibverbs-providers \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 rbgctl \
    && useradd --uid 10001 --gid rbgctl --home-dir /var/lib/rbgctl --shell /usr/sbin/nologin rbgctl \
    && mkdir -p /var/lib/rbgctl/shm /etc/rbgctl /dev/shm/rbgctl \
    && chown -R rbgctl:rbgctl /var/lib/rbgctl /dev/shm/rbgctl
# The Python client (pure Python; SGLang's and vLLM's images take it from here:
#   COPY --from=rbgctl:0.1.0 /opt/rbgctl/python /opt/rbgctl/python
#   RUN pip install /opt/rbgctl/python)
COPY python/pyproject.toml python/README.md /opt/rbgctl/python/
COPY python/src /opt/rbgctl/python/src
COPY config /etc/rbgctl/examples
# Program names the seeds' YAMLs run (argv[0] picks the role). tests/cli.rs keeps this list
# equal to the binary's own.
ARG LINKS="mooncake_master smg sglang-router"
RUN for name in ${LINKS}; do ln -s rbgctl "/usr/local/bin/${name}"; done
ENV RBGCTL_LOG=info
WORKDIR /var/lib/rbgctl
# Stores keep their segment here (mount a memory-backed volume at it to keep the cache
# across container restarts); roles that need root (none of the shipped ones) can override.
COPY scripts/docker-entrypoint.sh /usr/local/bin/rbgctl-entrypoint
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/rbgctl-entrypoint"]
CMD ["--help"]

# --- the binary built on the host: no Rust toolchain in the image (the default target) ------
FROM base AS prebuilt
ARG PREBUILT=target/release/rbgctl
COPY ${PREBUILT} /usr/local/bin/rbgctl
