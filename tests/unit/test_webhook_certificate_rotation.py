"""The rotation rule of the operator's own webhook certificates, without the API: when the
Secret gets a new CA or serving certificate, what the bundle holds, and how a replica puts
the files in place (``training_operator.webhook_certificates``)."""

from __future__ import annotations

import datetime
import ssl

from controller_kit.certificates import CertificateAuthority, cert_pem, key_pem
from training_operator import webhook_certificates as wc

HOSTS = wc.Hosts.for_service("training-operator-webhook", "ops", ("127.0.0.1", "local.test"))
VALIDITY = datetime.timedelta(seconds=60)


def now(seconds: float = 0) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)


def settled(_ca) -> bool:
    return True


def unsettled(_ca) -> bool:
    return False


def cas(data: dict[str, bytes]) -> list[str]:
    return [wc.fingerprint(c) for c in wc.read_bundle(data[wc.CA_CRT])]


def serving(data: dict[str, bytes]):
    return wc.read_bundle(data[wc.TLS_CRT])[0]


def fresh() -> dict[str, bytes]:
    step = wc.plan({}, HOSTS, VALIDITY, now(), settled)
    assert step.data is not None
    return step.data


def test_hosts_are_the_services_names_and_the_extra_ones():
    assert HOSTS.dns_names == ("training-operator-webhook.ops.svc",
                               "training-operator-webhook.ops.svc.cluster.local", "local.test")
    assert HOSTS.ip_addresses == ("127.0.0.1",)


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate_for_the_hosts():
    step = wc.plan({}, HOSTS, VALIDITY, now(), unsettled)  # nothing served yet: no wait
    assert step.data is not None and set(step.data) == set(wc.SECRET_KEYS)
    assert step.reason.startswith("no certificates yet: a new CA and a serving certificate")
    cert = serving(step.data)
    assert wc.Hosts.of(cert).same_as(HOSTS)
    assert wc.serving_problem(step.data, wc.read_bundle(step.data[wc.CA_CRT]), now()) == ""
    ca = wc.read_bundle(step.data[wc.CA_CRT])[0]
    life = ca.not_valid_after_utc - cert.not_valid_after_utc
    assert life > VALIDITY * (wc.CA_LIFETIMES - 2), "the CA outlives many serving certificates"


def test_a_good_secret_is_kept_until_two_thirds_of_the_serving_life():
    data = fresh()
    step = wc.plan(data, HOSTS, VALIDITY, now(), settled)
    assert step.data is None and step.reason == ""
    assert 35 < step.recheck_in <= 40, step.recheck_in  # 2/3 of 60 s
    # Short of the 40 s by more than a busy machine may take between making it and asking.
    assert wc.plan(data, HOSTS, VALIDITY, now(35), settled).data is None


def test_the_serving_certificate_is_renewed_under_the_same_ca():
    data = fresh()
    step = wc.plan(data, HOSTS, VALIDITY, now(41), settled)
    assert step.data is not None and "past 67% of its life" in step.reason
    assert step.data[wc.CA_CRT] == data[wc.CA_CRT] and step.data[wc.CA_KEY] == data[wc.CA_KEY]
    assert step.data[wc.TLS_CRT] != data[wc.TLS_CRT]
    serving(step.data).verify_directly_issued_by(wc.read_bundle(data[wc.CA_CRT])[0])


def test_other_hosts_renew_the_serving_certificate():
    data = fresh()
    other = wc.Hosts.for_service("renamed", "ops")
    step = wc.plan(data, other, VALIDITY, now(), settled)
    assert step.data is not None and "not renamed.ops.svc" in step.reason
    assert wc.Hosts.of(serving(step.data)).same_as(other)


def test_a_shortened_validity_renews_a_longer_lived_certificate():
    longer = datetime.timedelta(hours=1)
    data = wc.plan({}, HOSTS, longer, now(), settled).data
    # Within the margin (a tenth and a minute) it is kept; beyond it, renewed at once.
    assert wc.plan(data, HOSTS, longer * 0.95, now(), settled).data is None
    step = wc.plan(data, HOSTS, VALIDITY, now(), settled)
    assert step.data is not None and "longer than --webhook-cert-validity (60 s)" in step.reason
    assert step.data[wc.CA_CRT] == data[wc.CA_CRT]
    assert serving(step.data).not_valid_after_utc <= now(VALIDITY.total_seconds())


def test_a_due_certificate_waits_until_the_apiserver_trusts_the_ca():
    data = fresh()
    step = wc.plan(data, HOSTS, VALIDITY, now(41), unsettled)
    assert step.data is None and "trust" in step.reason and step.recheck_in <= 1


def authority_and_serving(ca_life: int, serving_life: int) -> dict[str, bytes]:
    ca = CertificateAuthority.create("old-ca", validity=datetime.timedelta(seconds=ca_life))
    key, cert = ca.issue("training-operator-webhook", dns_names=HOSTS.dns_names,
                         ip_addresses=HOSTS.ip_addresses, server=True,
                         validity=datetime.timedelta(seconds=serving_life))
    return {wc.CA_CRT: cert_pem(ca.cert), wc.CA_KEY: key_pem(ca.key),
            wc.TLS_CRT: cert_pem(cert), wc.TLS_KEY: key_pem(key)}


def test_a_ca_renewal_adds_the_new_ca_before_any_certificate_it_signs_is_served():
    data = authority_and_serving(ca_life=60, serving_life=60)
    old_ca = cas(data)[0]
    # Both are due at 40 s: first only the bundle changes (new CA at its head, old kept)...
    renewed = wc.plan(data, HOSTS, VALIDITY, now(41), settled)
    assert renewed.data is not None and "the CA is past 67%" in renewed.reason
    assert cas(renewed.data)[1:] == [old_ca] and cas(renewed.data)[0] != old_ca
    assert renewed.data[wc.CA_KEY] != data[wc.CA_KEY]
    assert (renewed.data[wc.TLS_CRT], renewed.data[wc.TLS_KEY]) == (data[wc.TLS_CRT],
                                                                      data[wc.TLS_KEY])
    # ...then, once the apiserver trusts the new CA, a serving certificate signed by it.
    assert wc.plan(renewed.data, HOSTS, VALIDITY, now(41), unsettled).data is None
    longer = VALIDITY * 2  # the new certificate outlives the old CA: its end is seen below
    moved = wc.plan(renewed.data, HOSTS, longer, now(42), settled)
    assert moved.data is not None and cas(moved.data) == cas(renewed.data)
    serving(moved.data).verify_directly_issued_by(wc.read_bundle(renewed.data[wc.CA_CRT])[0])
    # The old CA leaves the bundle once it has expired.
    pruned = wc.plan(moved.data, HOSTS, longer, now(61), settled)
    assert pruned.data is not None and "expired CAs" in pruned.reason
    assert cas(pruned.data) == cas(renewed.data)[:1]
    assert pruned.data[wc.TLS_CRT] == moved.data[wc.TLS_CRT]


def test_a_hand_made_secret_without_the_ca_key_keeps_its_certificate_meanwhile():
    data = authority_and_serving(ca_life=3600, serving_life=3600)
    del data[wc.CA_KEY]
    step = wc.plan(data, HOSTS, VALIDITY, now(), settled)
    assert step.data is not None and "ca.key missing" in step.reason
    assert step.data[wc.TLS_CRT] == data[wc.TLS_CRT] and len(cas(step.data)) == 2


def test_a_broken_pair_is_replaced_at_once():
    data = fresh()
    data[wc.TLS_KEY] = fresh()[wc.TLS_KEY]
    step = wc.plan(data, HOSTS, VALIDITY, now(), unsettled)
    assert step.data is not None and "tls.key does not match tls.crt" in step.reason
    assert step.data[wc.CA_KEY] == data[wc.CA_KEY]


def test_a_replica_swaps_its_files_all_at_once(tmp_path):
    first, second = fresh(), fresh()
    for data in (first, second):
        wc.write_served_files(tmp_path, {k: data[k] for k in wc.SERVED_KEYS})
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        assert (tmp_path / "ca.crt").read_bytes() == data[wc.CA_CRT]
    assert len([p for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()]) == 1
