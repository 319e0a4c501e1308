"""Kubernetes label selectors as ``kubectl get -l`` takes them (``region in
(eu-west,eu-north),tier!=spot``): requirements joined by commas, each ``key``, ``!key``,
``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)``, ``key notin (v1,v2)``,
``key>n`` or ``key<n``. The parser is strict: a key or value Kubernetes would refuse as a
label is refused, with where and why, so a typo never silently selects everything or
nothing. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"-?[0-9]+")
_PUNCTUATION = "(),"
_OPERATOR_CHARS = "=!<>"


class InvalidSelector(ValueError):
    """A selector that does not parse; the message says where and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # exists, !, =, !=, in, notin, >, <
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return value is not None
            case "!":
                return value is None
            case "=" | "in":
                return value is not None and value in self.values
            case "!=" | "notin":
                return value is None or value not in self.values
            case ">" | "<":
                if value is None or not _INTEGER.fullmatch(value):
                    return False
                bound = int(self.values[0])
                return int(value) > bound if self.operator == ">" else int(value) < bound
        return False

    def __str__(self) -> str:
        match self.operator:
            case "exists":
                return self.key
            case "!":
                return f"!{self.key}"
            case "in" | "notin":
                return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"


@dataclass(frozen=True)
class Selector:
    """Requirements that must all hold; none selects everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


def parse(text: str) -> Selector:
    """The selector ``text`` says, or InvalidSelector naming the character and the problem."""
    tokens = _tokens(text)
    requirements = []
    at = 0
    while at < len(tokens):
        requirement, at = _requirement(tokens, at, text)
        requirements.append(requirement)
        if at < len(tokens):
            if tokens[at][1] != ",":
                raise _error(tokens[at], f'expected "," between requirements, found '
                                         f'"{tokens[at][1]}"')
            at += 1
            if at == len(tokens):
                raise InvalidSelector(f"at character {len(text) + 1}: a requirement is "
                                      'expected after the last ","')
    return Selector(tuple(requirements))


Token = tuple[int, str, str]  # (position, text, kind: word, operator or punctuation)


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    at = 0
    while at < len(text):
        char = text[at]
        if char.isspace():
            at += 1
        elif char in _PUNCTUATION:
            tokens.append((at, char, "punctuation"))
            at += 1
        elif char in _OPERATOR_CHARS:
            two = text[at:at + 2]
            operator = two if two in ("==", "!=") else char
            tokens.append((at, operator, "operator"))
            at += len(operator)
        else:
            start = at
            while at < len(text) and not text[at].isspace() and \
                    text[at] not in _PUNCTUATION + _OPERATOR_CHARS:
                at += 1
            tokens.append((start, text[start:at], "word"))
    return tokens


def _error(token: Token, problem: str) -> InvalidSelector:
    return InvalidSelector(f"at character {token[0] + 1}: {problem}")


def _requirement(tokens: list[Token], at: int, text: str) -> tuple[Requirement, int]:
    """One requirement starting at ``tokens[at]``, and where the next token is."""
    end = (len(text), "", "end")

    def peek(offset: int = 0) -> Token:
        return tokens[at + offset] if at + offset < len(tokens) else end

    if peek()[1] == "!":
        key = peek(1)
        if key[2] != "word":
            raise _error(key if key is not end else (len(text), "", "end"),
                         'a label key is expected after "!"')
        return Requirement(_key(key), "!"), at + 2
    key_token = peek()
    if key_token[2] != "word":
        raise _error(key_token, f'a label key is expected, found "{key_token[1] or "the end"}"')
    key = _key(key_token)
    operator = peek(1)
    if operator is end or operator[1] == ",":
        return Requirement(key, "exists"), at + 1
    if operator[1] in ("=", "==", "!="):
        value = peek(2)
        if value is end or value[1] == ",":
            return Requirement(key, "!=" if operator[1] == "!=" else "=", ("",)), at + 2
        if value[2] != "word":
            raise _error(value, f'a label value is expected after "{operator[1]}", found '
                                f'"{value[1]}"')
        return Requirement(key, "!=" if operator[1] == "!=" else "=", (_value(value),)), at + 3
    if operator[1] in (">", "<"):
        value = peek(2)
        if value[2] != "word" or not _INTEGER.fullmatch(value[1]):
            raise _error(value, f'a whole number is expected after "{operator[1]}"')
        return Requirement(key, operator[1], (value[1],)), at + 3
    if operator[1] in ("in", "notin"):
        if peek(2)[1] != "(":
            raise _error(peek(2), f'"(" is expected after "{operator[1]}"')
        values, at = [], at + 3
        while True:
            value = peek()
            if value[2] != "word":
                raise _error(value, f'a label value is expected in the "{operator[1]}" list, '
                                    f'found "{value[1] or "the end"}"')
            values.append(_value(value))
            separator = peek(1)
            at += 2
            if separator[1] == ")":
                return Requirement(key, operator[1], tuple(values)), at
            if separator[1] != ",":
                raise _error(separator, f'"," or ")" is expected in the "{operator[1]}" list, '
                                        f'found "{separator[1] or "the end"}"')
    raise _error(operator, f'an operator (=, ==, !=, in, notin, <, >) or "," is expected '
                           f'after the key "{key}", found "{operator[1]}"')


def _key(token: Token) -> str:
    """A label key as Kubernetes allows it: [prefix/]name, a DNS subdomain prefix of at
    most 253 characters, a name of at most 63."""
    key = token[1]
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise _error(token, f'"{key}" is not a label key: its prefix must be a lowercase DNS '
                            "subdomain of at most 253 characters")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise _error(token, f'"{key}" is not a label key: the name must be at most 63 '
                            "characters, alphanumerics with -, _ or . inside")
    return key


def _value(token: Token) -> str:
    value = token[1]
    if len(value) > 63 or not _NAME.fullmatch(value):
        raise _error(token, f'"{value}" is not a label value: at most 63 characters, '
                            "alphanumerics with -, _ or . inside")
    return value
