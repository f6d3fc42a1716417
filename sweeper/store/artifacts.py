"""Optuna's artifact store for a study: a folder, or an S3 bucket.

optuna-dashboard lists what the workers upload here beside each trial."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper.errors import ConfigError
from sweeper.store.layout import artifacts_dir

if TYPE_CHECKING:
    from optuna.artifacts import Boto3ArtifactStore, FileSystemArtifactStore


def artifact_store(location: str) -> FileSystemArtifactStore | Boto3ArtifactStore:
    """FileSystemArtifactStore under a folder; Boto3ArtifactStore for ``s3://bucket``."""
    from optuna.artifacts import Boto3ArtifactStore, FileSystemArtifactStore  # boto3 itself loads on use

    if (bucket := check_artifacts(location)) is not None:
        return Boto3ArtifactStore(bucket)
    base = artifacts_dir(location)
    base.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(base))


def check_artifacts(location: str) -> str | None:
    """Pre-flight for ``study.artifacts``: the bucket of an ``s3://`` URL, once boto3 is known to import (it
    is optional, so a missing one must be a clear error here, not a crash in every worker)."""
    if not location.startswith("s3://"):
        return None
    bucket, _, prefix = location[len("s3://"):].partition("/")
    if not bucket or prefix.strip("/"):
        raise ConfigError(f"study.artifacts: {location!r}: give a bucket as s3://BUCKET "
                          "(Optuna's Boto3ArtifactStore writes at the bucket root; no prefix)")
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise ConfigError(f"study.artifacts: {location!r} needs boto3, which is not installed: "
                          "`pip install boto3`, or set study.artifacts to a shared folder") from None
    return bucket
