"""The bucket under a store, reached past it: what the bucket tests read,
write and forge behind the store's back."""

from __future__ import annotations

from obstore.store import S3Store


def raw_store(url: str) -> S3Store:
    """A client of the bucket and prefix of the store at ``url``
    (``s3://BUCKET/PREFIX``) that bypasses the store, with conditional puts."""
    _, rest = url.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    return S3Store(bucket, prefix=prefix, config={"conditional_put": "etag"})
