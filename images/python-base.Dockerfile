# A Python 3.11 base from Debian's own packages, for machines that cannot pull
# python:3.11-slim-bookworm: `python -m clusters images` tags it with that name. Debian's
# python3 lives in /usr/bin; python-is-python3 gives the `python` the Dockerfiles call.
FROM debian:bookworm-slim
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends python3 python3-venv python-is-python3 ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
