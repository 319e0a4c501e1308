"""The CURVE certificate Flux brokers authenticate each other with (ZeroMQ CURVE, i.e.
X25519 keys written in Z85), derived from the TrainJob's UID as upstream Trainer v2.3
derives it: the secret key is SHA-256 of the UID. Being a function of the UID, every build
for one TrainJob writes the same certificate (the Secret is applied on each build, like the
ConfigMap), and a controller taking over the job writes what the running brokers hold."""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

CERT_KEY = "curve.cert"
# ZeroMQ's Z85 alphabet (RFC 32).
_Z85 = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        ".-:+=^!/*?&<>()[]{}@%$#")


def z85(data: bytes) -> str:
    """Z85 text of ``data`` (a multiple of 4 bytes: 5 characters per big-endian word); ""
    for other lengths, as upstream's encoder answers."""
    if len(data) % 4:
        return ""
    out = []
    for i in range(0, len(data), 4):
        word = int.from_bytes(data[i:i + 4], "big")
        out.append("".join(_Z85[word // 85 ** p % 85] for p in range(4, -1, -1)))
    return "".join(out)


def key_pair(uid: str) -> tuple[bytes, bytes]:
    """(secret, public) raw X25519 keys for the TrainJob with ``uid``."""
    secret = hashlib.sha256(uid.encode()).digest()
    public = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return secret, public


def certificate(job_name: str, uid: str) -> str:
    """The certificate file in ZeroMQ's certificate layout (a ``metadata`` and a ``curve``
    section), which ``flux keygen`` writes and the brokers read. The keys are what a
    controller taking the job over must reproduce; the comment lines are free text."""
    secret, public = key_pair(uid)
    return ("#  ZeroMQ CURVE Secret Certificate\n"
            "#  Written by the training operator\n\n"
            "metadata\n"
            f'    name = "{job_name}"\n'
            "curve\n"
            f'    public-key = "{z85(public)}"\n'
            f'    secret-key = "{z85(secret)}"\n')
