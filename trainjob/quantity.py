"""Resource quantities as Kubernetes writes them back: a value keeps the format of the
string it came from (binary ``Ki``/``Mi``..., decimal ``m``/``k``/``M``..., or an exponent),
and is printed in that format's canonical form (``2Gi`` x 4 is ``8Gi``, ``1.5`` is
``1500m``). Objects compared with the ones upstream controllers build (PodGroups'
``minResources``) must carry the same strings, since a CRD stores them as written."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT = "BinarySI", "DecimalSI", "DecimalExponent"
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T",
                     15: "P", 18: "E"}


def format_of(text: str) -> str:
    """The format a quantity string is written in."""
    text = str(text).strip()
    if text.endswith("i"):
        return BINARY_SI
    if "e" in text.lower().lstrip("+-0123456789."):
        return DECIMAL_EXPONENT
    return DECIMAL_SI


@dataclass(frozen=True)
class Quantity:
    """An exact amount and the format it prints in."""

    amount: Decimal
    format: str = DECIMAL_SI

    @classmethod
    def parse(cls, text: str) -> Quantity:
        return cls(parse_quantity(text), format_of(str(text)))

    def __add__(self, other: Quantity) -> Quantity:
        # As Kubernetes adds: a zero takes the other's format, else the left one's stays.
        fmt = other.format if self.amount == 0 else self.format
        return Quantity(self.amount + other.amount, fmt)

    def times(self, count: int) -> Quantity:
        return Quantity(self.amount * count, self.format)

    def __str__(self) -> str:
        return canonical(self.amount, self.format)


def canonical(amount: Decimal, fmt: str) -> str:
    """``amount`` in ``fmt``'s canonical form, rounded up to nano units as Kubernetes does."""
    if amount == 0:
        return "0"
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    nanos = (amount * 10**9).to_integral_value(rounding="ROUND_CEILING")
    if fmt == BINARY_SI and amount >= 1024 and amount == amount.to_integral_value():
        number, power = int(amount), 0
        while number % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            number //= 1024
            power += 1
        return f"{sign}{number}{_BINARY_SUFFIXES[power]}"
    # Decimal: an integer mantissa times a power of ten that is a multiple of three.
    number, exponent = int(nanos), -9
    while number % 1000 == 0 and (fmt == DECIMAL_EXPONENT or exponent < 18):
        number //= 1000
        exponent += 3
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{number}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{number}{_DECIMAL_SUFFIXES[exponent]}"
