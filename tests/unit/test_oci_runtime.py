"""The runtime wrapper that lets privileged containers start on hosts short of a capability:
which capabilities it removes, from which file, and that it passes runc's arguments on."""

import json

from clusters import oci_runtime


def test_missing_capabilities_reads_the_bounding_set(tmp_path):
    status = tmp_path / "status"
    # Every capability up to CAP_CHECKPOINT_RESTORE (bit 40) except CAP_SYS_RESOURCE (bit 24).
    status.write_text("Name:\tx\nCapBnd:\t000001fffeffffff\n")
    assert oci_runtime.missing_capabilities(str(status)) == {"CAP_SYS_RESOURCE"}
    status.write_text("CapBnd:\t000001ffffffffff\n")
    assert oci_runtime.missing_capabilities(str(status)) == set()


def test_strip_capabilities_removes_only_the_missing_ones():
    process = {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_RESOURCE"],
                                "effective": ["CAP_SYS_RESOURCE"], "ambient": []}}
    assert oci_runtime.strip_capabilities(process, {"CAP_SYS_RESOURCE"})
    assert process["capabilities"] == {"bounding": ["CAP_CHOWN"], "effective": [],
                                       "ambient": []}
    assert not oci_runtime.strip_capabilities(process, {"CAP_SYS_RESOURCE"})


def test_create_rewrites_the_bundle_config_and_exec_the_process_file(tmp_path, monkeypatch):
    monkeypatch.setattr(oci_runtime, "missing_capabilities", lambda: {"CAP_SYS_RESOURCE"})
    ran = []
    monkeypatch.setattr(oci_runtime.os, "execvp", lambda path, argv: ran.append(argv))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"process": {"capabilities": {
        "bounding": ["CAP_SYS_ADMIN", "CAP_SYS_RESOURCE"]}}}))
    argv = ["--root", "/run/x", "--log", "/l.json", "create", "--bundle", str(tmp_path), "id1"]
    oci_runtime.main(argv)
    assert json.loads(config.read_text())["process"]["capabilities"] == {
        "bounding": ["CAP_SYS_ADMIN"]}
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"capabilities": {"effective": ["CAP_SYS_RESOURCE"]}}))
    oci_runtime.main(["exec", "--process", str(process), "id1"])
    assert json.loads(process.read_text()) == {"capabilities": {"effective": []}}
    # runc gets the arguments unchanged.
    assert ran == [["runc", *argv], ["runc", "exec", "--process", str(process), "id1"]]
