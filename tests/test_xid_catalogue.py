"""NVIDIA's XID catalogue as data (issue 33, first part): the YAML is exactly what the generator makes from the
committed source copy, its actions are the catalogue's own vocabulary, a broken file is refused naming the field,
and an operator's override names only catalogue XIDs and actions (check-config says which is wrong)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from agent.config import ConfigError, parse_config
from exporters.errors import ProfileError
from exporters.gpu.xid_catalogue import (
    ARCHITECTURES,
    DEFAULT_CATALOGUE,
    generate,
    load_catalogue,
    load_catalogue_file,
    parse_xids_sheet,
)
from tests.helpers import REPO
from tests.test_config import minimal


def test_the_committed_catalogue_is_what_the_generator_makes_from_the_source_copy():
    assert DEFAULT_CATALOGUE.read_text(encoding="utf-8") == generate(), (
        "xid-catalogue.yaml differs from its source: run python -m exporters.gpu.xid_catalogue --write "
        "(never edit it by hand; operators override entries in config)")


def test_entries_carry_the_catalogues_judgement_in_its_own_vocabulary():
    catalogue = load_catalogue_file()
    entries = load_catalogue()
    assert len(entries) > 100  # every XID Ampere/Hopper/Blackwell can raise, not a hand-picked few
    for code, e in entries.items():
        assert e.code == code and set(e.architectures) <= set(ARCHITECTURES) and e.architectures
        for action in (e.immediate_action, e.investigatory_action):
            assert action is None or action in catalogue.guidance_classes, (code, action)
        assert e.source == catalogue.source
    # Rows as the published page gives them (spot checks that the columns were not shifted by the parser).
    assert (entries[13].immediate_action, entries[13].investigatory_action) == ("RESTART_APP", "WORKFLOW_XID_13")
    assert entries[46].immediate_action == "RESET_GPU"
    assert entries[48].immediate_action == "WORKFLOW_XID_48"
    assert entries[48].xid154_linkage == "CUDA 12.7; GPU driver R565"
    assert entries[54].immediate_action == "CHECK_MECHANICALS" and "GB200" not in entries[54].architectures
    assert entries[79].immediate_action == "RESTART_BM"
    assert entries[121].architectures == ("GB200",)
    assert 1 not in entries and 9 not in entries  # "Unused" on every architecture: not raised, not listed
    # The page publishes no resolution bucket for 162-172: left empty, never invented.
    assert {c for c, e in entries.items() if e.immediate_action is None} == set(range(162, 173))


def _broken(tmp_path, mutate) -> str:
    raw = yaml.safe_load(DEFAULT_CATALOGUE.read_text(encoding="utf-8"))
    mutate(raw)
    path = tmp_path / "xid-catalogue.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ProfileError) as exc:
        load_catalogue(path)
    return str(exc.value)


def test_the_loader_refuses_a_broken_file_naming_the_field(tmp_path):
    def bad_action(raw):
        raw["xids"][3]["immediate_action"] = "REBOOT_EVERYTHING"

    msg = _broken(tmp_path, bad_action)
    assert "xids.3.immediate_action" in msg and "REBOOT_EVERYTHING" in msg, msg

    def bad_code(raw):
        raw["xids"][0]["code"] = "eight"

    assert "xids.0.code" in _broken(tmp_path, bad_code)

    def bad_arch(raw):
        raw["xids"][2]["architectures"] = ["V100"]

    assert "V100" in _broken(tmp_path, bad_arch)

    def twice(raw):
        raw["xids"].append(dict(raw["xids"][0]))

    assert "listed twice" in _broken(tmp_path, twice)


def test_the_generator_refuses_a_row_it_cannot_read():
    header = "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    with pytest.raises(ProfileError, match="XID 8"):
        parse_xids_sheet(header + "XID |\n8 |\nMNEMONIC |\nText |\nYES |\nMAYBE |\nYES |\nYES |\nRESTART_APP |\n")


def test_an_override_names_a_catalogue_xid_and_action(tmp_path):
    ok = parse_config(minimal(tmp_path, remediation={"xid_overrides": {48: {"immediate_action": "RESET_GPU"}}}))
    assert ok.config.remediation.xid_overrides[48].immediate_action == "RESET_GPU"

    def error(overrides) -> str:
        with pytest.raises(ConfigError) as exc:
            parse_config(minimal(tmp_path, remediation={"xid_overrides": overrides}), "agent.yaml")
        return str(exc.value)

    msg = error({48: {"immediate_action": "REBOOT_EVERYTHING"}})
    assert "remediation.xid_overrides.48.immediate_action" in msg and "RESET_GPU" in msg, msg
    assert "remediation.xid_overrides.1:" in error({1: {"immediate_action": "RESET_GPU"}})  # Unused on every arch
    assert "remediation.xid_overrides.13.investigatory_action" in error({13: {"investigatory_action": "PRAY"}})
    assert "remediation.xid_overrides.13.action" in error({13: {"action": "RESET_GPU"}})  # a typo'd key


def test_check_config_names_an_unknown_override_action(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump(minimal(tmp_path, remediation={"xid_overrides": {79: {"immediate_action": "NUKE"}}})))
    out = subprocess.run([sys.executable, "-m", "agent.cli", "check-config", str(cfg)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 1
    assert "remediation.xid_overrides.79.immediate_action" in out.stderr and "NUKE" in out.stderr, out.stderr


def test_the_nvml_sources_light_reader_agrees_with_the_typed_loader_and_names_a_bad_entry(tmp_path):
    from exporters.gpu.xid_actions import immediate_actions

    assert immediate_actions() == {e.code: e.immediate_action or "none" for e in load_catalogue().values()}
    bad = tmp_path / "xid-catalogue.yaml"
    bad.write_text("xids:\n  - {code: 13, immediate_action: RESTART_APP}\n  - {code: '48', immediate_action: X}\n")
    with pytest.raises(ProfileError, match=r"xids\.1: expected an integer code"):
        immediate_actions(bad)
