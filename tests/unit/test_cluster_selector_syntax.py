"""The cluster selector: Kubernetes' label-selector syntax, parsed strictly, matched against
MultiKueueCluster labels, and the reasons a job waits (pure)."""

from __future__ import annotations

import pytest

from dispatcher.placement.cluster_selector import (
    REASON_INVALID_SELECTOR,
    REASON_NO_WORKER_MATCHES,
    InvalidSelector,
    parse,
    select,
)

EU = {"region": "eu-west", "tier": "standard", "gpus": "8"}
US = {"region": "us-east", "tier": "spot"}
BARE: dict[str, str] = {}


@pytest.mark.parametrize("text, eu, us, bare", [
    ("", True, True, True),
    ("region=eu-west", True, False, False),
    ("region==eu-west", True, False, False),
    ("region = eu-west", True, False, False),
    ("region!=eu-west", False, True, True),
    ("region in (eu-west,eu-north)", True, False, False),
    ("region in ( eu-west , us-east )", True, True, False),
    ("region notin (eu-west)", False, True, True),
    ("tier", True, True, False),
    ("!tier", False, False, True),
    ("region in (eu-west,eu-north),tier!=spot", True, False, False),
    ("region in (eu-west, us-east), tier!=spot", True, False, False),
    ("gpus>4", True, False, False),
    ("gpus<4", False, False, False),
    ("region=", False, False, False),
    ("example.com/pool=a", False, False, False),
    ("in=x", False, False, False),
])
def test_matches_as_kubernetes_does(text, eu, us, bare):
    selector = parse(text)
    assert (selector.matches(EU), selector.matches(US), selector.matches(BARE)) == (eu, us, bare)


def test_prints_back_what_it_parsed():
    assert str(parse("region in ( eu-west , eu-north ),  tier!=spot,!gone,x")) == \
        "region in (eu-west,eu-north),tier!=spot,!gone,x"


@pytest.mark.parametrize("text, says", [
    ("region in (eu-west", 'at character 19: "," or ")" is expected in the "in" list, '
                           'found "the end"'),
    ("region in eu-west", 'at character 11: "(" is expected after "in"'),
    ("region in ()", 'at character 12: a label value is expected in the "in" list, found ")"'),
    ("region=eu,", 'at character 11: a requirement is expected after the last ","'),
    (",region", 'at character 1: a label key is expected, found ","'),
    ("region eu", 'at character 8: an operator (=, ==, !=, in, notin, <, >) or "," is '
                  'expected after the key "region", found "eu"'),
    ("region=eu tier=spot", 'at character 11: expected "," between requirements'),
    ("!", 'at character 2: a label key is expected after "!"'),
    ("gpus>four", 'at character 6: a whole number is expected after ">"'),
    ("-region=eu", '"-region" is not a label key'),
    ("Example.com/pool=a", '"Example.com/pool" is not a label key: its prefix'),
    ("region=eu_", '"eu_" is not a label value'),
    ("region=" + "x" * 64, "is not a label value: at most 63 characters"),
    ("region=(eu)", 'a label value is expected after "=", found "("'),
])
def test_refuses_what_kubernetes_would_with_where_and_why(text, says):
    with pytest.raises(InvalidSelector) as refused:
        parse(text)
    assert says in str(refused.value)


LABELS = {"worker-1": {"region": "eu"}, "worker-2": {"region": "us"}, "static": {}}


def test_select_names_the_workers_it_matches():
    assert select("region=eu", LABELS, LABELS.get) == {"worker-1"}
    assert select(None, LABELS, LABELS.get) == set(LABELS)
    assert select("  ", LABELS, LABELS.get) == set(LABELS)


def test_select_says_why_nothing_matches_with_the_labels_seen():
    waits = select("region=mars", LABELS, LABELS.get)
    assert waits.reason == REASON_NO_WORKER_MATCHES
    assert waits == ("cluster selector 'region=mars' (annotation "
                     "trainjob-dispatcher.io/cluster-selector) matches no registered worker "
                     "cluster; the workers' labels: static {}, worker-1 {region=eu}, "
                     "worker-2 {region=us}")
    assert "no worker cluster is registered" in select("region=eu", [], LABELS.get)


def test_select_reports_an_invalid_selector_with_the_annotation_and_the_error():
    waits = select("region in (eu", LABELS, LABELS.get)
    assert waits.reason == REASON_INVALID_SELECTOR
    assert waits.startswith("annotation trainjob-dispatcher.io/cluster-selector "
                            "'region in (eu' is not a valid label selector: at character")
