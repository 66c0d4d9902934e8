"""``treeguard ckpt`` and ``treeguard store``: output and exit codes 0, 1, 2, run in
process through the top-level command, as a user types them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from corpus import seed_params
from forge import forge

from treeguard import ArtifactStore, read_header, save, spec_of
from treeguard._cli.main import main


@pytest.fixture
def ckpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.safetensors"
    save(path, seed_params(), metadata={"step": 42, "run": "demo"})
    return path


def _corrupt_data(path: Path) -> None:
    h = read_header(path)
    with open(path, "r+b") as f:
        f.seek(h.data_start + 1)
        f.write(b"\x55")


def test_inspect_prints_tree_env_and_metadata(ckpt_file: Path) -> None:
    res = CliRunner().invoke(main, ["ckpt", "inspect", str(ckpt_file)])
    assert res.exit_code == 0, res.output
    assert "4 tensors" in res.output and "13 params" in res.output
    assert "['dense1']['w']" in res.output and "f32[2,3]" in res.output
    assert "backend" in res.output and "jaxlib" in res.output
    assert '"step": 42' in res.output


def test_inspect_reads_no_array_data(ckpt_file: Path) -> None:
    _corrupt_data(ckpt_file)  # only a data read would notice
    assert CliRunner().invoke(main, ["ckpt", "inspect", str(ckpt_file)]).exit_code == 0
    res = CliRunner().invoke(main, ["ckpt", "verify", str(ckpt_file)])
    assert res.exit_code == 1
    assert "corrupt" in res.output and "blake3" in res.output


def test_inspect_json(ckpt_file: Path) -> None:
    res = CliRunner().invoke(main, ["ckpt", "inspect", "--json", str(ckpt_file)])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert data["num_leaves"] == 4 and data["metadata"] == {"step": 42, "run": "demo"}
    assert data["tensors"][0]["path"] == "['dense1']['b']"


def test_verify_ok_and_contract(ckpt_file: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["ckpt", "verify", str(ckpt_file)])
    assert res.exit_code == 0 and "every blake3 matches" in res.output
    spec = tmp_path / "spec.json"
    spec_of(seed_params()).save(spec)
    assert (
        CliRunner().invoke(main, ["ckpt", "verify", str(ckpt_file), "--like", str(spec)]).exit_code
        == 0
    )
    other = tmp_path / "other.json"
    spec_of({"dense1": {"w": np.ones((2, 4), np.float32)}}).save(other)
    res = CliRunner().invoke(main, ["ckpt", "verify", str(ckpt_file), "--like", str(other)])
    assert res.exit_code == 1
    assert f"shape (2, 4) in {other}, (2, 3) in the checkpoint" in res.output


def test_unreadable_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x80\x04\x95 not a checkpoint")
    for args in (["inspect", str(bad)], ["verify", str(bad)], ["inspect", str(tmp_path / "no")]):
        res = CliRunner().invoke(main, ["ckpt", *args])
        assert res.exit_code == 2, (args, res.output)
    assert "never unpickles" in CliRunner().invoke(main, ["ckpt", "inspect", str(bad)]).output


def test_store_commands(tmp_path: Path) -> None:
    s = ArtifactStore(tmp_path / "s")
    v1 = s.put(seed_params())
    runner = CliRunner()
    root = str(tmp_path / "s")
    res = runner.invoke(main, ["store", "promote", root, v1])
    assert res.exit_code == 1 and "not verified" in res.output
    assert runner.invoke(main, ["store", "verify", root, v1]).exit_code == 0
    assert runner.invoke(main, ["store", "promote", root, v1]).exit_code == 0
    v2 = s.put(seed_params())
    assert runner.invoke(main, ["store", "verify", root, v2]).exit_code == 0
    assert runner.invoke(main, ["store", "promote", root, v2]).exit_code == 0
    res = runner.invoke(main, ["store", "ls", root])
    assert res.exit_code == 0 and "current: v000002" in res.output and "verified" in res.output
    listing = json.loads(runner.invoke(main, ["store", "ls", "--json", root]).output)
    assert listing["current"] == v2 and listing["previous"] == v1
    res = runner.invoke(main, ["store", "rollback", root])
    assert res.exit_code == 0 and "v000002 -> v000001" in res.output
    assert runner.invoke(main, ["store", "rollback", root]).exit_code == 1
    res = runner.invoke(main, ["store", "gc", root, "--keep", "0"])
    # v2 was rolled back from, so it is no longer on the rollback stack: gc may remove it.
    assert res.exit_code == 0 and "removed 1: v000002" in res.output
    assert runner.invoke(main, ["store", "ls", root]).output.count("verified") == 1


def test_store_usage_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["store", "ls", str(tmp_path / "none")]).exit_code == 2
    assert not (tmp_path / "none").exists()  # a read-only command creates nothing
    res = runner.invoke(main, ["store", "ls", str(tmp_path)])
    assert res.exit_code == 2 and "not a treeguard store (no STORE.json)" in res.output
    assert runner.invoke(main, ["store", "init", str(tmp_path)]).exit_code == 0
    res = runner.invoke(main, ["store", "promote", str(tmp_path), "../../etc"])
    assert res.exit_code == 2 and "not a version name" in res.output
    assert runner.invoke(main, ["store", "promote", str(tmp_path), "v000009"]).exit_code == 2
    assert runner.invoke(main, ["store", "gc", str(tmp_path), "--keep", "-1"]).exit_code == 2


def test_store_verify_rejects_with_reason(tmp_path: Path) -> None:
    s = ArtifactStore(tmp_path)
    v = s.put(seed_params())
    spec = tmp_path / "spec.json"
    spec_of({"w": np.ones(1, np.float32)}).save(spec)
    res = CliRunner().invoke(main, ["store", "verify", str(tmp_path), v, "--like", str(spec)])
    assert res.exit_code == 1 and "rejected" in res.output
    assert s.info(v).status == "rejected"


def test_store_ls_reports_a_malformed_status_file(tmp_path: Path) -> None:
    s = ArtifactStore(tmp_path)
    good, bad = s.put(seed_params()), s.put(seed_params())
    status_path = tmp_path / "versions" / bad / "status.json"
    status = json.loads(status_path.read_text())
    status["checks"] = [{"name": "x", "surprise": True}]
    status_path.write_text(json.dumps(status))
    runner = CliRunner()
    res = runner.invoke(main, ["store", "ls", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "unreadable" in res.output and "candidate" in res.output
    listing = json.loads(runner.invoke(main, ["store", "ls", "--json", str(tmp_path)]).output)
    rows = {v["version"]: v for v in listing["versions"]}
    assert rows[good]["status"] == "candidate" and rows[bad]["status"] == "unreadable"
    assert f"{status_path}: status.json is malformed" in rows[bad]["reason"]
    res = runner.invoke(main, ["store", "verify", str(tmp_path), bad])
    assert res.exit_code == 1 and "status.json is malformed" in res.output


def test_a_forged_header_exits_2_naming_the_fault(ckpt_file: Path) -> None:
    def mutate(meta: dict[str, str], table: dict[str, Any]) -> None:
        meta["treeguard.spec"] = meta["treeguard.spec"].replace('"float32"', '">f4"', 1)

    forge(ckpt_file, mutate)
    for command in ("inspect", "verify"):
        res = CliRunner().invoke(main, ["ckpt", command, str(ckpt_file)])
        assert res.exit_code == 2, res.output
        assert "'>f4' has non-native byte order" in res.output
