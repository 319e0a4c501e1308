# Image for running the project's harness and tests in a container (docker-compose.yml).
FROM golang:1.24-bookworm AS go

FROM python:3.11-slim-bookworm
COPY --from=go /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:/root/go/bin:$PATH \
    CLUSTERS_CACHE_DIR=/cache/binaries \
    GOMODCACHE=/cache/gomod \
    GOCACHE=/cache/gobuild
RUN apt-get update && apt-get install -y --no-install-recommends make git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make venv
CMD ["make", "test"]
