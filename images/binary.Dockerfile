# One static Go binary (CGO_ENABLED=0) on an empty base: the control-plane and upstream
# controller images, built from the binaries the harness provisions (`python -m clusters
# images`), where registry.k8s.io cannot be reached. The binary goes where the upstream image
# keeps it; there is no entrypoint, so give the command (as the project's compose file does).
FROM scratch
ARG BINARY
ARG TARGET=/usr/local/bin/${BINARY}
COPY ${BINARY} ${TARGET}
# Upstream files the container reads at start (e.g. JobSet's CRD and webhooks for compose's
# set-up), copied from the module cache into the build context; empty for most.
COPY config/ /config/
