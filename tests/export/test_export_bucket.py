"""An exported artifact in a store in a bucket (SeaweedFS): kept, covered by
the verdict, served, and refused once an object of it changes behind the store."""

from __future__ import annotations

import json

import jax
import obstore
import pytest
import usermodels
from click.testing import CliRunner

import treeguard
from treeguard._cli.main import main
from treeguard.export import export_version, served_from_store
from treeguard.serving import verify_version

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


def test_an_artifact_in_a_bucket_is_served_and_a_changed_one_refused(s3_url):
    store = treeguard.ArtifactStore.init(s3_url)
    m = usermodels.eqx_model
    v = store.put(m.init(m.key()))
    export_version(m, store, v)
    assert verify_version(store, v, m).status == "verified"
    store.promote(v)
    served = served_from_store(store)
    assert served.version == v
    out = CliRunner().invoke(main, ["store", "ls", s3_url, "--json"])
    assert out.exit_code == 0, out.output
    (listed,) = json.loads(out.output)["versions"]
    assert listed["exported"] == {"state": "covered", "platforms": ["cpu"], "jax": jax.__version__}
    bucket, _, prefix = s3_url.removeprefix("s3://").partition("/")
    objects = obstore.store.S3Store(bucket, prefix=prefix)
    name = f"versions/{v}/exported.bin"
    data = bytearray(bytes(obstore.get(objects, name).bytes()))
    data[-1] ^= 1
    obstore.put(objects, name, bytes(data))
    with pytest.raises(treeguard.ArtifactError, match="does not match its digest"):
        served_from_store(store)
    for change, state in ((data[:-1], "changed"), (None, "missing")):
        if change is None:
            obstore.delete(objects, name)
        else:
            obstore.put(objects, name, bytes(change))
        out = CliRunner().invoke(main, ["store", "ls", s3_url, "--json"])
        assert json.loads(out.output)["versions"][0]["exported"]["state"] == state
