"""An exported artifact in a store in a bucket (SeaweedFS): kept, covered by
the verdict, served, and refused once an object of it changes behind the store."""

from __future__ import annotations

import obstore
import pytest
import usermodels

import treeguard
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
    bucket, _, prefix = s3_url.removeprefix("s3://").partition("/")
    objects = obstore.store.S3Store(bucket, prefix=prefix)
    name = f"versions/{v}/exported.bin"
    data = bytearray(bytes(obstore.get(objects, name).bytes()))
    data[-1] ^= 1
    obstore.put(objects, name, bytes(data))
    with pytest.raises(treeguard.ArtifactError, match="does not match its digest"):
        served_from_store(store)
